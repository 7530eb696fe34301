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
#include <cstddef>
#include <cstdint>
#include <limits>

namespace mrstack::detail {

/// Shards per adaptor: threads beyond this share shards (still exact, only contended).
inline constexpr std::size_t counter_shards = 64;

/// The calling thread's shard index, in [0, counter_shards): threads get consecutive
/// ordinals as they first ask, so up to `counter_shards` threads never share one.
inline std::size_t this_thread_shard() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local std::size_t const mine = next.fetch_add(1, std::memory_order_relaxed) % counter_shards;
  return mine;
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
