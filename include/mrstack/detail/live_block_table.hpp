#pragma once
/// `live_block_table`: the blocks PyTorch holds from mrstack's device stacks, as the torch
/// entry points of the C ABI keep them (src/c_api/torch.cpp: one table per shard, under
/// the shard's lock). CUDA-free; not thread-safe.
///
/// An open-addressing table of (address, device, size) with linear probing and
/// backward-shift deletion (no tombstones), at most half full after an insert, that
/// allocates only when it grows. Unlike `pointer_map`, one address may be in it more
/// than once, for different devices: stacks over simulated memory hand out the same
/// addresses. An address of 0 marks an empty slot (no live block is at address 0).
///
/// Each insert stamps its entry with the table's next generation, so a caller that let the
/// lock go between two looks at an address can tell the block it saw from a block handed
/// out later at the same address (record_stream records its event between two such looks).
/// The generation fills the entry's padding and the counter the table's, so it costs no
/// memory and no cache line.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mrstack::detail {

struct live_block {
  void* ptr = nullptr;
  int device = -1;
  std::uint32_t generation = 0;  // set by `insert`; 2^32 inserts into one table before one repeats
  std::size_t size = 0;          // as allocated: a free must name it (a pool takes 1000 and 1024 bytes back alike)
};
static_assert(sizeof(live_block) == 24, "the generation fills the padding after the device");

class live_block_table {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  /// Blocks are 256-byte aligned, so the low 8 bits are dropped; the rest goes through a
  /// full 64-bit mixer (MurmurHash3's finalizer): the top `shard_bits` pick the caller's
  /// shard, the next bits the slot. One multiply was not enough: its high bits depend on
  /// all of the address, but a pool's addresses repeat a pattern of block sizes, and
  /// addresses a Fibonacci number of 256-byte steps apart landed in the same shard a few
  /// slots apart, every block with partners: probe runs ten times as long as for random
  /// addresses (a displacement of 2.3 slots against 0.22 for 10000 blocks).
  static std::uint64_t hash(void const* ptr) noexcept {
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(ptr) >> 8;
    h = (h ^ (h >> 33)) * 0xFF51AFD7ED558CCDULL;
    h = (h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
  }
  static constexpr unsigned shard_bits = 6;

  [[nodiscard]] std::size_t size() const noexcept { return live_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return table_.size(); }
  [[nodiscard]] live_block const& operator[](std::size_t slot) const noexcept { return table_[slot]; }

  /// The slot a probe for `ptr` starts at (capacity() > 0).
  [[nodiscard]] std::size_t home(void const* ptr) const noexcept {
    return static_cast<std::size_t>((hash(ptr) << shard_bits) >> (64 - bits_));
  }

  /// The slot of `ptr`'s block on `device` (any device when `device` < 0), or npos.
  [[nodiscard]] std::size_t find(void const* ptr, int device) const noexcept {
    if (table_.empty()) { return npos; }
    for (std::size_t i = home(ptr); table_[i].ptr != nullptr; i = next(i)) {
      if (table_[i].ptr == ptr && (device < 0 || table_[i].device == device)) { return i; }
    }
    return npos;
  }

  /// How many devices' blocks start at `ptr` (more than one only over simulated memory).
  [[nodiscard]] std::size_t count(void const* ptr) const noexcept {
    std::size_t n = 0;
    if (table_.empty()) { return 0; }
    for (std::size_t i = home(ptr); table_[i].ptr != nullptr; i = next(i)) { n += table_[i].ptr == ptr ? 1 : 0; }
    return n;
  }

  /// Adds a block, stamped with the next generation (its `generation` is ignored), and
  /// returns that generation. Throws std::bad_alloc, the table unchanged, only when it must
  /// grow and cannot.
  std::uint32_t insert(live_block block) {
    if (2 * (live_ + 1) > table_.size()) { grow(); }
    block.generation = ++generations_;
    place(block);
    return block.generation;
  }

  /// Adds back a block a free took out (`erase`) and then could not free, with the
  /// generation it had: it is the same block. It grows the
  /// table only when no slot would stay empty, so the undo needs no host memory even when
  /// other threads filled the table meanwhile (on failure the block would be lost from the
  /// books, and its right free refused). The table may be more than half full until the
  /// next insert grows it. Only more undos at once than half its capacity (32 or more),
  /// with no insert between, make it grow, and then it may throw std::bad_alloc as
  /// `insert` does.
  void put_back(live_block const& block) {
    if (live_ + 1 >= table_.size()) { grow(); }
    place(block);
  }

  /// Removes the block in `slot` (from `find`). Backward shift: later members of the probe
  /// run move into the hole, so no lookup ever steps over a dead slot.
  void erase(std::size_t slot) noexcept {
    std::size_t hole = slot;
    for (std::size_t j = next(hole); table_[j].ptr != nullptr; j = next(j)) {
      std::size_t const k = home(table_[j].ptr);
      // table_[j] moves to the hole unless its home lies cyclically in (hole, j].
      if (hole <= j ? (k <= hole || k > j) : (k <= hole && k > j)) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole] = live_block{};
    --live_;
  }

 private:
  [[nodiscard]] std::size_t next(std::size_t i) const noexcept { return (i + 1) & (table_.size() - 1); }

  void place(live_block const& block) noexcept {  // a slot is empty: the callers see to it
    std::size_t i = home(block.ptr);
    while (table_[i].ptr != nullptr) { i = next(i); }
    table_[i] = block;
    ++live_;
  }

  void grow() {
    // The new array first: when it cannot be had, the table is left as it was.
    std::vector<live_block> old(std::max<std::size_t>(64, 2 * table_.size()));
    old.swap(table_);
    bits_ = static_cast<unsigned>(std::countr_zero(table_.size()));
    live_ = 0;
    for (live_block const& block : old) {
      if (block.ptr != nullptr) { place(block); }
    }
  }

  std::vector<live_block> table_;  // a power of two (2^bits_) long, or empty before the first insert
  unsigned bits_ = 0;
  std::uint32_t generations_ = 0;  // the last generation `insert` stamped
  std::size_t live_ = 0;
};

}  // namespace mrstack::detail
