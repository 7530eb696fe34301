#include <mrstack/detail/stream_ordering.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_set>
#include <stdexcept>
#include <string>

namespace mrstack::detail {

namespace {

// A thread whose key was handed out and that is no longer live has exited: its per-thread
// default stream gets no more work, so its free memory can be taken over whole. Keys are
// handed out in order, so the live ones are all there is to keep: a set of the exited
// ones grew by an entry per thread that ever called, forever. Leaked on purpose: threads
// may exit after static destruction.
struct thread_registry {
  std::mutex mutex;
  std::unordered_set<std::uintptr_t> live;
  std::uintptr_t next = 1;  // the next key's index: keys handed out are (i << 1) | 1, i < next
  bool complete = true;     // false once a live key could not be noted: then nobody has exited
};
thread_registry& threads() {
  // In static storage, not from new: the first key is taken in noexcept code (this_thread_key),
  // where the process's first call, out of host memory, had ended the process.
  alignas(thread_registry) static unsigned char storage[sizeof(thread_registry)];
  static auto* const r = ::new (static_cast<void*>(storage)) thread_registry;
  return *r;
}

// The calling thread's key: trivially destructible, so a call from a thread_local destroyed
// after the thread's registration below (one built before this thread's first key) still
// reads it legally. Such a late call's thread already counts as exited.
thread_local std::uintptr_t this_key = 0;

/// Notes the thread's key as live from its first call until the thread exits.
struct thread_registration {
  thread_registration() {
    thread_registry& r = threads();
    std::lock_guard lock{r.mutex};
    this_key = (r.next++ << 1) | 1U;
    try {
      r.live.insert(this_key);
    } catch (...) {
      r.complete = false;  // the safe answer from now on: no thread has exited
    }
  }
  thread_registration(thread_registration const&) = delete;
  thread_registration& operator=(thread_registration const&) = delete;
  ~thread_registration() {
    thread_registry& r = threads();
    std::lock_guard lock{r.mutex};
    r.live.erase(this_key);
  }
};

}  // namespace

std::uintptr_t this_thread_key() noexcept {
  if (this_key != 0) [[likely]] { return this_key; }
  thread_local thread_registration const registration;  // sets this_key
  (void)registration;
  return this_key;
}

bool thread_has_exited(std::uintptr_t key) {
  thread_registry& r = threads();
  std::lock_guard lock{r.mutex};
  return r.complete && (key & 1U) != 0 && (key >> 1) < r.next && r.live.count(key) == 0;
}

std::size_t live_thread_keys() {
  thread_registry& r = threads();
  std::lock_guard lock{r.mutex};
  return r.live.size();
}

// ---- stream_owners ------------------------------------------------------------------------

stream_owners::stream_owners(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key, bool record_on_demand)
    : sync_{std::move(sync)}, thread_key_{thread_key}, on_demand_{record_on_demand} {
  if (!sync_) { throw std::invalid_argument("stream_owners: a stream_sync is required"); }
  slots_.emplace_back();  // owner 0: synchronized, never a stream
}

stream_owners::~stream_owners() {
  for (auto const& sl : slots_) {
    if (sl.event != 0) { sync_->destroy_event(sl.event); }
  }
  if (barrier_event_ != 0) { sync_->destroy_event(barrier_event_); }
}

owner_id stream_owners::new_slot() {
  if (slots_.size() > max_slot) {
    // A new stream after its resource synchronized everything and still found no slot
    // holding no memory: 65,534 streams and their parked memory hold free memory.
    throw std::length_error("stream-ordered resource: more than 65534 streams and their parked memory hold free "
                            "memory at once, even after a device synchronization");
  }
  slots_.emplace_back();
  return static_cast<owner_id>(slots_.size() - 1);
}

owner_id stream_owners::install(stream_ref const& s, owner_id reuse) {
  owner_id const o = reuse != 0 ? reuse : new_slot();
  slot& sl = slots_[o];
  sl.ref = s;
  sl.in_use = true;
  if (sl.parked != 0) { slots_[sl.parked].ref = s; }  // a recycled slot keeps its (empty) parked owner
  // Eager rule, a second stream: from now on created streams record while they are named.
  eager_ = eager_ || (!on_demand_ && by_key_.size() >= 1);
  several_streams_ = several_streams_ || by_key_.size() >= 1;
  sl.dirty = false;
  sl.dirty_bytes = 0;  // the stream it had freed these, not this one: no early park
  sl.cover = 0;
  sl.wanted = false;
  sl.last_thread = 0;
  sl.sole_thread = 0;  // a recycled slot holds no memory of the stream it had
  sl.parked_complete = false;
  sl.idle_asks = {};
  sl.freed_in_capture = false;
  sl.spilled_unnamed = false;
  sl.barrier_waited = 0;
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
  if (sync_->capturing(s.handle)) {  // stays dirty: recorded once the capture is over
    sl.freed_in_capture = sl.freed_in_capture || sl.dirty;
    return;
  }
  if (record_slot_event(sl, s.handle)) {
    ++records_;
    sl.dirty = false;
    sl.freed_in_capture = false;
    sl.spilled_unnamed = false;
    sl.cover = sl.event;
    // Asked once, answered once: a thread whose memory another wanted recorded at every
    // later free or refill (binning at 16 threads: 0.038 records a call, each under a
    // bin's lock); the next handover that finds it dirty asks again.
    sl.wanted = false;
  }
}

bool stream_owners::record_slot_event(slot& sl, stream_sync::handle stream) noexcept {
  try {
    if (sl.event == 0) { sl.event = sync_->create_event(); }
    return sync_->record(sl.event, stream);
  } catch (...) {
    return false;  // as a failed record: the slot stays dirty, its memory its stream's own
  }
}

owner_id stream_owners::park(owner_id o, stream_ref const& s, stream_sync::handle* prerecorded) {
  slot& sl = slots_[o];
  if (prerecorded != nullptr && *prerecorded != 0 && sl.sole_thread == thread_key_()) {
    // Recorded by this call before its lock. Since this thread's last park of `s` (or
    // since the slot was made) no other thread named `s`, so every free it holds — parked
    // then, or freed since by this thread — came before that record in this thread's own
    // order. The old event goes back to the caller: no wait is pending on it once the lock
    // is let go (waits are made under the lock and take the event's record as of then).
    std::swap(sl.event, *prerecorded);  // its record is counted by whoever made it
  } else {
    // Being captured: nothing parks (its frees stay its own) until a call after the capture.
    if (sync_->capturing(s.handle)) {
      sl.freed_in_capture = true;
      return 0;
    }
    if (!record_slot_event(sl, s.handle)) { return 0; }
    ++records_;
  }
  sl.cover = sl.event;
  sl.parked_complete = false;  // what it parks now waits for that event
  return parked_slot(o, s);
}

owner_id stream_owners::park_if_idle(owner_id o, stream_ref const& s, prepark const* before) {
  slot& sl = slots_[o];
  if (before == nullptr || !before->idle || sl.sole_thread != thread_key_()) {
    if (before != nullptr && before->event != 0) { return 0; }  // asked (or chose not to) before the lock
    if (sl.idle_asks.skip()) { return 0; }
    ++idle_queries_;
    bool const idle = sync_->idle(s.handle);
    sl.idle_asks.answered(idle);
    if (!idle) { return 0; }
  }
  // Every free `o` holds, and everything it parked before (under events recorded before
  // now), was made before the stream was seen idle: the work that used it has finished.
  sl.idle_asks.answered(true);
  sl.parked_complete = true;
  ++idle_parks_;
  return parked_slot(o, s);
}

owner_id stream_owners::parked_slot(owner_id o, stream_ref const& s) {
  // Every slot taken (65,534 streams hold free memory): no parked owner can be made, so
  // nothing parks — the memory stays its stream's, which another stream then does not
  // reach without growing. Only the resource's synchronization (at a new stream) frees
  // slots; a free must not fail after its block went back.
  if (slots_[o].parked == 0 && slots_.size() > max_slot) { return 0; }
  slot& sl = slots_[o];
  sl.sole_thread = thread_key_();  // everything held now is covered by this thread's park
  sl.dirty = false;
  sl.dirty_bytes = 0;
  sl.wanted = false;
  sl.freed_in_capture = false;
  parks_.fetch_add(1, std::memory_order_release);  // a thread waiting for this stream to park may look again
  if (sl.parked == 0) {
    owner_id const p = new_slot();  // may move slots_: `sl` is not used after this
    slots_[p].ref = s;
    slots_[p].in_use = true;
    slots_[p].parent = o;
    slots_[o].parked = p;
  }
  return slots_[o].parked;
}

stream_owners::handover stream_owners::hand_over(owner_id from, stream_ref const& to) {
  // Parked memory whose stream had finished all its work when it last parked: no wait.
  if (slots_[from].parent != 0 && slots_[slots_[from].parent].parked_complete) { return handover::ready; }
  // Every other way orders `to` after an event, or synchronizes the device: CUDA refuses
  // both into a stream being captured (and ends the capture). It takes other memory, or grows.
  if (sync_->capturing(to.handle)) { return handover::not_now; }
  if (slots_[from].parent != 0) {
    // Parked memory: covered by its stream's event, recorded after every free parked.
    sync_->wait(to.handle, slots_[slots_[from].parent].event);
    ++waits_;
    return handover::ready;
  }
  slot& f = slots_[from];
  if (!f.dirty && f.cover != 0) {
    // Every block `from` holds was freed before that record: waiting on it is enough.
    if (f.cover == barrier_event_) {
      wait_on_barrier(to);
    } else {
      sync_->wait(to.handle, f.cover);
      ++waits_;
    }
    f.wanted = false;
    return handover::ready;
  }
  if (f.ref.thread_bound && f.ref.key != thread_key_()) {
    // Another thread's default stream: ask its thread to record from now on (precise
    // events next time), and order `to` after it now through the legacy default stream.
    f.wanted = true;
    return hand_over_through_legacy_stream(to);
  }
  if (is_created(f.ref) && f.ref.key != to.key) {
    if (f.freed_in_capture || f.spilled_unnamed) {
      // Its stream was captured when it freed, or (spilled_unnamed) may have been: a
      // thread cache's frees ask CUDA nothing. No event orders after that work and a
      // device synchronization does not either (it runs when the graph is launched), and
      // CUDA refuses one while any capture lasts. It records (or parks) at its next call;
      // a stream that never calls again keeps it until growth is refused.
      f.wanted = true;
      return handover::not_now;
    }
    if (on_demand_) {
      f.wanted = true;  // it records and parks at its next call
      note_contention();
      if (f.last_thread != 0 && f.last_thread != thread_key_()) { asked_busy_stream_ = true; }
      return handover::not_now;
    }
    // Its frees since the last record predate the second stream (or its record failed),
    // and the stream itself may be destroyed: the device is the only thing to wait for.
    synchronize_all();
    return handover::everything_synchronized;
  }
  // The caller's own default stream, or the legacy stream: a record there while it is
  // being captured (the legacy stream counts as captured while any blocking stream is)
  // would land in the capture, or end it, and another stream cannot wait on it. Found by
  // a hostile review (tests/stream_ordering_review.cpp).
  if (sync_->capturing(f.ref.handle)) { return handover::not_now; }
  if (f.event == 0) { f.event = sync_->create_event(); }
  if (!sync_->record(f.event, f.ref.handle)) {
    synchronize_all();
    return handover::everything_synchronized;
  }
  ++records_;
  f.dirty = false;
  f.cover = f.event;
  f.wanted = false;
  sync_->wait(to.handle, f.event);
  ++waits_;
  return handover::ready;
}

stream_owners::handover stream_owners::hand_over_through_legacy_stream(stream_ref const& to) {
  // The legacy stream waits for every blocking stream — per-thread default streams are
  // blocking. While a blocking stream is being captured it may not be touched (a record
  // there ends that capture, relaxed or not: measured on an H200); its query reports an
  // error instead, which `capturing` answers true. The owner's thread records later.
  if (sync_->capturing(legacy_stream)) { return handover::not_now; }
  if (barrier_event_ == 0) { barrier_event_ = sync_->create_event(); }
  if (!sync_->record(barrier_event_, legacy_stream)) {
    synchronize_all();
    return handover::everything_synchronized;
  }
  ++records_;
  ++barrier_records_;
  cover_default_streams_by_barrier();
  wait_on_barrier(to);
  return handover::ready;
}

void stream_owners::cover_default_streams_by_barrier() noexcept {
  // The record follows every free noted so far (they were noted under the resource's
  // lock, which the caller holds), and CUDA orders legacy-stream work after all earlier
  // work of every blocking stream: per-thread default streams, and the legacy stream
  // itself. So every default stream's free memory is covered, not only the one asked
  // for: a later takeover from any of them needs only a wait (16 threads taking each
  // other's blocks through `binning` had made a record per takeover). No record on the
  // legacy stream is made while a blocking stream is being captured (see hand_over), so
  // memory a default stream freed during a capture is covered as the stream's own first
  // record after the capture would cover it. Only owners freed into since their last
  // cover: one covered by its own stream's event keeps it, since a wait on the legacy
  // stream also waits for every other blocking stream's work. Not parked owners (covered
  // by their stream's own event), nor created streams (blocking or not: only a query
  // would tell).
  for (auto& sl : slots_) {
    bool const default_stream = sl.ref.thread_bound || sl.ref.handle == legacy_stream;
    if (!sl.in_use || !sl.dirty || sl.parent != 0 || !default_stream) { continue; }
    sl.dirty = false;
    sl.cover = barrier_event_;  // re-recorded later only ever covers more
  }
}

void stream_owners::wait_on_barrier(stream_ref const& to) {
  // A stream that waited on the barrier's latest record is ordered after it already. Only
  // default streams are remembered: their keys are never reused, where a created stream's
  // handle may be destroyed and come back as another stream that never waited.
  bool const default_stream = to.thread_bound || to.handle == legacy_stream;
  std::uint32_t const found = default_stream ? by_key_.find(to.key) : address_map::npos;
  slot* const taker = found != address_map::npos ? &slots_[found] : nullptr;
  if (taker != nullptr && taker->barrier_waited == barrier_records_) { return; }
  sync_->wait(to.handle, barrier_event_);
  ++waits_;
  if (taker != nullptr) { taker->barrier_waited = barrier_records_; }
}

void stream_owners::synchronize_all() {
  sync_->synchronize_all();
  for (auto& sl : slots_) {
    sl.dirty = false;
    sl.dirty_bytes = 0;
    sl.wanted = false;
    sl.freed_in_capture = false;  // its free blocks become the synchronized ones (a last resort)
    sl.spilled_unnamed = false;
  }
}

bool stream_owners::held_by_capture(owner_id o) const {
  return slots_[o].freed_in_capture || sync_->capturing(slots_[o].ref.handle);
}

// ---- stream_ordered_pool -----------------------------------------------------------------------

stream_ordered_pool::stream_ordered_pool(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key,
                                         bool record_on_demand, park_policy parks)
    : owners_{std::move(sync), thread_key, record_on_demand}, parks_{parks} {
  parks_.divisor = std::max<std::size_t>(parks_.divisor, 1);
  owners_.set_contention_window(parks_.contention_window);
}

std::uintptr_t stream_ordered_pool::allocate_from_other_streams(std::size_t size, std::size_t alignment,
                                                               stream_ref const& s, owner_id o) {
  std::size_t const limit = owners_.limit();
  auto after_full_sync = [&]() -> std::uintptr_t {
    blocks_.synchronize_all_owners();
    ++holder_changes_;
    return blocks_.allocate(size, alignment, block_pool::synchronized);
  };
  // 1. A stream whose free blocks alone can serve the request: take over all it holds.
  for (std::size_t i = 1; i < limit; ++i) {
    auto const t = static_cast<owner_id>(i);
    if (owners_.stream_of(t) == o || !blocks_.can_allocate(size, alignment, t)) { continue; }
    switch (owners_.hand_over(t, s)) {
      case stream_owners::handover::ready:
        if (owners_.stream_of(t) != t || (owners_.ref(t).thread_bound && !thread_has_exited(owners_.ref(t).key))) {
          // Parked memory, or another thread's cache: take just the block needed and leave
          // the rest (moving it all would leave its stream with nothing, so the two would
          // pass their memory back and forth, or grow).
          if (std::uintptr_t const a = blocks_.allocate(size, alignment, t)) { return a; }
          break;
        }
        blocks_.transfer(t, o);
        ++holder_changes_;
        owners_.note_acquired(o, s);
        if (std::uintptr_t const a = blocks_.allocate(size, alignment, o)) { return a; }
        break;
      case stream_owners::handover::everything_synchronized:
        return after_full_sync();
      case stream_owners::handover::not_now:
        break;
    }
  }
  // 2. Everything the other streams hold: merged with ours it may fit.
  bool moved = false;
  for (std::size_t i = 1; i < limit; ++i) {
    auto const t = static_cast<owner_id>(i);
    if (owners_.stream_of(t) == o || blocks_.free_blocks(t) == 0) { continue; }
    switch (owners_.hand_over(t, s)) {
      case stream_owners::handover::ready:
        blocks_.transfer(t, o);
        ++holder_changes_;
        owners_.note_acquired(o, s);
        moved = true;
        break;
      case stream_owners::handover::everything_synchronized:
        return after_full_sync();
      case stream_owners::handover::not_now:
        break;
    }
  }
  return moved ? blocks_.allocate(size, alignment, o) : 0;
}

void stream_ordered_pool::claim_parked_block_ending_at(std::uintptr_t end, stream_ref const& s) {
  std::optional<owner_id> const t = blocks_.owner_of_free_block_ending_at(end);
  owner_id const o = owner_of(s);
  if (t && *t != o && *t != block_pool::synchronized && owners_.stream_of(*t) == o) {
    blocks_.transfer_free_block_ending_at(end, o);
  }
}

bool stream_ordered_pool::synchronize_everything() {
  bool pending = false;
  for (std::size_t i = 1; i < owners_.limit() && !pending; ++i) {
    pending = blocks_.free_blocks(static_cast<owner_id>(i)) != 0;
  }
  if (!pending) { return false; }
  owners_.synchronize_all();
  blocks_.synchronize_all_owners();
  ++holder_changes_;
  return true;
}

std::vector<owner_id> stream_ordered_pool::streams_holding(chunk_id c) const {
  std::vector<owner_id> owners;
  for (owner_id const x : blocks_.chunk_owners(c)) {
    owner_id const o = owners_.stream_of(x);  // a stream's parked memory is that stream's
    if (o != block_pool::synchronized && std::find(owners.begin(), owners.end(), o) == owners.end()) {
      owners.push_back(o);
    }
  }
  return owners;
}

bool stream_ordered_pool::return_stream_without_sync(chunk_id c, stream_ref& out, stream_ref const& caller) const {
  std::vector<owner_id> const owners = streams_holding(c);
  if (owners.empty()) {
    out = stream_ref{};
    return true;
  }
  // Nameable first: a created stream that this call does not name may be destroyed, and
  // asking CUDA about it crashed (an H200, tests/gpu/capture_growth.cpp).
  if (owners.size() == 1 && owners_.may_name(owners_.ref(owners.front()), caller) &&
      !owners_.held_by_capture(owners.front())) {
    out = owners_.ref(owners.front());
    return true;
  }
  return false;
}

bool stream_ordered_pool::hand_back_stream(chunk_id c, stream_ref& out, stream_ref const& caller) const {
  if (return_stream_without_sync(c, out, caller)) { return true; }
  std::vector<owner_id> const owners = streams_holding(c);
  if (owners.size() != 1 || !owners_.ref(owners.front()).thread_bound) { return false; }
  out = owners_.ref(owners.front());
  return true;
}

bool stream_ordered_pool::sole_holder(chunk_id c, stream_ref& out) const {
  std::vector<owner_id> const owners = streams_holding(c);
  if (owners.size() != 1) { return false; }
  out = owners_.ref(owners.front());
  return true;
}

bool stream_ordered_pool::capture_may_hold(chunk_id c, stream_ref const& caller) const {
  std::vector<owner_id> const owners = streams_holding(c);
  return std::any_of(owners.begin(), owners.end(), [&](owner_id o) {
    // The mark alone for a stream this call may not name (another thread's default stream,
    // or a created stream that may be gone): asking CUDA about it would ask about another.
    return owners_.may_name(owners_.ref(o), caller) ? owners_.held_by_capture(o) : owners_.freed_in_capture(o);
  });
}

stream_ref stream_ordered_pool::return_stream(chunk_id c) {
  std::vector<owner_id> const owners = streams_holding(c);
  if (owners.empty()) { return stream_ref{}; }
  if (owners.size() == 1 && owners_.nameable_here(owners.front())) { return owners_.ref(owners.front()); }
  synchronize_everything();
  return stream_ref{};
}

}  // namespace mrstack::detail
