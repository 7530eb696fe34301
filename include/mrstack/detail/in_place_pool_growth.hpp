#pragma once
/// `in_place_pool_growth`: what `pool_memory_resource` (and the arena's global arena,
/// detail/arena_core.hpp) does differently when its upstream has the `virtual_range`
/// capability (vmm, simulated_vmm). Kept apart from the pool so the pool's own code only
/// asks "is there one?" at four places (construction, growth, deallocate, release).
///
/// Over a virtual range the pool claims the whole range and keeps ONE chunk at its base
/// that grows in place (detail/in_place_growth.hpp): new physical memory extends the free
/// block at the chunk's end, so every free byte can merge with its neighbours, and
/// `release()` gives back every whole free granule (then the granules committed are
/// exactly those live blocks touch). Release also happens above `release_threshold` free
/// bytes and when the device is out of memory, before the pool gives up.
///
/// Streams: a free block may still be used by work queued on the stream that freed it.
/// Every release first synchronizes what the pool's streams hold
/// (`stream_ordered_pool::synchronize_everything`), so unmapping a granule, or handing a
/// released hole to another stream later, never races with that work.
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include <mrstack/detail/in_place_growth.hpp>
#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/detail/virtual_range.hpp>

namespace mrstack::detail {

/// in_place_growth's view of a stream_ordered_pool for one call: memory it adds or
/// restores goes to `stream`, or — without one, or when the policy gives it to the
/// synchronized owner — to every stream at once (freshly mapped memory has no pending
/// work).
struct stream_ordered_growth_view {
  static constexpr std::size_t granularity = block_pool::granularity;
  static constexpr owner_id synchronized = block_pool::synchronized;
  static constexpr std::size_t max_chunk_size = block_pool::max_chunk_size;  // the one chunk's limit
  using range = block_pool::range;

  stream_ordered_pool& pool;
  std::optional<stream_ref> stream;

  chunk_id add_chunk(std::uintptr_t base, std::size_t size, owner_id owner) {
    return stream && owner != synchronized ? pool.add_chunk(base, size, *stream)
                                           : pool.blocks().add_chunk(base, size, synchronized);
  }
  void extend_chunk(chunk_id c, std::size_t bytes, owner_id owner) {
    if (stream && owner != synchronized) {
      pool.extend_chunk(c, bytes, *stream);
    } else {
      pool.blocks().extend_chunk(c, bytes, synchronized);
    }
  }
  std::size_t restore(std::uintptr_t address, owner_id owner) {
    return stream && owner != synchronized ? pool.restore(address, *stream) : pool.blocks().restore(address, synchronized);
  }
  std::size_t split_hole(std::uintptr_t address, std::size_t offset) { return pool.blocks().split_hole(address, offset); }
  template <typename Choose>
  std::size_t withdraw_free_ranges(Choose&& choose) {
    return pool.blocks().withdraw_free_ranges(std::forward<Choose>(choose));
  }
  template <typename F>
  void for_each_free_block(F&& f) const {
    pool.blocks().for_each_free_block(std::forward<F>(f));
  }
  [[nodiscard]] std::size_t free_bytes() const noexcept { return pool.blocks().free_bytes(); }
  [[nodiscard]] bool merges(owner_id a, owner_id b) const noexcept { return pool.blocks().merges(a, b); }
  void before_release() { (void)pool.synchronize_everything(); }
};

class in_place_pool_growth {
 public:
  /// `claimant`: who the range names as its user (the pool, or the arena's global arena).
  in_place_pool_growth(virtual_range& range, in_place_growth_options const& options,
                       std::string_view claimant = "pool")
      : policy_{range, claimant, options} {}

  /// Commits the initial size, usable by every stream.
  void start(stream_ordered_pool& pool) {
    stream_ordered_growth_view view{pool, std::nullopt};
    policy_.start(view, block_pool::synchronized);
  }
  /// Room for a block of `bytes` (a multiple of 256) aligned to `alignment` on `stream`,
  /// where the pool's search finds it; throws growth_failure.
  void grow(stream_ordered_pool& pool, std::size_t bytes, std::size_t alignment, stream_ref const& stream) {
    stream_ordered_growth_view view{pool, stream};
    pool.claim_parked_block_ending_at(policy_.growth_start_address(), stream);
    owner_id const owner = pool.owner_of(stream);
    policy_.grow(view, bytes, alignment, owner);
    if (alignment > block_pool::granularity && !pool.blocks().can_allocate(bytes, alignment, owner)) {
      // A block with room to align is there, but a segregated-fit search looks for one only
      // in its own size class and in classes all of whose blocks have that room. Grow to
      // the next class above the padded size (classes are at most 1/32 wide).
      std::size_t const padded = bytes + alignment - block_pool::granularity;
      policy_.grow(view, padded + padded / 32 + block_pool::granularity, block_pool::granularity, owner);
    }
  }
  std::size_t release(stream_ordered_pool& pool) {
    stream_ordered_growth_view view{pool, std::nullopt};
    return policy_.release(view);
  }
  /// On the pool's deallocate path: one compare unless a release threshold is set. Not
  /// while a capture may hold free memory (see stream_ordered_pool::
  /// capture_may_hold_free_memory; `caller` is the stream the current call names): the
  /// release would synchronize every stream and decommit what the graph still uses. A
  /// later free releases, or `release()`. Never fails: the free that calls it went
  /// through, and a free reported as failed is made again and refused (a double free), so
  /// what the release meets (no host memory for its holes, a decommit the driver refuses)
  /// leaves the granules committed for a later free past the threshold, or `release()`.
  void after_deallocate(stream_ordered_pool& pool, stream_ref const& caller) noexcept {
    if (!policy_.past_threshold(pool.blocks().free_bytes()) || pool.capture_may_hold_free_memory(caller)) { return; }
    stream_ordered_growth_view view{pool, std::nullopt};
    try {
      policy_.after_deallocate(view);
    } catch (...) {
    }
  }

  /// Bytes of physical memory committed for the pool (its footprint).
  [[nodiscard]] std::size_t committed_bytes() const noexcept { return policy_.committed_bytes(); }
  [[nodiscard]] in_place_growth<stream_ordered_growth_view> const& policy() const noexcept { return policy_; }

 private:
  in_place_growth<stream_ordered_growth_view> policy_;
};

}  // namespace mrstack::detail
