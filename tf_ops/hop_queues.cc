// Hop's update queue and token queue as host-side resources: the completion
// protocol of their blocking operations (HopWaitable) and the queues' own
// state changes. Declarations, and the statement of the protocol, in
// hop_queues.h; the ops and their kernels in hop_queue_ops.cc. Hop paper
// sections 4.1, 4.2, 6.1 (design notes: docs/protocols/hop.md).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "hop_queues.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "timer_queue.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT

namespace {

std::string Tag(int64_t v) { return v < 0 ? std::string("*") : std::to_string(v); }

double MillisSince(TimerQueue::Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(TimerQueue::Clock::now() - start).count();
}

// Copies `elem` (one entry component) into row `row` of `out` ([rows, *shape]).
void CopyRow(const Tensor& elem, Tensor* out, int64_t row) {
  if (DataTypeCanUseMemcpy(elem.dtype())) {
    const size_t bytes = elem.tensor_data().size();
    if (bytes == 0) return;
    char* dst = const_cast<char*>(out->tensor_data().data()) + row * bytes;
    std::memcpy(dst, elem.tensor_data().data(), bytes);
  } else {  // DT_STRING (the only other dtype a queue accepts)
    const auto src = elem.flat<tstring>();
    auto dst = out->flat<tstring>();
    const int64_t n = src.size();
    for (int64_t j = 0; j < n; ++j) dst(row * n + j) = src(j);
  }
}

// Zeroes row `row` of `out` ([rows, *shape]); strings are already empty.
void ZeroRow(Tensor* out, int64_t row, int64_t rows) {
  if (!DataTypeCanUseMemcpy(out->dtype()) || rows == 0) return;
  const size_t bytes = out->tensor_data().size() / rows;
  if (bytes == 0) return;
  std::memset(const_cast<char*>(out->tensor_data().data()) + row * bytes, 0, bytes);
}

}  // namespace

// ---- HopWaiter / HopWaitable: the completion protocol ---------------------

HopWaiter::HopWaiter(Kind k, HopWaitable* q, OpKernelContext* c,
                     AsyncOpKernel::DoneCallback d, double timeout)
    : kind(k),
      owner(q),
      ctx(c),
      done(std::move(d)),
      start(TimerQueue::Clock::now()),
      timeout_ms(timeout) {
  owner->Ref();
}

HopWaiter::~HopWaiter() { owner->Unref(); }

void HopWaitable::Run(std::shared_ptr<HopWaiter> w) {
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    absl::Status refusal = RefusalLocked(*w);
    if (!refusal.ok()) {
      w->status = refusal;
      w->finished = true;
    } else if (TryCompleteLocked(w.get())) {
      w->finished = true;
    }
    finished = w->finished;
  }
  if (finished) {
    Finish(w);
    return;
  }
  // Park. The cancellation callback is registered before the waiter becomes
  // visible to other ops, so Finish can always deregister it.
  CancellationManager* cm = w->ctx->cancellation_manager();
  if (cm != nullptr) {
    const CancellationToken token = cm->get_cancellation_token();
    w->cm = cm;
    w->token = token;
    HopWaitable* self = this;
    const bool registered = cm->RegisterCallback(token, [self, w]() {
      self->Fail(w, errors::Cancelled("hetsync hop op cancelled by TensorFlow while waiting"));
    });
    if (!registered) {  // the step is already being cancelled
      w->cm = nullptr;
      w->status = errors::Cancelled("hetsync hop op cancelled by TensorFlow before waiting");
      {
        std::lock_guard<std::mutex> lock(mu);
        w->finished = true;
      }
      Finish(w);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (w->finished) return;  // cancelled meanwhile: the canceller finished it
    absl::Status refusal = RefusalLocked(*w);
    if (!refusal.ok()) {
      w->status = refusal;
      w->finished = true;
    } else if (TryCompleteLocked(w.get())) {
      w->finished = true;
    } else {
      waiters.push_back(w);
    }
    finished = w->finished;
  }
  if (finished) {
    Finish(w);
    return;
  }
  if (std::isfinite(w->timeout_ms)) {
    const auto deadline =
        w->start + std::chrono::microseconds(static_cast<int64_t>(w->timeout_ms * 1e3));
    HopWaitable* self = this;
    TimerQueue::Global()->Schedule(deadline, [self, w]() { self->Expire(w); });
  }
}

