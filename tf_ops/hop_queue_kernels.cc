// Kernels of Hop's update-queue and token-queue ops (definitions and docs in
// ops.cc; resources and the waiter protocol in hop_queues.h). Hop paper
// sections 4.1, 4.2, 6.1; spec /work/shared/specs/hop.md sections 2, 3, 11.
//
// Device: CPU kernels only. The queues are host-side state reached from the
// communication code; no GPU registrations (the resources live in the CPU
// device's ResourceMgr).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "hop_queues.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "timer_queue.h"

namespace hetsync {

using namespace ::tensorflow;  // NOLINT

namespace {

std::atomic<int64_t> g_hop_queue_counter{0};

std::string Tag(int64_t v) { return v < 0 ? std::string("*") : std::to_string(v); }

double MillisSince(TimerQueue::Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(TimerQueue::Clock::now() - start).count();
}

std::string Quoted(const std::string& label) { return label.empty() ? "" : " '" + label + "'"; }

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

Status ScalarInput(OpKernelContext* ctx, int index, const char* op, const char* what,
                   int64_t* value) {
  const Tensor& t = ctx->input(index);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(op, ": ", what, " must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  *value = t.scalar<int64_t>()();
  return OkStatus();
}

Status TimeoutInput(OpKernelContext* ctx, int index, const char* op, double* timeout_ms) {
  const Tensor& t = ctx->input(index);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(op, ": timeout_ms must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  *timeout_ms = t.scalar<double>()();
  if (!(*timeout_ms > 0.0)) {  // also rejects NaN
    return errors::InvalidArgument(op, ": timeout_ms must be > 0 (milliseconds; inf = no "
                                   "deadline), got ", *timeout_ms);
  }
  return OkStatus();
}

// Reads the component_types / shapes attrs of a queue op.
Status ComponentAttrs(OpKernelConstruction* ctx, const char* op, DataTypeVector* dtypes,
                      std::vector<TensorShape>* shapes) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("component_types", dtypes));
  std::vector<PartialTensorShape> partial;
  TF_RETURN_IF_ERROR(ctx->GetAttr("shapes", &partial));
  if (partial.size() != dtypes->size()) {
    return errors::InvalidArgument(op, ": got ", dtypes->size(), " component_types but ",
                                   partial.size(), " shapes");
  }
  for (const auto& p : partial) {
    TensorShape s;
    if (!p.AsTensorShape(&s)) {
      return errors::InvalidArgument(op, ": every component shape must be fully defined, got ",
                                     p.DebugString());
    }
    shapes->push_back(s);
  }
  return OkStatus();
}

// The component attrs of a dequeue op must describe the queue it reads.
Status CheckSameComponents(const HopUpdateQueue& q, const DataTypeVector& dtypes,
                           const std::vector<TensorShape>& shapes, const char* op) {
  if (dtypes != q.dtypes() || shapes.size() != q.shapes().size() ||
      !std::equal(shapes.begin(), shapes.end(), q.shapes().begin())) {
    std::string want, got;
    for (size_t i = 0; i < q.dtypes().size(); ++i)
      want += DataTypeString(q.dtypes()[i]) + q.shapes()[i].DebugString() + " ";
    for (size_t i = 0; i < dtypes.size() && i < shapes.size(); ++i)
      got += DataTypeString(dtypes[i]) + shapes[i].DebugString() + " ";
    return errors::InvalidArgument(op, ": the queue holds components [ ", want,
                                   "], the op was built for [ ", got, "]");
  }
  return OkStatus();
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
    Status refusal = RefusalLocked(*w);
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
    Status refusal = RefusalLocked(*w);
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

void HopWaitable::Fail(const std::shared_ptr<HopWaiter>& w, const Status& status) {
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

void HopWaitable::FailAllLocked(const Status& status,
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
  return "hetsync HopUpdateQueue" + Quoted(label_) + " of " + std::to_string(dtypes_.size()) +
         " components, " + std::to_string(num_slots_) + " slots";
}

Status HopUpdateQueue::CheckComponents(const OpInputList& values) const {
  if (values.size() != static_cast<int>(dtypes_.size())) {
    return errors::InvalidArgument("hop_update_queue_enqueue: the queue", Quoted(label_),
                                   " holds ", dtypes_.size(), " components per entry, got ",
                                   values.size(), " tensors");
  }
  for (int i = 0; i < values.size(); ++i) {
    if (values[i].dtype() != dtypes_[i]) {
      return errors::InvalidArgument("hop_update_queue_enqueue: component ", i, " has dtype ",
                                     DataTypeString(values[i].dtype()), ", the queue",
                                     Quoted(label_), " expects ", DataTypeString(dtypes_[i]));
    }
    if (values[i].shape() != shapes_[i]) {
      return errors::InvalidArgument("hop_update_queue_enqueue: component ", i, " has shape ",
                                     values[i].shape().DebugString(), ", the queue",
                                     Quoted(label_), " expects ", shapes_[i].DebugString());
    }
  }
  return OkStatus();
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

Status HopUpdateQueue::FindLocked(int64_t iter, int64_t w_id, std::vector<Loc>* locs) {
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
            "hop update queue", Quoted(label_), ": entry tagged iter=", e.iter,
            " (w_id=", e.w_id, ") found in slot ", s, " while looking for iter=", iter,
            "; with ", num_slots_, " slots (max_ig = ", num_slots_ - 1,
            ") that slot may only hold iter=", iter,
            ", so the token bound on the iteration gap was violated");
      }
      if (w_id < 0 || e.w_id == w_id) locs->push_back(Loc{e.seq, s, pos});
    }
    return OkStatus();  // one slot: already in arrival order
  }
  for (int64_t s = 0; s < num_slots_; ++s) {
    const auto& slot = slots_[s];
    for (size_t pos = 0; pos < slot.size(); ++pos) {
      if (w_id < 0 || slot[pos].w_id == w_id) locs->push_back(Loc{slot[pos].seq, s, pos});
    }
  }
  std::sort(locs->begin(), locs->end(), [](const Loc& a, const Loc& b) { return a.seq < b.seq; });
  return OkStatus();
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

Status HopUpdateQueue::SizeLocked(int64_t iter, int64_t w_id, int64_t* size) {
  if (iter < 0 && w_id < 0) {
    *size = size_;
    return OkStatus();
  }
  std::vector<Loc> locs;
  TF_RETURN_IF_ERROR(FindLocked(iter, w_id, &locs));
  *size = static_cast<int64_t>(locs.size());
  return OkStatus();
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

Status HopUpdateQueue::RefusalLocked(const HopWaiter& w) { return ClosedStatusLocked(); }

Status HopUpdateQueue::ClosedStatusLocked() const {
  if (!closed_) return OkStatus();
  return errors::Cancelled("hop update queue", Quoted(label_), " is closed: ", close_message_);
}

bool HopUpdateQueue::TryCompleteLocked(HopWaiter* w) {
  if (w->kind == HopWaiter::kDequeue) {
    std::vector<Loc> locs;
    Status s = FindLocked(w->iter, w->w_id, &locs);
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
    return "hop_update_queue_dequeue on queue" + Quoted(label_) + ": waited " + waited +
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
  return "hop_update_queue_dequeue_newest on queue" + Quoted(label_) + ": waited " + waited +
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
  return "hetsync HopTokenQueue" + Quoted(label_) + " of " + std::to_string(counts_.size()) +
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

Status HopTokenQueue::RefusalLocked(const HopWaiter& w) { return CancelledStatusLocked(); }

Status HopTokenQueue::CancelledStatusLocked() const {
  if (!cancelled_) return OkStatus();
  return errors::Cancelled("hop token queue", Quoted(label_), " is cancelled: ", cancel_message_);
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
  return "hop_token_take on token queue" + Quoted(label_) + ": waited " + waited + " ms for " +
         std::to_string(w.count) + " tokens on index " + std::to_string(w.index) + ", " +
         std::to_string(counts_[w.index]) + " present (newest iteration received on that index: " +
         std::to_string(newest_[w.index]) + ")";
}

void HopTokenQueue::EmitOutputs(HopWaiter* w) {
  Tensor* out = nullptr;
  OP_REQUIRES_OK(w->ctx, w->ctx->allocate_output(0, TensorShape({}), &out));
  out->scalar<int64_t>()() = w->remaining;
}

// ---- Update-queue kernels ---------------------------------------------------

class HopUpdateQueueCreateOp : public OpKernel {
 public:
  explicit HopUpdateQueueCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    const char* op = "hop_update_queue_create";
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, op, &dtypes_, &shapes_));
    OP_REQUIRES(ctx, !dtypes_.empty(),
                errors::InvalidArgument(op, ": an entry needs at least one component"));
    for (DataType dt : dtypes_) {
      OP_REQUIRES(ctx, DataTypeCanUseMemcpy(dt) || dt == DT_STRING,
                  errors::InvalidArgument(op, ": unsupported component dtype ",
                                          DataTypeString(dt),
                                          " (numeric, bool and string dtypes only)"));
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(ctx, num_slots_ >= 1,
                errors::InvalidArgument(op, ": num_slots (max_ig + 1) must be >= 1, got ",
                                        num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name =
        "hetsync_hop_update_queue_" + std::to_string(g_hop_queue_counter++) + "_" + label_;
    auto* q = new HopUpdateQueue(label_, dtypes_, shapes_, num_slots_);
    const std::string& container = ctx->resource_manager()->default_container();
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->Create<HopUpdateQueue>(container, name, q));
    std::vector<DtypeAndPartialTensorShape> specs;
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      specs.push_back(DtypeAndPartialTensorShape{dtypes_[i], PartialTensorShape(shapes_[i].dim_sizes())});
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = MakeResourceHandle<HopUpdateQueue>(ctx, container, name, specs);
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
  int64_t num_slots_ = 1;
  std::string label_;
};

class HopUpdateQueueEnqueueOp : public OpKernel {
 public:
  explicit HopUpdateQueueEnqueueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_update_queue_enqueue";
    HopUpdateQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    OpInputList values;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &values));
    OP_REQUIRES_OK(ctx, q->CheckComponents(values));
    int64_t iter = 0, w_id = 0;
    const int n = ctx->num_inputs();
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, n - 2, op, "iteration", &iter));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, n - 1, op, "w_id", &w_id));
    OP_REQUIRES(ctx, iter >= 0, errors::InvalidArgument(op, ": iteration must be >= 0, got ", iter));
    OP_REQUIRES(ctx, w_id >= 0, errors::InvalidArgument(op, ": w_id must be >= 0, got ", w_id));
    std::vector<Tensor> entry;
    for (int i = 0; i < values.size(); ++i) entry.push_back(values[i]);  // shares the buffer
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->EnqueueLocked(iter, w_id, std::move(entry));
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopUpdateQueueDequeueOp : public AsyncOpKernel {
 public:
  explicit HopUpdateQueueDequeueOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, "hop_update_queue_dequeue", &dtypes_, &shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("greedy", &greedy_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_update_queue_dequeue";
    HopUpdateQueue* q = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q), done);
    core::ScopedUnref unref(q);
    OP_REQUIRES_OK_ASYNC(ctx, CheckSameComponents(*q, dtypes_, shapes_, op), done);
    int64_t m = 0, iter = -1, w_id = -1;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 1, op, "m", &m), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "iteration", &iter), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 3, op, "w_id", &w_id), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 4, op, &timeout_ms), done);
    OP_REQUIRES_ASYNC(ctx, m >= 0, errors::InvalidArgument(op, ": m must be >= 0, got ", m), done);
    OP_REQUIRES_ASYNC(ctx, iter >= -1,
                      errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (any), got ", iter),
                      done);
    OP_REQUIRES_ASYNC(ctx, w_id >= -1,
                      errors::InvalidArgument(op, ": w_id must be >= 0 or -1 (any), got ", w_id),
                      done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kDequeue, q, ctx, std::move(done), timeout_ms);
    w->m = m;
    w->iter = iter;
    w->w_id = w_id;
    w->greedy = greedy_;
    q->Run(std::move(w));
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
  bool greedy_ = false;
};

