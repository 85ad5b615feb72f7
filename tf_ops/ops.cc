// Op definitions of the hetsync op library (kernels live in *_kernels.cc).
//
// Every op of the library is declared here with its shape function, so that
// the interface can be read in one place, as in TensorFlow's own ops/ folder.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;

// HetsyncBuildInfo: the TensorFlow version this library was compiled against.
REGISTER_OP("HetsyncBuildInfo")
    .Output("tf_version: string")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Returns the TensorFlow version string (TF_VERSION_STRING) the hetsync op
library was compiled against. Used by hetsync.ops to refuse a stale build.
)doc");

// HetsyncDelay: asynchronous pass-through that holds its inputs back.
REGISTER_OP("HetsyncDelay")
    .Input("tensors: T")
    .Input("control: float64")
    .Output("outputs: T")
    .Output("delay_ms: float64")
    .Output("compute_ms: float64")
    .Attr("T: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 1;
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(i));
      ::tensorflow::shape_inference::ShapeHandle control;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 1, &control));
      c->set_output(n, c->Scalar());
      c->set_output(n + 1, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
Forwards `tensors` unchanged after an injected delay, without holding a
thread while it waits (AsyncOpKernel + timer thread), so the step behaves
like one on a slower device.

control: float64 vector [step_start_s, factor, extra_ms] or
  [step_start_s, factor, extra_ms, device_ms].
  step_start_s: wall-clock time (seconds since the epoch) at which the step
    started; 0 means unknown (compute time taken as 0).
  factor: K >= 1; the delay adds (K - 1) times the compute time measured
    from step_start_s to the moment the op runs.
  extra_ms: constant extra delay in milliseconds (>= 0).
  device_ms: emulated device time of the step in milliseconds (>= 0, default
    0 = no emulation). If > 0 the op completes once the step has lasted
    factor * device_ms + extra_ms since step_start_s (delay = that minus the
    compute time, at least 0); factor no longer multiplies the compute time.
outputs: the inputs, unchanged (same buffers).
delay_ms: the delay that was applied, in milliseconds.
compute_ms: the compute time measured since step_start_s, in milliseconds.
)doc");

// ---- Gradient cache of RNA (kernels in grad_cache_kernels.cc) --------------
// RNA paper sections 3.3 and 6: WriteOp / ReadOp run inside the training step
// and never block; Take / Publish / Wait / Status run on the communication
// thread. Float32 only; the cache lives in host memory.

REGISTER_OP("HetsyncGradCacheCreate")
    .Output("cache: resource")
    .Attr("shapes: list(shape) >= 1")
    .Attr("max_staleness: int >= 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a gradient cache for float32 tensors of the given shapes and returns
its handle. max_staleness: write of iteration k drops pending gradients of
iterations t with k - t > max_staleness (counted).
)doc");

REGISTER_OP("HetsyncGradCacheWrite")
    .Input("cache: resource")
    .Input("grads: N * float")
    .Input("iteration: int64")
    .Output("dropped: int64")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
WriteOp: caches this step's gradients (by reference) as pending for local
iteration `iteration` (strictly increasing). An empty accumulation (the null
gradient) is replaced; pending gradients of earlier iterations stay and are
combined with staleness weights when taken; those older than max_staleness
are dropped. dropped: cumulative number of dropped gradients. Never blocks.
)doc");

REGISTER_OP("HetsyncGradCacheRead")
    .Input("cache: resource")
    .Input("local: N * float")
    .Input("iteration: int64")
    .Output("outputs: N * float")
    .Output("fresh: bool")
    .Output("round_id: int64")
    .Output("weight_sum: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 2;
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(1 + i));
      c->set_output(n, c->Scalar());
      c->set_output(n + 1, c->Scalar());
      c->set_output(n + 2, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
ReadOp: if a result was published since the last read, returns it (fresh =
true, its round id and sum of weights); else returns `local` unchanged
(fresh = false, the last read round id or -1, weight_sum = 1). Never blocks.
)doc");

REGISTER_OP("HetsyncGradCacheTake")
    .Input("cache: resource")
    .Output("weighted: float")
    .Output("iterations: int64")
    .Output("newest_iteration: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
Takes the pending accumulation, leaving the null gradient. weighted: float32
[total + 1]: w * g' flattened (tensor order, row-major) followed by w, where
g' = sum_t a_t g_t / sum_t a_t, a_t = t - (k - tau) + 1, k the newest pending
iteration, tau = k - (oldest pending iteration); w = 1, or all zeros (w = 0)
if nothing was pending. iterations: the combined iterations, oldest first.
newest_iteration: the newest iteration ever written (-1: none).
)doc");

REGISTER_OP("HetsyncGradCachePublish")
    .Input("cache: resource")
    .Input("reduced: float")
    .Input("round_id: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Publishes an allreduced [sum_r w_r g'_r..., sum_r w_r] (float32 [total + 1])
as the result of round `round_id` (strictly increasing): the stored result is
the first `total` values divided by the last (must be > 0).
)doc");

REGISTER_OP("HetsyncGradCacheWait")
    .Input("cache: resource")
    .Input("timeout_ms: float64")
    .Output("ready: bool")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Blocks up to timeout_ms milliseconds until a gradient is pending; returns
whether one is. For the communication thread only, never inside a step.
)doc");

REGISTER_OP("HetsyncGradCacheStatus")
    .Input("cache: resource")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(10));
      return Status();
    })
    .Doc(R"doc(
Returns int64 [10]: written, dropped, taken, takes, published, fresh_reads,
newest_round, last_read_round, pending, newest_iteration.
)doc");

REGISTER_OP("HetsyncGradCacheDestroy")
    .Input("cache: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Deletes the cache from its resource manager (it is freed when the last op
using it finishes).
)doc");

// ---- Hop update queue and token queue (kernels in hop_queue_kernels.cc) ----
// Hop paper sections 4.1, 4.2, 6.1; spec hop.md sections 2, 3, 11. Host-side
// resources (CPU kernels only). Blocking ops are asynchronous: they wait
// without holding a TensorFlow thread, up to timeout_ms (DeadlineExceeded).
// Tags: iteration and w_id are int64 >= 0; -1 means "any" in dequeue / size.

namespace {

Status ScalarInputs(InferenceContext* c, int first, int last) {
  ::tensorflow::shape_inference::ShapeHandle unused;
  for (int i = first; i <= last; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  return Status();
}

// Outputs 0..C-1: [lead, *shapes[i]] from the `shapes` attr.
Status StackedComponents(InferenceContext* c, ::tensorflow::shape_inference::DimensionHandle lead) {
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
  return Status();
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
      return Status();
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
      return Status();
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
      return Status();
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
      return Status();
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
      return Status();
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
      return Status();
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
      return Status();
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

}  // namespace hetsync
