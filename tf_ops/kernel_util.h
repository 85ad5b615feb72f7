// What every hetsync kernel does before and after its own work: reach the
// resource behind its handle input, read scalar inputs, write scalar outputs,
// create a uniquely named resource and return its handle.
//
// Each helper returns a Status whose message starts with the op's name (as
// the Python wrappers and the tests know it: "HetsyncGradCacheWrite: ...",
// "hop_token_take: ...") and names the argument and the value or shape it
// got, so a kernel reads
//
//   core::RefCountPtr<GradCache> cache;
//   OP_REQUIRES_OK(ctx, LookupHandle(ctx, kOp, "gradient cache", &cache));
//   int64_t k = 0;
//   OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, kOp, "iteration", &k));
//
// (OP_REQUIRES_OK_ASYNC in an AsyncOpKernel). The resource's mutex and its
// waiting protocol stay with the resource (grad_cache.h, hop_queues.h).

#ifndef HETSYNC_TF_OPS_KERNEL_UTIL_H_
#define HETSYNC_TF_OPS_KERNEL_UTIL_H_

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace hetsync {

// Error of a failed handle lookup or deletion: TensorFlow's code (NotFound:
// the resource was destroyed; InvalidArgument: a handle of another resource
// type or device) and TensorFlow's message, preceded by the op and what the
// handle should reach: "<op>: <what> handle (input 0): <TensorFlow's message>".
inline absl::Status HandleError(const absl::Status& s, const char* op, const char* what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(op, ": ", what, " handle (input 0): ", s.message()));
}

// Looks up the resource of type T whose handle is the kernel's input 0; *out
// holds one reference, released when it goes out of scope. Errors: see
// HandleError.
template <class T>
absl::Status LookupHandle(::tensorflow::OpKernelContext* ctx, const char* op, const char* what,
                          ::tensorflow::core::RefCountPtr<T>* out) {
  return HandleError(::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), out),
                     op, what);
}

// Deletes the resource of type T whose handle is input 0 from its resource
// manager (it is freed once the last op holding a reference finishes).
// Errors: see HandleError (NotFound when already deleted).
template <class T>
absl::Status DeleteHandle(::tensorflow::OpKernelContext* ctx, const char* op, const char* what) {
  return HandleError(::tensorflow::DeleteResource<T>(ctx, ::tensorflow::HandleFromInput(ctx, 0)),
                     op, what);
}

// Reads input `index`, a scalar of dtype T (int64_t, double, tstring: the op
// definition fixes the dtype). InvalidArgument "<op>: <what> must be a scalar
// [string], got shape <shape>" if it is not a scalar.
template <class T>
absl::Status ScalarInput(::tensorflow::OpKernelContext* ctx, int index, const char* op,
                         const char* what, T* value) {
  const ::tensorflow::Tensor& t = ctx->input(index);
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " must be a scalar",
                     std::is_same<T, ::tensorflow::tstring>::value ? " string" : "",
                     ", got shape ", t.shape().DebugString()));
  }
  *value = t.scalar<T>()();
  return absl::OkStatus();
}

// Reads the timeout of a blocking op, input `index`: a float64 scalar in
// milliseconds, > 0; +inf means no deadline. InvalidArgument if it is not a
// scalar, or not > 0 (NaN included).
inline absl::Status TimeoutInput(::tensorflow::OpKernelContext* ctx, int index, const char* op,
                                 double* timeout_ms) {
  TF_RETURN_IF_ERROR(ScalarInput(ctx, index, op, "timeout_ms", timeout_ms));
  if (!(*timeout_ms > 0.0)) {  // also rejects NaN
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": timeout_ms must be > 0 (milliseconds; inf = no deadline), got ", *timeout_ms));
  }
  return absl::OkStatus();
}

// Writes `value` as output `index`, a scalar of dtype T.
template <class T>
absl::Status ScalarOutput(::tensorflow::OpKernelContext* ctx, int index, const T& value) {
  ::tensorflow::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, ::tensorflow::TensorShape({}), &out));
  out->scalar<T>()() = value;
  return absl::OkStatus();
}

// Writes values[0..n) as output `index`, an int64 vector [n] (a status op's counters).
inline absl::Status Int64VectorOutput(::tensorflow::OpKernelContext* ctx, int index,
                                      const int64_t* values, int64_t n) {
  ::tensorflow::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, ::tensorflow::TensorShape({n}), &out));
  auto v = out->vec<int64_t>();
  for (int64_t i = 0; i < n; ++i) v(i) = values[i];
  return absl::OkStatus();
}

// Converts the `shapes` attribute (or another list of shapes) to fully defined
// shapes; InvalidArgument "<op>: every <what> must be fully defined, got <shape>"
// for the first one that is not.
inline absl::Status FullyDefinedShapes(
    const std::vector<::tensorflow::PartialTensorShape>& partial, const char* op,
    const char* what, std::vector<::tensorflow::TensorShape>* shapes) {
  for (const auto& p : partial) {
    ::tensorflow::TensorShape s;
    if (!p.AsTensorShape(&s)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": every ", what, " must be fully defined, got ", p.DebugString()));
    }
    shapes->push_back(s);
  }
  return absl::OkStatus();
}

// Registers `resource` (taking its one reference) as `name` in the default
// container of the kernel's resource manager and writes its handle as output
// 0; `specs` (component dtypes and shapes) become the handle's data. Errors:
// the resource manager's (AlreadyExists for a name in use).
template <class T>
absl::Status CreateResourceOutput(
    ::tensorflow::OpKernelContext* ctx, const std::string& name, T* resource,
    const std::vector<::tensorflow::DtypeAndPartialTensorShape>& specs = {}) {
  ::tensorflow::ResourceMgr* rm = ctx->resource_manager();
  const std::string& container = rm->default_container();
  TF_RETURN_IF_ERROR(rm->Create<T>(container, name, resource));
  return ScalarOutput(ctx, 0, ::tensorflow::MakeResourceHandle<T>(ctx, container, name, specs));
}

}  // namespace hetsync

#endif  // HETSYNC_TF_OPS_KERNEL_UTIL_H_