class HopUpdateQueueDequeueNewestOp : public AsyncOpKernel {
 public:
  explicit HopUpdateQueueDequeueNewestOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ComponentAttrs(ctx, "hop_update_queue_dequeue_newest", &dtypes_, &shapes_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_update_queue_dequeue_newest";
    HopUpdateQueue* q = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q), done);
    core::ScopedUnref unref(q);
    OP_REQUIRES_OK_ASYNC(ctx, CheckSameComponents(*q, dtypes_, shapes_, op), done);
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, TensorShapeUtils::IsVector(ids.shape()),
                      errors::InvalidArgument(op, ": w_ids must be a vector, got shape ",
                                              ids.shape().DebugString()),
                      done);
    std::vector<int64_t> w_ids;
    std::set<int64_t> seen;
    for (int64_t i = 0; i < ids.NumElements(); ++i) {
      const int64_t id = ids.vec<int64_t>()(i);
      OP_REQUIRES_ASYNC(ctx, id >= 0,
                        errors::InvalidArgument(op, ": w_ids must be >= 0, got ", id), done);
      OP_REQUIRES_ASYNC(ctx, seen.insert(id).second,
                        errors::InvalidArgument(op, ": w_ids must be distinct, ", id,
                                                " appears twice"),
                        done);
      w_ids.push_back(id);
    }
    int64_t min_iteration = 0;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "min_iteration", &min_iteration), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 3, op, &timeout_ms), done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kDequeueNewest, q, ctx, std::move(done),
                                         timeout_ms);
    w->w_ids = std::move(w_ids);
    w->min_iteration = min_iteration;
    q->Run(std::move(w));
  }

 private:
  DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
};

