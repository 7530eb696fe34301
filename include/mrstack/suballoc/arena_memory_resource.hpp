#pragma once
/// `arena_memory_resource`: the suballocator for many threads. A global arena of
/// superblocks plus one arena per stream — every thread's per-thread default stream
/// (`cudaStreamPerThread`) is a stream of its own — so threads allocating small blocks
/// on their own streams never wait for one another (design: detail/arena_core.hpp,
/// numbers: docs/suballocators.md).
///
/// Contract:
/// - `arena_size` (rounded up to whole superblocks) is a maximum: the arena holds at most
///   that many bytes from its upstream at once. It takes memory when first needed, in
///   chunks of max(request, held / `growth_divisor`, `minimum_growth`); wholly free chunks
///   go back to the upstream whenever the arena holds more than `max_free_bytes` free
///   outside its stream arenas (so it holds at most live bytes + `max_free_bytes` + what
///   the stream arenas keep + the free space inside partly used chunks), before it grows,
///   and on `release()`. (A chunk whose free memory several streams, or another thread's
///   per-thread stream, own needs a device synchronization to go back: it waits for
///   `release()` or exhaustion, so with many streams the bound is a target.) Superblocks
///   are carved aligned to their size: from an upstream that aligns only to 256 bytes, a
///   chunk may lose up to a superblock to padding (free for large blocks), and an arena of
///   one superblock serves small blocks only when the upstream's chunk is aligned. With
///   `eager`, it takes `arena_size` plus room to align its first superblock (a superblock
///   less 256 bytes) at construction and keeps it until destruction.
/// - Small requests (<= `max_small_size`, default 1 MiB, alignment 256) come from the
///   calling stream's arena: size classes of at most 25% rounding, O(1), one uncontended
///   lock. Threads that share a stream and contend for its arena get one arena each on
///   it (`thread_shards`). Larger requests, or larger alignments (any power of two), come from the global
///   arena: a coalescing, stream-ordered pool (as `pool_memory_resource`).
/// - Streams: a block is reused at once by the stream that freed it. A small block freed
///   on another stream than the one whose arena it came from synchronizes the freeing
///   stream first (the block's own arena reuses it without further ado); superblocks
///   move between streams with an event wait (recorded when a stream arena hands a batch
///   back while several streams are in use), large blocks too (lazily recorded). One
///   stream in use: no CUDA calls.
/// - On exhaustion the arena returns every stream arena's wholly free superblocks to the
///   global arena and retries, then synchronizes the device and retries; then throws
///   `out_of_memory` naming the request, the arena size, its free bytes and its largest
///   free block.
/// - `release()` returns wholly free superblocks to the global arena and, when streams
///   other than one hold free memory, synchronizes the device so it all merges, then
///   gives every wholly free chunk back to the upstream (not with `eager`: that region
///   stays until destruction). Destruction returns every chunk to the upstream.
/// - A foreign, double, wrong-size, wrong-alignment or interior free is a `logic_error`
///   naming the pointer, the size and alignment given and the block's size (or
///   alignment) where one is live there, and nothing is freed, nor the stream it names
///   synchronized or given an arena (a large block's second
///   free too, after its range was carved into superblocks); so is a free whose alignment
///   is not a power of two or whose size exceeds `arena_size()`.
/// - `out_of_memory` says "upstream refused" with the upstream's reason only when that
///   call's own growth was refused; otherwise the maximum size is reached.
///   Thread-safe.
#include <cstddef>
#include <memory>
#include <string>

#include <mrstack/detail/arena_core.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

