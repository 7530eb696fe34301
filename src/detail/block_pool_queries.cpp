// block_pool's read-only queries: chunk and owner lookups, the free block ending at an
// address, runs across two owners, the largest free block. None is on the hot path
// (allocate, take, deallocate), so they live apart from it.
#include <mrstack/detail/block_pool.hpp>

#include <algorithm>
#include <bit>
#include <optional>
#include <vector>

namespace mrstack::detail {

block_pool::chunk_info block_pool::chunk(chunk_id c) const {
  chunk_record const& rec = chunks_.at(c);
  return chunk_info{rec.base, rec.size, rec.live_blocks, rec.withdrawn_blocks};
}

std::vector<owner_id> block_pool::chunk_owners(chunk_id c) const {
  std::vector<owner_id> owners;
  for (std::uint32_t b = chunks_.at(c).first; b != npos; b = at(b).next) {
    block const& n = at(b);
    if (n.state != state_free) { continue; }
    bool seen = false;
    for (owner_id o : owners) { seen = seen || o == n.owner; }
    if (!seen) { owners.push_back(n.owner); }
  }
  return owners;
}

std::size_t block_pool::run_with(std::uint32_t node, owner_id owner, owner_id partner) const noexcept {
  auto joins = [&](std::uint32_t n) {
    return n != npos && at(n).state == state_free && (at(n).owner == owner || at(n).owner == partner);
  };
  std::size_t run = size_of(at(node));
  // A run of one owner's blocks alone would have merged into one block: allocate's job.
  bool with_owner = at(node).owner == owner, with_partner = at(node).owner == partner;
  for (std::uint32_t p = at(node).prev; joins(p); p = at(p).prev) {
    run += size_of(at(p));
    with_owner = with_owner || at(p).owner == owner;
    with_partner = with_partner || at(p).owner == partner;
  }
  for (std::uint32_t n = at(node).next; joins(n); n = at(n).next) {
    run += size_of(at(n));
    with_owner = with_owner || at(n).owner == owner;
    with_partner = with_partner || at(n).owner == partner;
  }
  return with_owner && with_partner ? run : 0;
}

std::uint32_t block_pool::free_block_ending_at(std::uintptr_t end) const noexcept {
  for (chunk_record const& r : chunks_) {
    if (!r.in_use || end <= r.base || end > r.base + r.size) { continue; }
    for (std::uint32_t b = r.last; b != npos; b = at(b).prev) {
      std::uintptr_t const start = addr_of(at(b));
      if (start + size_of(at(b)) == end) { return at(b).state == state_free ? b : npos; }
      if (start < end) { return npos; }  // `end` falls inside this block
    }
  }
  return npos;
}

std::optional<owner_id> block_pool::owner_of_free_block_ending_at(std::uintptr_t end) const {
  std::uint32_t const b = free_block_ending_at(end);
  if (b == npos) { return std::nullopt; }
  return owner_id{at(b).owner};
}

std::size_t block_pool::free_bytes(owner_id owner) const noexcept {
  return owner < indexes_.size() && indexes_[owner] ? indexes_[owner]->bytes : 0;
}

std::size_t block_pool::free_blocks(owner_id owner) const noexcept {
  return owner < indexes_.size() && indexes_[owner] ? indexes_[owner]->count : 0;
}

// ---- introspection ------------------------------------------------------------------------------------

std::size_t block_pool::largest_free_block(owner_id owner) const noexcept {
  if (owner >= indexes_.size() || !indexes_[owner] || indexes_[owner]->count == 0) { return 0; }
  class_index const& idx = *indexes_[owner];
  auto const fl = static_cast<unsigned>(31 - std::countl_zero(idx.fl_bitmap));
  auto const sl = static_cast<unsigned>(31 - std::countl_zero(idx.sl_bitmap[fl]));
  std::uint32_t largest = 0;
  for (free_entry const& e : idx.lists[fl * sl_count + sl]) { largest = std::max(largest, e.units); }
  return std::size_t{largest} * granularity;
}

std::size_t block_pool::largest_free_block() const noexcept {
  std::size_t largest = 0;
  for (std::size_t o = 0; o < indexes_.size(); ++o) {
    largest = std::max(largest, largest_free_block(static_cast<owner_id>(o)));
  }
  return largest;
}

}  // namespace mrstack::detail
