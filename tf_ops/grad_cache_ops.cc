// The gradient-cache op family of RNA's cross-iteration execution (RNA paper
// sections 3.3 and 6): HetsyncGradCacheCreate / Write / Read / Take / Publish
// / Wait / WaitPublished / SetReleased / Status / Destroy, their definitions and their kernels.
// WriteOp and ReadOp run inside the training step and never block; WaitPublished runs in
// the step and blocks only when RNA's wait_for_round asks it to; Take, Publish, Wait,
// SetReleased and Status run on the communication thread. Float32 only. The cache (grad_cache.h)
// is a resource in host memory whatever the device: every op also has a GPU
// kernel (the CPU one) with all of its arguments in host memory, so TensorFlow
// copies a GPU gradient into the cache on write and the result back on read.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "grad_cache.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT
using ::tensorflow::shape_inference::InferenceContext;

// ---- Op definitions ----------------------------------------------------------

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
      return absl::OkStatus();
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
      return absl::OkStatus();
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
    .Attr("accumulate: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Publishes an allreduced [sum_r w_r g'_r..., sum_r w_r] (float32 [total + 1])
as the result of round `round_id` (strictly increasing): the stored result is
the first `total` values divided by the last (must be > 0). With `accumulate`,
a stored result that no ReadOp has returned yet is combined with this one as
sums (values (W_old x_old + S) / (W_old + W), weight sum W_old + W), so a step
that reads after several rounds gets all of them.
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

REGISTER_OP("HetsyncGradCacheWaitPublished")
    .Input("cache: resource")
    .Input("iteration: int64")
    .Input("timeout_ms: float64")
    .Output("published: bool")
    .Output("wait_ms: float64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Step side: blocks up to timeout_ms milliseconds until a published round holds
the gradient of local iteration `iteration` (a take that included it was
followed by a publish), or the cache is released. A wait (timeout_ms > 0)
that times out marks the rounds stalled: later waits return at once until the
next publish.
published: whether a published round holds it; wait_ms: how long the op
blocked (milliseconds).
)doc");

REGISTER_OP("HetsyncGradCacheSetReleased")
    .Input("cache: resource")
    .Input("released: bool")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Communication side. released = true: no round follows, and every
HetsyncGradCacheWaitPublished, now and until released is set false again,
returns at once. released = false: waits block again (a new communication
thread starts).
)doc");

REGISTER_OP("HetsyncGradCacheStatus")
    .Input("cache: resource")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(10));
      return absl::OkStatus();
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

// ---- Kernels -----------------------------------------------------------------

