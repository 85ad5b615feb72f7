// HetsyncBuildInfo: the TensorFlow version this library was compiled against.
// hetsync.ops.library compares it with the running TensorFlow and refuses a
// stale build (a custom-op library built for another version can crash).

#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/public/version.h"
// TensorFlow 2.21 moved TF_VERSION_STRING (and the TF_*_VERSION macros) out of version.h into
// release_version.h; older releases have no such header. Include it where it exists (setup.py
// then defines the TF_MAJOR/MINOR/PATCH_VERSION and TF_VERSION_SUFFIX it needs, which TensorFlow's
// own build passes on its command line, from the installed TensorFlow's version).
#if defined(__has_include)
#if __has_include("tensorflow/core/public/release_version.h")
#include "tensorflow/core/public/release_version.h"
#endif
#endif
#ifndef TF_VERSION_STRING
#error "hetsync: TF_VERSION_STRING not found in tensorflow/core/public/{version,release_version}.h"
#endif

namespace hetsync {

using namespace ::tensorflow;  // NOLINT

REGISTER_OP("HetsyncBuildInfo")
    .Output("tf_version: string")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Returns the TensorFlow version string (TF_VERSION_STRING) the hetsync op
library was compiled against. Used by hetsync.ops to refuse a stale build.
)doc");

class BuildInfoOp : public OpKernel {
 public:
  explicit BuildInfoOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, tstring(TF_VERSION_STRING)));
  }
};

REGISTER_KERNEL_BUILDER(Name("HetsyncBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace hetsync
