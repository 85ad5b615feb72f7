// GradCache: the host-side gradient cache of RNA's cross-iteration execution
// (RNA paper, sections 3.3 and 6: WriteOp / ReadOp and the communication side).
//
// One cache holds, for a fixed list of float32 gradient tensors:
//   * the pending accumulation: the gradients written by the compute step
//     since the communication thread last took them, one entry per local
//     iteration t (at most max_staleness + 1 entries);
//   * the output slot: the newest reduced result published by the
//     communication thread, with its round id and sum of weights.
// It is a ref-counted ResourceBase reached through a DT_RESOURCE handle; all
// members are guarded by one mutex, held only for O(number of tensors) work
// (gradient tensors are shared by reference, never copied under the lock).

#ifndef HETSYNC_TF_OPS_GRAD_CACHE_H_
#define HETSYNC_TF_OPS_GRAD_CACHE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace hetsync {

class GradCache : public ::tensorflow::ResourceBase {
 public:
  // Indices of the counters returned by HetsyncGradCacheStatus.
  enum Counter {
    kWritten = 0,        // gradients written (WriteOp calls)
    kDropped,            // gradients dropped beyond max_staleness
    kTaken,              // gradients combined into taken accumulations
    kTakes,              // non-empty takes (rounds this rank contributed to)
    kPublished,          // results published
    kFreshReads,         // ReadOp calls that returned a published result
    kNewestRound,        // round id of the newest published result (-1: none)
    kLastReadRound,      // round id of the last result read (-1: none)
    kPending,            // gradients pending now
    kNewestIteration,    // newest iteration written (-1: none)
    kNumCounters
  };

  struct Entry {
    int64_t iteration;
    std::vector<::tensorflow::Tensor> grads;  // shared buffers, never mutated
  };

  GradCache(std::vector<::tensorflow::TensorShape> shapes, int64_t max_staleness)
      : shapes_(std::move(shapes)), max_staleness_(max_staleness) {
    total_ = 0;
    for (const auto& s : shapes_) total_ += s.num_elements();
  }

  std::string DebugString() const override {
    return "hetsync GradCache of " + std::to_string(shapes_.size()) + " tensors, " +
           std::to_string(total_) + " float32 values, max_staleness " +
           std::to_string(max_staleness_);
  }

  const std::vector<::tensorflow::TensorShape>& shapes() const { return shapes_; }
  int64_t total() const { return total_; }
  int64_t max_staleness() const { return max_staleness_; }

  std::mutex mu;
  std::condition_variable pending_cv;  // signalled on every write
  std::condition_variable published_cv;  // signalled on every publish and on release
  std::deque<Entry> pending;           // oldest first, strictly increasing iterations
  std::vector<::tensorflow::Tensor> result;  // newest published result (empty: none)
  float result_weight_sum = 0.0f;
  int64_t taken_upto = -1;      // newest iteration of the last non-empty take (-1: none)
  int64_t published_upto = -1;  // newest iteration inside a published round (-1: none)
  bool released = false;        // set once the communication side ends: no round will follow
  bool stalled = false;         // a wait timed out; waits return at once until the next publish
  int64_t counters[kNumCounters] = {0, 0, 0, 0, 0, 0, -1, -1, 0, -1};

 private:
  const std::vector<::tensorflow::TensorShape> shapes_;
  const int64_t max_staleness_;
  int64_t total_;
};

}  // namespace hetsync

#endif  // HETSYNC_TF_OPS_GRAD_CACHE_H_
