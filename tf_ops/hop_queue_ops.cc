// The Hop queue op family: HetsyncHopUpdateQueue* (the update queue, Hop
// paper sections 4.1 and 6.1) and HetsyncHopToken* (the token queue, section
// 4.2), their definitions and their kernels; design notes in
// docs/protocols/hop.md. The queues are host-side resources (hop_queues.h,
// with the completion protocol of their blocking ops; implemented in
// hop_queues.cc), reached from the communication code: CPU kernels only.
// Blocking ops (dequeue, dequeue_newest, token take) are asynchronous: they
// wait without holding a TensorFlow thread, up to timeout_ms
// (DeadlineExceeded). Tags: iteration and w_id are int64 >= 0; -1 means "any"
// in dequeue / size. Error messages name the Python wrapper
// ("hop_token_take: ...").

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hop_queues.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT
using ::tensorflow::shape_inference::InferenceContext;

// ---- Op definitions ----------------------------------------------------------

namespace {

// Shape functions: inputs first..last are scalars.
absl::Status ScalarInputs(InferenceContext* c, int first, int last) {
  ::tensorflow::shape_inference::ShapeHandle unused;
  for (int i = first; i <= last; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  return absl::OkStatus();
}

// Outputs 0..C-1: [lead, *shapes[i]] from the `shapes` attr.
absl::Status StackedComponents(InferenceContext* c, ::tensorflow::shape_inference::DimensionHandle lead) {
  std::vector<::tensorflow::PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  if (static_cast<int>(shapes.size()) + 2 != c->num_outputs()) {
    return ::tensorflow::errors::InvalidArgument("expected ", c->num_outputs() - 2,
                                                 " component shapes, got ", shapes.size());
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    ::tensorflow::shape_inference::ShapeHandle s, out;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
    TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(lead), s, &out));
    c->set_output(static_cast<int>(i), out);
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("HetsyncHopUpdateQueueCreate")
    .Output("handle: resource")
    .Attr("component_types: list(type) >= 1")
    .Attr("shapes: list(shape) >= 1")
    .Attr("num_slots: int >= 1")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ::tensorflow::DataTypeVector dtypes;
      std::vector<::tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("component_types", &dtypes));
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (dtypes.size() != shapes.size()) {
        return ::tensorflow::errors::InvalidArgument("got ", dtypes.size(),
                                                     " component_types but ", shapes.size(),
                                                     " shapes");
      }
      std::vector<::tensorflow::shape_inference::ShapeAndType> specs;
      for (size_t i = 0; i < dtypes.size(); ++i) {
        ::tensorflow::shape_inference::ShapeHandle s;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
        specs.emplace_back(s, dtypes[i]);
      }
      c->set_output(0, c->Scalar());
      c->set_output_handle_shapes_and_types(0, specs);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Creates a new (uniquely named) Hop update queue and returns its handle. Each
entry is a list of tensors with the given dtypes and fully defined shapes plus
int64 tags iter and w_id. num_slots = max_ig + 1: entries of iteration t are
kept in FIFO slot t mod num_slots; a global arrival number orders all slots.
The handle carries the component dtypes and shapes as handle data.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueEnqueue")
    .Input("handle: resource")
    .Input("tensors: T")
    .Input("iteration: int64")
    .Input("w_id: int64")
    .Attr("T: list(type) >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      return ScalarInputs(c, c->num_inputs() - 2, c->num_inputs() - 1);
    })
    .Doc(R"doc(
Appends one entry tagged (iteration >= 0, w_id >= 0) to slot iteration mod
num_slots and completes the parked dequeues it satisfies (FIFO among them).
On a closed queue the entry is counted as dropped_closed, without error.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueDequeue")
    .Input("handle: resource")
    .Input("m: int64")
    .Input("iteration: int64")
    .Input("w_id: int64")
    .Input("timeout_ms: float64")
    .Output("values: component_types")
    .Output("iters: int64")
    .Output("w_ids: int64")
    .Attr("component_types: list(type) >= 1")
    .Attr("shapes: list(shape) >= 1")
    .Attr("greedy: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 4));
      TF_RETURN_IF_ERROR(StackedComponents(c, c->UnknownDim()));
      c->set_output(c->num_outputs() - 2, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(c->num_outputs() - 1, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Removes and returns the first m entries, in FIFO order, whose tags match
(iteration / w_id -1: any); non-matching entries keep their order. Waits
(asynchronously, up to timeout_ms > 0, inf: no deadline) while fewer than m
match. greedy: once m match, returns every matching entry present. With
iteration k only slot k mod num_slots is searched: entries tagged < k there
are discarded (discarded_stale), one tagged > k fails the op
(FailedPrecondition). values[i]: [m', *shape_i]; iters, w_ids: int64 [m'].
Closed queue: Cancelled with the close message.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueDequeueNewest")
    .Input("handle: resource")
    .Input("w_ids: int64")
    .Input("min_iteration: int64")
    .Input("timeout_ms: float64")
    .Output("values: component_types")
    .Output("iters: int64")
    .Output("found: bool")
    .Attr("component_types: list(type) >= 1")
    .Attr("shapes: list(shape) >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
      TF_RETURN_IF_ERROR(ScalarInputs(c, 2, 3));
      const auto n = c->Dim(ids, 0);
      TF_RETURN_IF_ERROR(StackedComponents(c, n));
      c->set_output(c->num_outputs() - 2, c->Vector(n));
      c->set_output(c->num_outputs() - 1, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Bounded staleness (Hop section 4.4, spec section 5 recommended semantics).
Waits (asynchronously, up to timeout_ms) until, for every w_id in w_ids
(distinct, >= 0), the newest tag ever taken by this op or present now is
>= min_iteration; then removes every entry of those w_ids, keeps the newest
of each (largest iter, ties: latest arrived) and counts the others as
discarded_superseded. values[i]: [n, *shape_i], row r = newest entry of
w_ids[r] taken in this call (zeros if none); iters: int64 [n] (-1 if none);
found: bool [n]. A failed call takes nothing.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueSize")
    .Input("handle: resource")
    .Input("iteration: int64")
    .Input("w_id: int64")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 2));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Number of entries matching the tags (-1: any). With iteration k, entries
tagged < k in slot k mod num_slots are discarded first (discarded_stale) and
one tagged > k there is a FailedPrecondition, as in dequeue.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueStatus")
    .Input("handle: resource")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(7));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Returns int64 [7]: enqueued, dequeued, discarded_stale, discarded_superseded,
dropped_closed, size, waiters. enqueued = dequeued + discarded_stale +
discarded_superseded + size.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueClose")
    .Input("handle: resource")
    .Input("message: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputs(c, 1, 1); })
    .Doc(R"doc(
Closes the queue: parked and future dequeue / dequeue_newest ops fail with
Cancelled carrying `message`; later enqueues are counted as dropped_closed.
)doc");

REGISTER_OP("HetsyncHopUpdateQueueDestroy")
    .Input("handle: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Closes the queue (parked ops fail with Cancelled) and deletes it from its
resource manager; later ops on the handle fail with NotFound.
)doc");

REGISTER_OP("HetsyncHopTokenQueueCreate")
    .Output("handle: resource")
    .Attr("n: int >= 1")
    .Attr("initial: int >= 0")
    .Attr("label: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a new (uniquely named) Hop token queue: n token counters (one per
neighbour index), each starting at `initial`, and the newest iteration value
received per index (starting at -1).
)doc");

REGISTER_OP("HetsyncHopTokenTake")
    .Input("handle: resource")
    .Input("index: int64")
    .Input("count: int64")
    .Input("timeout_ms: float64")
    .Output("remaining: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 3));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Waits (asynchronously, up to timeout_ms) until counter[index] >= count (>= 0),
subtracts count and returns what remains. A closed index never blocks: it
returns the current count without subtracting. Cancelled after cancel.
)doc");

REGISTER_OP("HetsyncHopTokenPut")
    .Input("handle: resource")
    .Input("index: int64")
    .Input("count: int64")
    .Input("iteration: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputs(c, 1, 3); })
    .Doc(R"doc(
Adds count (>= 0) tokens to counter[index]; iteration >= 0 sets
newest[index] = max(newest[index], iteration) (-1: no value). Completes the
parked takes it satisfies.
)doc");

REGISTER_OP("HetsyncHopTokenSize")
    .Input("handle: resource")
    .Output("counts: int64")
    .Output("newest: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Returns the token counts and the newest iteration received (-1: none), int64
[n] each.
)doc");

REGISTER_OP("HetsyncHopTokenClose")
    .Input("handle: resource")
    .Input("index: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputs(c, 1, 1); })
    .Doc(R"doc(
Marks neighbour `index` finished: parked and future takes on it complete at
once without taking tokens.
)doc");

REGISTER_OP("HetsyncHopTokenCancel")
    .Input("handle: resource")
    .Input("message: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputs(c, 1, 1); })
    .Doc(R"doc(
Parked and future takes fail with Cancelled carrying `message`.
)doc");

REGISTER_OP("HetsyncHopTokenQueueDestroy")
    .Input("handle: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Cancels the token queue (parked takes fail with Cancelled) and deletes it
from its resource manager; later ops on the handle fail with NotFound.
)doc");

// ---- Kernels -----------------------------------------------------------------

namespace {

constexpr char kUpdateQueue[] = "update queue";  // what an update-queue op's handle reaches
constexpr char kTokenQueue[] = "token queue";    // what a token-queue op's handle reaches

std::atomic<int64_t> g_hop_queue_counter{0};

// Reads the component_types / shapes attrs of a queue op.
absl::Status ComponentAttrs(OpKernelConstruction* ctx, const char* op, DataTypeVector* dtypes,
                            std::vector<TensorShape>* shapes) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("component_types", dtypes));
  std::vector<PartialTensorShape> partial;
  TF_RETURN_IF_ERROR(ctx->GetAttr("shapes", &partial));
  if (partial.size() != dtypes->size()) {
    return errors::InvalidArgument(op, ": got ", dtypes->size(), " component_types but ",
                                   partial.size(), " shapes");
  }
  return FullyDefinedShapes(partial, op, "component shape", shapes);
}

// The component attrs of a dequeue op must describe the queue it reads.
absl::Status CheckSameComponents(const HopUpdateQueue& q, const DataTypeVector& dtypes,
                                 const std::vector<TensorShape>& shapes, const char* op) {
  if (dtypes != q.dtypes() || shapes.size() != q.shapes().size() ||
      !std::equal(shapes.begin(), shapes.end(), q.shapes().begin())) {
    std::string want, got;
    for (size_t i = 0; i < q.dtypes().size(); ++i)
      want += DataTypeString(q.dtypes()[i]) + q.shapes()[i].DebugString() + " ";
    for (size_t i = 0; i < dtypes.size() && i < shapes.size(); ++i)
      got += DataTypeString(dtypes[i]) + shapes[i].DebugString() + " ";
    return errors::InvalidArgument(op, ": the queue holds components [ ", want,
                                   "], the op was built for [ ", got, "]");
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Update-queue kernels ---------------------------------------------------

class HopUpdateQueueCreateOp : public OpKernel {
 public:
  explicit HopUpdateQueueCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    const char* op = "hop_update_queue_create";
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, op, &dtypes_, &shapes_));
    OP_REQUIRES(ctx, !dtypes_.empty(),
                errors::InvalidArgument(op, ": an entry needs at least one component"));
    for (DataType dt : dtypes_) {
      OP_REQUIRES(ctx, DataTypeCanUseMemcpy(dt) || dt == DT_STRING,
                  errors::InvalidArgument(op, ": unsupported component dtype ",
                                          DataTypeString(dt),
                                          " (numeric, bool and string dtypes only)"));
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(ctx, num_slots_ >= 1,
                errors::InvalidArgument(op, ": num_slots (max_ig + 1) must be >= 1, got ",
                                        num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name =
        "hetsync_hop_update_queue_" + std::to_string(g_hop_queue_counter++) + "_" + label_;
    std::vector<DtypeAndPartialTensorShape> specs;  // the handle data the Python wrappers read
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      specs.push_back(DtypeAndPartialTensorShape{dtypes_[i], PartialTensorShape(shapes_[i].dim_sizes())});
    }
    OP_REQUIRES_OK(ctx, CreateResourceOutput(
                            ctx, name, new HopUpdateQueue(label_, dtypes_, shapes_, num_slots_), specs));
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
  int64_t num_slots_ = 1;
  std::string label_;
};

class HopUpdateQueueEnqueueOp : public OpKernel {
 public:
  explicit HopUpdateQueueEnqueueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_update_queue_enqueue";
    core::RefCountPtr<HopUpdateQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kUpdateQueue, &q));
    OpInputList values;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &values));
    OP_REQUIRES_OK(ctx, q->CheckComponents(values));
    int64_t iter = 0, w_id = 0;
    const int n = ctx->num_inputs();
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, n - 2, op, "iteration", &iter));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, n - 1, op, "w_id", &w_id));
    OP_REQUIRES(ctx, iter >= 0, errors::InvalidArgument(op, ": iteration must be >= 0, got ", iter));
    OP_REQUIRES(ctx, w_id >= 0, errors::InvalidArgument(op, ": w_id must be >= 0, got ", w_id));
    std::vector<Tensor> entry;
    for (int i = 0; i < values.size(); ++i) entry.push_back(values[i]);  // shares the buffer
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->EnqueueLocked(iter, w_id, std::move(entry));
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopUpdateQueueDequeueOp : public AsyncOpKernel {
 public:
  explicit HopUpdateQueueDequeueOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, "hop_update_queue_dequeue", &dtypes_, &shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("greedy", &greedy_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_update_queue_dequeue";
    core::RefCountPtr<HopUpdateQueue> q;
    OP_REQUIRES_OK_ASYNC(ctx, LookupHandle(ctx, op, kUpdateQueue, &q), done);
    OP_REQUIRES_OK_ASYNC(ctx, CheckSameComponents(*q, dtypes_, shapes_, op), done);
    int64_t m = 0, iter = -1, w_id = -1;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 1, op, "m", &m), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "iteration", &iter), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 3, op, "w_id", &w_id), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 4, op, &timeout_ms), done);
    OP_REQUIRES_ASYNC(ctx, m >= 0, errors::InvalidArgument(op, ": m must be >= 0, got ", m), done);
    OP_REQUIRES_ASYNC(ctx, iter >= -1,
                      errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (any), got ", iter),
                      done);
    OP_REQUIRES_ASYNC(ctx, w_id >= -1,
                      errors::InvalidArgument(op, ": w_id must be >= 0 or -1 (any), got ", w_id),
                      done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kDequeue, q.get(), ctx, std::move(done), timeout_ms);
    w->m = m;
    w->iter = iter;
    w->w_id = w_id;
    w->greedy = greedy_;
    q->Run(std::move(w));
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
  bool greedy_ = false;
};

