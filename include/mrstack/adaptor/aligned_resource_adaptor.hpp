#pragma once
/// `aligned_resource_adaptor`: hands out memory aligned to more than the 256 bytes every
/// resource guarantees — to `alignment` for requests of at least `threshold` bytes, and
/// to whatever a caller asks of `allocate(bytes, stream, a)` with `a` above 256, whatever
/// the size. Requests that need no more than 256 pass straight through.
///
/// How: an over-aligned request of `n` bytes at alignment `A` asks the upstream for
/// `n + A - 256` bytes (the upstream's pointer is 256-aligned, so an `A`-aligned address
/// lies within the first `A - 256` bytes), returns that address and remembers which
/// upstream pointer it came from, so `deallocate` (called with the same size and
/// alignment, as the interface requires) hands the upstream back exactly what it gave.
/// Works over any upstream, including those that refuse alignments above 256 (cuda).
/// The memory is never touched (device memory is fine). An upstream pointer that is not
/// 256-aligned (a broken upstream: the padding would not cover the way to an aligned
/// address) is given back and the request is a `logic_error` naming the upstream.
///
/// The pointers are remembered in 16 mutex-guarded open-addressing tables chosen by
/// address (`detail::pointer_map`: no allocation per call, contention spread out), each
/// over-aligned allocation twice: by its aligned address (what `deallocate` is given) and
/// by the upstream's pointer behind it. Misuse is a `logic_error` naming the pointer, the
/// size given and the size allocated, and nothing is freed:
/// - an over-aligned deallocate of a pointer it does not remember (foreign, double), or
///   of a remembered one with another size (compared in 256-byte units, as a pool does;
///   the upstream always gets back the size it handed out) or alignment;
/// - a pass-through deallocate (a size or alignment that asks for no over-alignment) of
///   a live over-aligned allocation's own address, which the upstream never handed out;
/// - a pass-through deallocate of the upstream's pointer behind a live over-aligned
///   allocation (a stale pointer that now names the upstream block under the padding):
///   the adaptor never handed that pointer out for the block, so the upstream must not
///   see it. These cost every pass-through deallocate two table lookups under one or two
///   shards' mutexes, once any over-aligned allocation was made (until then, one relaxed load).
///
/// A free the upstream refuses (throws) leaves the block remembered, so it can be retried:
/// the tables keep its room while the upstream frees it, so putting it back allocates
/// nothing and the upstream's error is the one that propagates.
///
/// Thread-safe. `name()` is "aligned". `free_bytes_held`/`release` go to the upstream.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

#include <mrstack/detail/pointer_map.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class aligned_resource_adaptor final : public memory_resource {
 public:
  /// `alignment`: a power of two (values up to 256 only pass requests through);
  /// `threshold`: requests smaller than this keep 256 (0: every request is aligned).
  explicit aligned_resource_adaptor(resource_ptr upstream, std::size_t alignment = default_alignment,
                                    std::size_t threshold = 0);

  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::size_t threshold() const noexcept { return threshold_; }
  /// Over-aligned allocations outstanding now.
  [[nodiscard]] std::size_t outstanding_over_aligned() const;
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  /// The alignment a request of `bytes` at `requested` alignment is served with.
  [[nodiscard]] std::size_t effective_alignment(std::size_t bytes, std::size_t requested) const noexcept {
    std::size_t const configured = bytes >= threshold_ ? alignment_ : default_alignment;
    return requested > configured ? requested : configured;
  }

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "aligned"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  /// One over-aligned allocation, as seen from either of its two addresses.
  struct record {
    std::uintptr_t other;   // by aligned address: the upstream's pointer; by that: the aligned address
    std::size_t bytes;      // as the caller asked
    std::size_t alignment;  // as served (effective_alignment)
  };
  struct shard {
    std::mutex mutex;
    detail::pointer_map<record> by_aligned;   // in shard_for(aligned)
    detail::pointer_map<record> by_original;  // in shard_behind(upstream's pointer)
  };
  static constexpr std::size_t shard_count = 16;
  [[nodiscard]] shard& shard_for(std::uintptr_t address) const noexcept {
    return shards_[static_cast<std::size_t>((address >> 8) * 0x9e3779b97f4a7c15ULL >> 60) % shard_count];
  }

  /// Remembers both addresses of a new over-aligned block (throws, having remembered nothing).
  void remember(std::uintptr_t aligned, std::uintptr_t original, std::size_t bytes, std::size_t align);
  /// Forgets the over-aligned block at `aligned` and returns its record (`other`: the
  /// upstream's pointer), or throws (changing nothing) when it is not live or was
  /// allocated with another size or alignment. Both tables keep the block's room until
  /// `put_back` or `give_up_rooms`.
  record forget(std::uintptr_t aligned, std::size_t bytes, std::size_t align);
  /// Remembers again a block `forget` took out (its free was refused), in the rooms it
  /// kept: no allocation.
  void put_back(std::uintptr_t aligned, record const& r);
  /// Gives up the rooms `forget` kept, once the upstream has taken the block back.
  void give_up_rooms(std::uintptr_t aligned, std::uintptr_t original);
  /// The locks of two shards (one when they are the same), taken in address order.
  static std::pair<std::unique_lock<std::mutex>, std::unique_lock<std::mutex>> lock_both(shard& a, shard& b);
  /// Throws when a pass-through free names a live over-aligned block: its own address
  /// (freed with a size or alignment that does not ask for over-alignment) or the
  /// upstream's pointer behind it (a free of that would free the block under its owner).
  void refuse_if_over_aligned(std::uintptr_t ptr, std::size_t bytes, std::size_t alignment) const;

  /// Where the upstream's pointer `original` is remembered: by the address it aligns to at
  /// the configured alignment, so an allocation at that alignment keeps both of its
  /// entries in one shard (one lock), and a pass-through free finds it from the pointer alone.
  [[nodiscard]] shard& shard_behind(std::uintptr_t original) const noexcept {
    return shard_for(detail::align_up(original, alignment_));
  }

  resource_ptr upstream_;
  std::size_t alignment_;
  std::size_t threshold_;
  mutable std::array<shard, shard_count> shards_;
  std::atomic<bool> any_over_aligned_{false};  // set at the first over-aligned allocation, never cleared
};

}  // namespace mrstack
