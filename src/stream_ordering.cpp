#include <mrstack/detail/stream_ordering.hpp>

#include <atomic>
#include <stdexcept>
#include <string>

namespace mrstack::detail {

std::uintptr_t this_thread_key() noexcept {
  static std::atomic<std::uintptr_t> next_thread{1};
  thread_local std::uintptr_t const key = (next_thread.fetch_add(1, std::memory_order_relaxed) << 1) | 1U;
  return key;
}

// ---- stream_owners ------------------------------------------------------------------------

stream_owners::stream_owners(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key)
    : sync_{std::move(sync)}, thread_key_{thread_key} {
  if (!sync_) { throw std::invalid_argument("stream_owners: a stream_sync is required"); }
  slots_.emplace_back();  // owner 0: synchronized, never a stream
}

stream_owners::~stream_owners() {
  for (auto const& sl : slots_) {
    if (sl.event != 0) { sync_->destroy_event(sl.event); }
  }
  if (barrier_event_ != 0) { sync_->destroy_event(barrier_event_); }
}

owner_id stream_owners::install(stream_ref const& s, owner_id reuse) {
  owner_id o = reuse;
  if (o == 0) {
    if (slots_.size() > 0xffffU) {
      throw std::length_error("stream-ordered resource: more than 65535 streams hold free memory at once");
    }
    o = static_cast<owner_id>(slots_.size());
    slots_.emplace_back();
  }
  slot& sl = slots_[o];
  sl.ref = s;
  sl.in_use = true;
  sl.dirty = false;
  sl.recorded = false;
  sl.wanted = false;
  by_key_.insert(s.key, o);
  return o;
}

void stream_owners::retire(owner_id o) noexcept {
  by_key_.erase(slots_[o].ref.key);
  slots_[o].in_use = false;
  if (cached_owner_ == o) {
    cached_key_ = address_map::empty_key;
    cached_owner_ = 0;
  }
}

void stream_owners::record_now(slot& sl, stream_ref const& s) {
  if (sl.event == 0) { sl.event = sync_->create_event(); }
  if (sync_->record(sl.event, s.handle)) {
    ++records_;
    sl.dirty = false;
    sl.recorded = true;
  }
}

stream_owners::handover stream_owners::hand_over(owner_id from, stream_ref const& to) {
  slot& f = slots_[from];
  if (!f.dirty && f.recorded) {
    // Every block `from` holds was freed before its last record: waiting on it is enough.
    sync_->wait(to.handle, f.event);
    ++waits_;
    f.wanted = false;
    return handover::ready;
  }
  if (f.ref.thread_bound && f.ref.key != thread_key_()) {
    // Another thread's default stream: ask its thread to record from now on (precise
    // events next time), and order `to` after it now through the legacy default stream,
    // which waits for every blocking stream — per-thread default streams are blocking.
    f.wanted = true;
    if (barrier_event_ == 0) { barrier_event_ = sync_->create_event(); }
    if (!sync_->record(barrier_event_, legacy_stream)) {
      synchronize_all();
      return handover::everything_synchronized;
    }
    ++records_;
    sync_->wait(to.handle, barrier_event_);
    ++waits_;
    return handover::ready;
  }
  if (f.event == 0) { f.event = sync_->create_event(); }
  if (!sync_->record(f.event, f.ref.handle)) {
    synchronize_all();
    return handover::everything_synchronized;
  }
  ++records_;
  f.dirty = false;
  f.recorded = true;
  f.wanted = false;
  sync_->wait(to.handle, f.event);
  ++waits_;
  return handover::ready;
}

void stream_owners::synchronize_all() {
  sync_->synchronize_all();
  for (auto& sl : slots_) {
    sl.dirty = false;
    sl.wanted = false;
  }
}

void stream_owners::synchronize(owner_id o) {
  if (o == 0) { return; }
  if (!nameable_here(o)) {
    synchronize_all();
    return;
  }
  sync_->synchronize(slots_[o].ref.handle);
}

// ---- stream_ordered_pool -----------------------------------------------------------------------

stream_ordered_pool::stream_ordered_pool(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key)
    : owners_{std::move(sync), thread_key} {}

std::uintptr_t stream_ordered_pool::allocate_from_other_streams(std::size_t size, std::size_t alignment,
                                                               stream_ref const& s, owner_id o) {
  std::size_t const limit = owners_.limit();
  auto after_full_sync = [&]() -> std::uintptr_t {
    blocks_.synchronize_all_owners();
    return blocks_.allocate(size, alignment, block_pool::synchronized);
  };
  // 1. A stream whose free blocks alone can serve the request: take over all it holds.
  for (std::size_t i = 1; i < limit; ++i) {
    auto const t = static_cast<owner_id>(i);
    if (t == o || !blocks_.can_allocate(size, alignment, t)) { continue; }
    switch (owners_.hand_over(t, s)) {
      case stream_owners::handover::ready:
        blocks_.transfer(t, o);
        owners_.note_acquired(o);
        if (std::uintptr_t const a = blocks_.allocate(size, alignment, o)) { return a; }
        break;
      case stream_owners::handover::everything_synchronized:
        return after_full_sync();
    }
  }
  // 2. Everything the other streams hold: merged with ours it may fit.
  bool moved = false;
  for (std::size_t i = 1; i < limit; ++i) {
    auto const t = static_cast<owner_id>(i);
    if (t == o || blocks_.free_blocks(t) == 0) { continue; }
    switch (owners_.hand_over(t, s)) {
      case stream_owners::handover::ready:
        blocks_.transfer(t, o);
        owners_.note_acquired(o);
        moved = true;
        break;
      case stream_owners::handover::everything_synchronized:
        return after_full_sync();
    }
  }
  return moved ? blocks_.allocate(size, alignment, o) : 0;
}

bool stream_ordered_pool::synchronize_everything() {
  bool pending = false;
  for (std::size_t i = 1; i < owners_.limit() && !pending; ++i) {
    pending = blocks_.free_blocks(static_cast<owner_id>(i)) != 0;
  }
  if (!pending) { return false; }
  owners_.synchronize_all();
  blocks_.synchronize_all_owners();
  return true;
}

bool stream_ordered_pool::return_stream_without_sync(chunk_id c, stream_ref& out) const {
  std::vector<owner_id> owners = blocks_.chunk_owners(c);
  std::erase(owners, block_pool::synchronized);
  if (owners.empty()) {
    out = stream_ref{};
    return true;
  }
  if (owners.size() == 1 && owners_.nameable_here(owners.front())) {
    out = owners_.ref(owners.front());
    return true;
  }
  return false;
}

stream_ref stream_ordered_pool::return_stream(chunk_id c) {
  std::vector<owner_id> owners = blocks_.chunk_owners(c);
  std::erase(owners, block_pool::synchronized);
  if (owners.empty()) { return stream_ref{}; }
  if (owners.size() == 1 && owners_.nameable_here(owners.front())) { return owners_.ref(owners.front()); }
  synchronize_everything();
  return stream_ref{};
}

}  // namespace mrstack::detail
