// arena_core's introspection: the block a refused free names, statistics and the
// invariant checks (design: detail/arena_core.hpp). Kept apart from the allocation
// paths, which it only reads.
#include <mrstack/detail/arena_core.hpp>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <mrstack/detail/in_place_pool_growth.hpp>

namespace mrstack::detail {

// ---- introspection ------------------------------------------------------------------------------------

std::size_t arena_core::handed_out_alignment(std::uintptr_t p) const {
  std::lock_guard lock{global_mutex_};
  auto const it = large_alignments_.find(p);
  return it == large_alignments_.end() ? 256 : it->second;
}

std::size_t arena_core::live_size(std::uintptr_t p) const {
  auto const* const sb = map_.find(p);
  if (sb == nullptr) {
    std::lock_guard lock{global_mutex_};
    return global_.blocks().live_size(p);
  }
  stream_arena* const owner = sb->arena.load(std::memory_order_acquire);
  if (owner == nullptr) { return 0; }
  std::lock_guard lock{owner->mutex};
  std::uint32_t index = 0;
  return live_block(*sb, owner, p, index) ? small_size(*sb, index) : 0;
}

arena_core::statistics arena_core::stats() const {
  statistics st;
  {
    std::lock_guard lock{global_mutex_};
    st.held_bytes = held_bytes_locked();
    st.peak_held_bytes = peak_held_;
    st.chunks = in_place_ ? 1 : chunks_.size();
    st.upstream_allocations = in_place_ ? in_place_->policy().grow_count() : upstream_allocations_;
    st.upstream_deallocations = in_place_ ? in_place_->policy().release_count() : upstream_deallocations_;
    st.global_free_bytes = global_.blocks().free_bytes();
    st.global_free_blocks = global_.blocks().free_block_count();
    st.largest_free_block = global_.blocks().largest_free_block();
    st.large_live_bytes = global_.blocks().live_bytes();
    std::lock_guard depot_lock{depot_mutex_};
    // Depot superblocks are free memory outside the stream arenas, as the global arena's is.
    std::size_t const depot_bytes = depot_superblocks_ * opts_.superblock_size;
    depot_ranges const ranges = depot_free_ranges_locked();
    st.global_free_bytes += depot_bytes;
    st.global_free_blocks += ranges.count;
    st.large_live_bytes -= depot_bytes;  // live in the global arena's books, free in truth
    st.largest_free_block = std::max(st.largest_free_block, ranges.largest);
  }
  std::vector<stream_arena*> all;
  {
    std::lock_guard lock{registry_mutex_};
    for (auto const& a : arenas_) { all.push_back(a.get()); }
  }
  // A stream's thread shards add to its own arena's share: one share per stream.
  std::unordered_map<stream_arena const*, std::size_t> share_of_family;
  for (stream_arena* a : all) {
    statistics::stream_share share;
    {
      std::lock_guard arena_lock{a->mutex};
      if (a->retired) { continue; }
      ++(a->family == a ? st.stream_arenas : st.thread_shard_arenas);
      share.stream = a->stream;
      share.free_bytes = a->free_bytes;
      share.free_blocks = a->free_blocks;
      // Blocks freed inside a capture are neither live nor free until it ends.
      std::size_t held_back = 0;
      for (auto const& h : a->freed_in_capture) { held_back += h.sb->block_size; }
      st.small_live_bytes += a->usable_bytes - a->free_bytes - held_back;
      st.superblocks_in_arenas += a->superblocks;
      // The largest class with a free block; any class when a spare is ready.
      if (!a->spares.empty()) { share.largest_free_block = opts_.max_small_size; }
      for (unsigned cls = a->lists.size(); cls-- > 0 && share.largest_free_block == 0;) {
        if (a->lists[cls] != nullptr) { share.largest_free_block = arena_size_classes::class_size(cls); }
      }
    }
    st.free_bytes_in_arenas += share.free_bytes;
    st.free_blocks_in_arenas += share.free_blocks;
    st.largest_free_in_arenas = std::max(st.largest_free_in_arenas, share.largest_free_block);
    auto const [it, first] = share_of_family.try_emplace(a->family, st.streams.size());
    if (first) {
      st.streams.push_back(share);
      continue;
    }
    statistics::stream_share& family = st.streams[it->second];
    family.free_bytes += share.free_bytes;
    family.free_blocks += share.free_blocks;
    family.largest_free_block = std::max(family.largest_free_block, share.largest_free_block);
  }
  // The locks were not held together: an arena may have taken superblocks in between.
  std::size_t const in_arenas = st.superblocks_in_arenas * opts_.superblock_size;
  st.large_live_bytes = st.large_live_bytes > in_arenas ? st.large_live_bytes - in_arenas : 0;
  return st;
}

std::string arena_core::check_held_back() const {
  std::size_t in_superblocks = 0;
  for (auto const& d : descriptors_) { in_superblocks += d->base != 0 ? d->held_back : 0; }
  std::size_t listed = 0;
  std::size_t streams = 0;
  for (auto const& a : arenas_) {
    listed += a->freed_in_capture.size();
    streams += a->freed_in_capture.empty() ? 0 : 1;
    for (auto const& h : a->freed_in_capture) {
      if ((h.sb->live_bits[h.index / 64] >> (h.index % 64) & 1U) != 0) { return "a held-back block is live"; }
    }
  }
  if (in_superblocks != listed) { return "held-back blocks: superblocks and lists disagree"; }
  if (streams != held_back_streams_.load(std::memory_order_relaxed)) { return "held-back streams miscounted"; }
  return "";
}

std::string arena_core::check_arena_locked(stream_arena const& a, std::size_t usable) const {
  if (a.retired && (a.superblocks != 0 || a.late_calls != 0)) { return "a retired arena holds superblocks or is in use"; }
  std::size_t free_bytes = 0;
  std::size_t free_blocks = 0;
  std::size_t listed = 0;
  std::size_t empty = 0;
  for (unsigned cls = 0; cls < a.lists.size(); ++cls) {
    superblock const* prev = nullptr;
    for (superblock const* sb = a.lists[cls]; sb != nullptr; prev = sb, sb = sb->next) {
      if (sb->arena.load(std::memory_order_relaxed) != &a || sb->cls != cls || sb->prev != prev) { return "arena list corrupt"; }
      free_bytes += std::size_t{sb->free_count} * sb->block_size;
      free_blocks += sb->free_count;
      empty += sb->free_count == sb->capacity ? 1 : 0;
      ++listed;
    }
  }
  for (superblock const* sb : a.spares) {
    if (sb->arena.load(std::memory_order_relaxed) != &a || !sb->spare || sb->listed) { return "arena spare corrupt"; }
    free_bytes += std::size_t{sb->free_count} * sb->block_size;
    free_blocks += sb->free_count;
  }
  if (free_bytes != a.free_bytes) { return "arena free bytes wrong"; }
  if (usable != a.usable_bytes) { return "arena usable bytes wrong"; }
  if (free_blocks != a.free_blocks) { return "arena free block count wrong"; }
  if (empty != a.empty) { return "arena empty count wrong"; }
  if (!a.over_bounds && (empty > opts_.empty_superblocks_kept || a.spares.size() > spare_limit(a))) {
    return "arena keeps too many empty superblocks";
  }
  if (listed + a.spares.size() > a.superblocks) { return "arena lists more superblocks than it owns"; }
  return {};
}

std::string arena_core::check_invariants() const {
  std::lock_guard registry_lock{registry_mutex_};
  std::vector<std::unique_lock<lean_mutex>> locks;
  for (auto const& a : arenas_) { locks.emplace_back(a->mutex); }
  std::lock_guard global_lock{global_mutex_};
  if (std::string const e = global_.blocks().check_invariants(); !e.empty()) { return "global arena: " + e; }
  std::size_t held = 0;
  for (auto const& [base, rec] : chunks_) {
    auto const info = global_.blocks().chunk(rec.id);
    if (info.base != base || info.size != rec.size) { return "chunk record and global arena disagree"; }
    held += rec.size;
  }
  if (in_place_) {
    auto const& policy = in_place_->policy();
    if (!chunks_.empty() || global_.blocks().total_bytes() != policy.frontier_bytes() ||
        global_.blocks().withdrawn_bytes() != policy.hole_bytes()) {
      return "grown in place, but the global arena is not the range's one chunk and its holes";
    }
  } else if (held != held_ || held != global_.blocks().total_bytes()) {
    return "held bytes wrong";
  }
  if (!opts_.eager && held_bytes_locked() > opts_.max_size) { return "holds more than its maximum"; }
  for (auto const& [address, alignment] : large_alignments_) {
    if (address % alignment != 0 || map_.find(address) != nullptr || global_.blocks().live_size(address) == 0) {
      return "an alignment is remembered for " + std::to_string(address) + ", which starts no live large block so aligned";
    }
  }
  std::size_t carved = 0;
  std::unordered_map<stream_arena const*, std::size_t> usable_of;  // what each arena's superblocks' blocks cover
  for (auto const& d : descriptors_) {
    superblock const* sb = d.get();
    if (sb->base == 0) { continue; }  // idle
    ++carved;
    std::string const where = "superblock at " + std::to_string(sb->base);
    if (map_.find(sb->base) != sb) { return where + ": map and descriptor disagree"; }
    if (sb->arena.load(std::memory_order_relaxed) == nullptr) { continue; }  // in the depot: check_depot
    usable_of[sb->arena.load(std::memory_order_relaxed)] += std::size_t{sb->capacity} * sb->block_size;
    if (sb->base % opts_.superblock_size != 0) { return where + ": misaligned"; }
    if (map_.find(sb->base + opts_.superblock_size - 1) != sb) { return where + ": its last page is not mapped to it"; }
    if (global_.blocks().live_size(sb->base) != opts_.superblock_size) { return where + ": not live in the global arena"; }
    std::size_t live = 0;
    for (auto w : sb->live_bits) { live += static_cast<std::size_t>(std::popcount(w)); }
    if (live + sb->free_count + sb->held_back != sb->capacity) { return where + ": live bits and free count disagree"; }
    if (sb->free_stack.size() + (sb->capacity - sb->bump) != sb->free_count) { return where + ": free stack wrong"; }
    if (sb->listed != (sb->free_count > 0 && !sb->spare)) { return where + ": listed iff it has free blocks and is no spare"; }
    if (sb->spare && sb->free_count != sb->capacity) { return where + ": a spare with live blocks"; }
  }
  if (carved + idle_descriptors_.size() != descriptors_.size()) { return "descriptors lost"; }
  if (std::string const e = check_held_back(); !e.empty()) { return e; }
  for (std::uint32_t const index : orphaned_arenas_) {
    if (index < arenas_.size() && arenas_[index]->retired) { return "an exited thread's arena is listed, but retired"; }
  }
  std::size_t owned = 0;
  for (auto const& a : arenas_) {
    if (std::string const e = check_arena_locked(*a, usable_of[a.get()]); !e.empty()) { return e; }
    owned += a->superblocks;
  }
  if (std::string const e = check_depot(); !e.empty()) { return e; }
  if (owned + depot_superblocks_ != carved) { return "superblocks owned by arenas or the depot and carved in the table disagree"; }
  return {};
}

}  // namespace mrstack::detail
