#pragma once
// block_pool's class-array primitives, shared by its sources (block_pool.cpp, the hot
// path; block_pool_owners.cpp, merging and ownership changes). The hot path (allocate,
// take, deallocate) is a chain of small steps, and a call per step costs more than most
// steps do: they are forced inline.
#include <mrstack/detail/block_pool.hpp>

#include <algorithm>
#include <memory>

#define MRSTACK_HOT_INLINE [[gnu::always_inline]] inline

namespace mrstack::detail {

MRSTACK_HOT_INLINE void block_pool::delete_node(std::uint32_t i) noexcept {
  at(i).state = state_unused;
  free_nodes_.push_back(i);  // never reallocates: reserved for every node that exists
}

MRSTACK_HOT_INLINE block_pool::class_index& block_pool::index_of(owner_id owner) {
  if (owner >= indexes_.size()) { indexes_.resize(std::size_t{owner} + 1); }
  auto& slot = indexes_[owner];
  if (!slot) { slot = std::make_unique<class_index>(); }
  return *slot;
}

// ---- size classes --------------------------------------------------------------------------

MRSTACK_HOT_INLINE void block_pool::insert_free(std::uint32_t b, owner_id owner) {
  class_index& idx = index_of(owner);
  block& n = at(b);
  n.owner = owner;
  n.state = state_free;
  unsigned const cls = class_of(n.units);
  auto& list = idx.lists[cls];
  n.free_pos = static_cast<std::uint32_t>(list.size());
  n.free_class = cls;
  // Allocates only when the class array is full. Every caller but deallocate's plain
  // case made room first (make_room, make_room_for_merge), since host out-of-memory
  // later would leave the block unindexed; that case counts on the push coming before
  // anything but b's own fields changes.
  list.push_back(free_entry{b, n.units});
  idx.sl_bitmap[cls / sl_count] |= 1U << (cls % sl_count);
  idx.fl_bitmap |= 1U << (cls / sl_count);
  idx.bytes += size_of(n);
  ++idx.count;
  free_bytes_total_ += size_of(n);
}

MRSTACK_HOT_INLINE void block_pool::make_room(class_index& idx, unsigned cls, std::size_t extra) {
  auto& list = idx.lists[cls];
  if (list.capacity() - list.size() >= extra) [[likely]] { return; }
  grow_class_array(list, extra);
}

MRSTACK_HOT_INLINE void block_pool::unlink_entry(class_index& idx, std::uint32_t b) noexcept {
  block const& n = at(b);
  unsigned const cls = n.free_class;
  auto& list = idx.lists[cls];
  free_entry const last = list.back();
  if (last.node != b) {
    // The last entry fills the hole: one write to its node, none to any other.
    list[n.free_pos] = last;
    at(last.node).free_pos = n.free_pos;
  }
  list.pop_back();
  if (list.empty()) {
    unsigned const fl = cls / sl_count;
    idx.sl_bitmap[fl] &= ~(1U << (cls % sl_count));
    if (idx.sl_bitmap[fl] == 0) { idx.fl_bitmap &= ~(1U << fl); }
  }
}

MRSTACK_HOT_INLINE void block_pool::remove_free(std::uint32_t b) noexcept {
  block const& n = at(b);
  class_index& idx = *indexes_[n.owner];
  unlink_entry(idx, b);
  idx.bytes -= size_of(n);
  --idx.count;
  free_bytes_total_ -= size_of(n);
}

// ---- merging ---------------------------------------------------------------------------------

// The ownership rules of a merge, shared by coalesce and the reading pass that makes
// room for its result: which free neighbour joins, and who owns what they make.
struct block_pool::merge_rules {
  block_pool const& pool;
  owner_id result;
  owner_id also_mergeable;
  bool merge_any;

  [[nodiscard]] bool joins(std::uint32_t n) const {
    if (n == npos) { return false; }
    block const& nb = pool.at(n);
    return nb.state == state_free && (merge_any || nb.owner == result || nb.owner == also_mergeable ||
                                      pool.sync_mergeable(result, nb.owner));
  }
  void adopt(owner_id neighbour_owner) {
    // A synchronized result takes on the pending work of a stream-owned neighbour.
    if (!merge_any && result == synchronized && neighbour_owner != also_mergeable) { result = neighbour_owner; }
  }
};

MRSTACK_HOT_INLINE void block_pool::make_room_for_merge(std::uint32_t b, owner_id owner, owner_id also_mergeable, bool merge_any) {
  merge_rules rules{*this, owner, also_mergeable, merge_any};
  std::size_t units = at(b).units;
  for (std::uint32_t prev = at(b).prev; rules.joins(prev); prev = at(prev).prev) {
    rules.adopt(at(prev).owner);
    units += at(prev).units;
  }
  for (std::uint32_t next = at(b).next; rules.joins(next); next = at(next).next) {
    rules.adopt(at(next).owner);
    units += at(next).units;
  }
  make_room(index_of(rules.result), class_of(units), 1);
}

}  // namespace mrstack::detail
