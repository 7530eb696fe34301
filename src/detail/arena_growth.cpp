// arena_core's chunks: growing the global arena on demand, giving wholly free chunks back
// past the free-bytes bound, and the lock-free superblock map (design: detail/arena_core.hpp).
#include <mrstack/detail/arena_core.hpp>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <limits>
#include <stdexcept>

#include <mrstack/detail/align.hpp>
#include <mrstack/detail/in_place_pool_growth.hpp>

namespace mrstack::detail {

// ---- the global arena's chunks ---------------------------------------------------------------------

std::uintptr_t arena_core::global_allocate(std::size_t size, std::size_t alignment, stream_ref const& s) {
  global_free_note const note{*this};  // growth raises the free bytes the depot's bound reads
  if (std::uintptr_t const p = global_.allocate(size, alignment, s)) { return p; }
  if (depot_superblocks_seen_.load(std::memory_order_relaxed) != 0) {
    // Free superblocks waiting in the depot come before new memory.
    drain_depot_locked(s);
    if (std::uintptr_t const p = global_.allocate(size, alignment, s)) { return p; }
  }
  if (in_place_) { return grow_in_place_and_allocate(size, alignment, s); }
  // Room to align inside a chunk the upstream aligns to 256 only.
  if (size > std::numeric_limits<std::size_t>::max() / 2 || alignment > std::numeric_limits<std::size_t>::max() / 2) {
    return 0;
  }
  // An upstream chunk that happens to be aligned needs no padding: when the maximum leaves
  // no room for it (an arena of one superblock), a chunk of the size alone may still serve.
  if (!grow(size + alignment - 256, s) && (alignment <= 256 || !grow(size, s))) { return 0; }
  return global_.allocate(size, alignment, s);
}

std::size_t arena_core::global_deallocate(std::uintptr_t address, stream_ref const& s, std::size_t expected_size) {
  std::size_t const freed = global_.deallocate(address, s, expected_size);
  if (freed == 0) { return 0; }
  if (!opts_.eager && !in_place_ && global_.blocks().chunks_emptied() != emptied_seen_) {
    // Only a free that emptied its chunk can make a candidate: the chunk lookup (a tree
    // search, a tenth of a large free's time) is skipped for all the others.
    emptied_seen_ = global_.blocks().chunks_emptied();
    note_maybe_empty(address);
  }
  // The block is free now: giving chunks back is housekeeping this free does not fail for
  // (a bad_alloc there reported a free that had happened, and a large block's alignment
  // was remembered past it, refusing the next block there). A later free retries.
  try {
    after_global_free(s);
  } catch (std::bad_alloc const&) {
  }
  return freed;
}

void arena_core::after_global_free(stream_ref const& caller) {
  std::size_t const depot_bytes = depot_superblocks_seen_.load(std::memory_order_relaxed) * opts_.superblock_size;
  if (!opts_.eager && global_.blocks().free_bytes() + depot_bytes > opts_.max_free_bytes) {
    drain_depot_locked(caller);  // its superblocks would keep their chunks
    if (in_place_) {
      in_place_->after_deallocate(global_, caller);  // not while a capture may hold free memory
    } else {
      return_empty_chunks(opts_.max_free_bytes, false, caller);
    }
  }
  note_global_free_locked();
}

std::uintptr_t arena_core::grow_in_place_and_allocate(std::size_t size, std::size_t alignment, stream_ref const& s) {
  try {
    // Releases free granules itself and plans again when the range or the device is full.
    in_place_->grow(global_, size, alignment, s);
  } catch (growth_failure const& e) {
    upstream_.refused(e.what());
    return 0;
  }
  // Superblocks may now be carved anywhere up to the chunk's end: the map needs its levels.
  std::size_t const frontier = in_place_->policy().frontier_bytes();
  map_.reserve(reinterpret_cast<std::uintptr_t>(opts_.grow_in_place_over->range_base()), frontier);
  peak_held_ = std::max(peak_held_, held_bytes_locked());
  return global_.allocate(size, alignment, s);
}

std::size_t arena_core::held_bytes_locked() const noexcept {
  return in_place_ ? in_place_->committed_bytes() : held_;
}

bool arena_core::grow(std::size_t needed, stream_ref const& s) {
  if (opts_.eager) { return false; }
  std::size_t const held_before = held_;
  // Wholly free chunks go back first and their bytes join the new chunk where the maximum
  // leaves room: several small chunks become one larger one, so free memory does not stay
  // split between chunks. The request alone is what must fit (as the pool's growth).
  std::size_t const returned = return_empty_chunks(0, false, s);
  needed = align_up(needed, std::size_t{256});
  std::size_t const cap = opts_.max_size > held_ ? align_down(opts_.max_size - held_, std::size_t{256}) : 0;
  if (needed > cap) { return false; }
  constexpr std::size_t growth_granularity = std::size_t{2} << 20;
  std::size_t want = std::max({std::min(needed + returned, cap), held_before / opts_.growth_divisor, opts_.minimum_growth});
  want = std::min(align_up(want, growth_granularity), cap);
  for (std::size_t chunk = want;;) {
    if (std::uintptr_t const base = upstream_.allocate(chunk, s)) {
      add_chunk(base, chunk, s, false);
      return true;
    }
    if (chunk == needed) { return false; }
    chunk = std::max(needed, align_down(chunk / 2, std::size_t{256}));
  }
}

void arena_core::add_chunk(std::uintptr_t base, std::size_t size, stream_ref const& s, bool synchronized) {
  try {
    map_.reserve(base, size);
    auto const [it, inserted] = chunks_.emplace(base, chunk_record{});
    if (!inserted) { throw std::logic_error("arena: the upstream handed out a chunk the arena already holds"); }
    try {
      empty_candidates_.reserve(chunks_.size());  // room for every chunk: noting one never allocates
      it->second.id = synchronized ? global_.blocks().add_chunk(base, size, block_pool::synchronized)
                                   : global_.add_chunk(base, size, s);
    } catch (...) {
      chunks_.erase(it);
      throw;
    }
    it->second.size = size;
  } catch (...) {
    upstream_.deallocate(base, size, s);
    throw;
  }
  held_ += size;
  peak_held_ = std::max(peak_held_, held_);
  ++upstream_allocations_;
}

void arena_core::note_maybe_empty(std::uintptr_t address) {
  auto it = chunks_.upper_bound(address);
  if (it == chunks_.begin()) { return; }
  --it;
  if (it->second.candidate || global_.blocks().chunk(it->second.id).live_blocks != 0) { return; }
  it->second.candidate = true;
  empty_candidates_.push_back(it->first);  // within the reserve add_chunk made
}

std::size_t arena_core::return_empty_chunks(std::size_t keep_free, bool may_synchronize, stream_ref const& caller) {
  std::size_t returned = 0;
  for (std::size_t i = 0; i < empty_candidates_.size() && global_.blocks().free_bytes() > keep_free;) {
    auto const it = chunks_.find(empty_candidates_[i]);
    bool const gone = it == chunks_.end() || global_.blocks().chunk(it->second.id).live_blocks != 0;
    stream_ref s{};
    if (!gone) {
      if (may_synchronize) {
        s = global_.return_stream(it->second.id);
      } else if (!global_.return_stream_without_sync(it->second.id, s, caller)) {
        ++i;  // another thread's stream owns some of it: stays a candidate
        continue;
      }
    }
    empty_candidates_[i] = empty_candidates_.back();
    empty_candidates_.pop_back();
    if (it == chunks_.end()) { continue; }
    it->second.candidate = false;
    if (gone) { continue; }
    returned += it->second.size;
    return_chunk(it, s);
  }
  return returned;
}

void arena_core::return_chunk(std::map<std::uintptr_t, chunk_record>::iterator it, stream_ref const& s) noexcept {
  // Wholly free in the global arena, so no superblock of it is carved: nothing in map_.
  global_.blocks().remove_chunk(it->second.id);
  held_ -= it->second.size;
  ++upstream_deallocations_;
  upstream_.deallocate(it->first, it->second.size, s);
  chunks_.erase(it);
}

std::size_t arena_core::release_free_chunks() {
  std::lock_guard lock{global_mutex_};
  if (opts_.eager) { return 0; }
  drain_depot_locked(stream_ref{});
  global_free_note const note{*this};
  if (in_place_) { return in_place_->release(global_); }
  // Every chunk with no live block, not only those a free noted.
  for (auto& [base, rec] : chunks_) {
    if (!rec.candidate && global_.blocks().chunk(rec.id).live_blocks == 0) {
      rec.candidate = true;
      empty_candidates_.push_back(base);
    }
  }
  return return_empty_chunks(0, true, stream_ref{});
}

void arena_core::return_all_chunks() noexcept {
  try {
    std::lock_guard lock{global_mutex_};
    // One stream named here owning everything free (the common one-thread case): return
    // on it. Otherwise the device is synchronized once and all goes back on the legacy
    // default stream.
    stream_ref s{};
    // A stream's thread shards are on its stream: one stream in use is one family.
    bool single = std::count_if(arenas_.begin(), arenas_.end(), [](auto const& a) { return a->family == a.get(); }) <= 1;
    std::vector<owner_id> owners;
    for (auto const& [base, rec] : chunks_) {
      for (owner_id const x : global_.blocks().chunk_owners(rec.id)) {
        owner_id const o = global_.owners().stream_of(x);  // a stream's parked memory is that stream's
        if (o != block_pool::synchronized && std::find(owners.begin(), owners.end(), o) == owners.end()) {
          owners.push_back(o);
        }
      }
    }
    single = single && owners.size() <= 1;
    if (single && owners.size() == 1) {
      single = global_.owners().nameable_here(owners.front()) &&
               (arenas_.empty() || arenas_.front()->stream.key == global_.owners().ref(owners.front()).key);
      s = global_.owners().ref(owners.front());
    } else if (single && !arenas_.empty()) {
      single = global_.owners().nameable_here(global_.owner_of(arenas_.front()->stream));
      s = arenas_.front()->stream;
    }
    if (!single) {
      global_.synchronize_everything();
      sync_->synchronize_all();
      s = stream_ref{};
    }
    for (auto const& [base, rec] : chunks_) { upstream_.deallocate(base, rec.size, s); }
  } catch (...) {
    // Synchronizing failed (the device is gone): give everything back on the legacy stream.
    for (auto const& [base, rec] : chunks_) { upstream_.deallocate(base, rec.size, stream_ref{}); }
  }
  chunks_.clear();
  held_ = 0;
}

arena_core::superblock& arena_core::descriptor_for(std::uintptr_t address) {
  superblock* d = nullptr;
  if (!idle_descriptors_.empty()) {
    d = idle_descriptors_.back();
    idle_descriptors_.pop_back();
  } else {
    descriptors_.reserve(descriptors_.size() + 1);
    idle_descriptors_.reserve(descriptors_.size() + 1);  // every descriptor can go idle without allocating
    descriptors_.push_back(std::make_unique<superblock>());
    d = descriptors_.back().get();
  }
  d->base = address;
  return *d;
}

}  // namespace mrstack::detail
