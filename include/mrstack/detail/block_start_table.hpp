#pragma once
/// `block_start_table`: "which block node starts at this address?" — the lookup behind
/// `block_pool::deallocate`. CUDA-free; not thread-safe (its owner locks).
///
/// Why not `address_map`: with 1e5 live blocks the table no longer fits in the CPU's
/// nearer caches, and the slot a free lands on is a cache miss — the most expensive single
/// step of a free (measured: half of `deallocate`'s time at 1e5 live blocks). This table
/// stores 8-byte slots, half of a key+value map's 16: a 32-bit *tag* (high bits of a hash of
/// the address) and the 32-bit node index. The full address is not stored: whoever looks
/// up an address confirms a tag match against the node it names (`matches(node)`), a load
/// `deallocate` makes next anyway. Two live addresses share a tag with probability 2^-32;
/// when they do, the confirmation skips the wrong one and probing goes on, so the answer is
/// always exact.
///
/// Linear probing at a load factor of at most 1/2, backward-shift deletion (no tombstones:
/// lookups stay short under endless insert/erase churn). A slot's home is computed from its
/// tag alone, which is what lets deletion shift entries without their addresses.
///
/// The slots live in metadata memory (huge pages once the table reaches 1 MiB): lookups
/// land on random slots, so 4 KiB pages would add a TLB miss to most of them.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <mrstack/detail/metadata_memory.hpp>

namespace mrstack::detail {

class block_start_table {
 public:
  static constexpr std::uint32_t npos = 0xffffffffU;

  block_start_table() { rehash(64); }

  /// The node starting at `address` (for which `matches(node)` holds), or npos.
  template <typename Matches>
  [[nodiscard]] std::uint32_t find(std::uintptr_t address, Matches&& matches) const {
    std::size_t const i = locate(address, matches);
    return i == not_found ? npos : node_of(slots_[i]);
  }

  /// Records that `node` starts at `address` (which must not be recorded already).
  /// Throws std::bad_alloc (with nothing changed) when the table must grow and cannot;
  /// never after `reserve_one`.
  void insert(std::uintptr_t address, std::uint32_t node) {
    reserve_one();
    place(slot_of(tag_of(address), node));
    ++count_;
  }

  /// Grows the table now where one more entry needs it, so that the next `insert` cannot
  /// throw: a caller that must not fail halfway takes the room before it changes anything.
  void reserve_one() {
    if ((count_ + 1) * 2 > slots_.size()) { rehash(slots_.size() * 2); }
  }

  /// Removes the entry for `address`; returns its node, or npos when there was none.
  template <typename Matches>
  std::uint32_t erase(std::uintptr_t address, Matches&& matches) {
    std::size_t const i = locate(address, matches);
    if (i == not_found) { return npos; }
    std::uint32_t const node = node_of(slots_[i]);
    // Backward shift: later members of the probe run move into the hole unless their home
    // lies (cyclically) after the hole and at or before their own position.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j] != empty; j = (j + 1) & mask_) {
      std::size_t const h = home(tag_in(slots_[j]));
      bool const stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = empty;
    --count_;
    return node;
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  /// Starts loading the slot a lookup of `address` begins at, so the (usually missing)
  /// cache line arrives while the caller does other work.
  void prefetch(std::uintptr_t address) const noexcept { __builtin_prefetch(&slots_[home(tag_of(address))]); }

  /// Calls f(node) for every entry (any order).
  template <typename F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i] != empty) { f(node_of(slots_[i])); }
    }
  }

 private:
  // A slot: tag in the high half, node in the low half. Node npos never occurs, so the
  // all-ones word is free to mark an empty slot.
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  static constexpr std::size_t not_found = ~std::size_t{0};

  static std::uint32_t tag_of(std::uintptr_t address) noexcept {
    // Fibonacci hashing; the high half of the product depends on every bit of the address.
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(address) * 0x9E3779B97F4A7C15ULL) >> 32);
  }
  static std::uint64_t slot_of(std::uint32_t tag, std::uint32_t node) noexcept {
    return (std::uint64_t{tag} << 32) | node;
  }
  static std::uint32_t tag_in(std::uint64_t slot) noexcept { return static_cast<std::uint32_t>(slot >> 32); }
  static std::uint32_t node_of(std::uint64_t slot) noexcept { return static_cast<std::uint32_t>(slot); }
  [[nodiscard]] std::size_t home(std::uint32_t tag) const noexcept {
    // The tag's top bits: a table never exceeds 2^31 slots (2^30 live blocks).
    return static_cast<std::size_t>(tag >> shift_);
  }

  template <typename Matches>
  [[nodiscard]] std::size_t locate(std::uintptr_t address, Matches& matches) const {
    std::uint32_t const tag = tag_of(address);
    for (std::size_t i = home(tag);; i = (i + 1) & mask_) {
      std::uint64_t const s = slots_[i];
      if (s == empty) { return not_found; }
      if (tag_in(s) == tag && matches(node_of(s))) { return i; }
    }
  }

  void place(std::uint64_t s) noexcept {
    std::size_t i = home(tag_in(s));
    while (slots_[i] != empty) { i = (i + 1) & mask_; }
    slots_[i] = s;
  }

  void rehash(std::size_t capacity) {
    metadata_array<std::uint64_t> old = std::exchange(slots_, metadata_array<std::uint64_t>{capacity});
    std::fill_n(slots_.data(), capacity, empty);
    mask_ = capacity - 1;
    shift_ = 32 - static_cast<unsigned>(std::countr_zero(capacity));
    for (std::size_t i = 0; i < old.size(); ++i) {
      if (old[i] != empty) { place(old[i]); }
    }
  }

  metadata_array<std::uint64_t> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 0;
  std::size_t count_ = 0;
};

}  // namespace mrstack::detail