class HopUpdateQueueDequeueNewestOp : public AsyncOpKernel {
 public:
  explicit HopUpdateQueueDequeueNewestOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, "hop_update_queue_dequeue_newest", &dtypes_, &shapes_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_update_queue_dequeue_newest";
    core::RefCountPtr<HopUpdateQueue> q;
    OP_REQUIRES_OK_ASYNC(ctx, LookupHandle(ctx, op, kUpdateQueue, &q), done);
    OP_REQUIRES_OK_ASYNC(ctx, CheckSameComponents(*q, dtypes_, shapes_, op), done);
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, TensorShapeUtils::IsVector(ids.shape()),
                      errors::InvalidArgument(op, ": w_ids must be a vector, got shape ",
                                              ids.shape().DebugString()),
                      done);
    std::vector<int64_t> w_ids;
    std::set<int64_t> seen;
    for (int64_t i = 0; i < ids.NumElements(); ++i) {
      const int64_t id = ids.vec<int64_t>()(i);
      OP_REQUIRES_ASYNC(ctx, id >= 0,
                        errors::InvalidArgument(op, ": w_ids must be >= 0, got ", id), done);
      OP_REQUIRES_ASYNC(ctx, seen.insert(id).second,
                        errors::InvalidArgument(op, ": w_ids must be distinct, ", id,
                                                " appears twice"),
                        done);
      w_ids.push_back(id);
    }
    int64_t min_iteration = 0;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "min_iteration", &min_iteration), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 3, op, &timeout_ms), done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kDequeueNewest, q.get(), ctx, std::move(done),
                                         timeout_ms);
    w->w_ids = std::move(w_ids);
    w->min_iteration = min_iteration;
    q->Run(std::move(w));
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
};

