// A process-wide timer thread: runs callbacks at given deadlines.
//
// Used by asynchronous kernels that must wait without holding one of
// TensorFlow's inter-op threads (the delay op). One thread serves every
// kernel; callbacks run on that thread and must be short (they call the
// AsyncOpKernel's `done`).

#ifndef HETSYNC_TF_OPS_TIMER_QUEUE_H_
#define HETSYNC_TF_OPS_TIMER_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace hetsync {

class TimerQueue {
 public:
  using Clock = std::chrono::steady_clock;

  // The shared instance; created on first use, never destroyed (its thread
  // may still be serving callbacks while the process exits).
  static TimerQueue* Global();

  // Runs `fn` on the timer thread once `deadline` has passed.
  void Schedule(Clock::time_point deadline, std::function<void()> fn);

 private:
  TimerQueue();
  void Loop();

  struct Item {
    Clock::time_point deadline;
    uint64_t seq;  // FIFO order among equal deadlines
    std::function<void()> fn;
    bool operator>(const Item& o) const {
      return deadline != o.deadline ? deadline > o.deadline : seq > o.seq;
    }
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> items_;
  uint64_t next_seq_ = 0;
  std::thread thread_;
};

}  // namespace hetsync

#endif  // HETSYNC_TF_OPS_TIMER_QUEUE_H_