class HopUpdateQueueSizeOp : public OpKernel {
 public:
  explicit HopUpdateQueueSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_update_queue_size";
    HopUpdateQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    int64_t iter = -1, w_id = -1;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, op, "iteration", &iter));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "w_id", &w_id));
    OP_REQUIRES(ctx, iter >= -1,
                errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (any), got ", iter));
    OP_REQUIRES(ctx, w_id >= -1,
                errors::InvalidArgument(op, ": w_id must be >= 0 or -1 (any), got ", w_id));
    int64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      OP_REQUIRES_OK(ctx, q->SizeLocked(iter, w_id, &size));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = size;
  }
};

class HopUpdateQueueStatusOp : public OpKernel {
 public:
  explicit HopUpdateQueueStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    HopUpdateQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    int64_t c[HopUpdateQueue::kNumCounters];
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->CountersLocked(c);
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({HopUpdateQueue::kNumCounters}), &out));
    for (int i = 0; i < HopUpdateQueue::kNumCounters; ++i) out->vec<int64_t>()(i) = c[i];
  }
};

// Fails every parked waiter of a queue through `Fail` (HopUpdateQueue::CloseLocked or
// HopTokenQueue::CancelLocked) with `message`, and finishes them outside the lock.
template <class Q>
using FailLockedFn = void (Q::*)(const std::string&, std::vector<std::shared_ptr<HopWaiter>>*);