class HopUpdateQueueSizeOp : public OpKernel {
 public:
  explicit HopUpdateQueueSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_update_queue_size";
    core::RefCountPtr<HopUpdateQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kUpdateQueue, &q));
    int64_t iter = -1, w_id = -1;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op, "iteration", &iter));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "w_id", &w_id));
    OP_REQUIRES(ctx, iter >= -1,
                errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (any), got ", iter));
    OP_REQUIRES(ctx, w_id >= -1,
                errors::InvalidArgument(op, ": w_id must be >= 0 or -1 (any), got ", w_id));
    int64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      OP_REQUIRES_OK(ctx, q->SizeLocked(iter, w_id, &size));
    }
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, size));
  }
};

class HopUpdateQueueStatusOp : public OpKernel {
 public:
  explicit HopUpdateQueueStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HopUpdateQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, "hop_update_queue_status", kUpdateQueue, &q));
    int64_t c[HopUpdateQueue::kNumCounters];
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->CountersLocked(c);
    }
    OP_REQUIRES_OK(ctx, Int64VectorOutput(ctx, 0, c, HopUpdateQueue::kNumCounters));
  }
};

// Fails every parked waiter of a queue through `Fail` (HopUpdateQueue::CloseLocked or
// HopTokenQueue::CancelLocked) with `message`, and finishes them outside the lock.
template <class Q>
using FailLockedFn = void (Q::*)(const std::string&, std::vector<std::shared_ptr<HopWaiter>>*);

