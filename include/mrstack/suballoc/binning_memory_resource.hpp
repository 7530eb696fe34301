#pragma once
/// `binning_memory_resource`: size classes. Each bin serves the requests that fit its
/// block size (and alignment) from a resource of its own — a `fixed_size_memory_resource`
/// by default, so a served request costs a bin lookup plus an O(1) pop. Requests above
/// the largest bin go to the `large` resource (the upstream unless another is given).
///
/// Contract:
/// - `binning_memory_resource(upstream, min, max)`: one bin per power of two from `min`
///   (rounded up to a power of two, at least 256) to `max` (rounded up likewise). Custom
///   bins: `add_bin(size, resource)` (any multiple of 256, else a `logic_error`;
///   `resource` null: a fixed_size of that size over the upstream), or construct with no
///   bins and add them.
/// - A request (n, a) goes to the smallest bin whose size is >= n and whose blocks are
///   aligned to >= a; deallocate routes (n, a) the same way, so it reaches the same bin.
///   Power-of-two bins of size s are s-aligned, so large alignments are served by bins too.
/// - A free is checked by the resource it routes to (fixed_size bins check every free in
///   O(1)); when that one refuses it and another bin holds the block, the `logic_error`
///   says which bin allocated it: the size or alignment given was wrong. Nothing changes.
/// - Sizes: bins of 256 B to `max_bin_size` (1 TiB); `min_size` above `max_size`, or either
///   beyond 1 TiB, is a `logic_error` at construction.
/// - Streams, errors and thread safety are those of the bin and large resources (each
///   is thread-safe on its own; the bin table is fixed once allocation starts: `add_bin`
///   after the first allocation is a `logic_error`).
/// - `free_bytes_held()` counts the free bytes of every layer of the bins', the large
///   resource's and the upstream's stacks once, however many of them stand on it (a pool
///   under several bins); `fragmentation()` adds up each suballocator behind the bins and
///   the large resource once (an adaptor answers with its upstream's figures; the
///   suballocators are told apart by type — pool, arena, fixed_size, binning — so a
///   resource of one's own with an upstream counts as an adaptor here).
///   `release()` releases every bin, then the large resource and the upstream.
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <mrstack/resource.hpp>

namespace mrstack {

class binning_memory_resource final : public memory_resource {
 public:
  /// Power-of-two bins from `min_size` to `max_size` (both rounded up to powers of two);
  /// `max_size` 0: no bins (add them with add_bin). `large`: where bigger requests go
  /// (null: the upstream).
  binning_memory_resource(resource_ptr upstream, std::size_t min_size, std::size_t max_size, resource_ptr large = nullptr);
  static constexpr std::size_t max_bin_size = std::size_t{1} << 40;
  /// No bins yet: add them with `add_bin`.
  explicit binning_memory_resource(resource_ptr upstream, resource_ptr large = nullptr);

  /// Adds a bin of `size` bytes (a multiple of 256: a `logic_error` otherwise, as a size
  /// rounded up would replace another bin unseen) served by `resource` (null: a
  /// fixed_size resource of that size over the upstream, blocks aligned to the largest
  /// power of two dividing `size`). A bin of a size already present replaces it.
  /// `alignment`: what every block of the bin is aligned to (0: 256 B for a resource
  /// given, the blocks' own for one made here). A `logic_error`, with nothing added: a
  /// bin added after the first allocation (blocks out would be freed elsewhere, a
  /// replaced bin's memory returned while in use), or a fixed_size bin whose blocks are
  /// smaller than `size` or aligned to less than `alignment`.
  void add_bin(std::size_t size, resource_ptr resource = nullptr, std::size_t alignment = 0);

  struct bin {
    std::size_t size;
    std::size_t alignment;  ///< alignment every block of this bin has
    resource_ptr resource;
  };
  [[nodiscard]] std::vector<bin> const& bins() const noexcept { return bins_; }
  [[nodiscard]] memory_resource& large_resource() const noexcept { return *large_; }
  /// The resource a request (bytes, alignment) goes to.
  [[nodiscard]] memory_resource& resource_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept {
    return *target(bytes, alignment);
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    if (!allocated_.load(std::memory_order_relaxed)) { allocated_.store(true, std::memory_order_relaxed); }
    return target(bytes, alignment)->allocate(bytes, stream, alignment);
  }
  /// A fixed_size bin (`resource`, or the one made when it is null) must serve every
  /// request of the bin: blocks of at least `size` bytes aligned to `alignment`.
  void check_fixed_size_bin(std::size_t size, resource_ptr const& resource, std::size_t alignment) const;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    memory_resource* const routed = target(bytes, alignment);
    try {
      routed->deallocate(ptr, bytes, stream, alignment);
    } catch (logic_error const& refusal) {
      explain_bad_free(ptr, bytes, alignment, *routed, refusal.what());
      throw;
    }
  }
  /// After a refused free: throws a clearer logic_error when another bin holds `ptr` live,
  /// or when a bin refused it and no bin holds it (then it may be a large block freed with
  /// a bin's size).
  void explain_bad_free(void const* ptr, std::size_t bytes, std::size_t alignment, memory_resource const& routed_to,
                        char const* refusal) const;
  fragmentation_info do_fragmentation() const override;
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }
  std::string do_name() const override { return "binning"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;

  /// Bin lookup: `first_bin_[ceil_log2(n)]` is the first bin that may hold n bytes; a
  /// forward walk settles size and alignment (one step for power-of-two bins at the
  /// default alignment). Indexed by the size alone, not by max(size, alignment): a smaller
  /// bin whose blocks are aligned enough (a custom bin) comes first.
  [[nodiscard]] memory_resource* target(std::size_t bytes, std::size_t alignment) const noexcept {
    if (bytes > largest_bin_) { return large_; }
    unsigned const log = bytes <= 1 ? 0U : static_cast<unsigned>(std::bit_width(bytes - 1));
    for (std::size_t i = first_bin_[log]; i < bins_.size(); ++i) {
      bin const& b = bins_[i];
      if (b.size >= bytes && b.alignment >= alignment) { return b.resource.get(); }
    }
    return large_;
  }
  void rebuild_index();

  resource_ptr upstream_;
  resource_ptr large_owner_;
  memory_resource* large_;
  std::vector<bin> bins_;  // ascending size
  std::array<std::uint8_t, 65> first_bin_{};
  std::size_t largest_bin_ = 0;
  std::atomic<bool> allocated_{false};  // bins are fixed from the first allocation on
};

}  // namespace mrstack
