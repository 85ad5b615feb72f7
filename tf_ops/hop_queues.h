// Hop's update queue and token queue (Hop paper sections 4.1, 4.2, 6.1; design
// notes: docs/protocols/hop.md) as host-side TensorFlow resources. Implemented
// in hop_queues.cc; the ops reaching them in hop_queue_ops.cc.
//
// HopUpdateQueue: tagged FIFO entries (a fixed list of tensors + int64 tags
//   iter and w_id) kept in num_slots = max_ig + 1 rotating FIFO slots (entry
//   of iteration t in slot t mod num_slots). Every entry also carries a global
//   arrival sequence number, so wildcard-iteration operations see all slots in
//   overall FIFO order.
// HopTokenQueue: n token counters (one per neighbour index) plus the newest
//   iteration value received per index.
//
// Both are ref-counted ResourceBase objects reached through DT_RESOURCE
// handles; all state is guarded by one mutex per resource. Blocking operations
// (dequeue, dequeue_newest, token take) are AsyncOpKernels: when they cannot
// complete at once they park a HopWaiter in the resource and return without
// holding a TensorFlow thread. A waiter is completed by exactly one of: an
// operation that makes it satisfiable (enqueue / put / close of an index), its
// deadline on TimerQueue::Global() (DeadlineExceeded), TensorFlow's
// cancellation manager, or close / cancel / destroy of the resource
// (Cancelled). `HopWaiter::finished`, read and written only under the
// resource's mutex, decides which one: whoever sets it calls `done`, after
// releasing the mutex.

#ifndef HETSYNC_TF_OPS_HOP_QUEUES_H_
#define HETSYNC_TF_OPS_HOP_QUEUES_H_

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "timer_queue.h"

namespace hetsync {

class HopWaitable;

// " '<label>'" for messages naming a queue, "" for an unlabelled one.
inline std::string QuotedLabel(const std::string& label) {
  return label.empty() ? "" : " '" + label + "'";
}

// A parked blocking op. Shared (shared_ptr) by the resource's waiter list, the
// deadline callback and the cancellation callback; holds a reference on its
// resource so both callbacks may still reach it after the op completed.
struct HopWaiter {
  enum Kind { kDequeue, kDequeueNewest, kTokenTake };

  HopWaiter(Kind k, HopWaitable* q, ::tensorflow::OpKernelContext* c,
            ::tensorflow::AsyncOpKernel::DoneCallback d, double timeout);
  ~HopWaiter();

  const Kind kind;
  HopWaitable* const owner;  // referenced (Ref in the constructor, Unref in the destructor)
  ::tensorflow::OpKernelContext* ctx;
  ::tensorflow::AsyncOpKernel::DoneCallback done;
  const TimerQueue::Clock::time_point start;
  const double timeout_ms;
  ::tensorflow::CancellationManager* cm = nullptr;
  ::tensorflow::CancellationToken token = ::tensorflow::CancellationManager::kInvalidToken;
  bool finished = false;       // guarded by owner->mu
  absl::Status status;  // result status, set by the finisher under owner->mu

  // Request. kDequeue: m, iter, w_id (-1 = wildcard), greedy.
  // kDequeueNewest: w_ids, min_iteration. kTokenTake: index, count.
  int64_t m = 0, iter = -1, w_id = -1;
  bool greedy = false;
  std::vector<int64_t> w_ids;
  int64_t min_iteration = -1;
  int64_t index = 0, count = 0;

  // Result (written by the finisher under owner->mu, read by it afterwards).
  struct Taken {
    int64_t iter = -1, w_id = -1;
    std::vector<::tensorflow::Tensor> values;  // empty: no entry (dequeue_newest row)
  };
  std::vector<Taken> taken;  // kDequeue: in FIFO order; kDequeueNewest: one row per w_ids[i]
  int64_t remaining = 0;     // kTokenTake
};

// Common part of both resources: the mutex, the FIFO list of parked waiters
// and the completion protocol described at the top of this file.
class HopWaitable : public ::tensorflow::ResourceBase {
 public:
  std::mutex mu;
  std::list<std::shared_ptr<HopWaiter>> waiters;  // guarded by mu, FIFO

  // Runs the blocking op of `w` (a new, unshared waiter): completes it at once
  // if possible, else parks it with a deadline and a cancellation callback.
  void Run(std::shared_ptr<HopWaiter> w);

  // Fails `w` with `status` unless it already finished (deadline, cancellation).
  void Fail(const std::shared_ptr<HopWaiter>& w, const absl::Status& status);

  // Under mu: re-tries every parked waiter in FIFO order; the finished ones
  // are removed from the list and appended to `out` (to Finish outside mu).
  void PollLocked(std::vector<std::shared_ptr<HopWaiter>>* out);

  // Under mu: fails every parked waiter with `status`, moving them to `out`.
  void FailAllLocked(const absl::Status& status,
                     std::vector<std::shared_ptr<HopWaiter>>* out);

  // Outside mu, once per finished waiter: writes its outputs (or its error)
  // into its context and calls `done`.
  static void Finish(const std::shared_ptr<HopWaiter>& w);
  static void FinishAll(const std::vector<std::shared_ptr<HopWaiter>>& ws) {
    for (const auto& w : ws) Finish(w);
  }

 protected:
  // Under mu: a non-OK status if `w` must fail at once (closed / cancelled).
  virtual absl::Status RefusalLocked(const HopWaiter& w) = 0;
  // Under mu: tries to complete `w`; true if it finished (w->status set, ok or
  // an error), false if it must keep waiting (nothing changed).
  virtual bool TryCompleteLocked(HopWaiter* w) = 0;
  // Under mu: the DeadlineExceeded message of `w` after waiting `waited_ms`.
  virtual std::string TimeoutMessageLocked(const HopWaiter& w, double waited_ms) = 0;
  // Outside mu: writes the outputs of a successfully finished `w`.
  virtual void EmitOutputs(HopWaiter* w) = 0;