template <class Q, FailLockedFn<Q> Fail>
void FailWaiters(Q* q, const std::string& message) {
  std::vector<std::shared_ptr<HopWaiter>> failed;
  {
    std::lock_guard<std::mutex> lock(q->mu);
    (q->*Fail)(message, &failed);
  }
  HopWaitable::FinishAll(failed);
}

// Close / cancel kernel: input 0 the queue handle (reaching `what`), input 1 a scalar string
// message; every parked and later wait fails with Cancelled(message).
template <class Q, FailLockedFn<Q> Fail>
class HopQueueFailOp : public OpKernel {
 public:
  HopQueueFailOp(OpKernelConstruction* ctx, const char* op, const char* what)
      : OpKernel(ctx), op_(op), what_(what) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Q> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op_, what_, &q));
    tstring message;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op_, "message", &message));
    FailWaiters<Q, Fail>(q.get(), std::string(message));
  }

 private:
  const char* const op_;
  const char* const what_;
};

// Destroy kernel: fails every parked waiter with `message`, then deletes the resource.
template <class Q, FailLockedFn<Q> Fail>
class HopQueueDestroyOp : public OpKernel {
 public:
  HopQueueDestroyOp(OpKernelConstruction* ctx, const char* op, const char* what,
                    const char* message)
      : OpKernel(ctx), op_(op), what_(what), message_(message) {}

