#include <mrstack/detail/block_pool.hpp>

#include <algorithm>
#include <bit>
#include <cassert>
#include <stdexcept>

#include <mrstack/detail/align.hpp>

#include "block_pool_inline.hpp"

namespace mrstack::detail {

block_pool::block_pool(std::size_t max_blocks)
    : node_space_{std::min(max_blocks, max_nodes) * sizeof(block),
                  std::min(max_blocks, min_reserved_nodes) * sizeof(block)} {}
block_pool::~block_pool() = default;

// ---- node slab ---------------------------------------------------------------------------

MRSTACK_HOT_INLINE std::uint32_t block_pool::new_node() {
  // Free node indices wait on a stack of their own: popping one reads hot memory, not
  // the (cold) node it names.
  if (!free_nodes_.empty()) {
    std::uint32_t const i = free_nodes_.back();
    free_nodes_.pop_back();
    return i;
  }
  if (std::size_t{node_count_} * sizeof(block) == node_space_.committed_bytes()) [[unlikely]] { grow_node_space(); }
  return node_count_++;
}

void block_pool::grow_node_space() {
  std::size_t const limit = node_space_.reserved_bytes() / sizeof(block);  // <= max_nodes < npos
  if (node_count_ == limit) {
    throw std::length_error("block_pool: more than " + std::to_string(limit) +
                            " blocks at once (the node space this pool could reserve)");
  }
  std::size_t const want = (std::size_t{node_count_} + 1) * sizeof(block);
  // Room first for every node index the growth creates on the free-node stack, so that
  // delete_node never allocates; only then the nodes (zeroed, like value-initialized ones).
  std::size_t const nodes = node_space_.commit_target(want) / sizeof(block);
  if (free_nodes_.capacity() < nodes) { free_nodes_.reserve(std::max(nodes, 2 * free_nodes_.capacity())); }
  node_space_.commit(want);
}

MRSTACK_HOT_INLINE void block_pool::new_nodes(std::array<std::uint32_t, 2>& out, unsigned count) {
  // All or none: a call that needs two nodes and gets one at the node limit must hand it
  // back, or the node would be lost and the call would change something after all.
  unsigned got = 0;
  try {
    for (; got < count; ++got) { out[got] = new_node(); }
  } catch (...) {
    while (got > 0) { delete_node(out[--got]); }
    throw;
  }
}

void block_pool::set_exclusive(owner_id owner, bool exclusive) {
  if (owner >= exclusive_.size()) { exclusive_.resize(std::size_t{owner} + 1, 0); }
  exclusive_[owner] = exclusive ? 1 : 0;
}

// ---- size classes --------------------------------------------------------------------------

void block_pool::grow_class_array(std::vector<free_entry>& list, std::size_t extra) {
  list.reserve(std::max(list.size() + extra, 2 * list.capacity()));  // amortized doubling, as push_back's
}

MRSTACK_HOT_INLINE std::uint32_t block_pool::first_in_larger_class(class_index const& idx, unsigned cls) noexcept {
  unsigned fl = cls / sl_count;
  unsigned const sl = cls % sl_count;
  std::uint32_t sl_map = sl + 1 < sl_count ? idx.sl_bitmap[fl] & (~0U << (sl + 1)) : 0U;
  if (sl_map == 0) {
    std::uint32_t const fl_map = fl + 1 < fl_count ? idx.fl_bitmap & (~0U << (fl + 1)) : 0U;
    if (fl_map == 0) { return npos; }
    fl = static_cast<unsigned>(std::countr_zero(fl_map));
    sl_map = idx.sl_bitmap[fl];
  }
  return idx.lists[fl * sl_count + static_cast<unsigned>(std::countr_zero(sl_map))].back().node;
}

// ---- splitting and merging ---------------------------------------------------------------------

MRSTACK_HOT_INLINE std::uint32_t block_pool::split(std::uint32_t b, std::size_t offset, std::uint32_t u) noexcept {
  block& lower = at(b);
  block& upper = at(u);
  upper.offset = lower.offset + static_cast<std::uint32_t>(offset / granularity);
  upper.units = lower.units - static_cast<std::uint32_t>(offset / granularity);
  upper.prev = b;
  upper.next = lower.next;
  upper.free_pos = npos;
  upper.chunk = lower.chunk;
  upper.owner = lower.owner;
  upper.state = lower.state;
  if (lower.next != npos) {
    at(lower.next).prev = u;
  } else {
    chunks_[lower.chunk].last = u;
  }
  lower.next = u;
  lower.units = static_cast<std::uint32_t>(offset / granularity);
  return u;
}

std::uint32_t block_pool::coalesce(std::uint32_t b, owner_id owner, owner_id also_mergeable, bool merge_any) {
  merge_rules rules{*this, owner, also_mergeable, merge_any};
  // Both neighbours are looked at: start both loads now so their cache misses overlap.
  __builtin_prefetch(&at(at(b).prev == npos ? b : at(b).prev));
  __builtin_prefetch(&at(at(b).next == npos ? b : at(b).next));
  // Loops, not single steps: when ownership changes (transfer, a full synchronization)
  // a whole run of formerly separate free blocks may become mergeable.
  for (std::uint32_t prev = at(b).prev; rules.joins(prev); prev = at(b).prev) {
    rules.adopt(at(prev).owner);
    remove_free(prev);
    block& p = at(prev);
    block const& cur = at(b);
    p.units += cur.units;
    p.next = cur.next;
    if (cur.next != npos) {
      at(cur.next).prev = prev;
    } else {
      chunks_[cur.chunk].last = prev;
    }
    delete_node(b);
    b = prev;
  }
  for (std::uint32_t next = at(b).next; rules.joins(next); next = at(b).next) {
    rules.adopt(at(next).owner);
    remove_free(next);
    block& cur = at(b);
    block const& nx = at(next);
    cur.units += nx.units;
    cur.next = nx.next;
    if (nx.next != npos) {
      at(nx.next).prev = b;
    } else {
      chunks_[cur.chunk].last = b;
    }
    delete_node(next);
  }
  at(b).owner = rules.result;
  return b;
}

MRSTACK_HOT_INLINE std::uint32_t block_pool::carve(std::uint32_t b, std::size_t offset, std::size_t length) {
  block const& n = at(b);
  owner_id const owner = n.owner;
  std::size_t const rest = size_of(n) - offset - length;
  // Everything that can fail first: room in the classes the pieces go to (one entry is
  // b's own, freed below, but counting it would need its class too) and up to two nodes.
  // At the node limit the block had left its index already, and a whole free block
  // (a 1 GiB chunk) was lost.
  class_index& idx = *indexes_[owner];
  unsigned const front = class_of(offset / granularity);
  unsigned const back = class_of(rest / granularity);
  if (offset != 0) { make_room(idx, front, 1); }
  if (rest != 0) { make_room(idx, back, offset != 0 && front == back ? 2 : 1); }
  std::array<std::uint32_t, 2> nodes{npos, npos};
  new_nodes(nodes, (offset != 0 ? 1U : 0U) + (rest != 0 ? 1U : 0U));
  unsigned used = 0;
  remove_free(b);
  std::uint32_t piece = b;
  if (offset != 0) {
    piece = split(b, offset, nodes[used++]);
    insert_free(b, owner);
  }
  if (rest != 0) { insert_free(split(piece, length, nodes[used]), owner); }
  return piece;
}

// ---- chunks ---------------------------------------------------------------------------------------

chunk_id block_pool::add_chunk(std::uintptr_t base, std::size_t size, owner_id owner) {
  if (size == 0 || size % granularity != 0 || base % granularity != 0) {
    throw std::invalid_argument("block_pool::add_chunk: base and size must be non-zero multiples of 256");
  }
  if (size > max_chunk_size) { throw std::invalid_argument("block_pool::add_chunk: a chunk holds at most 1 TiB"); }
  // What can fail comes first (room in the index, the node, the chunk record): a refused
  // call changes nothing, so the caller can give the range back to its upstream.
  make_room(index_of(owner), class_of(size / granularity), 1);
  std::uint32_t const b = new_node();
  chunk_id c = 0;
  if (!free_chunk_slots_.empty()) {
    c = free_chunk_slots_.back();
    free_chunk_slots_.pop_back();
  } else {
    try {
      // Room on the free-slot stack for every slot there is: remove_chunk cannot fail.
      if (free_chunk_slots_.capacity() < chunks_.size() + 1) {
        free_chunk_slots_.reserve(std::max(chunks_.size() + 1, 2 * free_chunk_slots_.capacity()));
      }
      chunks_.emplace_back();
    } catch (...) {
      delete_node(b);
      throw;
    }
    c = static_cast<chunk_id>(chunks_.size() - 1);
  }
  block& n = at(b);
  n.offset = 0;
  n.units = static_cast<std::uint32_t>(size / granularity);
  n.prev = npos;
  n.next = npos;
  n.free_pos = npos;
  n.chunk = c;
  chunks_[c] = chunk_record{base, size, b, b, 0, 0, true};
  insert_free(b, owner);
  total_bytes_ += size;
  ++chunk_count_;
  return c;
}

void block_pool::reserve_add_chunk(std::size_t size, owner_id owner) {
  make_room(index_of(owner), class_of(size / granularity), 1);
  if (free_nodes_.empty()) { delete_node(new_node()); }  // a spare node; delete_node has room
  if (free_chunk_slots_.empty()) {
    if (free_chunk_slots_.capacity() < chunks_.size() + 1) {
      free_chunk_slots_.reserve(std::max(chunks_.size() + 1, 2 * free_chunk_slots_.capacity()));
    }
    if (chunks_.capacity() < chunks_.size() + 1) { chunks_.reserve(std::max(chunks_.size() + 1, 2 * chunks_.capacity())); }
  }
}

void block_pool::extend_chunk(chunk_id c, std::size_t bytes, owner_id owner) {
  if (c >= chunks_.size() || !chunks_[c].in_use) { throw std::invalid_argument("block_pool::extend_chunk: no such chunk"); }
  if (bytes == 0 || bytes % granularity != 0) {
    throw std::invalid_argument("block_pool::extend_chunk: bytes must be a non-zero multiple of 256");
  }
  chunk_record& rec = chunks_[c];
  if (bytes > max_chunk_size - rec.size) { throw std::invalid_argument("block_pool::extend_chunk: a chunk holds at most 1 TiB"); }
  std::uint32_t const last = rec.last;
  block& tail = at(last);
  if (tail.state == state_free &&
      (tail.owner == owner || sync_mergeable(tail.owner, owner))) {
    owner_id const merged = owner != synchronized ? owner : tail.owner;
    make_room(index_of(merged), class_of(tail.units + bytes / granularity), 1);  // before anything changes
    remove_free(last);
    at(last).units += static_cast<std::uint32_t>(bytes / granularity);
    insert_free(last, merged);
  } else {
    make_room(index_of(owner), class_of(bytes / granularity), 1);  // before anything changes
    std::uint32_t const b = new_node();
    block& n = at(b);
    n.offset = static_cast<std::uint32_t>(rec.size / granularity);
    n.units = static_cast<std::uint32_t>(bytes / granularity);
    n.prev = last;
    n.next = npos;
    n.free_pos = npos;
    n.chunk = c;
    at(last).next = b;
    rec.last = b;
    insert_free(b, owner);
  }
  rec.size += bytes;
  total_bytes_ += bytes;
}

bool block_pool::remove_chunk(chunk_id c) {
  if (c >= chunks_.size() || !chunks_[c].in_use) { throw std::invalid_argument("block_pool::remove_chunk: no such chunk"); }
  chunk_record& rec = chunks_[c];
  if (rec.live_blocks != 0) { return false; }
  for (std::uint32_t b = rec.first; b != npos;) {
    block const& n = at(b);
    std::uint32_t const next = n.next;
    if (n.state == state_free) {
      remove_free(b);
    } else {  // withdrawn
      live_.erase(addr_of(n), starts_at(addr_of(n)));
      withdrawn_bytes_ -= size_of(n);
      --withdrawn_count_;
    }
    delete_node(b);
    b = next;
  }
  total_bytes_ -= rec.size;
  rec = chunk_record{};
  free_chunk_slots_.push_back(c);  // never reallocates: add_chunk made room for every slot
  --chunk_count_;
  return true;
}

// ---- allocation ----------------------------------------------------------------------------------

bool block_pool::can_allocate(std::size_t size, std::size_t alignment, owner_id owner) const {
  if (owner >= indexes_.size() || !indexes_[owner] || indexes_[owner]->count == 0) { return false; }
  class_index const& idx = *indexes_[owner];
  std::size_t const need = (size + (alignment > granularity ? alignment - granularity : 0)) / granularity;
  if (need > max_units) { return false; }
  unsigned const cls = class_of(need);
  if (class_floor(cls) == need && !idx.lists[cls].empty()) { return true; }
  if (first_in_larger_class(idx, cls) != npos) { return true; }
  // The request's own class may still hold a block that fits, and so may the padded
  // size's class (some of its blocks have room to align).
  if (best_in_class(idx, class_of(size / granularity), size, alignment) != npos) { return true; }
  return alignment > granularity && best_in_class(idx, cls, size, alignment) != npos;
}

MRSTACK_HOT_INLINE std::uint32_t block_pool::best_in_class(class_index const& idx, unsigned cls, std::size_t size,
                                                           std::size_t alignment) const {
  auto const units = static_cast<std::uint32_t>(size / granularity);
  auto const& list = idx.lists[cls];
  std::uint32_t best = npos;
  std::uint32_t best_units = 0;
  std::size_t const scan = std::min<std::size_t>(list.size(), exact_class_scan);
  for (std::size_t k = 1; k <= scan; ++k) {
    free_entry const e = list[list.size() - k];
    if (e.units < units || (best != npos && e.units >= best_units)) { continue; }
    if (alignment > granularity) {  // only then does the block's address matter
      std::uintptr_t const addr = addr_of(at(e.node));
      if (align_up(addr, alignment) - addr + size > std::size_t{e.units} * granularity) { continue; }
    }
    best = e.node;
    best_units = e.units;
    if (e.units == units) { break; }
  }
  return best;
}

std::uintptr_t block_pool::allocate(std::size_t size, std::size_t alignment, owner_id owner) {
  assert(size % granularity == 0 && size > 0 && alignment >= granularity);
  if (owner >= indexes_.size() || !indexes_[owner]) { return 0; }
  class_index const& idx = *indexes_[owner];
  if (idx.count == 0) { return 0; }
  std::size_t const need = (size + (alignment > granularity ? alignment - granularity : 0)) / granularity;
  if (need > max_units) { return 0; }  // larger than any chunk
  // 1. The request's own class: its blocks may or may not fit; look at a few, keep the tightest.
  std::uint32_t best = best_in_class(idx, class_of(size / granularity), size, alignment);
  if (best == npos) {
    // 2. The smallest class all of whose blocks fit (with room to align).
    unsigned const cls = class_of(need);
    best = class_floor(cls) == need && !idx.lists[cls].empty() ? idx.lists[cls].back().node
                                                               : first_in_larger_class(idx, cls);
    // 3. Aligned: the padded size's own class, some of whose blocks have the room (a
    // superblock-aligned superblock in a free block just short of twice its size).
    if (best == npos && alignment > granularity) { best = best_in_class(idx, cls, size, alignment); }
    if (best == npos) { return 0; }
  }
  return take(best, size, alignment, owner);
}

MRSTACK_HOT_INLINE std::uintptr_t block_pool::take(std::uint32_t b, std::size_t size, std::size_t alignment, owner_id owner) {
  auto const units = static_cast<std::uint32_t>(size / granularity);
  block& n = at(b);
  std::uintptr_t const addr = addr_of(n);
  // What can fail comes first, in both cases: a slot in the address table (so the insert
  // below cannot throw), then what each case needs. A refused call changes nothing
  // (block_pool.hpp).
  live_.reserve_one();
  if (n.units > units && align_up(addr, alignment) == addr) {
    live_.prefetch(addr);  // the slot the new live block goes into: load it during the work below
    // The common case: the allocation is the front of b and b keeps the rest. The rest
    // keeps b's node and its place in the class array (moving only when its class
    // changed), so no array entry and no other free block's node is touched. Room in the
    // class the rest moves to and the node are taken before anything moves.
    if (unsigned const rest = class_of(n.units - units); rest != n.free_class) { make_room(*indexes_[n.owner], rest, 1); }
    std::uint32_t const a = new_node();  // node addresses are stable: `n` stays valid
    block& front = at(a);
    front.offset = n.offset;
    front.units = units;
    front.prev = n.prev;
    front.next = b;
    front.free_pos = npos;
    front.chunk = n.chunk;
    front.owner = owner;
    front.state = state_live;
    if (n.prev != npos) {
      at(n.prev).next = a;
    } else {
      chunks_[n.chunk].first = a;
    }
    n.prev = a;
    n.offset += units;
    resize_free(b, n.units - units);
    b = a;
  } else {
    b = carve(b, align_up(addr, alignment) - addr, size);
    at(b).state = state_live;
  }
  block const& taken = at(b);
  std::uintptr_t const start = addr_of(taken);
  live_.insert(start, b);
  ++chunks_[taken.chunk].live_blocks;
  live_bytes_ += size;
  return start;
}

std::size_t block_pool::deallocate(std::uintptr_t address, owner_id owner, std::size_t expected_size) {
  std::uint32_t const b = live_.erase(address, starts_at(address));
  if (b == npos) { return 0; }
  block& n = at(b);
  std::size_t const size = size_of(n);
  // A hole (not a live block), or a free naming another size: put it back and refuse.
  if (n.state != state_live || (expected_size != any_size && size != expected_size)) {
    live_.insert(address, b);
    return 0;
  }
  // How a neighbour joins the freed block: not at all, as a free block of the same owner
  // (the common case, handled here without moving index entries), or under the
  // ownership rules (a synchronized neighbour: `coalesce` decides who owns the result).
  enum { apart, same_owner, by_rules };
  auto join = [&](std::uint32_t x) {
    if (x == npos) { return apart; }
    block const& nb = at(x);
    if (nb.state != state_free) { return apart; }
    if (nb.owner == owner) { return same_owner; }
    return sync_mergeable(owner, nb.owner) ? by_rules : apart;
  };
  std::uint32_t const p = n.prev;
  std::uint32_t const x = n.next;
  // Both neighbours are looked at: start both loads now so their cache misses overlap.
  __builtin_prefetch(&at(p == npos ? b : p));
  __builtin_prefetch(&at(x == npos ? b : x));
  auto const join_prev = join(p);
  auto const join_next = join(x);
  // Host memory runs out only where an entry goes into a class array that is full: a
  // free that meets it throws before anything changes, the block still live and its
  // address back in the table.
  owner_id const owner_before = n.owner;
  chunk_id const chunk = n.chunk;  // read before b may merge into a neighbour
  auto refuse_whole = [&] {
    n.state = state_live;
    n.owner = owner_before;
    live_.insert(address, b);
  };
  if (join_prev == by_rules || join_next == by_rules) {
    try {
      make_room_for_merge(b, owner, owner);
    } catch (...) {
      refuse_whole();
      throw;
    }
    n.state = state_free;
    std::uint32_t const merged = coalesce(b, owner, owner);
    insert_free(merged, at(merged).owner);
  } else if (join_prev == same_owner || join_next == same_owner) {
    std::uint32_t const absorber = join_prev == same_owner ? p : x;
    std::uint32_t const units = n.units + (join_prev == same_owner ? at(p).units : 0) +
                                (join_next == same_owner ? at(x).units : 0);
    if (unsigned const cls = class_of(units); cls != at(absorber).free_class) {
      try {
        make_room(*indexes_[owner], cls, 1);
      } catch (...) {
        refuse_whole();
        throw;
      }
    }
    n.state = state_free;
    absorb_freed(b, join_prev == same_owner, join_next == same_owner, units);
  } else {
    try {
      insert_free(b, owner);  // throws, if at all, before it changes anything but b
    } catch (...) {
      refuse_whole();
      throw;
    }
  }
  live_bytes_ -= size;
  if (--chunks_[chunk].live_blocks == 0) { ++chunks_emptied_; }
  return size;
}

bool block_pool::reserve_deallocate(std::uintptr_t address, owner_id owner) {
  std::uint32_t const b = live_.find(address, starts_at(address));
  if (b == npos || at(b).state != state_live) { return false; }
  // The same merge deallocate makes (make_room_for_merge's rules cover its plain and
  // same-owner cases too: a block of its own class, or its same-owner neighbours'), and
  // the same index: the room it makes is the room deallocate needs.
  make_room_for_merge(b, owner, owner);
  return true;
}

MRSTACK_HOT_INLINE void block_pool::absorb_freed(std::uint32_t b, bool into_prev, bool with_next,
                                                 std::uint32_t units) {
  block const& n = at(b);
  if (into_prev) {
    // The previous block absorbs b (and the next one too, when it joins).
    std::uint32_t const p = n.prev;
    block& prev = at(p);
    std::uint32_t after = n.next;
    if (with_next) {
      std::uint32_t const x = n.next;
      remove_free(x);
      after = at(x).next;
      delete_node(x);
    }
    prev.next = after;
    if (after != npos) {
      at(after).prev = p;
    } else {
      chunks_[prev.chunk].last = p;
    }
    delete_node(b);
    resize_free(p, units);
    return;
  }
  // The next block absorbs b: it starts where b started.
  std::uint32_t const x = n.next;
  block& next = at(x);
  next.offset = n.offset;
  next.prev = n.prev;
  if (n.prev != npos) {
    at(n.prev).next = x;
  } else {
    chunks_[next.chunk].first = x;
  }
  delete_node(b);
  resize_free(x, units);
}

MRSTACK_HOT_INLINE void block_pool::resize_free(std::uint32_t b, std::uint32_t units) {
  block& n = at(b);
  class_index& idx = *indexes_[n.owner];
  unsigned const cls = n.free_class;
  unsigned const new_cls = class_of(units);
  std::size_t const before = size_of(n);
  n.units = units;
  idx.bytes = idx.bytes - before + size_of(n);
  free_bytes_total_ = free_bytes_total_ - before + size_of(n);
  if (new_cls == cls) {
    idx.lists[cls][n.free_pos].units = units;
    return;
  }
  // Move the entry to its new class: the block count and owner stay as they are.
  unlink_entry(idx, b);
  auto& to = idx.lists[new_cls];
  n.free_pos = static_cast<std::uint32_t>(to.size());
  n.free_class = new_cls;
  to.push_back(free_entry{b, units});  // room was made: see insert_free
  idx.sl_bitmap[new_cls / sl_count] |= 1U << (new_cls % sl_count);
  idx.fl_bitmap |= 1U << (new_cls / sl_count);
}

std::size_t block_pool::live_size(std::uintptr_t address) const {
  std::uint32_t const b = live_.find(address, starts_at(address));
  if (b == npos || at(b).state != state_live) { return 0; }
  return size_of(at(b));
}

// ---- holes ------------------------------------------------------------------------------------------

std::uint32_t block_pool::withdraw(std::uint32_t b, std::size_t offset, std::size_t length) {
  block const& n = at(b);
  if (offset % granularity != 0 || length % granularity != 0 || offset + length > size_of(n) || offset + length < offset) {
    throw std::invalid_argument("block_pool::withdraw_free_ranges: range must be granular and inside the free block");
  }
  live_.reserve_one();  // before carve changes anything: the insert below cannot fail
  std::uint32_t const hole = carve(b, offset, length);
  block& h = at(hole);
  h.state = state_withdrawn;
  live_.insert(addr_of(h), hole);
  ++chunks_[h.chunk].withdrawn_blocks;
  ++withdrawn_count_;
  withdrawn_bytes_ += length;
  return hole;
}

std::size_t block_pool::split_hole(std::uintptr_t address, std::size_t offset) {
  std::uint32_t const b = live_.find(address, starts_at(address));
  if (b == npos || at(b).state != state_withdrawn) { return 0; }
  if (offset == 0 || offset % granularity != 0 || offset >= size_of(at(b))) {
    throw std::invalid_argument("block_pool::split_hole: offset " + std::to_string(offset) +
                                " must be granular and inside the hole of " + std::to_string(size_of(at(b))) + " B");
  }
  live_.reserve_one();  // before anything changes: the insert below cannot fail
  std::uint32_t const upper = split(b, offset, new_node());
  live_.insert(addr_of(at(upper)), upper);
  ++chunks_[at(upper).chunk].withdrawn_blocks;
  ++withdrawn_count_;
  return offset;
}

}  // namespace mrstack::detail
