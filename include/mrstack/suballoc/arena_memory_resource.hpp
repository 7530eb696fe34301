#pragma once
/// `arena_memory_resource`: the suballocator for many threads. A global arena of
/// superblocks plus one arena per stream — every thread's per-thread default stream
/// (`cudaStreamPerThread`) is a stream of its own — so threads allocating small blocks
/// on their own streams never wait for one another (design: detail/arena_core.hpp,
/// numbers: docs/suballocators.md).
///
/// Contract:
/// - The arena takes `arena_size` bytes (rounded up to whole superblocks) from its
///   upstream once, at construction, and never grows: it is the memory budget.
/// - Small requests (<= `max_small_size`, default 1 MiB, alignment 256) come from the
///   calling stream's arena: size classes of at most 25% rounding, O(1), one uncontended
///   lock. Larger requests, or larger alignments (any power of two), come from the global
///   arena: a coalescing, stream-ordered pool (as `pool_memory_resource`).
/// - Streams: a block is reused at once by the stream that freed it. A small block freed
///   on another stream than the one whose arena it came from synchronizes the freeing
///   stream first (the block's own arena reuses it without further ado); superblocks and
///   large blocks move between streams with an event wait (lazily recorded). One stream
///   in use: no CUDA calls.
/// - On exhaustion the arena returns every stream arena's wholly free superblocks to the
///   global arena and retries, then synchronizes the device and retries; then throws
///   `out_of_memory` naming the request, the arena size, its free bytes and its largest
///   free block.
/// - `release()` returns wholly free superblocks to the global arena and, when streams
///   other than one hold free memory, synchronizes the device so it all merges (the
///   region itself stays until destruction). Destruction returns the region to the upstream.
/// - A foreign or double free is a `logic_error`. Thread-safe.
#include <cstddef>
#include <memory>

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
  /// it has more hands all but this many back in one trip.
  std::size_t empty_superblocks_kept = 4;
  /// The seam to CUDA events (null: CUDA over device memory, no-ops over host/simulated).
  std::shared_ptr<detail::stream_sync> stream_sync;
};

class arena_memory_resource final : public memory_resource {
 public:
  arena_memory_resource(resource_ptr upstream, std::size_t arena_size, arena_options options = {});
  ~arena_memory_resource() override;

  [[nodiscard]] std::size_t arena_size() const noexcept { return usable_size_; }
  [[nodiscard]] detail::arena_core::statistics stats() const { return core_->stats(); }
  /// Every structural invariant; empty when all hold (takes every lock: for tests).
  [[nodiscard]] std::string check_invariants() const { return core_->check_invariants(); }
  /// The managed range [base, base + arena_size()).
  [[nodiscard]] void* base() const noexcept { return reinterpret_cast<void*>(base_); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }
  std::string do_name() const override { return "arena"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;

  resource_ptr upstream_;
  void* region_ = nullptr;
  std::size_t region_size_ = 0;
  std::uintptr_t base_ = 0;
  std::size_t usable_size_ = 0;
  std::unique_ptr<detail::arena_core> core_;
};

}  // namespace mrstack
