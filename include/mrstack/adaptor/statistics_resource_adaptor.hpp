#pragma once
/// `statistics_resource_adaptor`: counts what goes through it — bytes and allocations,
/// each as current (outstanding now), peak (most outstanding at once) and total (ever
/// allocated) — with push/pop scopes to measure a region of a program.
///
/// Scopes: `push_counters()` opens a region whose counters start at zero; until the
/// matching `pop_counters()` the adaptor's `bytes_counter()`/`allocations_counter()` are
/// the region's. A region's current value can go negative (it freed memory allocated
/// before it began). `pop_counters()` returns the region's counters and folds them into
/// the enclosing one: its total grows by the region's total, its current by the
/// region's current, and its peak becomes max(its peak, its current at the push + the
/// region's peak) — exactly the peak the enclosing region would have seen without the
/// push. Scopes nest to any depth; they belong to the adaptor, not to a thread.
///
/// When an allocation counts: from the moment the upstream returned it until its
/// deallocation starts (the decrement happens before the free is forwarded, so memory
/// handed back to the upstream and reused at once by another thread is never counted
/// twice: the peak never exceeds what the upstream really had out).
///
/// Exact, and scaling with threads. Each thread counts in a shard of its own (a cache
/// line with its own uncontended lock): its change of current and total since they were
/// last merged, and a *headroom credit*. The innermost region's peak is kept exact this
/// way: the headroom peak − current is split between a global pool and the shards'
/// credits. An allocation that fits in its shard's credit cannot make a new peak, so it
/// touches only its shard. One that does not takes the global lock, refills its credit
/// from the pool, and, if the pool is short, moves other shards' credit into it, shard by
/// shard, until it is enough, keeping each shard it took locked until it is done (so none
/// gets credit back behind it); when every shard was taken, pool + credit is exactly
/// peak − current, and when the allocation needs more, the peak
/// rises by exactly the excess — the peak the calls would have reached taken one at a
/// time in the order they took the locks. A free adds its bytes to its shard's credit.
/// Reads, push and pop take the global lock and every shard's lock, so they see one
/// consistent state: every counter is exact when read. (A thread that only allocates
/// while others only free goes to the global lock once per refill, which takes 1/128 of
/// the pool: amortized while the headroom is large, and no hoarding while it is tight.)
///
/// Overflow: counters are signed 64-bit and saturate, never wrap (a total past 2^63 − 1
/// stays there). A deallocate with a larger size than was allocated (or one of memory
/// never allocated through this adaptor) cannot be caught on the spot without tracking
/// every block (the tracking adaptor does that); its effect is clamped instead: when a
/// read finds the lifetime's current below zero — less the frees still in the upstream's
/// hands, which it may yet refuse — it is raised to that and the excess is
/// added to `overfreed_bytes()` / `overfreed_allocations()`, so current never reads as
/// negative (or as 2^64 − n to a caller that converts it) outside a scope.
///
/// Thread-safe. `name()` is "statistics". `free_bytes_held`/`release` go to the upstream.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <mrstack/detail/shard_spin_lock.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class statistics_resource_adaptor final : public memory_resource {
 public:
  /// One counted quantity.
  struct counter {
    std::int64_t value = 0;  ///< outstanding now (may be negative within a scope)
    std::int64_t peak = 0;   ///< most outstanding at once
    std::int64_t total = 0;  ///< ever allocated

    friend bool operator==(counter const&, counter const&) = default;
  };
  /// A frame: bytes and allocation counts together.
  struct counters {
    counter bytes;
    counter allocations;

    friend bool operator==(counters const&, counters const&) = default;
  };

  explicit statistics_resource_adaptor(resource_ptr upstream);
  ~statistics_resource_adaptor() override;

  /// The current region's byte counter (the whole lifetime's when no scope is open).
  [[nodiscard]] counter bytes_counter() const { return current_counters().bytes; }
  /// The current region's allocation-count counter.
  [[nodiscard]] counter allocations_counter() const { return current_counters().allocations; }
  /// Both, read together (one consistent state of every thread's counts).
  [[nodiscard]] counters current_counters() const;
  /// Open scopes (0 when only the lifetime frame exists).
  [[nodiscard]] std::size_t scope_depth() const;
  /// Bytes / allocations freed beyond what was outstanding in the lifetime (wrong-size or
  /// foreign frees), clamped away from the lifetime's current (see above).
  [[nodiscard]] std::int64_t overfreed_bytes() const;
  [[nodiscard]] std::int64_t overfreed_allocations() const;

  /// Allocations that found their thread's headroom credit short and took the global lock
  /// to refill it (a diagnostic: in steady state this stops growing; a high rate means
  /// threads are passing a tight headroom between them).
  [[nodiscard]] std::uint64_t refills() const;

  /// Opens a region with zeroed counters. Returns the enclosing region's counters as
  /// they stood at the push. Out of host memory for the region: `std::bad_alloc`, and no
  /// region is opened.
  counters push_counters();
  /// Closes the innermost region, folds it into the enclosing one and returns it. A pop
  /// without a matching push is a `logic_error`.
  counters pop_counters();

  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  static constexpr int bytes_q = 0;   // quantity indices in the shards
  static constexpr int allocs_q = 1;
  struct alignas(64) shard {
    detail::shard_spin_lock mutex;
    std::int64_t credit[2] = {0, 0};  // headroom this shard may use without the global lock
    std::int64_t delta[2] = {0, 0};   // change of the innermost region's current since the last merge
    std::int64_t total[2] = {0, 0};   // its total's growth since the last merge
    // Frees counted down and not yet accepted or refused by the upstream: the lifetime's
    // clamp leaves them be. A read between a free's count and the upstream's refusal had
    // clamped that free as an over-free, and the refusal's count back then raised the peak:
    // a refused double free under a reader left 1 allocation current and twice the real
    // peak. Under the shard's lock, as the rest.
    std::int64_t in_flight[2] = {0, 0};
  };

  /// Counts an allocation of `n` bytes (`k` = 1) as outstanding and in the totals.
  void count_up(std::int64_t n, std::int64_t k);
  void count_up_slow(shard& s, std::int64_t n, std::int64_t k);
  /// Counts a free down (and as in flight until `settle_free` or `count_back_refused`);
  /// returns the shard it used and sets `frame` to the id of the region its count goes
  /// into. Null, counting nothing, when a counter would saturate (a size no block has):
  /// a refusal could not then give back exactly what the saturation lost.
  shard* count_down(std::int64_t n, std::int64_t k, std::uint64_t& frame) noexcept;
  /// A free `count_down` would not count, after the upstream accepted it (saturating).
  void count_down_accepted(std::int64_t n, std::int64_t k) noexcept;
  /// The upstream accepted the free `count_down` counted in `s`.
  static void settle_free(shard& s, std::int64_t n, std::int64_t k) noexcept;
  /// The upstream refused it: the memory is still out. It counts again — as outstanding,
  /// not as a new allocation — in the region its count went into (or, if that region was
  /// closed since, the one it folded into), never in a region opened after the free began.
  void count_back_refused(shard& s, std::int64_t n, std::int64_t k, std::uint64_t frame);
  /// With `mutex_` and every shard lock held: merges every shard into the innermost frame;
  /// `take_credits` also moves their credits into the pool.
  void merge_locked(bool take_credits) const;
  /// The lifetime frame's clamp (see above), with everything merged.
  void clamp_lifetime_locked() const;
  /// The innermost frame as a read returns it (the lifetime's current never below zero).
  counters reported_locked() const;

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "statistics"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  std::unique_ptr<shard[]> shards_;
  std::uint64_t top_frame_id_ = 0;  // frame_ids_.back(); written under every shard lock, read under one
  // A cache line of its own, with what refills write after it: the line above (the
  // vtable pointer, upstream_, shards_) is read by every call of every thread, and a
  // refill's lock and unlock there made each of them fetch it again.
  alignas(64) mutable std::mutex mutex_;  // frames_, pool_, overfreed_; taken before any shard lock
  mutable std::vector<counters> frames_;  // back(): the innermost region, less what the shards hold
  std::vector<std::uint64_t> frame_ids_{0};  // each frame's id, rising from the bottom (a push's is new)
  std::uint64_t next_frame_id_ = 0;
  mutable std::int64_t pool_[2] = {0, 0};  // innermost peak - current - every shard's credit
  mutable std::int64_t overfreed_[2] = {0, 0};
  std::uint64_t refills_ = 0;  // under mutex_
};

}  // namespace mrstack
