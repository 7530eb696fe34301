#pragma once
/// `shard_spin_lock`: the lock of a per-thread shard (the sharded adaptors' shards,
/// fixed_size's thread caches) whose critical sections are mostly a few table or counter
/// operations and never wait for another thread. CUDA-free.
///
/// Why not `lean_mutex`: its waiters sleep, so its unlock reads a sleeper count after
/// its store and makes a system call when the count says someone sleeps, and a waiter
/// that count misses (x86 may read it before the store is seen) sleeps until the next
/// unlock or its timeout. A shard's lock is taken almost only by its own thread, and its
/// holder never waits for anything, so waiters can afford to spin (and yield the core
/// after a while, then nap, in case the holder was preempted): nobody ever needs waking,
/// the unlock is a plain release store and nothing else, and a lock and unlock pair costs
/// one locked instruction.
///
/// Use it only where the holder never waits for a thread that may be waiting on the lock:
/// no call to another resource, no lock that such a thread could hold. A holder's work is
/// bounded but not always a few operations, and waiters wait out all of it: a
/// refill's pass and a read take many shard locks in index order under their adaptor's
/// global lock (`shard_pass`, `all_shards_lock`); tracking's insert may grow its table
/// (host memory, a rehash) and `outstanding()` copies a whole shard; a refusal or misuse
/// error builds its message with the locks held; a fixed_size thread cache's spill may
/// record a CUDA event with its cache's lock held. A waiter spins, then yields the core,
/// then naps (50 us at a time, no wake-up needed): yielding alone would never let a
/// preempted holder run under a real-time (SCHED_FIFO/RR) waiter of higher priority on
/// its core. Meets the Lockable requirements; visible to ThreadSanitizer through its
/// atomic.
#include <atomic>
#include <chrono>
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
  static constexpr int tries_before_napping = spins_before_yielding + 64;
  /// A nap needs no wake-up (so the unlock stays a plain store): the waiter looks again
  /// when it is over. Only a wait this long (a preempted holder, a refill's pass) pays it.
  static constexpr std::chrono::microseconds nap{50};

  void lock_contended() noexcept {
    for (int tries = 0;; tries += tries < tries_before_napping ? 1 : 0) {  // saturates
      // Read until it looks free before trying again: the exchange takes the cache line
      // for writing, which would slow the holder down.
      if (!held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire)) { return; }
      if (tries < spins_before_yielding) {
        cpu_pause();
      } else if (tries < tries_before_napping) {
        std::this_thread::yield();
      } else {
        // Yielding gives the core only to threads of the waiter's priority: a real-time
        // waiter that preempted the holder on its core would never let it run (the lock
        // tests' case waited ~1 s, until the kernel throttled real-time threads). Sleeping
        // lets any thread run.
        std::this_thread::sleep_for(nap);
      }
    }
  }

  std::atomic<bool> held_{false};
};

}  // namespace mrstack::detail
