#pragma once
/// `lean_mutex`: the lock of the suballocators' hot paths (pool, fixed-size, arena). CUDA-free.
///
/// Why not std::mutex: an uncontended pthread lock + unlock pair runs ~50 instructions
/// (type dispatch, elision checks, owner bookkeeping), as many as a whole fixed-size
/// allocation, and the pool takes it twice per allocate+free pair. This one is one
/// compare-and-swap to lock and a plain store to unlock.
///
/// Why the unlock is a plain store. A lock whose waiters sleep must learn at unlock
/// whether one sleeps. Learning it exactly takes a locked instruction (an exchange, or a
/// fence between the store and a load of a sleeper count), which also waits for every
/// store before it to leave the core (in the pool, stores to block nodes that miss the
/// cache), and under contention keeps the lock's line longer from the next locker. On a
/// 16-core H200 host the pool's global lock, contended by eight streams' threads, served
/// 20–30% more calls with the plain store (docs/benchmarks.md, machine EF); a single
/// thread did not move measurably. So the unlock stores "free" and then reads a count of sleepers,
/// and x86 may let that read run before the store is seen: a locker counted and put to
/// sleep just then is not woken by this unlock. It is woken by the next unlock that
/// reads its count (under contention, soon) or by its own timeout (`sleep_bound`), after
/// which it looks again. The bound only matters for such a race on a lock that then
/// stays free; a sleeper on a lock held long (a device synchronization under the pool's
/// global lock) looks again once per bound.
///
/// A contended locker spins briefly (critical sections here are tens of nanoseconds),
/// then counts itself a sleeper and sleeps on the lock word (a futex on Linux; elsewhere a
/// nap of an eighth of the bound, as nobody wakes it). Meets the Lockable requirements, so
/// std::lock_guard and std::unique_lock work with it; visible to ThreadSanitizer through
/// its atomics.
///
/// Unlike std::mutex, it must not be destroyed by a thread that learned only through the
/// lock itself that the other users are done (the last of them to unlock freeing the
/// object that holds it): an unlock reads the sleeper count after its store let the lock
/// go, so another thread's unlock may still be reading it.
#include <atomic>
#include <chrono>
#include <cstdint>

namespace mrstack::detail {

class lean_mutex {
 public:
  /// The longest a sleeping locker sleeps before it looks at the lock again.
  static constexpr std::chrono::microseconds sleep_bound{2000};

  lean_mutex() = default;
  lean_mutex(lean_mutex const&) = delete;
  lean_mutex& operator=(lean_mutex const&) = delete;

  void lock() noexcept {
    if (try_lock()) { return; }
    lock_contended();
  }

  bool try_lock() noexcept {
    std::uint32_t expected = free;
    return state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed);
  }

  void unlock() noexcept {
    state_.store(free, std::memory_order_release);
    if (sleepers_.load(std::memory_order_relaxed) != 0) { wake_one(); }
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr int spins_before_sleeping = 128;

  void lock_contended() noexcept;  // src/detail/lean_mutex.cpp
  void wake_one() noexcept;
  void sleep_while_held() noexcept;  // returns when woken, at the bound, or at once when the lock is free

  std::atomic<std::uint32_t> state_{free};
  std::atomic<std::uint32_t> sleepers_{0};  // lockers past spinning, asleep or about to be
};

}  // namespace mrstack::detail
