#pragma once
/// `pool_memory_resource`: a coalescing, stream-ordered suballocator. It takes chunks from
/// its upstream and carves them into blocks in O(1) per call, flat in the number of live
/// blocks (design, numbers and the footprint it gives on real logs: docs/suballocators.md).
///
/// Contract:
/// - `allocate(n, s, a)`: a block of n bytes (rounded up to 256) aligned to max(a, 256)
///   (any power of two), usable on stream s at once. Good fit from a two-level
///   segregated-fit index; metadata lives out of band, so the memory may be device
///   memory the host cannot touch. Throws `out_of_memory` naming the request, the pool's
///   footprint, its free bytes, its largest free block and the maximum.
/// - `deallocate(p, n, s, a)`: the block merges with free neighbours and is reusable on s
///   at once. A pointer the pool never handed out, or freed twice, is a `logic_error`
///   (the lookup that finds the block detects it for free), and so is an alignment the
///   block cannot have (not a power of two, or one the pointer lacks); nothing is freed.
/// - Streams: a block freed on stream s is reused on s without synchronization; another
///   stream t takes it only after `cudaStreamWaitEvent(t, e)` on an event `e` recorded on
///   s no earlier than the free. Events are recorded on demand: a free records nothing;
///   when t wants s's memory, s records at its next call (which names s, so s cannot
///   have been destroyed) and parks its free memory under that event, which t then takes
///   after one wait (`record_on_demand`; RMM's event-per-free rule as an option). When
///   that stream is driven by another thread, the asking thread waits for its park (up to
///   `park_wait`, without the lock) before it grows. Blocks
///   of different streams never merge. With one stream in use the pool makes no CUDA
///   call per allocate or deallocate. Per-thread default streams are told apart by
///   thread. Rules in detail: detail/stream_ordering.hpp.
/// - Growth: when nothing fits (after taking over what other streams hold), the pool
///   returns wholly free chunks (folding their bytes into the new one) and asks its
///   upstream for a chunk of max(request, pool_size / growth_divisor,
///   minimum_growth), rounded up to growth_granularity and capped by the maximum (and by
///   the largest chunk, 1 TiB, never below the request); when the
///   upstream refuses it tries smaller sizes down to the request, then synchronizes and
///   returns wholly free chunks, and only then throws. The default policy holds the peak
///   footprint of a real PyTorch training log within 1.10x of its peak live bytes
///   (tests/pool_footprint.cpp). A request the maximum can never hold (its size, or its
///   size plus the padding its alignment may need) is refused before any of that. When
///   the block metadata cannot grow (its node limit, host memory), the request is refused
///   the same way: out_of_memory, nothing changed.
/// - `release()` returns every wholly free chunk to the upstream (synchronizing first
///   only when their free blocks belong to several streams). Destruction returns every
///   chunk, live blocks or not.
/// - Threads: used by one thread, or by threads that take turns, the pool is one structure
///   behind one lock. Once threads contend for it (`shard_after_contentions`), each thread
///   allocates blocks of up to
///   `shard_block_limit` from its own *shard* (its own lock and block metadata), which
///   takes 2 MiB-aligned slabs from the pool's global blocks as it grows (geometrically,
///   as the pool does); any thread may free any block. Before the pool grows, shards give
///   back their wholly free slabs where no synchronization is needed, and before it
///   reports out of memory, all of them (docs/suballocators.md, "Threads").
/// - Works over any upstream: cuda, cuda_async, managed, pinned_host, system, simulated.
///   The upstream is only ever asked for 256-byte alignment.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/spare_events.hpp>
#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

namespace detail {
class in_place_pool_growth;
class pool_shard_set;
struct pool_shard;
struct slab_return;
}  // namespace detail

