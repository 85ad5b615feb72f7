// The delay op family: HetsyncDelay, an asynchronous pass-through that holds
// a step's tensors back to emulate a slower device (the emulation behind
// hetsync.ops.delay, --slowdown and netdelay latency). It completes after
// (factor - 1) * compute_time + extra_ms or, on an emulated device
// (device_ms > 0), once the step has lasted factor * device_ms + extra_ms.
// The wait runs on TimerQueue::Global(), so no TensorFlow thread is held.

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "timer_queue.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT
using ::tensorflow::shape_inference::InferenceContext;

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
      shape_inference::ShapeHandle control;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 1, &control));
      c->set_output(n, c->Scalar());
      c->set_output(n + 1, c->Scalar());
      return absl::OkStatus();
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

class DelayOp : public AsyncOpKernel {
 public:
  explicit DelayOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs() - 1;
    const Tensor& control = ctx->input(n);
    OP_REQUIRES_ASYNC(ctx, control.dims() == 1 && (control.NumElements() == 3 ||
                                                   control.NumElements() == 4),
                      errors::InvalidArgument(
                          "HetsyncDelay: control must be a float64 vector "
                          "[step_start_s, factor, extra_ms] or [step_start_s, factor, "
                          "extra_ms, device_ms] (length 3 or 4), got shape ",
                          control.shape().DebugString()),
                      done);
    const auto c = control.vec<double>();
    const double start_s = c(0), factor = c(1), extra_ms = c(2);
    const double device_ms = control.NumElements() == 4 ? c(3) : 0.0;
    OP_REQUIRES_ASYNC(ctx, std::isfinite(factor) && factor >= 1.0,
                      errors::InvalidArgument("HetsyncDelay: factor must be a finite "
                                              "number >= 1, got ", factor),
                      done);
    OP_REQUIRES_ASYNC(ctx, std::isfinite(extra_ms) && extra_ms >= 0.0,
                      errors::InvalidArgument("HetsyncDelay: extra_ms must be a finite "
                                              "number >= 0, got ", extra_ms),
                      done);
    OP_REQUIRES_ASYNC(ctx, std::isfinite(device_ms) && device_ms >= 0.0,
                      errors::InvalidArgument("HetsyncDelay: device_ms must be a finite "
                                              "number >= 0, got ", device_ms),
                      done);

    const double now_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const double compute_ms = start_s > 0.0 ? std::max(0.0, (now_s - start_s) * 1e3) : 0.0;
    // Emulated device: pad the step, from its start to here, to exactly
    // factor * device_ms + extra_ms; a step whose real compute already took
    // longer is not shortened (delay 0: an overrun, counted by the caller).
    const double delay_ms = device_ms > 0.0
                                ? std::max(0.0, factor * device_ms + extra_ms - compute_ms)
                                : (factor - 1.0) * compute_ms + extra_ms;

    for (int i = 0; i < n; ++i) ctx->set_output(i, ctx->input(i));
    OP_REQUIRES_OK_ASYNC(ctx, ScalarOutput(ctx, n, delay_ms), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarOutput(ctx, n + 1, compute_ms), done);

    if (delay_ms <= 0.0) {
      done();
      return;
    }
    const auto deadline = TimerQueue::Clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(delay_ms * 1e3));
    TimerQueue::Global()->Schedule(deadline, std::move(done));
  }
};

REGISTER_KERNEL_BUILDER(Name("HetsyncDelay").Device(DEVICE_CPU), DelayOp);

// On a GPU the pass-through tensors stay in device memory (forwarded, not
// copied); only the control vector and the scalar outputs live on the host.
// No CUDA code is involved, so the registration is in every build (only the
// registration is tested here: no GPU).
REGISTER_KERNEL_BUILDER(Name("HetsyncDelay")
                            .Device(DEVICE_GPU)
                            .HostMemory("control")
                            .HostMemory("delay_ms")
                            .HostMemory("compute_ms"),
                        DelayOp);

}  // namespace hetsync
