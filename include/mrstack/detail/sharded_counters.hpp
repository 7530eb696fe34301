#pragma once
/// Pieces shared by the adaptors that count per thread and merge when read (statistics,
/// limiting): a shard per thread and 64-bit arithmetic that saturates instead of
/// wrapping. CUDA-free.
///
/// Why shards: one counter (or one lock) that every thread writes is one cache line that
/// moves between cores on every call; with a few threads that transfer costs more than
/// the whole suballocator below. Each thread writes its own shard (a cache line with its
/// own lock, uncontended), and whoever needs the exact sum takes every shard's lock.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <new>

namespace mrstack::detail {

/// Shards per adaptor: live threads beyond this share shards (still exact, only contended).
inline constexpr std::size_t counter_shards = 64;

/// Hands out shard indices: each thread gets the index the fewest live threads hold (the
/// lowest of those) and gives it back when it exits, so live threads share a shard only
/// when more than `counter_shards` of them use it at once, and then as evenly as they
/// can. The first version dealt ordinals from a counter that only grew: in a process whose
/// threads come and go (a benchmark's workers, a thread pool made anew) a new thread's
/// ordinal came round to a long-lived thread's (n + 64 ≡ n), and those two contended
/// for one shard while others sat unused: on 16-core H200 hosts the bare pool at 16
/// threads ran at 64 or 119 M pairs/s from run to run, the adaptors over it likewise.
/// Never destroyed: a thread may exit after static destruction began.
class shard_indices {
 public:
  static shard_indices& instance() {
    // Built in static storage, not with new: a thread's first index is taken in noexcept
    // code, where the process's first call, out of host memory, had ended the process.
    alignas(shard_indices) static unsigned char storage[sizeof(shard_indices)];
    static auto* const registry = ::new (static_cast<void*>(storage)) shard_indices;
    return *registry;
  }
  /// An index for a new live thread (counted as held until `release`).
  std::size_t acquire() noexcept {
    std::lock_guard lock{mutex_};
    std::size_t const i = least_held();
    ++holders_[i];
    return i;
  }
  void release(std::size_t index) noexcept {
    std::lock_guard lock{mutex_};
    if (index < counter_shards && holders_[index] != 0) { --holders_[index]; }
  }
  /// The index the fewest live threads hold, not taken (for a call made after its
  /// thread's index went back, from a later thread-exit destructor).
  std::size_t least_shared() noexcept {
    std::lock_guard lock{mutex_};
    return least_held();
  }

 private:
  std::size_t least_held() const noexcept {
    std::size_t best = 0;
    for (std::size_t i = 1; i < counter_shards && holders_[best] != 0; ++i) {
      if (holders_[i] < holders_[best]) { best = i; }
    }
    return best;
  }
  std::mutex mutex_;
  std::array<std::uint32_t, counter_shards> holders_{};  // live threads holding each index
};

/// The calling thread's shard index (as `this_thread_shard`) and whether the thread holds
/// it: `own` is false only for a call made after the thread's index went back at its exit
/// (from a later thread_local destructor), which borrows the least-held index.
struct thread_shard {
  std::size_t index;
  bool own;
};

inline thread_shard this_thread_shard_held() noexcept {
  // Trivially destructible, so a thread_local destructor that runs after the index went
  // back (one built before this thread's first call) still reads them legally; such a
  // late call shares the least-held index rather than one a new thread may hold alone.
  thread_local std::size_t index = counter_shards;  // counter_shards: none held
  thread_local bool given_back = false;
  if (index < counter_shards) [[likely]] { return {index, true}; }
  if (given_back) { return {shard_indices::instance().least_shared(), false}; }
  struct give_back_at_exit {
    ~give_back_at_exit() {
      shard_indices::instance().release(index);
      index = counter_shards;
      given_back = true;
    }
  };
  index = shard_indices::instance().acquire();
  thread_local give_back_at_exit const at_exit;
  (void)at_exit;
  return {index, true};
}

/// The calling thread's shard index, in [0, counter_shards): distinct among live threads
/// (up to `counter_shards` of them), given back when the thread exits.
inline std::size_t this_thread_shard() noexcept { return this_thread_shard_held().index; }

/// a + b, clamped to the int64 range instead of wrapping.
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) { return r; }
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

