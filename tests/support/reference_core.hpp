#pragma once
// A deliberately simple pool core for tests: the same chunk/hole interface as
// detail::block_pool (add_chunk, extend_chunk, allocate, deallocate, withdraw_free_ranges,
// restore, split_hole, free_bytes), written as plainly as possible — std::map of blocks tiling one
// chunk, best fit by linear scan, eager coalescing. Slow and obviously right; the model the
// in-place growth policy is tested over, and the reference the real core is compared with.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mrstack::test {

class reference_core {
 public:
  static constexpr std::size_t granularity = 256;
  static constexpr int synchronized = 0;
  struct range {
    std::size_t offset = 0;
    std::size_t length = 0;
  };
  enum class state { free, live, withdrawn };
  struct block {
    std::size_t size;
    state st;
  };

  /// Owners are not modelled: every free neighbour merges.
  [[nodiscard]] bool merges(int /*a*/, int /*b*/) const noexcept { return true; }

  int add_chunk(std::uintptr_t base, std::size_t size, int /*owner*/) {
    if (has_chunk_) { throw std::logic_error("reference_core: one chunk only"); }
    has_chunk_ = true;
    base_ = base;
    size_ = size;
    blocks_[base] = {size, state::free};
    free_ += size;
    return 7;  // any id: the policy must hand it back unchanged
  }

  void extend_chunk(int chunk, std::size_t bytes, int /*owner*/) {
    if (!has_chunk_ || chunk != 7) { throw std::logic_error("reference_core: extend of an unknown chunk"); }
    auto last = std::prev(blocks_.end());
    if (last->second.st == state::free) {
      last->second.size += bytes;
    } else {
      blocks_[base_ + size_] = {bytes, state::free};
    }
    size_ += bytes;
    free_ += bytes;
  }

  /// Best fit: the smallest free block that holds an aligned block of `size`; lowest address on ties.
  std::uintptr_t allocate(std::size_t size, std::size_t alignment, int /*owner*/) {
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->second.st != state::free) { continue; }
      std::uintptr_t const start = (it->first + alignment - 1) & ~(alignment - 1);
      if (start + size > it->first + it->second.size) { continue; }
      if (best == blocks_.end() || it->second.size < best->second.size) { best = it; }
    }
    if (best == blocks_.end()) { return 0; }
    std::uintptr_t const addr = best->first;
    std::size_t const bsize = best->second.size;
    std::uintptr_t const start = (addr + alignment - 1) & ~(alignment - 1);
    blocks_.erase(best);
    if (start > addr) { blocks_[addr] = {start - addr, state::free}; }
    blocks_[start] = {size, state::live};
    if (start + size < addr + bsize) { blocks_[start + size] = {addr + bsize - start - size, state::free}; }
    free_ -= size;
    live_ += size;
    return start;
  }

  std::size_t deallocate(std::uintptr_t address, int /*owner*/) {
    auto it = blocks_.find(address);
    if (it == blocks_.end() || it->second.st != state::live) { return 0; }
    std::size_t const size = it->second.size;
    it->second.st = state::free;
    live_ -= size;
    free_ += size;
    merge(it);
    return size;
  }

  template <typename Choose>
  std::size_t withdraw_free_ranges(Choose&& choose) {
    std::vector<std::pair<std::uintptr_t, std::size_t>> free_blocks;
    for (auto const& [a, b] : blocks_) {
      if (b.st == state::free) { free_blocks.emplace_back(a, b.size); }
    }
    std::size_t total = 0;
    for (auto const& [a, n] : free_blocks) {
      range const r = choose(a, n, 0);
      if (r.length == 0) { continue; }
      if (r.offset % granularity != 0 || r.length % granularity != 0 || r.offset + r.length > n) {
        throw std::logic_error("reference_core: withdraw range outside its free block");
      }
      blocks_.erase(a);
      if (r.offset > 0) { blocks_[a] = {r.offset, state::free}; }
      blocks_[a + r.offset] = {r.length, state::withdrawn};
      if (r.offset + r.length < n) { blocks_[a + r.offset + r.length] = {n - r.offset - r.length, state::free}; }
      free_ -= r.length;
      withdrawn_ += r.length;
      total += r.length;
    }
    return total;
  }

  std::size_t restore(std::uintptr_t address, int /*owner*/) {
    auto it = blocks_.find(address);
    if (it == blocks_.end() || it->second.st != state::withdrawn) { return 0; }
    std::size_t const size = it->second.size;
    it->second.st = state::free;
    withdrawn_ -= size;
    free_ += size;
    merge(it);
    return size;
  }

  /// Cuts the hole at `address` in two at `address + offset`; both stay withdrawn.
  std::size_t split_hole(std::uintptr_t address, std::size_t offset) {
    auto it = blocks_.find(address);
    if (it == blocks_.end() || it->second.st != state::withdrawn) { return 0; }
    if (offset == 0 || offset % granularity != 0 || offset >= it->second.size) {
      throw std::logic_error("reference_core: split outside its hole");
    }
    blocks_[address + offset] = {it->second.size - offset, state::withdrawn};  // may throw: nothing changed yet
    it->second.size = offset;
    return offset;
  }

  template <typename F>
  void for_each_free_block(F&& f) const {
    for (auto const& [a, b] : blocks_) {
      if (b.st == state::free) { f(a, b.size, 0); }
    }
  }

  /// Counts the calls: a stream-ordered core synchronizes here.
  void before_release() noexcept { ++releases_prepared; }
  std::size_t releases_prepared = 0;

  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_; }
  [[nodiscard]] std::size_t live_bytes() const noexcept { return live_; }
  [[nodiscard]] std::size_t withdrawn_bytes() const noexcept { return withdrawn_; }
  [[nodiscard]] std::size_t total_bytes() const noexcept { return size_; }
  [[nodiscard]] std::uintptr_t chunk_base() const noexcept { return base_; }
  [[nodiscard]] std::map<std::uintptr_t, block> const& blocks() const noexcept { return blocks_; }

  /// Empty when the blocks tile the chunk, no two free blocks touch, and the totals add up.
  [[nodiscard]] std::string check() const {
    std::uintptr_t at = base_;
    std::size_t f = 0, l = 0, w = 0;
    bool prev_free = false;
    for (auto const& [a, b] : blocks_) {
      if (a != at) { return "gap or overlap at " + std::to_string(a - base_); }
      if (b.st == state::free && prev_free) { return "two free neighbours at " + std::to_string(a - base_); }
      prev_free = b.st == state::free;
      (b.st == state::free ? f : b.st == state::live ? l : w) += b.size;
      at += b.size;
    }
    if (at != base_ + size_) { return "blocks do not reach the chunk's end"; }
    if (f != free_ || l != live_ || w != withdrawn_) { return "totals disagree"; }
    return {};
  }

 private:
  void merge(std::map<std::uintptr_t, block>::iterator it) {
    auto next = std::next(it);
    if (next != blocks_.end() && next->second.st == state::free) {
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.st == state::free) {
        prev->second.size += it->second.size;
        blocks_.erase(it);
      }
    }
  }

  std::map<std::uintptr_t, block> blocks_;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  bool has_chunk_ = false;
  std::size_t free_ = 0;
  std::size_t live_ = 0;
  std::size_t withdrawn_ = 0;
};

}  // namespace mrstack::test
