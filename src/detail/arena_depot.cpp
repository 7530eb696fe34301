// arena_core's depot: wholly free superblocks that stream arenas hand back, kept carved
// and passed to other stream arenas under one short lock (design: detail/arena_core.hpp).
//
// Why: every superblock a thread takes or hands back had been one allocation or free in
// the global arena's block pool, under the global lock. A thread growing to a thousand
// superblocks and back makes two thousand of them, and on a 16-core H200 host 16 such
// threads spent most of their time asleep on that lock (all of their futex waits were
// there: docs/benchmarks.md). Through the depot a batch of superblocks moves as one list.
#include <mrstack/detail/arena_core.hpp>

#include <algorithm>

namespace mrstack::detail {

namespace {
// Batches looked at, from the newest, for one of the taker's own stream.
constexpr std::size_t batches_searched = 8;
}  // namespace

// ---- superblocks going back: to the depot, else the global arena ---------------------------------

void arena_core::surrender_spares(stream_arena& a, std::size_t keep, stream_ref const& caller) {
  if (a.spares.size() <= keep) { return; }
  if (surrender_to_depot(a, keep, caller)) { return; }
  // Freed as `a`'s stream's memory. Named only when the current call may name it: a
  // stream the user created may be destroyed by now (asking CUDA about it, or recording
  // on it, is undefined behaviour), so then nothing is asked or recorded.
  bool const named = global_.owners().may_name(a.stream, caller);
  // One at a time from the back, each detached only once the global arena has it back:
  // if a free throws, the spares not yet returned are still wholly this arena's. (Under
  // the global lock, so no other arena can take one before it is detached here.)
  std::lock_guard lock{global_mutex_};
  while (a.spares.size() > keep) {
    superblock& sb = *a.spares.back();
    std::uintptr_t const base = sb.base;
    if (named) {
      global_.deallocate(base, a.stream);
    } else {
      global_.deallocate_without_naming(base, a.stream);
    }
    detach_superblock(a, sb);
    a.spares.pop_back();
    sb.base = 0;
    idle_descriptors_.push_back(&sb);  // within the room descriptor_for reserved
    if (!opts_.eager && !in_place_) { note_maybe_empty(base); }
  }
  after_global_free(caller);
}

std::size_t arena_core::reclaim_from(stream_arena& a, stream_ref const& caller) {
  // Every wholly free superblock joins the spares, then all of them go back in one trip.
  // (Room first: a superblock taken off its list must not be lost to a failed push.)
  a.spares.reserve(a.spares.size() + a.empty);
  for (auto& head : a.lists) {
    for (superblock* sb = head; sb != nullptr;) {
      superblock* const next = sb->next;
      if (sb->free_count == sb->capacity) {
        list_remove(a, *sb);
        --a.empty;
        make_spare(a, *sb);
      }
      sb = next;
    }
  }
  std::size_t const returned = a.spares.size() * opts_.superblock_size;
  surrender_spares(a, 0, caller);
  a.over_bounds = false;  // within them again: it holds no wholly free superblock
  return returned;
}

std::size_t arena_core::reclaim(stream_ref const& caller) {
  std::vector<stream_arena*> all;
  {
    std::lock_guard lock{registry_mutex_};
    for (auto const& a : arenas_) { all.push_back(a.get()); }
  }
  std::size_t returned = depot_superblocks_seen_.load(std::memory_order_relaxed) * opts_.superblock_size;
  for (stream_arena* a : all) {
    std::lock_guard lock{a->mutex};
    returned += reclaim_from(*a, caller);
  }
  std::lock_guard lock{global_mutex_};
  drain_depot_locked(caller);
  return returned;
}

bool arena_core::synchronize_everything() {
  std::lock_guard lock{global_mutex_};
  drain_depot_locked(stream_ref{});
  return global_.synchronize_everything();
}

// ---- arenas of exited threads ----------------------------------------------------------------------

bool arena_core::retire_if_empty(stream_arena& a, stream_ref const& caller) {
  reclaim_from(a, caller);
  if (a.superblocks != 0 || !a.freed_in_capture.empty()) { return false; }
  std::uint32_t const index = arena_by_key_.erase(a.stream.key);
  if (index == address_map::npos) { return true; }  // retired already
  retired_arenas_.reserve(arenas_.size());
  a.retired = true;
  retired_arenas_.push_back(index);
  streams_in_use_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

void arena_core::retire_emptied_orphans() {
  std::erase_if(orphaned_arenas_, [&](std::uint32_t index) {
    if (index >= arenas_.size()) { return true; }
    stream_arena& o = *arenas_[index];
    if (o.late_calls != 0) { return false; }  // its thread's late destructor uses it now
    std::lock_guard lock{o.mutex};
    return retire_if_empty(o, stream_ref{});  // its thread is gone: its stream is named by nobody
  });
}

void arena_core::after_orphan_emptied() noexcept {
  try {
    std::lock_guard registry{registry_mutex_};
    retire_emptied_orphans();
  } catch (...) {
    // Best effort: the next thread's exit retires it.
  }
}

// ---- the depot ------------------------------------------------------------------------------------

stream_sync::handle arena_core::depot_event() {
  {
    std::lock_guard lock{depot_mutex_};
    if (!depot_events_.empty()) {
      stream_sync::handle const e = depot_events_.back();
      depot_events_.pop_back();
      return e;
    }
  }
  return sync_->create_event();
}

void arena_core::leave_arena(stream_arena& a, superblock& sb) noexcept {
  --a.superblocks;
  a.free_bytes -= std::size_t{sb.capacity} * sb.block_size;
  a.usable_bytes -= std::size_t{sb.capacity} * sb.block_size;
  a.free_blocks -= sb.capacity;
  sb.arena.store(nullptr, std::memory_order_release);
  sb.spare = false;
}

bool arena_core::surrender_to_depot(stream_arena& a, std::size_t keep, stream_ref const& caller) {
  std::size_t const n = a.spares.size() - keep;
  // Free memory outside the stream arenas stays within `max_free_bytes` (as seen at the
  // global arena's last free): past it the superblocks go to the global arena, whose
  // wholly free chunks then go back — a depot superblock would keep its chunk.
  std::size_t const depot_after = (depot_superblocks_seen_.load(std::memory_order_relaxed) + n) * opts_.superblock_size;
  if (global_free_seen_.load(std::memory_order_relaxed) + depot_after > opts_.max_free_bytes) { return false; }
  // Another stream may take these only after their frees, so with other streams in use an
  // event is recorded on `a`'s stream now, after every one of them. That needs a call that
  // may name the stream (one the user created may be destroyed by now) and a stream not
  // being captured (a capture's record orders nothing outside the graph). One stream in
  // use: no event and no CUDA call; a later stream leaves such a batch to the global arena.
  stream_sync::handle event = 0;
  if (streams_in_use_.load(std::memory_order_relaxed) > 1) {
    if (!global_.owners().may_name(a.stream, caller) || sync_->capturing(a.stream.handle)) { return false; }
  }
  // A per-thread default stream's batch needs no event: its takers wait on the legacy
  // barrier (order_after_batch), one record for every such batch handed in before it.
  if (streams_in_use_.load(std::memory_order_relaxed) > 1 && !a.stream.thread_bound) {
    try {
      event = depot_event();
    } catch (...) {
      return false;  // no event to be had (cudaEventCreate failed): the global arena orders them
    }
    if (!sync_->record(event, a.stream.handle)) {
      std::lock_guard lock{depot_mutex_};
      try {
        depot_events_.push_back(event);
      } catch (...) {
        sync_->destroy_event(event);
      }
      return false;
    }
  }
  std::lock_guard lock{depot_mutex_};
  try {
    depot_.reserve(depot_.size() + 1);
    depot_events_.reserve(depot_events_.size() + depot_.size() + 1);  // a batch's event always has room back
  } catch (...) {
    if (event != 0) { sync_->destroy_event(event); }
    return false;
  }
  depot_batch batch{a.stream, event, nullptr, n, ++depot_seq_};
  for (std::size_t i = 0; i < n; ++i) {
    superblock& sb = *a.spares.back();
    a.spares.pop_back();
    leave_arena(a, sb);
    sb.next = batch.head;
    batch.head = &sb;
  }
  depot_.push_back(batch);
  depot_superblocks_ += n;
  depot_superblocks_seen_.store(depot_superblocks_, std::memory_order_relaxed);
  return true;
}

bool arena_core::order_after_batch(stream_arena& a, depot_batch const& batch) {
  // Waits are made under the depot's lock: the batch's event cannot be recorded again for
  // another batch before it.
  stream_ref const& s = a.stream;
  if (sync_->capturing(s.handle)) { return false; }
  if (batch.event != 0) {
    sync_->wait(s.handle, batch.event);
    return true;
  }
  // A per-thread default stream's batch (they carry no event; nor did any batch made
  // while one stream was in use, its thread often gone since). Per-thread default streams
  // are blocking, so work on the legacy stream follows all of theirs: a barrier recorded
  // there after the batch was handed in orders `s` after its frees once `s` waits on it,
  // and `s` needs no call for any batch that barrier covers again.
  if (a.barrier_waited >= batch.seq) { return true; }
  // The legacy stream may not be touched while a blocking stream is being captured.
  if (sync_->capturing(stream_owners::legacy_stream)) { return false; }
  if (legacy_barrier_covers_ < batch.seq) {
    if (legacy_barrier_ == 0) {
      try {
        legacy_barrier_ = sync_->create_event();
      } catch (...) {
        return false;  // no event to be had: the batch waits for a drain
      }
    }
    if (!sync_->record(legacy_barrier_, stream_owners::legacy_stream)) { return false; }
    legacy_barrier_covers_ = depot_seq_;  // every batch handed in so far came before the record
  }
  sync_->wait(s.handle, legacy_barrier_);
  a.barrier_waited = legacy_barrier_covers_;
  return true;
}

std::size_t arena_core::covered_batch(stream_arena const& a) const noexcept {
  // Batches are in `seq` order, so those up to what `a` waited for are a prefix.
  auto const end = std::upper_bound(depot_.begin(), depot_.end(), a.barrier_waited,
                                    [](std::uint64_t waited, depot_batch const& b) { return waited < b.seq; });
  std::size_t i = static_cast<std::size_t>(end - depot_.begin());
  for (std::size_t looked = 0; i-- > 0 && looked < batches_searched; ++looked) {
    if (depot_[i].event == 0 && depot_[i].stream.thread_bound) { return i; }
  }
  return depot_.size();
}

std::size_t arena_core::take_from_depot(stream_arena& a, superblock** got, std::size_t want) {
  if (depot_superblocks_seen_.load(std::memory_order_relaxed) == 0) { return 0; }
  std::lock_guard lock{depot_mutex_};
  // Room for the batch's event and a legacy record's, before anything moves.
  depot_events_.reserve(depot_events_.size() + 2);
  // The newest batch of `a`'s own stream among the newest few (no wait), else the newest
  // another stream can be ordered after (see `orderable`). Others wait for a drain.
  auto orderable = [](depot_batch const& b) { return b.event != 0 || b.stream.thread_bound; };
  std::size_t pick = depot_.size();
  std::size_t const oldest_searched = depot_.size() > batches_searched ? depot_.size() - batches_searched : 0;
  for (std::size_t i = depot_.size(); i-- > 0;) {
    if (i >= oldest_searched && depot_[i].stream.key == a.stream.key) {
      pick = i;
      break;
    }
    if (pick == depot_.size() && orderable(depot_[i])) {
      pick = i;
      if (i < oldest_searched) { break; }
    }
  }
  // Not its own: a batch its stream already waited for comes at no call.
  if (pick == depot_.size() || depot_[pick].stream.key != a.stream.key) {
    if (std::size_t const covered = covered_batch(a); covered != depot_.size()) { pick = covered; }
  }
  if (pick == depot_.size()) { return 0; }
  depot_batch& batch = depot_[pick];
  if (batch.stream.key != a.stream.key && !order_after_batch(a, batch)) { return 0; }
  std::size_t n = 0;
  for (; n < want && batch.head != nullptr; ++n) {
    superblock* sb = batch.head;
    batch.head = sb->next;
    sb->next = nullptr;
    sb->arena.store(&a, std::memory_order_release);
    got[n] = sb;
  }
  batch.count -= n;
  if (batch.count == 0) {
    if (batch.event != 0) { depot_events_.push_back(batch.event); }
    depot_.erase(depot_.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  depot_superblocks_ -= n;
  depot_superblocks_seen_.store(depot_superblocks_, std::memory_order_relaxed);
  return n;
}

void arena_core::drain_depot_locked(stream_ref const& caller) {
  if (depot_superblocks_seen_.load(std::memory_order_relaxed) == 0) { return; }
  std::lock_guard lock{depot_mutex_};
  bool const caller_may_wait = !sync_->capturing(caller.handle);
  global_free_note const note{*this};
  struct publish_count {  // also when a free throws: what is left stays counted
    arena_core& core;
    ~publish_count() { core.depot_superblocks_seen_.store(core.depot_superblocks_, std::memory_order_relaxed); }
  } const publish{*this};
  while (!depot_.empty()) {
    depot_batch& batch = depot_.back();
    // The caller's stream waits for the batch's frees and takes them as its own; a batch
    // of its own stream needs no wait. Otherwise they stay the freeing stream's, freed
    // since its last record (the global arena's rules then decide who may take them).
    bool const as_callers = batch.stream.key == caller.key || (batch.event != 0 && caller_may_wait);
    if (as_callers && batch.stream.key != caller.key) { sync_->wait(caller.handle, batch.event); }
    while (batch.head != nullptr) {
      superblock& sb = *batch.head;
      std::uintptr_t const base = sb.base;
      if (as_callers) {
        global_.deallocate(base, caller);
      } else {
        global_.deallocate_without_naming(base, batch.stream);
      }
      batch.head = sb.next;
      sb.next = nullptr;
      --batch.count;
      --depot_superblocks_;
      map_.assign(base, opts_.superblock_size, nullptr);
      sb.base = 0;
      idle_descriptors_.push_back(&sb);  // within the room descriptor_for reserved
      if (!opts_.eager && !in_place_) { note_maybe_empty(base); }
    }
    if (batch.event != 0) { depot_events_.push_back(batch.event); }
    depot_.pop_back();
  }
}

arena_core::depot_ranges arena_core::depot_free_ranges_locked() const {
  // Contiguous depot superblocks merge when the depot drains: count them as one range.
  std::vector<std::uintptr_t> bases;
  bases.reserve(depot_superblocks_);
  for (depot_batch const& b : depot_) {
    for (superblock const* sb = b.head; sb != nullptr; sb = sb->next) { bases.push_back(sb->base); }
  }
  std::sort(bases.begin(), bases.end());
  depot_ranges r;
  std::size_t run = 0;
  for (std::size_t i = 0; i < bases.size(); ++i) {
    run = i > 0 && bases[i - 1] + opts_.superblock_size == bases[i] ? run + opts_.superblock_size : opts_.superblock_size;
    if (run == opts_.superblock_size) { ++r.count; }
    r.largest = std::max(r.largest, run);
  }
  return r;
}

std::string arena_core::check_depot() const {
  std::lock_guard lock{depot_mutex_};
  std::size_t total = 0;
  for (depot_batch const& b : depot_) {
    std::size_t n = 0;
    for (superblock const* sb = b.head; sb != nullptr; sb = sb->next, ++n) {
      if (sb->base == 0 || map_.find(sb->base) != sb) { return "depot superblock not carved and mapped"; }
      if (sb->arena.load(std::memory_order_relaxed) != nullptr || sb->listed || sb->spare) {
        return "depot superblock held by an arena";
      }
      if (global_.blocks().live_size(sb->base) != opts_.superblock_size) { return "depot superblock not live in the global arena"; }
    }
    if (n != b.count || n == 0) { return "depot batch miscounted"; }
    total += n;
  }
  if (total != depot_superblocks_) { return "depot superblocks miscounted"; }
  return "";
}

}  // namespace mrstack::detail