struct arena_options {
  /// Superblock size: a power of two from 64 KiB to 16 MiB.
  std::size_t superblock_size = std::size_t{4} << 20;
  /// Requests up to this size go to the stream arenas (at most half a superblock).
  std::size_t max_small_size = std::size_t{1} << 20;
  /// Wholly free superblocks a stream arena keeps. It takes up to twice this many from
  /// the global arena per trip to its lock, holds up to twice this many spares, and when
  /// it has more hands all but this many back in one trip (to the depot, where other
  /// stream arenas take them first). An arena that owns many superblocks holds and moves
  /// more: up to an eighth of them (at most 64 a trip from the depot), so a thread
  /// growing to gigabytes of small blocks makes a few dozen trips, not hundreds. 0: it
  /// keeps nothing; at most `max_empty_superblocks_kept` (a `logic_error` otherwise).
  std::size_t empty_superblocks_kept = 4;
  static constexpr std::size_t max_empty_superblocks_kept = std::size_t{1} << 20;
  /// Take the whole `arena_size` from the upstream at construction and keep it until
  /// destruction (no growth, no return): one upstream call, addresses fixed up front.
  bool eager = false;
  /// Free bytes the global arena may hold before wholly free chunks go back to the upstream.
  /// The default, a quarter of the arena's size, keeps a training loop's memory between
  /// iterations: a small bound made the arena hand its chunks back and take them again
  /// with cudaMalloc on every iteration (about 7 us an allocation replaying a ResNet-50
  /// log on an H200, against 50-100 ns with the memory kept). Set it lower to share the
  /// device more eagerly.
  static constexpr std::size_t a_quarter_of_the_size = ~std::size_t{0};
  std::size_t max_free_bytes = a_quarter_of_the_size;
  /// A new chunk is at least (bytes held) / this, and at least `minimum_growth`. 12, as
  /// the pool's: chunks of a quarter overshot by up to a quarter, and on an H200 host the
  /// sample ResNet-50 log held 1.208x its peak live with 4 against 1.081x with 12, and
  /// the multi-stream benchmark 1.02-1.63x the cap against 1.10-1.36x. The price is more,
  /// smaller cudaMallocs while growing: that log's cold replay cost 399 ns a call with 4
  /// against 798 (the same 55-59 ns once grown).
  std::size_t growth_divisor = 12;
  std::size_t minimum_growth = std::size_t{32} << 20;
  /// Over a virtual range (vmm, simulated_vmm) and not `eager`: the global arena is one
  /// chunk grown in place by the granules a request lacks, and free granules go back
  /// past `max_free_bytes` (the growth divisor and minimum then do not apply). False:
  /// chunks through the upstream's allocate, as over any other upstream.
  bool grow_in_place = true;
  /// Threads sharing one stream (one they created, or the legacy default stream) share
  /// its arena and its lock. Once they found that lock taken `shard_after_contentions`
  /// times (0: once a second thread calls on the stream), each thread gets an arena of
  /// its own on the stream, as threads on their per-thread default streams have: 16
  /// threads on one stream of an H200 host made 0.78 M calls/s through the one arena
  /// (docs/suballocators.md). Each such arena keeps its own spares, as a stream's does.
  bool thread_shards = true;
  std::size_t shard_after_contentions = 256;
  /// The seam to CUDA events (null: CUDA over device memory, no-ops over host/simulated).
  std::shared_ptr<detail::stream_sync> stream_sync;
};

class arena_memory_resource final : public memory_resource {
 public:
  arena_memory_resource(resource_ptr upstream, std::size_t arena_size, arena_options options = {});
  ~arena_memory_resource() override;

  /// `arena_size` rounded up to whole superblocks: the most bytes the arena holds from its
  /// upstream. With `eager` it holds this plus a superblock less 256 bytes (room to align
  /// its first superblock), from construction to destruction.
  [[nodiscard]] std::size_t arena_size() const noexcept { return usable_size_; }
  [[nodiscard]] detail::arena_core::statistics stats() const { return core_->stats(); }
  /// Bytes held from the upstream now.
  [[nodiscard]] std::size_t held_bytes() const { return core_->stats().held_bytes; }
  /// True over a virtual range with `grow_in_place` (and not `eager`).
  [[nodiscard]] bool grows_in_place() const noexcept { return core_->grows_in_place(); }
  /// Every structural invariant; empty when all hold (takes every lock: for tests).
  [[nodiscard]] std::string check_invariants() const { return core_->check_invariants(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  /// A refused free's logic_error: the pointer, the size and alignment given, and the
  /// live block's where one starts there.
  [[noreturn]] void refuse_free(void* ptr, std::size_t bytes, std::size_t alignment) const;
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }
  std::string do_name() const override { return "arena"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;
  fragmentation_info do_fragmentation() const override;

  /// The core's view of the upstream: out_of_memory becomes 0 (the core then reclaims,
  /// synchronizes, and the resource reports the refusal with the reason this call's
  /// growth was refused for, if it was).
  class chunk_source final : public detail::arena_upstream {
   public:
    explicit chunk_source(memory_resource& up) : up_{up} {}
    std::uintptr_t allocate(std::size_t size, detail::stream_ref const& s) override;
    void deallocate(std::uintptr_t base, std::size_t size, detail::stream_ref const& s) noexcept override;
    void refused(std::string const& why) const override;
   private:
    memory_resource& up_;
  };

  resource_ptr upstream_;
  std::size_t usable_size_ = 0;
  chunk_source source_;
  std::unique_ptr<detail::arena_core> core_;  // after source_: destroyed first, returning its chunks there
};

}  // namespace mrstack
