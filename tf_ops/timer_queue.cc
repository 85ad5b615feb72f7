#include "timer_queue.h"

namespace hetsync {

TimerQueue* TimerQueue::Global() {
  static TimerQueue* queue = new TimerQueue();
  return queue;
}

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) { thread_.detach(); }

void TimerQueue::Schedule(Clock::time_point deadline, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push(Item{deadline, next_seq_++, std::move(fn)});
  }
  cv_.notify_one();
}

void TimerQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (items_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto deadline = items_.top().deadline;
    if (Clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;  // re-check: an earlier item may have arrived
    }
    std::function<void()> fn = std::move(const_cast<Item&>(items_.top()).fn);
    items_.pop();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace hetsync