template <class Q, FailLockedFn<Q> Fail>
void FailWaiters(Q* q, const std::string& message) {
  std::vector<std::shared_ptr<HopWaiter>> failed;
  {
    std::lock_guard<std::mutex> lock(q->mu);
    (q->*Fail)(message, &failed);
  }
  HopWaitable::FinishAll(failed);
}

// Close / cancel kernel: input 0 the queue handle, input 1 a scalar string message; every parked
// and later wait fails with Cancelled(message).
template <class Q, FailLockedFn<Q> Fail>
class HopQueueFailOp : public OpKernel {
 public:
  HopQueueFailOp(OpKernelConstruction* ctx, const char* op) : OpKernel(ctx), op_(op) {}

  void Compute(OpKernelContext* ctx) override {
    Q* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    const Tensor& msg = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(msg.shape()),
                errors::InvalidArgument(op_, ": message must be a scalar string"));
    FailWaiters<Q, Fail>(q, std::string(msg.scalar<tstring>()()));
  }

 private:
  const char* const op_;
};

// Destroy kernel: fails every parked waiter with `message`, then deletes the resource.
template <class Q, FailLockedFn<Q> Fail>
class HopQueueDestroyOp : public OpKernel {
 public:
  HopQueueDestroyOp(OpKernelConstruction* ctx, const char* message) : OpKernel(ctx), message_(message) {}