struct pool_options {
  /// A new chunk is at least pool_size / growth_divisor: growth is geometric (few chunks,
  /// O(log) of them for any footprint) but by a small factor (1 + 1/growth_divisor), so
  /// the last chunk overshoots what the program needs by little.
  std::size_t growth_divisor = 12;
  /// A new chunk is at least this big (avoids many tiny chunks early on).
  std::size_t minimum_growth = std::size_t{4} << 20;
  /// Chunk sizes are rounded up to this (2 MiB: the device's large-page granule).
  std::size_t growth_granularity = std::size_t{2} << 20;
  /// Before growing, return wholly free chunks to the upstream and take their bytes back
  /// as part of the one new chunk: free memory scattered over small chunks becomes one
  /// contiguous range instead of staying stranded next to a growing footprint.
  /// Only chunks that need no synchronization to return are consolidated.
  bool consolidate_on_growth = true;
  /// The stream the initial chunk is taken on; it is synchronized once, after which the
  /// chunk is usable by every stream without an event.
  stream_view initial_stream{};
  /// Over an upstream with the virtual_range capability (vmm, simulated_vmm): grow one
  /// chunk in place and give whole free granules back (detail/in_place_pool_growth.hpp,
  /// docs/vmm.md); the growth settings above do not apply then. false: take separate
  /// chunks, as from any upstream.
  bool grow_in_place = true;
  /// When growing in place: give free granules back whenever more than this many bytes
  /// are free (max: only on release() and when the device runs out of memory).
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  /// Streams the user created record a CUDA event only when another stream wants their
  /// memory, or after freeing 1/1024 of the pool (at least 8 MiB), and park their free
  /// memory under it (detail/stream_ordering.hpp). false: once a second stream is in use, every free on a
  /// created stream records (RMM's rule: more CUDA calls, no memory waiting to be asked for).
  bool record_on_demand = true;
  /// On demand, with several streams, while memory is contended (always, by default): a
  /// stream also records and parks once it has freed 1/park_divisor of the pool since its
  /// last record (bounds the memory other streams cannot reach without asking; fewer
  /// records with a smaller divisor) ...
  std::size_t park_divisor = detail::park_policy::default_divisor;
  /// ... but not before it has freed this many bytes: a record costs the same whatever
  /// it covers, so in a small pool 1/park_divisor alone would record at nearly every free.
  std::size_t park_minimum = detail::park_policy::default_minimum;
  /// Memory counts as contended for this many frees on created streams after a stream
  /// asked another for memory or the pool grew; 0 (the default): always. A window suits
  /// streams that never share memory: once warm they record nothing per free, but their
  /// free memory then stays out of each other's reach (more footprint).
  std::size_t contention_window = detail::stream_owners::default_contention_window;
  /// The three settings above, as the stream-ordered core takes them.
  [[nodiscard]] detail::park_policy parks() const noexcept {
    return {park_divisor, park_minimum, contention_window};
  }
  /// How many thread shards a pool used by several threads may make (at most 64; threads
  /// beyond share them). 0: never shard — one lock for every thread.
  std::size_t thread_shards = 64;
  /// Sharding starts once a thread has found the pool's lock taken this many times: where
  /// threads take turns (PyTorch's main and autograd threads) the pool stays one
  /// structure, which holds the least memory. 0: from the second calling thread on.
  std::size_t shard_after_contentions = 256;
  /// Larger requests bypass the shards and go to the global blocks (under the one lock):
  /// shards are for the many small blocks, whose calls are the ones a lock would slow. A
  /// request counts with the padding its alignment may need (alignment - 256 bytes).
  std::size_t shard_block_limit = std::size_t{1} << 20;
  /// The seam to CUDA events; null: CUDA over device/managed/pinned memory, no-ops over
  /// host and simulated memory (see suballoc/stream_sync.hpp).
  std::shared_ptr<detail::stream_sync> stream_sync;
};

class pool_memory_resource final : public memory_resource {
 public:
  /// `initial_size` bytes are taken at once (rounded up to 256; one chunk, so at most
  /// 1 TiB: larger is a logic_error before the upstream is asked); the pool never holds
  /// more than `maximum_size` (unbounded when empty).
  explicit pool_memory_resource(resource_ptr upstream, std::size_t initial_size = 0,
                                std::optional<std::size_t> maximum_size = std::nullopt, pool_options options = {});
  ~pool_memory_resource() override;

