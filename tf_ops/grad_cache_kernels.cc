// Kernels of the gradient-cache ops (definitions and docs in ops.cc):
// HetsyncGradCacheCreate / Write / Read / Take / Publish / Wait / Status /
// Destroy. RNA paper sections 3.3 and 6 (WriteOp, ReadOp, the controller's
// "take the accumulation" and "publish with iterationID").
//
// Device: CPU kernels only. The Python wrappers (hetsync/ops.py) pin every
// cache op to /CPU:0, so on a GPU machine TensorFlow's placer inserts the
// device-to-host copy of the gradients before WriteOp and the host-to-device
// copy after ReadOp: the cache lives in host memory as in the paper. GPU
// registrations with HostMemory inputs are not possible here: the resource
// lives in the CPU device's ResourceMgr, which a GPU kernel cannot look up.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "grad_cache.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT

namespace {

std::atomic<int64_t> g_cache_counter{0};

Status LookupCache(OpKernelContext* ctx, GradCache** cache) {
  return LookupResource(ctx, HandleFromInput(ctx, 0), cache);
}

Status CheckGradList(const GradCache& cache, const OpInputList& list, const char* op,
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
  return OkStatus();
}

}  // namespace

// Creates a new cache (a fresh, uniquely named resource) and returns its handle.
class GradCacheCreateOp : public OpKernel {
 public:
  explicit GradCacheCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<PartialTensorShape> partial;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shapes", &partial));
    for (const auto& p : partial) {
      TensorShape s;
      OP_REQUIRES(ctx, p.AsTensorShape(&s),
                  errors::InvalidArgument("HetsyncGradCacheCreate: every shape must be fully "
                                          "defined, got ", p.DebugString()));
      shapes_.push_back(s);
    }
    OP_REQUIRES(ctx, !shapes_.empty(),
                errors::InvalidArgument("HetsyncGradCacheCreate: shapes must not be empty"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_staleness", &max_staleness_));
    OP_REQUIRES(ctx, max_staleness_ >= 0,
                errors::InvalidArgument("HetsyncGradCacheCreate: max_staleness must be >= 0, "
                                        "got ", max_staleness_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name = "hetsync_grad_cache_" + std::to_string(g_cache_counter++);
    GradCache* cache = new GradCache(shapes_, max_staleness_);
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->Create<GradCache>(
                            ctx->resource_manager()->default_container(), name, cache));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = MakeResourceHandle<GradCache>(
        ctx, ctx->resource_manager()->default_container(), name);
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
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, CheckGradList(*cache, grads, "HetsyncGradCacheWrite", "grads"));
    const Tensor& it_t = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(it_t.shape()),
                errors::InvalidArgument("HetsyncGradCacheWrite: iteration must be a scalar"));
    const int64_t k = it_t.scalar<int64_t>()();

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
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = dropped;
  }
};

// ReadOp: newest published result if unread, else the local gradients. Never blocks.
class GradCacheReadOp : public OpKernel {
 public:
  explicit GradCacheReadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    OpInputList local;
    OP_REQUIRES_OK(ctx, ctx->input_list("local", &local));
    OP_REQUIRES_OK(ctx, CheckGradList(*cache, local, "HetsyncGradCacheRead", "local"));
    const Tensor& it_t = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(it_t.shape()),
                errors::InvalidArgument("HetsyncGradCacheRead: iteration must be a scalar"));

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
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, TensorShape({}), &out));
    out->scalar<bool>()() = fresh;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n + 1, TensorShape({}), &out));
    out->scalar<int64_t>()() = round;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n + 2, TensorShape({}), &out));
    out->scalar<float>()() = weight_sum;
  }
};

// Communication side: take the pending accumulation, combined with the
// staleness weights a_t = t - (k - tau) + 1 = t - t_min + 1, where k is the
// newest pending iteration and tau = k - t_min the largest iteration gap.
class GradCacheTakeOp : public OpKernel {
 public:
  explicit GradCacheTakeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    std::deque<GradCache::Entry> taken;
    int64_t newest = -1;
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      taken.swap(cache->pending);
      int64_t* c = cache->counters;
      c[GradCache::kPending] = 0;
      c[GradCache::kTaken] += static_cast<int64_t>(taken.size());
      if (!taken.empty()) ++c[GradCache::kTakes];
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
    Tensor* newest_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &newest_t));
    newest_t->scalar<int64_t>()() = newest;

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
  explicit GradCachePublishOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    const Tensor& flat_t = ctx->input(1);
    const int64_t total = cache->total();
    OP_REQUIRES(ctx, flat_t.dims() == 1 && flat_t.NumElements() == total + 1,
                errors::InvalidArgument("HetsyncGradCachePublish: reduced must be a float32 "
                                        "vector of length ", total + 1, " (all values + the "
                                        "weight sum), got shape ", flat_t.shape().DebugString()));
    const Tensor& round_t = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(round_t.shape()),
                errors::InvalidArgument("HetsyncGradCachePublish: round_id must be a scalar"));
    const int64_t round = round_t.scalar<int64_t>()();
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
    cache->result = std::move(result);
    cache->result_weight_sum = w;
    c[GradCache::kNewestRound] = round;
    ++c[GradCache::kPublished];
  }
};

// Communication side: wait up to timeout_ms for a pending gradient (never call in a step).
class GradCacheWaitOp : public OpKernel {
 public:
  explicit GradCacheWaitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    const Tensor& to = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(to.shape()),
                errors::InvalidArgument("HetsyncGradCacheWait: timeout_ms must be a scalar"));
    const double timeout_ms = to.scalar<double>()();
    OP_REQUIRES(ctx, timeout_ms >= 0.0,
                errors::InvalidArgument("HetsyncGradCacheWait: timeout_ms must be >= 0, got ",
                                        timeout_ms));
    bool ready = false;
    {
      std::unique_lock<std::mutex> lock(cache->mu);
      ready = cache->pending_cv.wait_for(
          lock, std::chrono::microseconds(static_cast<int64_t>(timeout_ms * 1e3)),
          [cache] { return !cache->pending.empty(); });
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = ready;
  }
};

class GradCacheStatusOp : public OpKernel {
 public:
  explicit GradCacheStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    GradCache* cache = nullptr;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &cache));
    core::ScopedUnref unref(cache);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({GradCache::kNumCounters}), &out));
    auto v = out->flat<int64_t>();
    std::lock_guard<std::mutex> lock(cache->mu);
    for (int i = 0; i < GradCache::kNumCounters; ++i) v(i) = cache->counters[i];
  }
};

class GradCacheDestroyOp : public OpKernel {
 public:
  explicit GradCacheDestroyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, DeleteResource<GradCache>(ctx, HandleFromInput(ctx, 0)));
  }
};

REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheCreate").Device(DEVICE_CPU), GradCacheCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWrite").Device(DEVICE_CPU), GradCacheWriteOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheRead").Device(DEVICE_CPU), GradCacheReadOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheTake").Device(DEVICE_CPU), GradCacheTakeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCachePublish").Device(DEVICE_CPU), GradCachePublishOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheWait").Device(DEVICE_CPU), GradCacheWaitOp);
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
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheStatus")
                            .Device(DEVICE_GPU)
                            .HostMemory("cache")
                            .HostMemory("counters"),
                        GradCacheStatusOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncGradCacheDestroy").Device(DEVICE_GPU).HostMemory("cache"),
                        GradCacheDestroyOp);

}  // namespace hetsync