  void Compute(OpKernelContext* ctx) override {
    {
      core::RefCountPtr<Q> q;
      OP_REQUIRES_OK(ctx, LookupHandle(ctx, op_, what_, &q));
      FailWaiters<Q, Fail>(q.get(), message_);
    }
    OP_REQUIRES_OK(ctx, DeleteHandle<Q>(ctx, op_, what_));
  }

 private:
  const char* const op_;
  const char* const what_;
  const char* const message_;
};

class HopUpdateQueueCloseOp : public HopQueueFailOp<HopUpdateQueue, &HopUpdateQueue::CloseLocked> {
 public:
  explicit HopUpdateQueueCloseOp(OpKernelConstruction* ctx)
      : HopQueueFailOp(ctx, "hop_update_queue_close", kUpdateQueue) {}
};

class HopUpdateQueueDestroyOp : public HopQueueDestroyOp<HopUpdateQueue, &HopUpdateQueue::CloseLocked> {
 public:
  explicit HopUpdateQueueDestroyOp(OpKernelConstruction* ctx)
      : HopQueueDestroyOp(ctx, "hop_update_queue_destroy", kUpdateQueue, "the queue was destroyed") {}
};

// ---- Token-queue kernels ----------------------------------------------------

namespace {

absl::Status IndexInput(OpKernelContext* ctx, int input, const HopTokenQueue& q, const char* op,
                        int64_t* index) {
  TF_RETURN_IF_ERROR(ScalarInput(ctx, input, op, "index", index));
  if (*index < 0 || *index >= q.n()) {
    return errors::InvalidArgument(op, ": index ", *index, " is out of range [0, ", q.n(),
                                   ") of token queue", QuotedLabel(q.label()));
  }
  return absl::OkStatus();
}

}  // namespace

class HopTokenQueueCreateOp : public OpKernel {
 public:
  explicit HopTokenQueueCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial", &initial_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    OP_REQUIRES(ctx, n_ >= 1,
                errors::InvalidArgument("hop_token_queue_create: n must be >= 1, got ", n_));
    OP_REQUIRES(ctx, initial_ >= 0,
                errors::InvalidArgument("hop_token_queue_create: initial must be >= 0, got ",
                                        initial_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name =
        "hetsync_hop_token_queue_" + std::to_string(g_hop_queue_counter++) + "_" + label_;
    OP_REQUIRES_OK(ctx, CreateResourceOutput(ctx, name, new HopTokenQueue(label_, n_, initial_)));
  }

 private:
  int64_t n_ = 1, initial_ = 0;
  std::string label_;
};