void HopWaitable::Fail(const std::shared_ptr<HopWaiter>& w, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (w->finished) return;
    w->finished = true;
    w->status = status;
    waiters.remove(w);
  }
  Finish(w);
}

void HopWaitable::Expire(const std::shared_ptr<HopWaiter>& w) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (w->finished) return;
    w->finished = true;
    waiters.remove(w);
    w->status = errors::DeadlineExceeded(TimeoutMessageLocked(*w, MillisSince(w->start)));
  }
  Finish(w);
}

void HopWaitable::PollLocked(std::vector<std::shared_ptr<HopWaiter>>* out) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (TryCompleteLocked(it->get())) {
      (*it)->finished = true;
      out->push_back(std::move(*it));
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void HopWaitable::FailAllLocked(const absl::Status& status,
                                std::vector<std::shared_ptr<HopWaiter>>* out) {
  for (auto& w : waiters) {
    w->finished = true;
    w->status = status;
    out->push_back(std::move(w));
  }
  waiters.clear();
}

void HopWaitable::Finish(const std::shared_ptr<HopWaiter>& w) {
  if (w->cm != nullptr) w->cm->TryDeregisterCallback(w->token);  // never blocks
  if (w->status.ok()) {
    w->owner->EmitOutputs(w.get());
  } else {
    w->ctx->SetStatus(w->status);
  }
  AsyncOpKernel::DoneCallback done = std::move(w->done);
  w->ctx = nullptr;
  w->taken.clear();
  done();
}

// ---- HopUpdateQueue ---------------------------------------------------------

std::string HopUpdateQueue::DebugString() const {
  return "hetsync HopUpdateQueue" + QuotedLabel(label_) + " of " + std::to_string(dtypes_.size()) +
         " components, " + std::to_string(num_slots_) + " slots";
}

absl::Status HopUpdateQueue::CheckComponents(const OpInputList& values) const {
  if (values.size() != static_cast<int>(dtypes_.size())) {
    return errors::InvalidArgument("hop_update_queue_enqueue: the queue", QuotedLabel(label_),
                                   " holds ", dtypes_.size(), " components per entry, got ",
                                   values.size(), " tensors");
  }
  for (int i = 0; i < values.size(); ++i) {
    if (values[i].dtype() != dtypes_[i]) {
      return errors::InvalidArgument("hop_update_queue_enqueue: component ", i, " has dtype ",
                                     DataTypeString(values[i].dtype()), ", the queue",
                                     QuotedLabel(label_), " expects ", DataTypeString(dtypes_[i]));
    }
    if (values[i].shape() != shapes_[i]) {
      return errors::InvalidArgument("hop_update_queue_enqueue: component ", i, " has shape ",
                                     values[i].shape().DebugString(), ", the queue",
                                     QuotedLabel(label_), " expects ", shapes_[i].DebugString());
    }
  }
  return absl::OkStatus();
}

void HopUpdateQueue::EnqueueLocked(int64_t iter, int64_t w_id, std::vector<Tensor> values) {
  if (closed_) {
    ++counters_[kDroppedClosed];
    return;
  }
  slots_[iter % num_slots_].push_back(Entry{next_seq_++, iter, w_id, std::move(values)});
  ++size_;
  ++counters_[kEnqueued];
}

absl::Status HopUpdateQueue::FindLocked(int64_t iter, int64_t w_id, std::vector<Loc>* locs) {
  locs->clear();
  if (iter >= 0) {
    const int64_t s = iter % num_slots_;
    auto& slot = slots_[s];
    // Late updates of an earlier iteration sharing this slot: discard, counted.
    const size_t before = slot.size();
    slot.erase(std::remove_if(slot.begin(), slot.end(),
                              [iter](const Entry& e) { return e.iter < iter; }),
               slot.end());
    const int64_t stale = static_cast<int64_t>(before - slot.size());
    counters_[kDiscardedStale] += stale;
    size_ -= stale;
    for (size_t pos = 0; pos < slot.size(); ++pos) {
      const Entry& e = slot[pos];
      if (e.iter > iter) {
        return errors::FailedPrecondition(
            "hop update queue", QuotedLabel(label_), ": entry tagged iter=", e.iter,
            " (w_id=", e.w_id, ") found in slot ", s, " while looking for iter=", iter,
            "; with ", num_slots_, " slots (max_ig = ", num_slots_ - 1,
            ") that slot may only hold iter=", iter,
            ", so the token bound on the iteration gap was violated");
      }
      if (w_id < 0 || e.w_id == w_id) locs->push_back(Loc{e.seq, s, pos});
    }
    return absl::OkStatus();  // one slot: already in arrival order
  }
  for (int64_t s = 0; s < num_slots_; ++s) {
    const auto& slot = slots_[s];
    for (size_t pos = 0; pos < slot.size(); ++pos) {
      if (w_id < 0 || slot[pos].w_id == w_id) locs->push_back(Loc{slot[pos].seq, s, pos});
    }
  }
  std::sort(locs->begin(), locs->end(), [](const Loc& a, const Loc& b) { return a.seq < b.seq; });
  return absl::OkStatus();
}

std::vector<HopUpdateQueue::Entry> HopUpdateQueue::RemoveLocked(const std::vector<Loc>& locs) {
  std::vector<Entry> out(locs.size());
  std::vector<std::vector<size_t>> per_slot(num_slots_);
  for (size_t i = 0; i < locs.size(); ++i) {
    out[i] = std::move(slots_[locs[i].slot][locs[i].pos]);
    per_slot[locs[i].slot].push_back(locs[i].pos);
  }
  for (int64_t s = 0; s < num_slots_; ++s) {
    auto& pos = per_slot[s];
    if (pos.empty()) continue;
    std::sort(pos.begin(), pos.end());
    auto& slot = slots_[s];
    size_t keep = 0, k = 0;
    for (size_t r = 0; r < slot.size(); ++r) {
      if (k < pos.size() && pos[k] == r) {
        ++k;
        continue;
      }
      if (keep != r) slot[keep] = std::move(slot[r]);
      ++keep;
    }
    slot.erase(slot.begin() + keep, slot.end());
  }
  size_ -= static_cast<int64_t>(locs.size());
  return out;
}

absl::Status HopUpdateQueue::SizeLocked(int64_t iter, int64_t w_id, int64_t* size) {
  if (iter < 0 && w_id < 0) {
    *size = size_;
    return absl::OkStatus();
  }
  std::vector<Loc> locs;
  TF_RETURN_IF_ERROR(FindLocked(iter, w_id, &locs));
  *size = static_cast<int64_t>(locs.size());
  return absl::OkStatus();
}

void HopUpdateQueue::CloseLocked(const std::string& message,
                                 std::vector<std::shared_ptr<HopWaiter>>* out) {
  if (!closed_) {
    closed_ = true;
    close_message_ = message;
  }
  FailAllLocked(ClosedStatusLocked(), out);
}

void HopUpdateQueue::CountersLocked(int64_t out[kNumCounters]) const {
  for (int i = 0; i < kNumCounters; ++i) out[i] = counters_[i];
  out[kSize] = size_;
  out[kWaiters] = static_cast<int64_t>(waiters.size());
}

absl::Status HopUpdateQueue::RefusalLocked(const HopWaiter& w) { return ClosedStatusLocked(); }

absl::Status HopUpdateQueue::ClosedStatusLocked() const {
  if (!closed_) return absl::OkStatus();
  return errors::Cancelled("hop update queue", QuotedLabel(label_), " is closed: ", close_message_);
}

bool HopUpdateQueue::TryCompleteLocked(HopWaiter* w) {
  if (w->kind == HopWaiter::kDequeue) {
    std::vector<Loc> locs;
    absl::Status s = FindLocked(w->iter, w->w_id, &locs);
    if (!s.ok()) {
      w->status = s;
      return true;
    }
    if (static_cast<int64_t>(locs.size()) < w->m) return false;
    if (!w->greedy) locs.resize(w->m);
    std::vector<Entry> entries = RemoveLocked(locs);
    counters_[kDequeued] += static_cast<int64_t>(entries.size());
    w->taken.clear();
    for (auto& e : entries) w->taken.push_back(HopWaiter::Taken{e.iter, e.w_id, std::move(e.values)});
    return true;
  }
  // kDequeueNewest: complete only once every w_id has reached min_iteration
  // (counting what is present now); then take all entries of those w_ids.
  struct Best {
    int64_t iter = -1, seq = -1;
  };
  std::map<int64_t, Best> best;
  for (int64_t w_id : w->w_ids) best[w_id] = Best();
  for (const auto& slot : slots_) {
    for (const Entry& e : slot) {
      auto it = best.find(e.w_id);
      if (it == best.end()) continue;
      Best& b = it->second;
      if (b.seq < 0 || e.iter > b.iter || (e.iter == b.iter && e.seq > b.seq)) b = Best{e.iter, e.seq};
    }
  }
  for (int64_t w_id : w->w_ids) {
    auto rcv = iter_rcv_.find(w_id);
    const int64_t have = std::max(rcv == iter_rcv_.end() ? -1 : rcv->second, best[w_id].iter);
    if (have < w->min_iteration) return false;
  }
  std::vector<Loc> locs;
  for (int64_t s = 0; s < num_slots_; ++s) {
    for (size_t pos = 0; pos < slots_[s].size(); ++pos) {
      if (best.count(slots_[s][pos].w_id)) locs.push_back(Loc{slots_[s][pos].seq, s, pos});
    }
  }
  std::vector<Entry> entries = RemoveLocked(locs);
  std::map<int64_t, Entry*> kept;
  for (auto& e : entries) {
    if (e.seq == best[e.w_id].seq) {
      kept[e.w_id] = &e;
    } else {
      ++counters_[kDiscardedSuperseded];
    }
  }
  w->taken.assign(w->w_ids.size(), HopWaiter::Taken());
  for (size_t i = 0; i < w->w_ids.size(); ++i) {
    auto it = kept.find(w->w_ids[i]);
    if (it == kept.end()) continue;
    Entry* e = it->second;
    w->taken[i] = HopWaiter::Taken{e->iter, e->w_id, std::move(e->values)};
    auto& rcv = iter_rcv_.emplace(e->w_id, -1).first->second;
    rcv = std::max(rcv, e->iter);
    ++counters_[kDequeued];
  }
  return true;
}

std::string HopUpdateQueue::PresentSummaryLocked() const {
  std::vector<const Entry*> all;
  for (const auto& slot : slots_)
    for (const Entry& e : slot) all.push_back(&e);
  std::sort(all.begin(), all.end(), [](const Entry* a, const Entry* b) { return a->seq < b->seq; });
  const size_t shown = std::min<size_t>(all.size(), 16);
  std::string out = "present (iter, w_id) in arrival order: [";
  for (size_t i = 0; i < shown; ++i) {
    out += (i ? " (" : "(") + std::to_string(all[i]->iter) + "," + std::to_string(all[i]->w_id) + ")";
  }
  if (all.size() > shown) out += " ... +" + std::to_string(all.size() - shown) + " more";
  return out + "]";
}

std::string HopUpdateQueue::TimeoutMessageLocked(const HopWaiter& w, double waited_ms) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", waited_ms);
  if (w.kind == HopWaiter::kDequeue) {
    int64_t matching = 0;  // read-only count (no discarding here)
    for (int64_t s = 0; s < num_slots_; ++s) {
      if (w.iter >= 0 && s != w.iter % num_slots_) continue;
      for (const Entry& e : slots_[s]) {
        if ((w.iter < 0 || e.iter == w.iter) && (w.w_id < 0 || e.w_id == w.w_id)) ++matching;
      }
    }
    return "hop_update_queue_dequeue on queue" + QuotedLabel(label_) + ": waited " + waited +
           " ms for " + std::to_string(w.m) + " entries with iter=" + Tag(w.iter) +
           " w_id=" + Tag(w.w_id) + (w.greedy ? " (greedy)" : "") + ", " +
           std::to_string(matching) + " matching present, queue size " + std::to_string(size_) +
           "; " + PresentSummaryLocked();
  }
  std::map<int64_t, int64_t> present;  // newest tag present per w_id
  for (const auto& slot : slots_)
    for (const Entry& e : slot) {
      auto it = present.emplace(e.w_id, e.iter).first;
      it->second = std::max(it->second, e.iter);
    }
  std::string lacking;
  for (int64_t w_id : w.w_ids) {
    auto rcv = iter_rcv_.find(w_id);
    const int64_t r = rcv == iter_rcv_.end() ? -1 : rcv->second;
    auto p = present.find(w_id);
    const int64_t pr = p == present.end() ? -1 : p->second;
    if (std::max(r, pr) >= w.min_iteration) continue;
    lacking += (lacking.empty() ? "w_id " : ", w_id ") + std::to_string(w_id) +
               " (newest taken " + std::to_string(r) + ", newest present " +
               std::to_string(pr) + ")";
  }
  std::string ids;
  for (size_t i = 0; i < w.w_ids.size(); ++i) ids += (i ? "," : "") + std::to_string(w.w_ids[i]);
  return "hop_update_queue_dequeue_newest on queue" + QuotedLabel(label_) + ": waited " + waited +
         " ms for an entry with iter >= " + std::to_string(w.min_iteration) +
         " from each of w_ids [" + ids + "]; lacking: " + lacking + "; queue size " +
         std::to_string(size_) + "; " + PresentSummaryLocked();
}