 private:
  void Expire(const std::shared_ptr<HopWaiter>& w);
};

class HopUpdateQueue : public HopWaitable {
 public:
  // Fields of HopUpdateQueueStatus, in order.
  enum Counter {
    kEnqueued = 0,         // entries accepted by enqueue
    kDequeued,             // entries returned by dequeue / dequeue_newest
    kDiscardedStale,       // entries tagged < k found in slot k mod num_slots
    kDiscardedSuperseded,  // older entries of a w_id dropped by dequeue_newest
    kDroppedClosed,        // enqueues on a closed queue (not in kEnqueued)
    kSize,                 // entries present now
    kWaiters,              // parked dequeue / dequeue_newest ops now
    kNumCounters
  };

  struct Entry {
    int64_t seq;   // global arrival number
    int64_t iter;  // tag: iteration the update was generated in (>= 0)
    int64_t w_id;  // tag: sender id (>= 0)
    std::vector<::tensorflow::Tensor> values;  // shared buffers, never mutated
  };

  HopUpdateQueue(std::string label, ::tensorflow::DataTypeVector dtypes,
                 std::vector<::tensorflow::TensorShape> shapes, int64_t num_slots)
      : label_(std::move(label)),
        dtypes_(std::move(dtypes)),
        shapes_(std::move(shapes)),
        num_slots_(num_slots),
        slots_(num_slots) {}

  std::string DebugString() const override;

  const std::string& label() const { return label_; }
  const ::tensorflow::DataTypeVector& dtypes() const { return dtypes_; }
  const std::vector<::tensorflow::TensorShape>& shapes() const { return shapes_; }
  int64_t num_slots() const { return num_slots_; }

  // Checks a component list against the queue's dtypes and shapes.
  absl::Status CheckComponents(const ::tensorflow::OpInputList& values) const;

  // Under mu. Appends one entry (or counts it as dropped if closed); the
  // caller then polls the waiters.
  void EnqueueLocked(int64_t iter, int64_t w_id, std::vector<::tensorflow::Tensor> values);
  // Under mu. Number of matching entries (iter >= 0: discards stale entries of
  // slot iter mod num_slots first; FailedPrecondition on a tag > iter there).
  absl::Status SizeLocked(int64_t iter, int64_t w_id, int64_t* size);
  // Under mu. Closes the queue and fails every parked waiter.
  void CloseLocked(const std::string& message, std::vector<std::shared_ptr<HopWaiter>>* out);
  void CountersLocked(int64_t out[kNumCounters]) const;

 protected:
  absl::Status RefusalLocked(const HopWaiter& w) override;
  bool TryCompleteLocked(HopWaiter* w) override;
  std::string TimeoutMessageLocked(const HopWaiter& w, double waited_ms) override;
  void EmitOutputs(HopWaiter* w) override;

 private:
  struct Loc {
    int64_t seq;
    int64_t slot;
    size_t pos;
  };
  // Under mu: matching entries, sorted by seq (see SizeLocked for iter >= 0).
  absl::Status FindLocked(int64_t iter, int64_t w_id, std::vector<Loc>* locs);
  // Under mu: removes the entries at `locs` (any order), returning them in `locs` order.
  std::vector<Entry> RemoveLocked(const std::vector<Loc>& locs);
  std::string PresentSummaryLocked() const;
  absl::Status ClosedStatusLocked() const;  // Cancelled(message) once closed

  const std::string label_;
  const ::tensorflow::DataTypeVector dtypes_;
  const std::vector<::tensorflow::TensorShape> shapes_;
  const int64_t num_slots_;

  // All guarded by mu.
  std::vector<std::deque<Entry>> slots_;  // each in arrival order
  int64_t next_seq_ = 0;
  int64_t size_ = 0;
  int64_t counters_[kNumCounters] = {0, 0, 0, 0, 0, 0, 0};
  std::map<int64_t, int64_t> iter_rcv_;  // newest tag ever taken by dequeue_newest, per w_id
  bool closed_ = false;
  std::string close_message_;
};

class HopTokenQueue : public HopWaitable {
 public:
  HopTokenQueue(std::string label, int64_t n, int64_t initial)
      : label_(std::move(label)), counts_(n, initial), newest_(n, -1), closed_(n, false) {}

  std::string DebugString() const override;

  const std::string& label() const { return label_; }
  int64_t n() const { return static_cast<int64_t>(counts_.size()); }

  // All under mu.
  void PutLocked(int64_t index, int64_t count, int64_t iteration);
  void CloseIndexLocked(int64_t index);
  void CancelLocked(const std::string& message, std::vector<std::shared_ptr<HopWaiter>>* out);
  const std::vector<int64_t>& counts() const { return counts_; }
  const std::vector<int64_t>& newest() const { return newest_; }

 protected:
  absl::Status RefusalLocked(const HopWaiter& w) override;
  bool TryCompleteLocked(HopWaiter* w) override;
  std::string TimeoutMessageLocked(const HopWaiter& w, double waited_ms) override;
  void EmitOutputs(HopWaiter* w) override;

 private:
  absl::Status CancelledStatusLocked() const;  // Cancelled(message) once cancelled

  const std::string label_;
  // All guarded by mu.
  std::vector<int64_t> counts_;  // tokens granted per neighbour index
  std::vector<int64_t> newest_;  // newest iteration value received per index (-1: none)
  std::vector<bool> closed_;     // index finished: takes never block
  bool cancelled_ = false;
  std::string cancel_message_;
};

}  // namespace hetsync

#endif  // HETSYNC_TF_OPS_HOP_QUEUES_H_
