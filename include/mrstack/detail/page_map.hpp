#pragma once
/// `page_map<V>`: a value for each page (a power of two from 64 KiB to 4 GiB, fixed at
/// construction) of the 64-bit address space, read by any thread without a lock. CUDA-free.
///
/// Why: a free, from whatever thread, must find the structure that owns its block before
/// it can take that structure's lock (a pool's thread shard, an arena's superblock). Three
/// dependent loads answer it: a radix table whose two lower levels have 2^16 entries and
/// whose top level covers the rest. Levels are made on first use and freed only with the
/// map, so a reader never sees one vanish; they are calloc'ed, so the kernel maps fresh
/// zero pages as they are first touched and a map costs nothing for address space it
/// never covers. Entries are written when a page changes hands (rare).
///
/// `V` is a pointer or an unsigned integer; a page never set reads as `V{}`.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <type_traits>

namespace mrstack::detail {

template <typename V>
class page_map {
  static_assert(std::is_trivial_v<V> && (std::is_pointer_v<V> || std::is_unsigned_v<V>),
                "page_map values are zero-initialized by calloc and read atomically");

 public:
  explicit page_map(unsigned page_shift)
      : page_shift_{checked_shift(page_shift)},
        top_size_{std::size_t{1} << (64 - page_shift - 2 * level_bits)},
        top_{static_cast<V***>(std::calloc(top_size_, sizeof(V**)))} {
    if (top_ == nullptr) { throw std::bad_alloc(); }
  }
  ~page_map() {
    for (std::size_t t = 0; t < top_size_; ++t) {
      if (top_[t] == nullptr) { continue; }
      for (std::size_t m = 0; m < level_size; ++m) { std::free(top_[t][m]); }
      std::free(top_[t]);
    }
    std::free(top_);
  }
  page_map(page_map const&) = delete;
  page_map& operator=(page_map const&) = delete;

  /// The value set for the page holding `address` (`V{}` when none).
  [[nodiscard]] V find(std::uintptr_t address) const noexcept {
    std::uintptr_t const page = address >> page_shift_;
    V** const mid = std::atomic_ref<V**>{top_[page >> (2 * level_bits)]}.load(std::memory_order_acquire);
    if (mid == nullptr) { return V{}; }
    V* const leaf = std::atomic_ref<V*>{mid[(page >> level_bits) & level_mask]}.load(std::memory_order_acquire);
    if (leaf == nullptr) { return V{}; }
    return std::atomic_ref<V>{leaf[page & level_mask]}.load(std::memory_order_acquire);
  }

  /// Makes the levels for [base, base + size) (size > 0, not wrapping). Throws
  /// std::bad_alloc when one cannot be made; the entries are unchanged either way.
  void reserve(std::uintptr_t base, std::size_t size) {
    std::uintptr_t const first = base >> page_shift_;
    std::uintptr_t const last = (base + (size - 1)) >> page_shift_;
    for (std::uintptr_t p = first;; p = (p | level_mask) + 1) {
      (void)leaf_for(p);
      if ((p | level_mask) >= last) { break; }
    }
  }
  /// Sets every page of [base, base + size) to `value`; the range was reserved.
  void assign(std::uintptr_t base, std::size_t size, V value) noexcept {
    std::uintptr_t const first = base >> page_shift_;
    std::uintptr_t const last = (base + (size - 1)) >> page_shift_;
    for (std::uintptr_t p = first; p <= last; ++p) {
      V* const leaf = top_[p >> (2 * level_bits)][(p >> level_bits) & level_mask];
      std::atomic_ref<V>{leaf[p & level_mask]}.store(value, std::memory_order_release);
    }
  }
  /// reserve, then assign: all or nothing.
  void set(std::uintptr_t base, std::size_t size, V value) {
    reserve(base, size);
    assign(base, size, value);
  }

 private:
  static constexpr unsigned level_bits = 16;
  static constexpr std::size_t level_size = std::size_t{1} << level_bits;
  static constexpr std::uintptr_t level_mask = level_size - 1;

  static unsigned checked_shift(unsigned shift) {
    if (shift < 16 || shift > 32) { throw std::invalid_argument("page_map: pages of 2^16 to 2^32 bytes"); }
    return shift;
  }

  /// Installs a zeroed level in `slot` unless another thread got there first.
  template <typename T>
  static T* install(T*& slot) {
    std::atomic_ref<T*> ref{slot};
    if (T* existing = ref.load(std::memory_order_acquire)) { return existing; }
    auto* fresh = static_cast<T*>(std::calloc(level_size, sizeof(T)));
    if (fresh == nullptr) { throw std::bad_alloc(); }
    T* expected = nullptr;
    if (ref.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) { return fresh; }
    std::free(fresh);
    return expected;
  }
  V* leaf_for(std::uintptr_t page) {
    V** const mid = install(top_[page >> (2 * level_bits)]);
    return install(mid[(page >> level_bits) & level_mask]);
  }

  unsigned page_shift_;
  std::size_t top_size_;  // 2^(32 - page_shift): 2^0 to 2^16 entries
  V*** top_;              // read and written through std::atomic_ref
};

}  // namespace mrstack::detail