class HopTokenTakeOp : public AsyncOpKernel {
 public:
  explicit HopTokenTakeOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_token_take";
    core::RefCountPtr<HopTokenQueue> q;
    OP_REQUIRES_OK_ASYNC(ctx, LookupHandle(ctx, op, kTokenQueue, &q), done);
    int64_t index = 0, count = 0;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, IndexInput(ctx, 1, *q, op, &index), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "count", &count), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 3, op, &timeout_ms), done);
    OP_REQUIRES_ASYNC(ctx, count >= 0,
                      errors::InvalidArgument(op, ": count must be >= 0, got ", count), done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kTokenTake, q.get(), ctx, std::move(done), timeout_ms);
    w->index = index;
    w->count = count;
    q->Run(std::move(w));
  }
};

class HopTokenPutOp : public OpKernel {
 public:
  explicit HopTokenPutOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_token_put";
    core::RefCountPtr<HopTokenQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kTokenQueue, &q));
    int64_t index = 0, count = 0, iteration = -1;
    OP_REQUIRES_OK(ctx, IndexInput(ctx, 1, *q, op, &index));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "count", &count));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 3, op, "iteration", &iteration));
    OP_REQUIRES(ctx, count >= 0, errors::InvalidArgument(op, ": count must be >= 0, got ", count));
    OP_REQUIRES(ctx, iteration >= -1,
                errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (none), got ",
                                        iteration));
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      OP_REQUIRES(ctx, q->counts()[index] <= std::numeric_limits<int64_t>::max() - count,
                  errors::InvalidArgument(op, ": token count of index ", index, " would overflow"));
      q->PutLocked(index, count, iteration);
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopTokenSizeOp : public OpKernel {
 public:
  explicit HopTokenSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HopTokenQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, "hop_token_size", kTokenQueue, &q));
    Tensor* counts = nullptr;
    Tensor* newest = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({q->n()}), &counts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({q->n()}), &newest));
    std::lock_guard<std::mutex> lock(q->mu);
    for (int64_t i = 0; i < q->n(); ++i) {
      counts->vec<int64_t>()(i) = q->counts()[i];
      newest->vec<int64_t>()(i) = q->newest()[i];
    }
  }
};

class HopTokenCloseOp : public OpKernel {
 public:
  explicit HopTokenCloseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_token_close";
    core::RefCountPtr<HopTokenQueue> q;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kTokenQueue, &q));
    int64_t index = 0;
    OP_REQUIRES_OK(ctx, IndexInput(ctx, 1, *q, op, &index));
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->CloseIndexLocked(index);
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopTokenCancelOp : public HopQueueFailOp<HopTokenQueue, &HopTokenQueue::CancelLocked> {
 public:
  explicit HopTokenCancelOp(OpKernelConstruction* ctx)
      : HopQueueFailOp(ctx, "hop_token_cancel", kTokenQueue) {}
};

class HopTokenQueueDestroyOp : public HopQueueDestroyOp<HopTokenQueue, &HopTokenQueue::CancelLocked> {
 public:
  explicit HopTokenQueueDestroyOp(OpKernelConstruction* ctx)
      : HopQueueDestroyOp(ctx, "hop_token_queue_destroy", kTokenQueue, "the token queue was destroyed") {}
};

// ---- Kernel registrations (CPU only: the queues are host-side state) ------------

REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueCreate").Device(DEVICE_CPU), HopUpdateQueueCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueEnqueue").Device(DEVICE_CPU), HopUpdateQueueEnqueueOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDequeue").Device(DEVICE_CPU), HopUpdateQueueDequeueOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDequeueNewest").Device(DEVICE_CPU),
                        HopUpdateQueueDequeueNewestOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueSize").Device(DEVICE_CPU), HopUpdateQueueSizeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueStatus").Device(DEVICE_CPU), HopUpdateQueueStatusOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueClose").Device(DEVICE_CPU), HopUpdateQueueCloseOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDestroy").Device(DEVICE_CPU), HopUpdateQueueDestroyOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenQueueCreate").Device(DEVICE_CPU), HopTokenQueueCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenTake").Device(DEVICE_CPU), HopTokenTakeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenPut").Device(DEVICE_CPU), HopTokenPutOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenSize").Device(DEVICE_CPU), HopTokenSizeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenClose").Device(DEVICE_CPU), HopTokenCloseOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenCancel").Device(DEVICE_CPU), HopTokenCancelOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenQueueDestroy").Device(DEVICE_CPU), HopTokenQueueDestroyOp);

}  // namespace hetsync
