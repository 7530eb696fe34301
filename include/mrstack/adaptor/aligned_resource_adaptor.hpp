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
/// The memory is never touched (device memory is fine).
///
/// The pointers are remembered in 16 mutex-guarded open-addressing tables chosen by
/// address (`detail::pointer_map`: no allocation per call, contention spread out). A
/// deallocate of an over-aligned pointer it does not remember is a `logic_error`.
///
/// Thread-safe. `name()` is "aligned". `free_bytes_held`/`release` go to the upstream.
#include <array>
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

  struct shard {
    std::mutex mutex;
    detail::pointer_map<std::uintptr_t> original;  // aligned address -> upstream's pointer
  };
  static constexpr std::size_t shard_count = 16;
  [[nodiscard]] shard& shard_for(std::uintptr_t address) const noexcept {
    return shards_[static_cast<std::size_t>((address >> 8) * 0x9e3779b97f4a7c15ULL >> 60) % shard_count];
  }

  resource_ptr upstream_;
  std::size_t alignment_;
  std::size_t threshold_;
  mutable std::array<shard, shard_count> shards_;
};

}  // namespace mrstack
