#pragma once
/// `lean_mutex`: the lock of the suballocators' hot paths (pool, fixed-size). CUDA-free.
///
/// Why not std::mutex: an uncontended pthread lock + unlock pair runs ~50 instructions
/// (type dispatch, elision checks, owner bookkeeping), as many as a whole fixed-size
/// allocation, and the pool takes it twice per allocate+free pair. This one is a single
/// compare-and-swap to lock and a single exchange to unlock while nobody waits.
///
/// The classic three-state futex lock: 0 free, 1 held, 2 held and someone may sleep. A
/// contended locker spins briefly (critical sections here are tens of nanoseconds), then
/// marks the lock 2 and sleeps in `std::atomic::wait` (a futex on Linux); an unlock that
/// sees 2 wakes one sleeper — if a count of sleepers says there is one. Without the count,
/// a woken locker leaves the state at 2 (it cannot know whether others sleep), and under
/// steady contention every later unlock made a futex system call for nobody: at 8 threads
/// on the pool's global lock, a microsecond per call on the unlocking thread. Meets the
/// Lockable requirements, so std::lock_guard and std::unique_lock work with it; visible
/// to ThreadSanitizer through its atomics.
#include <atomic>
#include <cstdint>

#include <mrstack/detail/cpu_pause.hpp>

namespace mrstack::detail {

class lean_mutex {
 public:
  lean_mutex() = default;
  lean_mutex(lean_mutex const&) = delete;
  lean_mutex& operator=(lean_mutex const&) = delete;

  void lock() noexcept {
    std::uint32_t expected = free;
    if (state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed)) {
      return;
    }
    lock_contended();
  }

  bool try_lock() noexcept {
    std::uint32_t expected = free;
    return state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed);
  }

  void unlock() noexcept {
    // seq_cst pairs with the sleeper's count-then-mark: an unlock that reads the mark 2 a
    // sleeper set also sees that sleeper counted.
    if (state_.exchange(free, std::memory_order_seq_cst) == held_with_sleepers &&
        sleepers_.load(std::memory_order_seq_cst) != 0) {
      state_.notify_one();
    }
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr std::uint32_t held_with_sleepers = 2;
  static constexpr int spins_before_sleeping = 128;

  void lock_contended() noexcept {
    for (int i = 0; i < spins_before_sleeping; ++i) {
      cpu_pause();
      if (state_.load(std::memory_order_relaxed) == free && try_lock()) { return; }
    }
    // Counted before marking: an unlock that sees the mark sees the count. Taking the lock
    // as "held with sleepers" is the price of never missing a wake-up; the count keeps
    // that from costing a system call when nobody sleeps.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (state_.exchange(held_with_sleepers, std::memory_order_seq_cst) != free) {
      state_.wait(held_with_sleepers, std::memory_order_relaxed);
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }


  std::atomic<std::uint32_t> state_{free};
  std::atomic<std::uint32_t> sleepers_{0};  // lockers past spinning, asleep or about to be
};

}  // namespace mrstack::detail