namespace {

constexpr char kCache[] = "gradient cache";  // what a cache op's handle input reaches

std::atomic<int64_t> g_cache_counter{0};

absl::Status CheckGradList(const GradCache& cache, const OpInputList& list, const char* op,
                           const char* what) {
  if (list.size() != static_cast<int>(cache.shapes().size())) {
    return errors::InvalidArgument(op, ": the cache holds ", cache.shapes().size(),
                                   " tensors, got ", list.size(), " ", what);
  }
  for (int i = 0; i < list.size(); ++i) {
    if (list[i].shape() != cache.shapes()[i]) {
      return errors::InvalidArgument(op, ": ", what, "[", i, "] has shape ",
                                     list[i].shape().DebugString(), ", the cache expects ",
                                     cache.shapes()[i].DebugString());
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Creates a new cache (a fresh, uniquely named resource) and returns its handle.
class GradCacheCreateOp : public OpKernel {
 public:
  explicit GradCacheCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<PartialTensorShape> partial;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shapes", &partial));
    OP_REQUIRES_OK(ctx, FullyDefinedShapes(partial, "HetsyncGradCacheCreate", "shape", &shapes_));
    OP_REQUIRES(ctx, !shapes_.empty(),
                errors::InvalidArgument("HetsyncGradCacheCreate: shapes must not be empty"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_staleness", &max_staleness_));
    OP_REQUIRES(ctx, max_staleness_ >= 0,
                errors::InvalidArgument("HetsyncGradCacheCreate: max_staleness must be >= 0, "
                                        "got ", max_staleness_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name = "hetsync_grad_cache_" + std::to_string(g_cache_counter++);
    OP_REQUIRES_OK(ctx, CreateResourceOutput(ctx, name, new GradCache(shapes_, max_staleness_)));
  }

 private:
  std::vector<TensorShape> shapes_;
  int64_t max_staleness_ = 0;
};

// WriteOp: cache this iteration's gradients (shared, no copy); enforce the bound.
class GradCacheWriteOp : public OpKernel {
 public:
  explicit GradCacheWriteOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCacheWrite";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, CheckGradList(*cache, grads, op, "grads"));
    int64_t k = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, ctx->num_inputs() - 1, op, "iteration", &k));

    GradCache::Entry entry;
    entry.iteration = k;
    entry.grads.reserve(grads.size());
    for (int i = 0; i < grads.size(); ++i) entry.grads.push_back(grads[i]);  // shares the buffer

    int64_t dropped = 0;
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      int64_t* c = cache->counters;
      OP_REQUIRES(ctx, k > c[GradCache::kNewestIteration],
                  errors::InvalidArgument("HetsyncGradCacheWrite: iterations must increase; got ",
                                          k, " after ", c[GradCache::kNewestIteration]));
      // Bounded staleness: keep only iterations t with k - t <= max_staleness.
      while (!cache->pending.empty() &&
             k - cache->pending.front().iteration > cache->max_staleness()) {
        cache->pending.pop_front();
        ++c[GradCache::kDropped];
      }
      cache->pending.push_back(std::move(entry));
      ++c[GradCache::kWritten];
      c[GradCache::kNewestIteration] = k;
      c[GradCache::kPending] = static_cast<int64_t>(cache->pending.size());
      dropped = c[GradCache::kDropped];
    }
    cache->pending_cv.notify_all();
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, dropped));
  }
};

// ReadOp: newest published result if unread, else the local gradients. Never blocks.
class GradCacheReadOp : public OpKernel {
 public:
  explicit GradCacheReadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCacheRead";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    OpInputList local;
    OP_REQUIRES_OK(ctx, ctx->input_list("local", &local));
    OP_REQUIRES_OK(ctx, CheckGradList(*cache, local, op, "local"));
    int64_t iteration = 0;  // checked only: ReadOp does not need it
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, ctx->num_inputs() - 1, op, "iteration", &iteration));

    std::vector<Tensor> result;
    bool fresh = false;
    int64_t round = -1;
    float weight_sum = 1.0f;
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      int64_t* c = cache->counters;
      if (c[GradCache::kNewestRound] > c[GradCache::kLastReadRound]) {
        result = cache->result;  // shared buffers: published results are never mutated
        weight_sum = cache->result_weight_sum;
        c[GradCache::kLastReadRound] = c[GradCache::kNewestRound];
        ++c[GradCache::kFreshReads];
        fresh = true;
      }
      round = c[GradCache::kLastReadRound];
    }
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("outputs", &outputs));
    for (int i = 0; i < local.size(); ++i) outputs.set(i, fresh ? result[i] : local[i]);
    const int n = local.size();
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, n, fresh));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, n + 1, round));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, n + 2, weight_sum));
  }
};

// Communication side: take the pending accumulation, combined with the
// staleness weights a_t = t - (k - tau) + 1 = t - t_min + 1, where k is the
// newest pending iteration and tau = k - t_min the largest iteration gap.
class GradCacheTakeOp : public OpKernel {
 public:
  explicit GradCacheTakeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, "HetsyncGradCacheTake", kCache, &cache));
    std::deque<GradCache::Entry> taken;
    int64_t newest = -1;
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      taken.swap(cache->pending);
      int64_t* c = cache->counters;
      c[GradCache::kPending] = 0;
      c[GradCache::kTaken] += static_cast<int64_t>(taken.size());
      if (!taken.empty()) {
        ++c[GradCache::kTakes];
        cache->taken_upto = taken.back().iteration;
      }
      newest = c[GradCache::kNewestIteration];
    }
    const int64_t total = cache->total();
    Tensor* flat_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total + 1}), &flat_t));
    float* flat = flat_t->flat<float>().data();
    Tensor* its_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({static_cast<int64_t>(taken.size())}), &its_t));
    auto its = its_t->flat<int64_t>();
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 2, newest));

    if (taken.empty()) {  // the null gradient, weight 0
      std::fill(flat, flat + total + 1, 0.0f);
      return;
    }
    const int64_t t_min = taken.front().iteration;
    double a_sum = 0.0;
    for (const auto& e : taken) a_sum += static_cast<double>(e.iteration - t_min + 1);
    for (size_t j = 0; j < taken.size(); ++j) its(j) = taken[j].iteration;
    int64_t offset = 0;
    for (size_t i = 0; i < cache->shapes().size(); ++i) {
      const int64_t n = cache->shapes()[i].num_elements();
      float* dst = flat + offset;
      if (taken.size() == 1) {
        const float* src = taken[0].grads[i].flat<float>().data();
        std::memcpy(dst, src, n * sizeof(float));
      } else {
        std::fill(dst, dst + n, 0.0f);
        for (const auto& e : taken) {
          const float a = static_cast<float>((e.iteration - t_min + 1) / a_sum);
          const float* src = e.grads[i].flat<float>().data();
          for (int64_t x = 0; x < n; ++x) dst[x] += a * src[x];
        }
      }
      offset += n;
    }
    flat[total] = 1.0f;  // w = 1: this rank contributes
  }
};