  /// Bytes held from the upstream.
  [[nodiscard]] std::size_t pool_size() const;
  /// Bytes held free (any stream).
  [[nodiscard]] std::size_t free_bytes() const;
  /// Bytes handed out (rounded to 256).
  [[nodiscard]] std::size_t used_bytes() const;
  [[nodiscard]] std::size_t largest_free_block() const;
  [[nodiscard]] std::size_t chunk_count() const;
  [[nodiscard]] std::optional<std::size_t> maximum_size() const noexcept { return maximum_size_; }
  /// True when the pool grows in place over a virtual-range upstream (then `pool_size` is
  /// the physical memory committed, without released holes).
  [[nodiscard]] bool grows_in_place() const noexcept { return growth_ != nullptr; }
  [[nodiscard]] pool_options const& options() const noexcept { return options_; }

  struct statistics {
    std::size_t pool_size = 0;
    std::size_t free_bytes = 0;
    std::size_t used_bytes = 0;
    std::size_t largest_free_block = 0;
    std::size_t chunks = 0;
    std::size_t live_blocks = 0;
    std::size_t free_blocks = 0;
    std::size_t peak_pool_size = 0;
    std::size_t upstream_allocations = 0;  ///< chunks ever taken
    std::size_t events_recorded = 0;       ///< cross-stream handovers that recorded an event
    std::size_t stream_waits = 0;          ///< cudaStreamWaitEvent calls
    std::size_t idle_parks = 0;            ///< parks that found their stream idle and recorded nothing
    std::size_t idle_queries = 0;          ///< parks that asked whether their stream was idle (a blocking
                                           ///< or captured stream is answered "busy" with no cudaStreamQuery)
    std::size_t thread_shards = 0;         ///< shards made (0: one thread so far, or sharding off)
    std::size_t slab_bytes = 0;            ///< bytes the shards hold as slabs (part of pool_size)
    std::size_t slab_walks = 0;            ///< times a shard looked through its slabs for free ones to give back
  };
  [[nodiscard]] statistics stats() const;