void HopUpdateQueue::EmitOutputs(HopWaiter* w) {
  OpKernelContext* ctx = w->ctx;
  const int64_t rows = static_cast<int64_t>(w->taken.size());
  const int ncomp = static_cast<int>(dtypes_.size());
  for (int c = 0; c < ncomp; ++c) {
    TensorShape shape({rows});
    shape.AppendShape(shapes_[c]);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(c, shape, &out));
    for (int64_t r = 0; r < rows; ++r) {
      if (w->taken[r].values.empty()) {
        ZeroRow(out, r, rows);
      } else {
        CopyRow(w->taken[r].values[c], out, r);
      }
    }
  }
  Tensor* iters = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(ncomp, TensorShape({rows}), &iters));
  Tensor* last = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(
                          ncomp + 1, TensorShape({rows}), &last));
  for (int64_t r = 0; r < rows; ++r) {
    const bool found = !w->taken[r].values.empty();
    iters->vec<int64_t>()(r) = found ? w->taken[r].iter : -1;
    if (w->kind == HopWaiter::kDequeue) {
      last->vec<int64_t>()(r) = w->taken[r].w_id;
    } else {
      last->vec<bool>()(r) = found;
    }
  }
}

// ---- HopTokenQueue ----------------------------------------------------------

std::string HopTokenQueue::DebugString() const {
  return "hetsync HopTokenQueue" + QuotedLabel(label_) + " of " + std::to_string(counts_.size()) +
         " counters";
}

