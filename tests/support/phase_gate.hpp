#pragma once
// Steps two test threads through numbered phases: one advances to phase p, the other waits
// until phase p is reached. Used where a test needs "thread 1 freed, now thread 2 takes".
#include <condition_variable>
#include <mutex>

namespace mrstack::test {

class phase_gate {
 public:
  void wait_for(int p) {
    std::unique_lock lock{mutex_};
    reached_.wait(lock, [&] { return phase_ >= p; });
  }
  void advance(int p) {
    {
      std::lock_guard lock{mutex_};
      phase_ = p;
    }
    reached_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable reached_;
  int phase_ = 0;
};

}  // namespace mrstack::test
