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

control: float64 vector of length 3: [step_start_s, factor, extra_ms].
  step_start_s: wall-clock time (seconds since the epoch) at which the step
    started; 0 means unknown (compute time taken as 0).
  factor: K >= 1; the delay adds (K - 1) times the compute time measured
    from step_start_s to the moment the op runs.
  extra_ms: constant extra delay in milliseconds (>= 0).
outputs: the inputs, unchanged (same buffers).
delay_ms: the delay that was applied, in milliseconds.
compute_ms: the compute time measured since step_start_s, in milliseconds.
)doc");

}  // namespace hetsync
