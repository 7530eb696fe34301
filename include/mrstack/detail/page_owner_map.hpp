#pragma once
/// `page_owner_map`: which shard owns the 2 MiB page an address falls in, read by any
/// thread without a lock. CUDA-free.
///
/// Why: a sharded pool (pool_memory_resource with thread shards) hands whole 2 MiB-aligned
/// slabs to its shards, and a free, from whatever thread, must find the shard that holds
/// its block before it can take that shard's lock. Three dependent loads (a radix table
/// over 64-bit addresses) answer it; the table's levels are made on first use
/// and never freed before the map, so a reader never sees one vanish. Entries are written
/// when a slab moves into or out of a shard (rare: a shard takes slabs geometrically).
///
/// Values are shard index + 1; 0 means "no shard: the pool's own global blocks".
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mrstack::detail {

class page_owner_map {
 public:
  static constexpr unsigned page_shift = 21;  // 2 MiB pages
  static constexpr std::size_t page_size = std::size_t{1} << page_shift;

  page_owner_map();
  ~page_owner_map();
  page_owner_map(page_owner_map const&) = delete;
  page_owner_map& operator=(page_owner_map const&) = delete;

  /// The value set for the page holding `address` (0 when none).
  [[nodiscard]] std::uint16_t find(std::uintptr_t address) const noexcept {
    std::uintptr_t const page = address >> page_shift;
    mid_level const* mid = top_[page >> (mid_bits + leaf_bits)].load(std::memory_order_acquire);
    if (mid == nullptr) { return 0; }
    std::uint16_t const* leaf = (*mid)[(page >> leaf_bits) & mid_mask].load(std::memory_order_acquire);
    if (leaf == nullptr) { return 0; }
    return std::atomic_ref<std::uint16_t const>{leaf[page & leaf_mask]}.load(std::memory_order_acquire);
  }

  /// Sets every page of [base, base + size) to `value` (base and size multiples of
  /// page_size, the range not wrapping). Throws std::bad_alloc when a level cannot be
  /// made; then nothing changed.
  void set(std::uintptr_t base, std::size_t size, std::uint16_t value);

 private:
  // 64 - 21 = 43 bits of page number: 11 + 12 + 20.
  static constexpr unsigned leaf_bits = 20;
  static constexpr unsigned mid_bits = 12;
  static constexpr unsigned top_bits = 11;
  static constexpr std::uintptr_t leaf_mask = (std::uintptr_t{1} << leaf_bits) - 1;
  static constexpr std::uintptr_t mid_mask = (std::uintptr_t{1} << mid_bits) - 1;
  using mid_level = std::array<std::atomic<std::uint16_t*>, std::size_t{1} << mid_bits>;

  std::uint16_t* leaf_for(std::uintptr_t page);

  // 2^11 pointers to middle levels of 2^12 pointers to leaves of 2^20 entries (2 MiB, one
  // per 2 TiB of address space, made only where slabs lie): device allocations cluster,
  // so one leaf is typical.
  std::array<std::atomic<mid_level*>, std::size_t{1} << top_bits> top_{};
};

}  // namespace mrstack::detail
