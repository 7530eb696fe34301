// Thread shards of a stream's arena: threads that share one stream (a created stream, or
// the legacy one) and contend for its arena's lock each get an arena of their own on that
// stream (detail/arena_core.hpp, docs/suballocators.md "arena").
#include <mrstack/detail/arena_core.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <new>

namespace mrstack::detail {

arena_core::stream_arena* arena_core::arena_for(stream_ref const& s) {
  stream_arena* const a = keyed_arena_for(s);
  shard_table* table = a->shards.load(std::memory_order_acquire);
  if (table == nullptr) [[likely]] {
    // With no threshold, a second thread on the stream shards it at once.
    if (opts_.shard_after_contentions != 0 || !may_shard(*a) || this_thread_shard() == a->creator_shard) { return a; }
    std::lock_guard lock{a->mutex};
    if (!start_thread_shards_locked(*a)) { return a; }
    table = a->shard_storage.get();
  }
  return thread_shard(*a, *table, s);
}

void arena_core::note_contention(stream_arena& a) {
  if (!may_shard(a) || a.shard_storage) { return; }
  if (++a.contentions >= opts_.shard_after_contentions) { (void)start_thread_shards_locked(a); }
}

bool arena_core::start_thread_shards_locked(stream_arena& a) {
  if (a.shard_storage) { return true; }
  // Shards are an optimization: without host memory for the table the stream keeps its
  // one arena (which serves this call with no host allocation), and a later call tries again.
  std::unique_ptr<shard_table> table;
  try {
    table = std::make_unique<shard_table>();
  } catch (std::bad_alloc const&) {
    return false;
  }
  // The thread that made the arena keeps it: its superblocks and cached blocks stay in use.
  table->arenas[a.creator_shard].store(&a, std::memory_order_relaxed);
  a.shard_storage = std::move(table);
  a.shards.store(a.shard_storage.get(), std::memory_order_release);
  return true;
}

arena_core::stream_arena* arena_core::thread_shard(stream_arena& family, shard_table& table, stream_ref const& s) {
  std::size_t const index = this_thread_shard();
  if (stream_arena* const mine = table.arenas[index].load(std::memory_order_acquire)) [[likely]] { return mine; }
  std::lock_guard lock{registry_mutex_};
  if (stream_arena* const made = table.arenas[index].load(std::memory_order_acquire)) { return made; }
  // Never keyed, never retired, not counted in streams_in_use_ (the stream is counted once):
  // a new thread given this index (an exited thread's) takes it over, on the same stream.
  // Without host memory for it the thread uses the stream's own arena (the family: its
  // frees are the stream's as any shard's), and a later call tries again.
  try {
    auto a = std::make_unique<stream_arena>();
    a->stream = s;
    a->family = &family;
    a->creator_shard = index;
    a->spares.reserve(spare_limit(*a) + 1);  // as find_or_create_arena_locked: spares never allocate
    arenas_.push_back(std::move(a));
  } catch (std::bad_alloc const&) {
    return &family;
  }
  table.arenas[index].store(arenas_.back().get(), std::memory_order_release);
  return arenas_.back().get();
}

// ---- blocks held back during a capture ------------------------------------------------------------

void arena_core::settle_held_back_slow(stream_ref const& s) {
  // Every thread shard of the stream: the thread that held a block back may never call
  // on the stream again.
  // Only a stream with an arena can hold blocks back: a call on any other (a large block
  // on a new stream) makes it none, nor counts it in use.
  stream_arena* const own = keyed_arena_for(s, false);
  if (own == nullptr) { return; }
  bool emptied_orphan = settle_arena(*own, s);
  if (shard_table const* const table = own->shards.load(std::memory_order_acquire)) {
    for (auto const& slot : table->arenas) {
      stream_arena* const shard = slot.load(std::memory_order_acquire);
      if (shard != nullptr && shard != own) { emptied_orphan = settle_arena(*shard, s) || emptied_orphan; }
    }
  }
  // As a free that empties an exited thread's arena: retired now, not at another exit.
  if (emptied_orphan) { after_orphan_emptied(); }
}

bool arena_core::settle_arena(stream_arena& arena, stream_ref const& s) {
  stream_arena* const a = &arena;
  std::uint64_t ready = 0;  // blocks numbered below this were held before the synchronization
  {
    std::lock_guard lock{a->mutex};
    if (a->freed_in_capture.empty() || sync_->capturing(s.handle)) { return false; }
    ready = a->held_back_total;
  }
  // Before the blocks leave the list. What this orders is the work s itself enqueued;
  // the graph's own work runs at its launches, which ordering with the memory freed in
  // its capture is the caller's (as with the pool). A failure leaves the blocks held back
  // for a later call, and does not fail this one.
  try {
    sync_->synchronize(s.handle);
  } catch (std::exception const&) {
    return false;
  }
  std::vector<stream_arena::held_block> blocks;
  {
    std::lock_guard lock{a->mutex};
    auto& held = a->freed_in_capture;
    // Another thread on s may have settled some meanwhile, or held back more in a new
    // capture (those wait for its end): only blocks held before the synchronization go.
    auto const last = std::find_if(held.begin(), held.end(), [&](auto const& h) { return h.number >= ready; });
    blocks.assign(held.begin(), last);
    held.erase(held.begin(), last);
    if (!blocks.empty() && held.empty()) { held_back_streams_.fetch_sub(1, std::memory_order_relaxed); }
  }
  bool emptied_orphan = false;
  for (auto const& h : blocks) {
    stream_arena* const owner = h.sb->arena.load(std::memory_order_acquire);
    std::lock_guard lock{owner->mutex};
    --h.sb->held_back;
    push_block(*owner, *h.sb, h.index, s);
    emptied_orphan = emptied_orphan || (owner->orphaned && owner->superblocks == 0);
  }
  return emptied_orphan;
}

}  // namespace mrstack::detail
