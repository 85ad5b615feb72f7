// Kernel of HetsyncBuildInfo: reports the TensorFlow version of the build.

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/public/version.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT

class BuildInfoOp : public OpKernel {
 public:
  explicit BuildInfoOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = TF_VERSION_STRING;
  }
};

REGISTER_KERNEL_BUILDER(Name("HetsyncBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace hetsync
