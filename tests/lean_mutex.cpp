// lean_mutex: mutual exclusion under contention, including the sleeping path.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>

using mrstack::detail::lean_mutex;

TEST_CASE("lean_mutex: a plain counter stays exact under 8 contending threads") {
  lean_mutex mutex;
  std::size_t counter = 0;  // not atomic: only the lock protects it
  constexpr int threads = 8;
  constexpr int rounds = 50000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard lock{mutex};
        // A read-modify-write split in two: a lost update shows when two threads overlap.
        std::size_t const seen = counter;
        if (i % 1024 == 0) { std::this_thread::yield(); }
        counter = seen + 1;
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(counter == std::size_t{threads} * rounds);
}

TEST_CASE("lean_mutex: a waiter that went to sleep is woken by unlock") {
  lean_mutex mutex;
  mutex.lock();
  CHECK_FALSE(mutex.try_lock());
  bool entered = false;
  std::thread waiter([&] {
    std::lock_guard lock{mutex};  // spins, then sleeps: the holder keeps it for 200 ms
    entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  mutex.unlock();
  waiter.join();  // hangs (and the test times out) if the wake-up were lost
  CHECK(entered);
  CHECK(mutex.try_lock());
  mutex.unlock();
}