  void Compute(OpKernelContext* ctx) override {
    Q* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    FailWaiters<Q, Fail>(q, message_);
    q->Unref();
    OP_REQUIRES_OK(ctx, DeleteResource<Q>(ctx, HandleFromInput(ctx, 0)));
  }

 private:
  const char* const message_;
};

class HopUpdateQueueCloseOp : public HopQueueFailOp<HopUpdateQueue, &HopUpdateQueue::CloseLocked> {
 public:
  explicit HopUpdateQueueCloseOp(OpKernelConstruction* ctx) : HopQueueFailOp(ctx, "hop_update_queue_close") {}
};

class HopUpdateQueueDestroyOp : public HopQueueDestroyOp<HopUpdateQueue, &HopUpdateQueue::CloseLocked> {
 public:
  explicit HopUpdateQueueDestroyOp(OpKernelConstruction* ctx)
      : HopQueueDestroyOp(ctx, "the queue was destroyed") {}
};

// ---- Token-queue kernels ----------------------------------------------------

namespace {

Status IndexInput(OpKernelContext* ctx, int input, const HopTokenQueue& q, const char* op,
                  int64_t* index) {
  TF_RETURN_IF_ERROR(ScalarInput(ctx, input, op, "index", index));
  if (*index < 0 || *index >= q.n()) {
    return errors::InvalidArgument(op, ": index ", *index, " is out of range [0, ", q.n(),
                                   ") of token queue", Quoted(q.label()));
  }
  return OkStatus();
}

}  // namespace

class HopTokenQueueCreateOp : public OpKernel {
 public:
  explicit HopTokenQueueCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial", &initial_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    OP_REQUIRES(ctx, n_ >= 1,
                errors::InvalidArgument("hop_token_queue_create: n must be >= 1, got ", n_));
    OP_REQUIRES(ctx, initial_ >= 0,
                errors::InvalidArgument("hop_token_queue_create: initial must be >= 0, got ",
                                        initial_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string name =
        "hetsync_hop_token_queue_" + std::to_string(g_hop_queue_counter++) + "_" + label_;
    auto* q = new HopTokenQueue(label_, n_, initial_);
    const std::string& container = ctx->resource_manager()->default_container();
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->Create<HopTokenQueue>(container, name, q));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = MakeResourceHandle<HopTokenQueue>(ctx, container, name);
  }

 private:
  int64_t n_ = 1, initial_ = 0;
  std::string label_;
};

class HopTokenTakeOp : public AsyncOpKernel {
 public:
  explicit HopTokenTakeOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const char* op = "hop_token_take";
    HopTokenQueue* q = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q), done);
    core::ScopedUnref unref(q);
    int64_t index = 0, count = 0;
    double timeout_ms = 0.0;
    OP_REQUIRES_OK_ASYNC(ctx, IndexInput(ctx, 1, *q, op, &index), done);
    OP_REQUIRES_OK_ASYNC(ctx, ScalarInput(ctx, 2, op, "count", &count), done);
    OP_REQUIRES_OK_ASYNC(ctx, TimeoutInput(ctx, 3, op, &timeout_ms), done);
    OP_REQUIRES_ASYNC(ctx, count >= 0,
                      errors::InvalidArgument(op, ": count must be >= 0, got ", count), done);
    auto w = std::make_shared<HopWaiter>(HopWaiter::kTokenTake, q, ctx, std::move(done), timeout_ms);
    w->index = index;
    w->count = count;
    q->Run(std::move(w));
  }
};