  /// Every structural invariant of the pool's bookkeeping; empty when all hold (O(blocks)).
  [[nodiscard]] std::string check_invariants() const;
  /// Calls f(base, size) for every chunk (under the pool's lock: do not call the pool from f).
  template <typename F>
  void for_each_chunk(F&& f) const {
    std::lock_guard lock{mutex_};
    core_.blocks().for_each_chunk([&](detail::chunk_id, detail::block_pool::chunk_info const& c) { f(c.base, c.size); });
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }
  std::string do_name() const override { return "pool"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;
  fragmentation_info do_fragmentation() const override;

  void* grow_and_allocate(std::size_t bytes, std::size_t size, std::size_t alignment, detail::stream_ref const& s);
  /// After an allocation failed under `lock`: when it asked a stream another thread drives
  /// to park, waits for a park (detail::wait_for_asked_park) and tries again; 0 when
  /// nothing came of it.
  std::uintptr_t retry_after_park(std::unique_lock<detail::lean_mutex>& lock, std::size_t size, std::size_t alignment,
                                  detail::stream_ref const& s);
  /// Tries to take a chunk that can serve `needed` bytes; false when the cap or the upstream refuses.
  bool grow(std::size_t needed, detail::stream_ref const& s, std::string& why);
  /// Returns wholly free chunks to the upstream; the bytes returned. Without
  /// `may_synchronize`, chunks whose return would need a device synchronization stay.
  std::size_t release_free_chunks(bool may_synchronize = true, detail::stream_ref const& caller = {});
  [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::string why) const;
  /// With a maximum: refuses a request larger than the maximum, before anything grows.
  void refuse_past_maximum(std::size_t bytes) const;
  /// Where the pool would grow: refuses a request whose size with the padding its
  /// alignment may need passes the maximum (a free aligned block may serve it first).
  void refuse_padding_past_maximum(std::size_t bytes, std::size_t size, std::size_t alignment) const;
  /// A refusal of `bytes` for `why`, before its statistics are read.
  [[nodiscard]] allocation_failure refusal(std::size_t bytes, std::string why) const;
  /// The largest request a thread shard serves (the shard block limit, in whole 256 B).
  [[nodiscard]] std::size_t shard_request_limit() const noexcept;
  /// The same refusal, its footprint and free memory read again with the thread shards'.
  [[noreturn]] void throw_out_of_memory_counting_shards(allocation_failure info) const;
  /// Growing in place over a range of `granule`-byte granules: the sizes fit whole granules.
  void check_whole_granules(std::size_t initial, std::size_t granule) const;
  /// do_allocate past its size checks.
  void* allocate_checked(std::size_t bytes, std::size_t alignment, stream_view stream);
  void* grow_in_place_and_allocate(std::size_t bytes, std::size_t size, std::size_t alignment,
                                   detail::stream_ref const& s);
  /// Bytes held from the upstream: the chunks, less the holes released in place.
  [[nodiscard]] std::size_t footprint() const noexcept;

  // ---- thread shards (src/suballoc/pool_shards.cpp) ----
  /// With `shard_after_contentions` 0: true (and sharding started) when a thread other
  /// than the first calls.
  bool second_thread_arrived();
  /// A sharded pool's allocation: small blocks from the caller's shard, the rest globally.
  void* allocate_sharded(std::size_t bytes, std::size_t size, std::size_t alignment, detail::stream_ref const& s);
  /// Counts a contended lock; true once sharding has started because of it.
  bool contended();
  /// True once the shards are made; false (nothing changed) when they cannot be.
  bool start_sharding() noexcept;
  void* allocate_in_shard(std::size_t bytes, std::size_t size, std::size_t alignment, detail::stream_ref const& s);
  void* refill_and_allocate(detail::pool_shard& shard, std::uint16_t index, std::size_t bytes, std::size_t size,
                            std::size_t alignment, detail::stream_ref const& s);
  /// A 2 MiB-aligned slab of `bytes` from the global blocks (growing the pool if need be),
  /// already mapped to shard `index`; 0 when none.
  std::uintptr_t take_slab(std::size_t bytes, detail::stream_ref const& s, detail::pool_shard* held,
                           std::uint16_t index);
  /// Maps a slab just taken to shard `index` (under the global lock); on failure frees it.
  std::uintptr_t map_slab(std::uintptr_t base, std::size_t bytes, std::uint16_t index, detail::stream_ref const& s);
  /// Makes `shards`' page-map levels for [base, base + bytes), or (bytes 0) for every
  /// address the global blocks hold or may grow to, so that mapping a slab cannot fail.
  /// Under the global lock; throws std::bad_alloc with the entries unchanged.
  void reserve_slab_pages(detail::pool_shard_set& shards, std::uintptr_t base, std::size_t bytes) const;
  /// The global path of a sharded pool: drains the shards before growing and before
  /// reporting out of memory.
  void* allocate_globally(std::size_t bytes, std::size_t size, std::size_t alignment, detail::stream_ref const& s,
                          detail::pool_shard* held);
  void deallocate_in_shard(detail::pool_shard& shard, void* ptr, std::size_t bytes, std::size_t expected,
                           detail::stream_ref const& s);
  /// Takes the wholly free slabs of every shard (`held`: one the caller has locked) back
  /// into the global blocks; with `may_synchronize`, all of them (the device may be
  /// synchronized), else those that need no synchronization. Returns the bytes taken.
  std::size_t drain_shards(detail::stream_ref const& caller, bool may_synchronize, detail::pool_shard* held);
  /// Takes `shard`'s lock for a drain: tried, except in the last drain before out-of-memory.
  bool lock_for_drain(detail::pool_shard& shard, std::unique_lock<detail::lean_mutex>& lock, bool last_drain,
                             detail::pool_shard const* held);
  /// Lists `shard`'s wholly free slabs that may go back now (the caller holds its lock);
  /// they stay its chunks until return_slabs moves them.
  std::vector<detail::slab_return> collect_free_slabs(detail::pool_shard& shard, detail::stream_ref const& caller,
                                                      bool may_synchronize);
  /// At a call of `shard`'s own (its lock held): gives back the free slabs `s` may, and
  /// nothing when that fails (then the shard looks again at its next call).
  void give_back_free_slabs(detail::pool_shard& shard, detail::stream_ref const& s) noexcept;
  /// Moves the slabs out of `shard` (null: slabs in no shard) and frees them into the
  /// global blocks, under the global lock, one by one; each leaves the shard only once
  /// room for its free is made. Throws std::bad_alloc when that room cannot be had: the
  /// slabs not yet moved stay the shard's (it is asked to look again), none is lost.
  void return_slabs(detail::pool_shard* shard, std::vector<detail::slab_return> const& slabs);
  [[noreturn]] void throw_bad_free(void* ptr, std::size_t bytes, std::size_t actual) const;
  /// Sums over the shards.
  struct shard_totals {
    std::size_t slab_bytes = 0, slabs = 0, live_bytes = 0, live_blocks = 0, free_bytes = 0, free_blocks = 0;
    std::size_t largest_free_block = 0, events_recorded = 0, stream_waits = 0, shards = 0;
    std::size_t idle_parks = 0, idle_queries = 0;
  };
  /// Calls `read` with the shards' totals while every shard's lock and then the global
  /// lock are held: one snapshot, in which each slab is in its shard and a live global
  /// block (summed shard by shard, a slab going back in between was subtracted without
  /// its global block: used bytes wrapped around, found by a hostile test). `each_shard`,
  /// if given, sees every shard's pool in the same snapshot.
  void with_shard_totals(std::function<void(shard_totals const&)> const& read,
                         std::function<void(detail::stream_ordered_pool const&)> const& each_shard = {}) const;
  /// Under the global lock: true when every shard made so far is one of `locked`.
  [[nodiscard]] bool every_shard_in(std::vector<detail::pool_shard const*> const& locked) const;
  [[nodiscard]] std::string check_shards() const;
  void fill_stats(statistics& st, shard_totals const& shards) const;

  resource_ptr upstream_;
  std::optional<std::size_t> maximum_size_;
  pool_options options_;
  mutable detail::lean_mutex mutex_;  // a CAS to lock: see detail/lean_mutex.hpp
  detail::stream_ordered_pool core_;
  detail::spare_events spare_events_;  // prerecorded by frees that park (detail/spare_events.hpp)
  // core_.park_certain_above() as of the last free, read before the lock (stale is safe:
  // a needless record is harmless, a missing one is made under the lock as before)
  std::atomic<std::size_t> park_certain_above_{~std::size_t{0}};
  std::size_t peak_pool_size_ = 0;
  std::size_t upstream_allocations_ = 0;
  std::unique_ptr<detail::in_place_pool_growth> growth_;  // set over a virtual range; destroyed first
  std::atomic<std::uintptr_t> first_thread_{0};  // the thread key of the first caller
  std::atomic<std::size_t> contentions_{0};      // times a caller found the lock taken
  std::atomic<bool> sharded_{false};             // set (once) after shards_ is made
  std::atomic<std::size_t> slab_walks_{0};       // collect_free_slabs calls (stats().slab_walks)
  // Threads in a last drain before out-of-memory, waiting for other shards: statistics
  // readers stay off the shards' locks meanwhile (with_shard_totals).
  mutable std::atomic<int> drains_waiting_{0};
  std::unique_ptr<detail::pool_shard_set> shards_;
};

}  // namespace mrstack
