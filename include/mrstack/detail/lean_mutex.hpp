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
/// sees 2 wakes one sleeper. Meets the Lockable requirements, so std::lock_guard and
/// std::unique_lock work with it; visible to ThreadSanitizer through its atomics.
#include <atomic>
#include <cstdint>

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
    if (state_.exchange(free, std::memory_order_release) == held_with_sleepers) { state_.notify_one(); }
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr std::uint32_t held_with_sleepers = 2;
  static constexpr int spins_before_sleeping = 128;

  void lock_contended() noexcept {
    for (int i = 0; i < spins_before_sleeping; ++i) {
      pause();
      if (state_.load(std::memory_order_relaxed) == free && try_lock()) { return; }
    }
    // Taking the lock as "held with sleepers" may cause one needless wake-up later; that
    // is the price of never missing one.
    while (state_.exchange(held_with_sleepers, std::memory_order_acquire) != free) {
      state_.wait(held_with_sleepers, std::memory_order_relaxed);
    }
  }

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<std::uint32_t> state_{free};
};

}  // namespace mrstack::detail
