#pragma once
/// `pointer_map<V>`: a small open-addressing hash map from a non-null address to a
/// trivially copyable value. CUDA-free; not thread-safe (callers shard it under mutexes).
///
/// Why not `std::unordered_map`: it allocates a node per insert, and the adaptors that
/// remember pointers (aligned, tracking) sit on the allocation hot path. This table keeps
/// its entries in one array, so an insert allocates only when the table grows (amortized,
/// doubling), never per call. Linear probing with backward-shift deletion: no tombstones,
/// so lookups stay short however long the program runs. Address 0 marks an empty slot,
/// which is why keys must be non-null (resources never hand out nullptr).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace mrstack::detail {

template <typename V>
class pointer_map {
  static_assert(std::is_trivially_copyable_v<V>, "pointer_map values are copied around on growth");

 public:
  pointer_map() = default;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Inserts `key -> value`. Returns false (and changes nothing) when `key` is already there.
  bool insert(std::uintptr_t key, V const& value) {
    // Load factor <= 1/2 keeps probes short; rooms kept for put_back count as taken.
    if ((size_ + kept_ + 1) * 2 > capacity_) { grow(); }
    return place(key, value);
  }

  /// Removes `key` but keeps its room until `put_back` or `give_up_room`: meanwhile the
  /// table grows for other inserts as if the entry were still there, so putting it back
  /// never needs host memory. For a caller that must be able to undo the removal (a free
  /// the layer below refuses). Returns false (nothing kept) when `key` was not there.
  bool erase_keeping_room(std::uintptr_t key) noexcept {
    if (!erase(key)) { return false; }
    ++kept_;
    return true;
  }
  /// Inserts into a room kept by `erase_keeping_room`, which it uses up; never allocates.
  /// Returns false (the room given up all the same) when `key` is already there.
  bool put_back(std::uintptr_t key, V const& value) noexcept {
    --kept_;
    return place(key, value);  // size_ + kept_ <= capacity_ / 2 before: a slot is free
  }
  /// Gives up a room kept by `erase_keeping_room`: the entry is gone for good.
  void give_up_room() noexcept { --kept_; }

  /// The value for `key`, or nullptr.
  [[nodiscard]] V* find(std::uintptr_t key) noexcept {
    if (capacity_ == 0) { return nullptr; }
    for (std::size_t i = slot_of(key); slots_[i].key != 0; i = (i + 1) & mask()) {
      if (slots_[i].key == key) { return &slots_[i].value; }
    }
    return nullptr;
  }
  [[nodiscard]] V const* find(std::uintptr_t key) const noexcept { return const_cast<pointer_map*>(this)->find(key); }

  /// Removes `key`; returns false when it was not there.
  bool erase(std::uintptr_t key) noexcept {
    if (capacity_ == 0) { return false; }
    std::size_t i = slot_of(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) { return false; }
      i = (i + 1) & mask();
    }
    // Backward-shift deletion: pull later members of the probe run into the hole so no
    // lookup ever has to step over a dead slot.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      std::size_t const home = slot_of(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      bool const home_after_hole = ((j - home) & mask()) < ((j - hole) & mask());
      if (!home_after_hole) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = 0;
    --size_;
    return true;
  }

  /// Calls `f(key, value)` for every entry, in no particular order.
  template <typename F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != 0) { f(slots_[i].key, slots_[i].value); }
    }
  }

 private:
  struct slot {
    std::uintptr_t key;
    V value;
  };

  /// Stores `key -> value` in the slots there are (one is free: the callers keep the load
  /// factor); false when `key` is already there.
  bool place(std::uintptr_t key, V const& value) noexcept {
    std::size_t i = slot_of(key);
    while (slots_[i].key != 0) {
      if (slots_[i].key == key) { return false; }
      i = (i + 1) & mask();
    }
    slots_[i] = slot{key, value};
    ++size_;
    return true;
  }

  [[nodiscard]] std::size_t mask() const noexcept { return capacity_ - 1; }
  [[nodiscard]] std::size_t slot_of(std::uintptr_t key) const noexcept {
    // Resource addresses are multiples of 256, so the low bits carry nothing: mix them
    // (a 64-bit multiplicative hash) and take the high bits.
    std::uint64_t const h = static_cast<std::uint64_t>(key) * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(h >> 32) & mask();
  }

  void grow() {
    std::size_t const new_capacity = capacity_ == 0 ? 64 : capacity_ * 2;
    // The new array first: when it cannot be had, the exception leaves the table as it was
    // (moving the slots out first lost every entry and left a null table behind).
    auto bigger = std::make_unique<slot[]>(new_capacity);  // value-initialized: every key 0
    auto old = std::exchange(slots_, std::move(bigger));
    std::size_t const old_capacity = capacity_;
    capacity_ = new_capacity;
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key != 0) { place(old[i].key, old[i].value); }
    }
  }

  std::unique_ptr<slot[]> slots_;
  std::size_t capacity_{0};  // a power of two, or 0 before the first insert
  std::size_t size_{0};
  std::size_t kept_{0};  // rooms kept by erase_keeping_room; size_ + kept_ <= capacity_ / 2
};

}  // namespace mrstack::detail