/// a - b, clamped to the int64 range instead of wrapping (`saturating_add(a, -b)` would
/// itself overflow for b = INT64_MIN, a counter that saturated downwards).
inline std::int64_t saturating_sub(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) { return r; }
  return b < 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

/// a + b for byte counts, stopping at SIZE_MAX instead of wrapping.
inline std::size_t saturating_add_size(std::size_t a, std::size_t b) noexcept {
  std::size_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::size_t>::max() : r;
}

/// A byte count as a signed counter increment (sizes past 2^63 - 1 saturate).
inline std::int64_t to_count(std::size_t n) noexcept {
  return n > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) ? std::numeric_limits<std::int64_t>::max()
                                                                                 : static_cast<std::int64_t>(n);
}

/// For tests: when set, a refill's pass calls it with each shard index it has taken (that
/// shard's lock still held), so a test can make other threads call while the pass runs.
/// One relaxed load a shard, on the refill path only.
inline std::atomic<void (*)(std::size_t)> shard_passed_hook{nullptr};

/// A refill's pass over the other shards, in index order: it takes each one's credit and
/// keeps that shard's lock until the pass ends, so a shard already taken cannot get credit
/// back (a free there waits). Once every shard was passed, what the caller sees is one
/// state of all of them: it may then refuse a request or raise a peak exactly. (A pass
/// that let each lock go after taking it missed frees behind it: `limiting` refused with
/// that much of the limit unused, `statistics` raised its peak past any order of the
/// calls; tests/adaptor_sharded_passes.cpp.) Callers hold their adaptor's global lock, so
/// two passes, or a pass and a reader taking every lock, never interleave, and their own
/// shard's lock, which the pass skips.
template <typename Shard>
class shard_pass {
 public:
  shard_pass(Shard* shards, Shard const& own) noexcept : shards_{shards}, own_{&own} {}
  ~shard_pass() {
    for (std::size_t i = next_; i-- > 0;) {
      if (&shards_[i] != own_) { shards_[i].mutex.unlock(); }
    }
  }
  shard_pass(shard_pass const&) = delete;
  shard_pass& operator=(shard_pass const&) = delete;

  /// Takes the next shards' credit (`take(shard&)`) until `enough()` or none is left.
  template <typename Take, typename Enough>
  void take_until(Take take, Enough enough) {
    while (next_ < counter_shards && !enough()) {
      std::size_t const i = next_;
      Shard& t = shards_[i];
      if (&t == own_) {
        ++next_;
        continue;
      }
      t.mutex.lock();
      ++next_;  // from here the destructor lets it go, whatever `take` or the hook does
      take(t);
      if (auto* hook = shard_passed_hook.load(std::memory_order_relaxed)) { hook(i); }
    }
  }

 private:
  Shard* shards_;
  Shard const* own_;
  std::size_t next_ = 0;  // shards below it are taken and locked (but the caller's own)
};

/// Holds every shard's lock (`Shard` has a `mutex` member) for a scope, taken in index
/// order. Callers hold their adaptor's global lock first, so two of these never interleave.
template <typename Shard>
class all_shards_lock {
 public:
  explicit all_shards_lock(Shard* shards) : shards_{shards} {
    for (std::size_t i = 0; i < counter_shards; ++i) { shards_[i].mutex.lock(); }
  }
  ~all_shards_lock() {
    for (std::size_t i = counter_shards; i-- > 0;) { shards_[i].mutex.unlock(); }
  }
  all_shards_lock(all_shards_lock const&) = delete;
  all_shards_lock& operator=(all_shards_lock const&) = delete;

 private:
  Shard* shards_;
};

}  // namespace mrstack::detail