void HopTokenQueue::PutLocked(int64_t index, int64_t count, int64_t iteration) {
  counts_[index] += count;
  if (iteration >= 0) newest_[index] = std::max(newest_[index], iteration);
}

void HopTokenQueue::CloseIndexLocked(int64_t index) { closed_[index] = true; }

void HopTokenQueue::CancelLocked(const std::string& message,
                                 std::vector<std::shared_ptr<HopWaiter>>* out) {
  if (!cancelled_) {
    cancelled_ = true;
    cancel_message_ = message;
  }
  FailAllLocked(CancelledStatusLocked(), out);
}

absl::Status HopTokenQueue::RefusalLocked(const HopWaiter& w) { return CancelledStatusLocked(); }

absl::Status HopTokenQueue::CancelledStatusLocked() const {
  if (!cancelled_) return absl::OkStatus();
  return errors::Cancelled("hop token queue", QuotedLabel(label_), " is cancelled: ", cancel_message_);
}

bool HopTokenQueue::TryCompleteLocked(HopWaiter* w) {
  if (closed_[w->index]) {  // that neighbour finished: never block, take nothing
    w->remaining = counts_[w->index];
    return true;
  }
  if (counts_[w->index] < w->count) return false;
  counts_[w->index] -= w->count;
  w->remaining = counts_[w->index];
  return true;
}

std::string HopTokenQueue::TimeoutMessageLocked(const HopWaiter& w, double waited_ms) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", waited_ms);
  return "hop_token_take on token queue" + QuotedLabel(label_) + ": waited " + waited + " ms for " +
         std::to_string(w.count) + " tokens on index " + std::to_string(w.index) + ", " +
         std::to_string(counts_[w.index]) + " present (newest iteration received on that index: " +
         std::to_string(newest_[w.index]) + ")";
}

void HopTokenQueue::EmitOutputs(HopWaiter* w) {
  OP_REQUIRES_OK(w->ctx, ScalarOutput(w->ctx, 0, w->remaining));
}

}  // namespace hetsync
