#pragma once
/// `shard_spin_lock`: the lock of a per-thread shard whose critical sections are a few
/// table or counter operations and never block. CUDA-free.
///
/// Why not `lean_mutex`: a lock that lets waiters sleep must learn at unlock whether
/// anyone sleeps, which on x86 takes a locked exchange (a plain store followed by a load
/// of a sleeper count can be reordered and lose a wake-up). So every lean_mutex lock and
/// unlock pair is two locked instructions. A shard's lock is taken almost only by its own
/// thread, and its holder never waits for anything, so waiters can afford to spin (and
/// yield the core after a while, in case the holder was preempted): the unlock is then a
/// plain release store, and a lock and unlock pair costs one locked instruction.
///
/// Use it only where the holder does bounded work: no call to another resource, no
/// allocation that could wait, no other lock taken. Meets the Lockable requirements;
/// visible to ThreadSanitizer through its atomic.
#include <atomic>
#include <thread>

#include <mrstack/detail/cpu_pause.hpp>

namespace mrstack::detail {

class shard_spin_lock {
 public:
  shard_spin_lock() = default;
  shard_spin_lock(shard_spin_lock const&) = delete;
  shard_spin_lock& operator=(shard_spin_lock const&) = delete;

  void lock() noexcept {
    if (!held_.exchange(true, std::memory_order_acquire)) { return; }
    lock_contended();
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  static constexpr int spins_before_yielding = 64;

  void lock_contended() noexcept {
    for (int spins = 0;; ++spins) {
      // Read until it looks free before trying again: the exchange takes the cache line
      // for writing, which would slow the holder down.
      if (!held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire)) { return; }
      if (spins < spins_before_yielding) {
        cpu_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }


  std::atomic<bool> held_{false};
};

}  // namespace mrstack::detail
