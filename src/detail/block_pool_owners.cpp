// block_pool's ownership changes, off the hot path: runs across two owners, transfers,
// the full synchronization, restoring holes. Each makes room for the merged block's
// class-array entry (make_room_for_merge) before it changes anything.
#include <mrstack/detail/block_pool.hpp>

#include <bit>

#include "block_pool_inline.hpp"

namespace mrstack::detail {

std::uintptr_t block_pool::allocate_across(std::size_t size, std::size_t alignment, owner_id owner,
                                           owner_id partner) {
  if (owner == partner || partner >= indexes_.size() || !indexes_[partner] || alignment < granularity) { return 0; }
  if (owner >= indexes_.size() || !indexes_[owner]) { return 0; }
  std::size_t const needed = size + (alignment - granularity);  // room to align wherever the run starts
  // Under the pool's lock on every request the owner's blocks missed: the two owners'
  // bytes together bound any run; every run holds blocks of both, so the owner with fewer
  // free blocks is walked, and only its non-empty classes (a walk of all 896 lists took
  // about as long as a whole call; walking the parked blocks, usually the many, visited
  // ~800 a call for 16 threads on 4 created streams through thread shards).
  if (indexes_[partner]->bytes + free_bytes(owner) < needed) { return 0; }  // one address space: no wrap
  class_index const& walked =
      indexes_[owner]->count <= indexes_[partner]->count ? *indexes_[owner] : *indexes_[partner];
  std::uint32_t found = npos;
  for (std::uint32_t fls = walked.fl_bitmap; fls != 0 && found == npos; fls &= fls - 1) {
    auto const fl = static_cast<unsigned>(std::countr_zero(fls));
    for (std::uint32_t sls = walked.sl_bitmap[fl]; sls != 0 && found == npos; sls &= sls - 1) {
      auto const sl = static_cast<unsigned>(std::countr_zero(sls));
      for (free_entry const& e : walked.lists[fl * sl_count + sl]) {
        if (run_with(e.node, owner, partner) >= needed) {
          found = e.node;
          break;
        }
      }
    }
  }
  if (found == npos) { return 0; }
  make_room_for_merge(found, owner, partner);
  remove_free(found);
  std::uint32_t const merged = coalesce(found, owner, partner);
  insert_free(merged, at(merged).owner);
  return allocate(size, alignment, owner);
}

// ---- owners ---------------------------------------------------------------------------------------

void block_pool::transfer(owner_id from, owner_id to) {
  if (from == to || from >= indexes_.size() || !indexes_[from]) { return; }
  class_index& src = *indexes_[from];
  index_of(to);  // make sure the destination exists before nodes move
  while (src.count != 0) {
    auto const fl = static_cast<unsigned>(std::countr_zero(src.fl_bitmap));
    auto const sl = static_cast<unsigned>(std::countr_zero(src.sl_bitmap[fl]));
    std::uint32_t const b = src.lists[fl * sl_count + sl].back().node;
    make_room_for_merge(b, to, from);
    remove_free(b);
    std::uint32_t const merged = coalesce(b, to, from);
    insert_free(merged, at(merged).owner);
  }
}

void block_pool::synchronize_all_owners() {
  index_of(synchronized);
  for (std::size_t o = 1; o < indexes_.size(); ++o) {
    if (!indexes_[o]) { continue; }
    class_index& src = *indexes_[o];
    while (src.count != 0) {
      auto const fl = static_cast<unsigned>(std::countr_zero(src.fl_bitmap));
      auto const sl = static_cast<unsigned>(std::countr_zero(src.sl_bitmap[fl]));
      std::uint32_t const b = src.lists[fl * sl_count + sl].back().node;
      make_room_for_merge(b, synchronized, synchronized, true);
      remove_free(b);
      std::uint32_t const merged = coalesce(b, synchronized, synchronized, true);
      insert_free(merged, synchronized);
    }
  }
}

void block_pool::transfer_free_block_ending_at(std::uintptr_t end, owner_id to) {
  std::uint32_t const b = free_block_ending_at(end);
  if (b == npos || at(b).owner == to) { return; }
  owner_id const from = at(b).owner;
  make_room_for_merge(b, to, from);
  remove_free(b);
  std::uint32_t const merged = coalesce(b, to, from);
  insert_free(merged, at(merged).owner);
}

std::size_t block_pool::restore(std::uintptr_t address, owner_id owner) {
  std::uint32_t const b = live_.find(address, starts_at(address));
  if (b == npos || at(b).state != state_withdrawn) { return 0; }
  make_room_for_merge(b, owner, owner);  // before anything changes
  live_.erase(address, starts_at(address));
  block& n = at(b);
  std::size_t const size = size_of(n);
  withdrawn_bytes_ -= size;
  --chunks_[n.chunk].withdrawn_blocks;
  --withdrawn_count_;
  n.state = state_free;
  std::uint32_t const merged = coalesce(b, owner, owner);
  insert_free(merged, at(merged).owner);
  return size;
}

}  // namespace mrstack::detail
