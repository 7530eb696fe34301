#pragma once
/// `address_map`: an open-addressing hash map from a pointer-sized key to a 32-bit value,
/// the O(1) "which block starts at this address?" lookup behind every suballocator's
/// deallocate. CUDA-free.
///
/// Why this structure: block metadata lives out of band (device memory cannot hold
/// headers the host reads), so deallocate must find a block by its address alone.
/// An ordered tree costs O(log n) dependent cache misses; a radix page map over a 48-bit
/// address space at 256-byte granularity is either huge or several levels deep. Linear
/// probing over a flat array, kept at most half full, finds a key in ~1.5 probes on
/// average — usually one cache line — and never allocates except when it doubles.
/// Deletion shifts later entries back (no tombstones), so lookups stay short under
/// long-running insert/erase churn.
///
/// Keys are addresses (or stream keys); `~0` is reserved as the empty marker, which no
/// real address or stream handle ever equals. Not thread-safe (its owner locks).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mrstack::detail {

class address_map {
 public:
  static constexpr std::uint32_t npos = 0xffffffffU;
  static constexpr std::uintptr_t empty_key = ~std::uintptr_t{0};

  address_map() { rehash(64); }

  /// The value stored for `key`, or npos.
  [[nodiscard]] std::uint32_t find(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      slot const& s = slots_[i];
      if (s.key == key) { return s.value; }
      if (s.key == empty_key) { return npos; }
    }
  }

  /// Inserts `key` (which must be absent) with `value`.
  void insert(std::uintptr_t key, std::uint32_t value) {
    if ((count_ + 1) * 2 > slots_.size()) { rehash(slots_.size() * 2); }
    place(key, value);
    ++count_;
  }

  /// Sets the value of `key`, inserting it when absent.
  void assign(std::uintptr_t key, std::uint32_t value) {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      slot& s = slots_[i];
      if (s.key == key) {
        s.value = value;
        return;
      }
      if (s.key == empty_key) { break; }
    }
    insert(key, value);
  }

  /// Removes `key`; returns its value, or npos when it was absent.
  std::uint32_t erase(std::uintptr_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) { break; }
      if (slots_[i].key == empty_key) { return npos; }
    }
    std::uint32_t const value = slots_[i].value;
    // Backward-shift deletion: move later members of the probe run into the hole when
    // their home position does not lie (cyclically) between the hole and themselves.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].key == empty_key) { break; }
      std::size_t const h = home(slots_[j].key);
      bool const stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = empty_key;
    --count_;
    return value;
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  void clear() noexcept {
    for (auto& s : slots_) { s.key = empty_key; }
    count_ = 0;
  }

  /// Calls f(key, value) for every entry (any order).
  template <typename F>
  void for_each(F&& f) const {
    for (auto const& s : slots_) {
      if (s.key != empty_key) { f(s.key, s.value); }
    }
  }

 private:
  struct slot {
    std::uintptr_t key;
    std::uint32_t value;
  };

  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept {
    // Fibonacci hashing: the high bits of the product depend on every bit of the key
    // (the always-zero low bits of aligned addresses simply contribute nothing).
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void place(std::uintptr_t key, std::uint32_t value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != empty_key) { i = (i + 1) & mask_; }
    slots_[i] = slot{key, value};
  }

  void rehash(std::size_t capacity) {
    std::vector<slot> old = std::move(slots_);
    slots_.assign(capacity, slot{empty_key, 0});
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    for (auto const& s : old) {
      if (s.key != empty_key) { place(s.key, s.value); }
    }
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 0;
  std::size_t count_ = 0;
};

}  // namespace mrstack::detail