// Communication side: publish an allreduced [sum_r w_r g_r..., sum_r w_r] with its round id.
class GradCachePublishOp : public OpKernel {
 public:
  explicit GradCachePublishOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("accumulate", &accumulate_));
  }

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCachePublish";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    const Tensor& flat_t = ctx->input(1);
    const int64_t total = cache->total();
    OP_REQUIRES(ctx, flat_t.dims() == 1 && flat_t.NumElements() == total + 1,
                errors::InvalidArgument("HetsyncGradCachePublish: reduced must be a float32 "
                                        "vector of length ", total + 1, " (all values + the "
                                        "weight sum), got shape ", flat_t.shape().DebugString()));
    int64_t round = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "round_id", &round));
    OP_REQUIRES(ctx, round >= 0,
                errors::InvalidArgument("HetsyncGradCachePublish: round_id must be >= 0, got ",
                                        round));
    const float* flat = flat_t.flat<float>().data();
    const float w = flat[total];
    OP_REQUIRES(ctx, w > 0.0f,
                errors::InvalidArgument("HetsyncGradCachePublish: the sum of weights must be "
                                        "> 0 (at least the initiator contributes), got ", w));
    std::vector<Tensor> result;
    int64_t offset = 0;
    const float inv = 1.0f / w;
    for (const auto& shape : cache->shapes()) {
      Tensor t(DT_FLOAT, shape);
      float* dst = t.flat<float>().data();
      const int64_t n = shape.num_elements();
      for (int64_t x = 0; x < n; ++x) dst[x] = flat[offset + x] * inv;
      offset += n;
      result.push_back(std::move(t));
    }
    std::lock_guard<std::mutex> lock(cache->mu);
    int64_t* c = cache->counters;
    OP_REQUIRES(ctx, round > c[GradCache::kNewestRound],
                errors::InvalidArgument("HetsyncGradCachePublish: round ids must increase; got ",
                                        round, " after ", c[GradCache::kNewestRound]));
    float weight_sum = w;
    if (accumulate_ && !cache->result.empty() &&
        c[GradCache::kNewestRound] > c[GradCache::kLastReadRound]) {
      // The unread result joins this one as sums. New tensors: a stored result may be shared
      // with a reader's output, and published results are never mutated.
      const float w_old = cache->result_weight_sum;
      weight_sum = w_old + w;
      const float a = w_old / weight_sum, b = w / weight_sum;
      for (size_t i = 0; i < result.size(); ++i) {
        float* dst = result[i].flat<float>().data();
        const float* old = cache->result[i].flat<float>().data();
        const int64_t n = result[i].NumElements();
        for (int64_t x = 0; x < n; ++x) dst[x] = a * old[x] + b * dst[x];
      }
    }
    cache->result = std::move(result);
    cache->result_weight_sum = weight_sum;
    c[GradCache::kNewestRound] = round;
    ++c[GradCache::kPublished];
    cache->published_upto = cache->taken_upto;
    cache->stalled = false;
    cache->published_cv.notify_all();
  }

 private:
  bool accumulate_ = false;
};

// Communication side: wait up to timeout_ms for a pending gradient (never call in a step).
class GradCacheWaitOp : public OpKernel {
 public:
  explicit GradCacheWaitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCacheWait";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    // Not TimeoutInput: 0 is allowed here (a poll), and the wait is synchronous.
    double timeout_ms = 0.0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op, "timeout_ms", &timeout_ms));
    OP_REQUIRES(ctx, timeout_ms >= 0.0,
                errors::InvalidArgument("HetsyncGradCacheWait: timeout_ms must be >= 0, got ",
                                        timeout_ms));
    bool ready = false;
    {
      GradCache* c = cache.get();
      std::unique_lock<std::mutex> lock(c->mu);
      ready = c->pending_cv.wait_for(
          lock, std::chrono::microseconds(static_cast<int64_t>(timeout_ms * 1e3)),
          [c] { return !c->pending.empty(); });
    }
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, ready));
  }
};

