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

}  // namespace hetsync
