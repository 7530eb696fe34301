// The hot paths' own locks: lean_mutex (spins, then sleeps) and shard_spin_lock (spins,
// then yields): mutual exclusion under contention, try_lock, and lean_mutex's sleeping path.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/shard_spin_lock.hpp>

using mrstack::detail::lean_mutex;
using mrstack::detail::shard_spin_lock;

TEMPLATE_TEST_CASE("a plain counter stays exact under 8 contending threads", "", lean_mutex, shard_spin_lock) {
  TestType mutex;
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

TEMPLATE_TEST_CASE("try_lock fails while held and succeeds once let go", "", lean_mutex, shard_spin_lock) {
  TestType mutex;
  CHECK(mutex.try_lock());
  CHECK_FALSE(mutex.try_lock());
  bool other_got_it = true;
  std::thread([&] { other_got_it = mutex.try_lock(); }).join();
  CHECK_FALSE(other_got_it);
  mutex.unlock();
  std::thread([&] {
    other_got_it = mutex.try_lock();
    if (other_got_it) { mutex.unlock(); }
  }).join();
  CHECK(other_got_it);
}

TEST_CASE("shard_spin_lock: a waiter gets the lock of a holder that keeps it past the spinning") {
  shard_spin_lock mutex;
  mutex.lock();
  bool entered = false;
  std::thread waiter([&] {
    std::lock_guard lock{mutex};  // spins, then yields the core until the holder lets go
    entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(entered);
  mutex.unlock();
  waiter.join();
  CHECK(entered);
}