// Step side: wait until the round that took iteration `iteration` is published (RNA's
// wait_for_round; the step then reads it). Synchronous: it holds the step's thread while it waits.
class GradCacheWaitPublishedOp : public OpKernel {
 public:
  explicit GradCacheWaitPublishedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCacheWaitPublished";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    int64_t iteration = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op, "iteration", &iteration));
    double timeout_ms = 0.0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "timeout_ms", &timeout_ms));
    OP_REQUIRES(ctx, timeout_ms >= 0.0 && std::isfinite(timeout_ms),
                errors::InvalidArgument(op, ": timeout_ms must be finite and >= 0, got ", timeout_ms));
    const auto t0 = std::chrono::steady_clock::now();
    bool published = false;
    {
      GradCache* c = cache.get();
      std::unique_lock<std::mutex> lock(c->mu);
      if (!c->stalled) {
        const bool woke = c->published_cv.wait_for(
            lock, std::chrono::microseconds(static_cast<int64_t>(timeout_ms * 1e3)),
            [c, iteration] { return c->published_upto >= iteration || c->released; });
        // until the next publish: do not hold every step for a stalled round (a poll, timeout 0, is no stall)
        if (!woke && timeout_ms > 0.0) c->stalled = true;
      }
      published = c->published_upto >= iteration;
    }
    const double waited =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, published));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 1, waited));
  }
};

class GradCacheSetReleasedOp : public OpKernel {
 public:
  explicit GradCacheSetReleasedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "HetsyncGradCacheSetReleased";
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, op, kCache, &cache));
    bool released = false;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op, "released", &released));
    std::lock_guard<std::mutex> lock(cache->mu);
    cache->released = released;
    cache->published_cv.notify_all();
  }
};

class GradCacheStatusOp : public OpKernel {
 public:
  explicit GradCacheStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GradCache> cache;
    OP_REQUIRES_OK(ctx, LookupHandle(ctx, "HetsyncGradCacheStatus", kCache, &cache));
    int64_t counters[GradCache::kNumCounters];
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      std::copy(cache->counters, cache->counters + GradCache::kNumCounters, counters);
    }
    OP_REQUIRES_OK(ctx, Int64VectorOutput(ctx, 0, counters, GradCache::kNumCounters));
  }
};

class GradCacheDestroyOp : public OpKernel {
 public:
  explicit GradCacheDestroyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, DeleteHandle<GradCache>(ctx, "HetsyncGradCacheDestroy", kCache));
  }
};

// ---- Kernel registrations ----------------------------------------------------

REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheCreate").Device(DEVICE_CPU), GradCacheCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWrite").Device(DEVICE_CPU), GradCacheWriteOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheRead").Device(DEVICE_CPU), GradCacheReadOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheTake").Device(DEVICE_CPU), GradCacheTakeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCachePublish").Device(DEVICE_CPU), GradCachePublishOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWait").Device(DEVICE_CPU), GradCacheWaitOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWaitPublished").Device(DEVICE_CPU), GradCacheWaitPublishedOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheSetReleased").Device(DEVICE_CPU), GradCacheSetReleasedOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheStatus").Device(DEVICE_CPU), GradCacheStatusOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheDestroy").Device(DEVICE_CPU), GradCacheDestroyOp);

// GPU variants: the cache lives in host memory whatever the device, so every
// tensor argument is pinned to host memory and TensorFlow inserts the device
// copies (gradients device->host on write, the result host->device on read).
// The kernels are the CPU ones; registering them needs no CUDA code, so they are
// registered in every build. Only the registration is tested here (no GPU).
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheCreate").Device(DEVICE_GPU).HostMemory("cache"), GradCacheCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWrite")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("grads")
                            .HostMemory("iteration")
                            .HostMemory("dropped"),
                        GradCacheWriteOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheRead")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("local")
                            .HostMemory("iteration")
                            .HostMemory("outputs")
                            .HostMemory("fresh")
                            .HostMemory("round_id")
                            .HostMemory("weight_sum"),
                        GradCacheReadOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheTake")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("weighted")
                            .HostMemory("iterations")
                            .HostMemory("newest_iteration"),
                        GradCacheTakeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCachePublish")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("reduced")
                            .HostMemory("round_id"),
                        GradCachePublishOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWait")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("timeout_ms")
                            .HostMemory("ready"),
                        GradCacheWaitOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWaitPublished")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("iteration")
                            .HostMemory("timeout_ms")
                            .HostMemory("published")
                            .HostMemory("wait_ms"),
                        GradCacheWaitPublishedOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheSetReleased")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("released"),
                        GradCacheSetReleasedOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheStatus")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("counters"),
                        GradCacheStatusOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheDestroy").Device(DEVICE_GPU).HostMemory("cache"),
                        GradCacheDestroyOp);

}  // namespace hetsync
