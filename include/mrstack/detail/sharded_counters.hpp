#pragma once
/// Pieces shared by the adaptors that count per thread and merge when read (statistics,
/// limiting): a shard per thread and 64-bit arithmetic that saturates instead of
/// wrapping. CUDA-free.
///
/// Why shards: one counter (or one lock) that every thread writes is one cache line that
/// moves between cores on every call; with a few threads that transfer costs more than
/// the whole suballocator below. Each thread writes its own shard (a cache line with its
/// own lock, uncontended), and whoever needs the exact sum takes every shard's lock.
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>

namespace mrstack::detail {

/// Shards per adaptor: live threads beyond this share shards (still exact, only contended).
inline constexpr std::size_t counter_shards = 64;

/// Hands out shard indices: each thread gets the lowest index no live thread holds and
/// gives it back when it exits, so live threads share a shard only when more than
/// `counter_shards` of them use it at once (then indices are dealt round-robin). The
/// first version dealt ordinals from a counter that only grew: in a process whose
/// threads come and go (a benchmark's workers, a thread pool made anew) a new thread's
/// ordinal came round to a long-lived thread's (n + 64 ≡ n), and those two contended
/// for one shard while others sat unused: on 16-core H200 hosts the bare pool at 16
/// threads ran at 64 or 119 M pairs/s from run to run, the adaptors over it likewise.
/// Never destroyed: a thread may exit after static destruction began.
class shard_indices {
 public:
  struct grant {
    std::size_t index;
    bool exclusive;  // false: dealt round-robin to a thread beyond the first 64, shared
  };
  static shard_indices& instance() {
    static auto* const registry = new shard_indices;
    return *registry;
  }
  grant acquire() noexcept {
    std::lock_guard lock{mutex_};
    if (used_ == ~std::uint64_t{0}) { return {overflow_++ % counter_shards, false}; }
    auto const i = static_cast<std::size_t>(std::countr_one(used_));
    used_ |= std::uint64_t{1} << i;
    return {i, true};
  }
  void release(grant g) noexcept {
    if (!g.exclusive) { return; }
    std::lock_guard lock{mutex_};
    used_ &= ~(std::uint64_t{1} << g.index);
  }

 private:
  static_assert(counter_shards == 64, "the set of indices in use is one 64-bit word");
  std::mutex mutex_;
  std::uint64_t used_ = 0;
  std::size_t overflow_ = 0;
};

/// The calling thread's shard index, in [0, counter_shards): distinct among live threads
/// (up to `counter_shards` of them), given back when the thread exits.
inline std::size_t this_thread_shard() noexcept {
  struct held {
    shard_indices::grant grant = shard_indices::instance().acquire();
    ~held() { shard_indices::instance().release(grant); }
  };
  thread_local held const mine;
  return mine.grant.index;
}

/// a + b, clamped to the int64 range instead of wrapping.
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) { return r; }
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

/// A byte count as a signed counter increment (sizes past 2^63 - 1 saturate).
inline std::int64_t to_count(std::size_t n) noexcept {
  return n > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) ? std::numeric_limits<std::int64_t>::max()
                                                                                 : static_cast<std::int64_t>(n);
}

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