class HopTokenPutOp : public OpKernel {
 public:
  explicit HopTokenPutOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "hop_token_put";
    HopTokenQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    int64_t index = 0, count = 0, iteration = -1;
    OP_REQUIRES_OK(ctx, IndexInput(ctx, 1, *q, op, &index));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, op, "count", &count));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 3, op, "iteration", &iteration));
    OP_REQUIRES(ctx, count >= 0, errors::InvalidArgument(op, ": count must be >= 0, got ", count));
    OP_REQUIRES(ctx, iteration >= -1,
                errors::InvalidArgument(op, ": iteration must be >= 0 or -1 (none), got ",
                                        iteration));
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      OP_REQUIRES(ctx, q->counts()[index] <= std::numeric_limits<int64_t>::max() - count,
                  errors::InvalidArgument(op, ": token count of index ", index, " would overflow"));
      q->PutLocked(index, count, iteration);
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopTokenSizeOp : public OpKernel {
 public:
  explicit HopTokenSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    HopTokenQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    Tensor* counts = nullptr;
    Tensor* newest = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({q->n()}), &counts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({q->n()}), &newest));
    std::lock_guard<std::mutex> lock(q->mu);
    for (int64_t i = 0; i < q->n(); ++i) {
      counts->vec<int64_t>()(i) = q->counts()[i];
      newest->vec<int64_t>()(i) = q->newest()[i];
    }
  }
};

class HopTokenCloseOp : public OpKernel {
 public:
  explicit HopTokenCloseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    HopTokenQueue* q = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &q));
    core::ScopedUnref unref(q);
    int64_t index = 0;
    OP_REQUIRES_OK(ctx, IndexInput(ctx, 1, *q, "hop_token_close", &index));
    std::vector<std::shared_ptr<HopWaiter>> completed;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->CloseIndexLocked(index);
      q->PollLocked(&completed);
    }
    HopWaitable::FinishAll(completed);
  }
};

class HopTokenCancelOp : public HopQueueFailOp<HopTokenQueue, &HopTokenQueue::CancelLocked> {
 public:
  explicit HopTokenCancelOp(OpKernelConstruction* ctx) : HopQueueFailOp(ctx, "hop_token_cancel") {}
};

class HopTokenQueueDestroyOp : public HopQueueDestroyOp<HopTokenQueue, &HopTokenQueue::CancelLocked> {
 public:
  explicit HopTokenQueueDestroyOp(OpKernelConstruction* ctx)
      : HopQueueDestroyOp(ctx, "the token queue was destroyed") {}
};

REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueCreate").Device(DEVICE_CPU), HopUpdateQueueCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueEnqueue").Device(DEVICE_CPU), HopUpdateQueueEnqueueOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDequeue").Device(DEVICE_CPU), HopUpdateQueueDequeueOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDequeueNewest").Device(DEVICE_CPU),
                        HopUpdateQueueDequeueNewestOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueSize").Device(DEVICE_CPU), HopUpdateQueueSizeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueStatus").Device(DEVICE_CPU), HopUpdateQueueStatusOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueClose").Device(DEVICE_CPU), HopUpdateQueueCloseOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopUpdateQueueDestroy").Device(DEVICE_CPU), HopUpdateQueueDestroyOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenQueueCreate").Device(DEVICE_CPU), HopTokenQueueCreateOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenTake").Device(DEVICE_CPU), HopTokenTakeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenPut").Device(DEVICE_CPU), HopTokenPutOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenSize").Device(DEVICE_CPU), HopTokenSizeOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenClose").Device(DEVICE_CPU), HopTokenCloseOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenCancel").Device(DEVICE_CPU), HopTokenCancelOp);
REGISTER_KERNEL_BUILDER(Name("HetsyncHopTokenQueueDestroy").Device(DEVICE_CPU), HopTokenQueueDestroyOp);

}  // namespace hetsync
