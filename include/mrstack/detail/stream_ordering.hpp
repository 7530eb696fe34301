#pragma once
/// Stream-ordered reuse, CUDA-free: which stream owns which free memory, and what it takes
/// for another stream to use it. Shared by the pool, the fixed-size resource and the
/// arena.
///
/// The rule every resource keeps: memory freed on stream s is reusable on s at once;
/// another stream t may use it only after `cudaStreamWaitEvent(t, e)` on an event `e`
/// recorded on s no earlier than the free. Events are recorded *lazily*: nothing happens
/// on a free; only when t first wants s's memory does the resource record an event on s
/// (it then covers every free s has made so far) and make t wait on it. With one stream
/// in use there are no CUDA calls at all.
///
/// Per-thread default streams are a twist: every thread passing `cudaStreamPerThread`
/// names a different stream with the same handle, and only the thread that owns one can
/// record an event on it. So such a stream is keyed by its thread (`this_thread_key`).
/// When another thread wants its memory, two ways remain: (1) the owner records for it —
/// the asking thread sets `wanted`, and the owner records on its next call into the
/// resource, so later handovers wait on that precise event; (2) right now, an event
/// recorded on the *legacy* default stream: per-thread default streams are blocking
/// streams, and CUDA makes work on the legacy stream wait for all earlier work of every
/// blocking stream, so that event covers the owner's frees — an ordering point for all
/// blocking streams, but no host wait. (It also covers threads that have exited, whose
/// streams nobody can name any more.)
///
/// Streams the user created may be destroyed at any time after their last call, and CUDA
/// gives no error for a destroyed handle: naming one is undefined behaviour (a crash).
/// So such a stream is named only while a call is naming it. (A stream is known by its
/// handle: a new stream that CUDA gives a destroyed one's handle is taken for it, so the
/// user lets a stream's work on memory it freed finish before destroying it — see
/// docs/suballocators.md.) Two rules for them:
/// - *Recording on demand* (`stream_ordered_pool`: the pool and the arena's global arena).
///   A free records nothing. When stream t wants the free memory of a created stream s
///   and s is not the stream of the current call, t cannot record on s: it marks s
///   *wanted* and takes nothing from it now (it grows, or takes other memory). At s's next
///   call (allocate or free, which names s), s records one event and *parks* everything it
///   holds free under it: the blocks move to a companion owner, "s's memory covered by
///   s's event". Any stream takes parked memory after one wait on that event; s itself
///   uses it with no wait. One record thus covers every free s made before it, and
///   records happen only when another stream wanted the memory, or once a stream has
///   freed a share of the pool (`park_policy`; with a contention window, only while
///   memory is contended: `contended_now`). A park first asks whether s has finished all
///   its work (`stream_sync::idle`, cudaStreamQuery): then it records nothing, and its
///   parked memory is taken with no wait (`park_if_idle`). A stream
///   that never calls again (destroyed) keeps its unparked memory until the device is
///   synchronized (when growth is refused, or on release).
/// - *Eager* (fixed_size): once a second stream appears, frees and acquisitions on a
///   created stream record at once (what RMM does on every free; a thread cache's spill
///   records once for its batch), and a handover waits on that event alone; memory such
///   a stream freed before the second stream appeared has no event: taking it over
///   synchronizes the device once. Memory that went back from a thread cache while no call
///   named its stream (`mark_spilled_unnamed`) waits for the stream's next record.
/// Chunks go back to the upstream on a created stream only when the caller names it;
/// otherwise after a device synchronization, on the legacy default stream (always valid).
///
/// CUDA enters only through `stream_sync`, an interface with a CUDA implementation
/// (suballoc/stream_sync.hpp) and a recording fake in the tests, so the cross-stream
/// logic is model-tested on machines without a GPU.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <thread>
#include <vector>

#include <mrstack/detail/address_map.hpp>
#include <mrstack/detail/block_pool.hpp>
#include <mrstack/detail/stream_seam.hpp>

namespace mrstack::detail {

/// Stream slots: maps streams to the small owner ids `block_pool` (and the others) use,
/// and holds each stream's lazily recorded event. Owner 0 is "synchronized". Not
/// thread-safe (its resource locks).
class stream_owners {
 public:
  /// `record_on_demand`: created streams follow the on-demand rule (see above), else the eager one.
  explicit stream_owners(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key = &this_thread_key,
                         bool record_on_demand = false);
  ~stream_owners();
  stream_owners(stream_owners const&) = delete;
  stream_owners& operator=(stream_owners const&) = delete;

  /// Whether `o` has a parked owner or one can be made (not once every slot is taken).
  [[nodiscard]] bool can_park(owner_id o) const noexcept { return slots_[o].parked != 0 || slots_.size() <= max_slot; }

  /// The owner id of `s`, creating a slot for a stream not seen before. `holds_memory(o)`
  /// tells whether owner o still holds free memory (slots that do not may be recycled).
  /// `consolidate()` runs when every slot is taken (65,534 streams hold free memory): it
  /// synchronizes every stream's free memory (synchronize_everything), freeing slots.
  template <typename HoldsMemory, typename Consolidate>
  owner_id acquire(stream_ref const& s, HoldsMemory&& holds_memory, Consolidate&& consolidate) {
    if (s.key == cached_key_) { return cached_owner_; }
    std::uint32_t const found = by_key_.find(s.key);
    owner_id const o =
        found != address_map::npos ? static_cast<owner_id>(found) : create(s, holds_memory, consolidate);
    cached_key_ = s.key;
    cached_owner_ = o;
    return o;
  }

  /// True (and `o` set) when `s` is the stream the last `acquire` returned.
  [[nodiscard]] bool cached(stream_ref const& s, owner_id& o) const noexcept {
    if (s.key != cached_key_) { return false; }
    o = cached_owner_;
    return true;
  }

  /// After `bytes` were freed into `o` by its stream `s`. (A thread-bound stream's memory
  /// freed by another thread — an arena reclaiming superblocks — records nothing.) True
  /// when `o` must be parked now (`park`, on-demand rule): another stream wants its
  /// memory, or — several streams in use and memory *contended* (`contended_now`) — it
  /// holds more than `park_above` bytes freed since its last record, which bounds what
  /// other streams cannot reach without asking.
  [[nodiscard]] bool note_free(owner_id o, stream_ref const& s, std::size_t bytes = 0,
                               std::size_t park_above = ~std::size_t{0}) {
    slot& sl = slots_[o];
    sl.dirty = true;
    if (on_demand_ && is_created(s)) {
      sl.dirty_bytes += bytes;
      ++frees_;
      return sl.wanted || (several_streams_ && contended_now() && sl.dirty_bytes > park_above);
    }
    if (sl.wanted && (!s.thread_bound || s.key == thread_key_())) {
      record_now(sl, s);
    } else if (eager_ && is_created(s)) {
      record_now(sl, s);  // s may be destroyed after this call: record while it is named
    }
    return false;
  }
  /// Memory was freed into `o` by a call that does not name its stream (an arena handing
  /// back another stream's superblocks): it counts as freed since the last record, and
  /// nothing is recorded.
  void mark_freed_unrecorded(owner_id o) noexcept { slots_[o].dirty = true; }
  /// Eager rule: a thread cache of `o`'s created stream went back while no call named it.
  /// Its frees made no CUDA call, so some may have been made during a graph capture of
  /// the stream, which no event and no device synchronization orders after: no other
  /// stream takes `o`'s memory until its stream records again (its next named call) or
  /// the device is synchronized as a last resort (growth refused, release). A device
  /// synchronization is also refused by CUDA while any capture lasts.
  void mark_spilled_unnamed(owner_id o) noexcept {
    slots_[o].dirty = true;
    slots_[o].spilled_unnamed = true;
  }
  /// True when some stream holds memory it freed during a graph capture and has not
  /// recorded since (asks CUDA nothing). O(streams).
  [[nodiscard]] bool any_freed_in_capture() const noexcept {
    return std::any_of(slots_.begin(), slots_.end(), [](slot const& sl) { return sl.freed_in_capture; });
  }
  /// Memory freed during a capture entered `o` from elsewhere (a thread shard's slab given
  /// back to the pool's global blocks): `o` keeps it from the upstream as if freed into
  /// it, until its stream next records (see held_by_capture).
  void mark_freed_in_capture(owner_id o) noexcept {
    slots_[o].dirty = true;
    slots_[o].freed_in_capture = true;
  }
  /// Memory entered `o` (the stream `s` the caller names) some other way than a free on
  /// it (taken over from another stream after a wait, or a new chunk allocated on it): a
  /// later handover must be ordered after that wait or allocation too.
  void note_acquired(owner_id o, stream_ref const& s) {
    slot& sl = slots_[o];
    sl.dirty = true;
    if (eager_ && is_created(s) && sl.ref.key == s.key) { record_now(sl, s); }
  }
  /// On every allocation by `o`'s stream: a thread-bound stream records here when
  /// another thread asked for its memory. True when `o` must be parked now (as note_free).
  [[nodiscard]] bool note_use(owner_id o, stream_ref const& s) {
    slot& sl = slots_[o];
    if (!sl.wanted || !sl.dirty) { return false; }
    if (on_demand_ && is_created(s)) { return true; }
    if (!s.thread_bound || s.key == thread_key_()) { record_now(sl, s); }
    return false;
  }
  /// On-demand rule: records `o`'s event on its stream `s` (which the current call names)
  /// and returns the owner its free memory is to move to, covered by that event (0 when
  /// the record failed: the memory stays where it is, wanted).
  ///
  /// `prerecorded`, when not null and not 0: an event the current call recorded on `s`
  /// before its resource took its lock (so the CUDA call is not made under the lock). It
  /// is used instead of a record here when no thread but the caller has named `s` since
  /// the caller's own last park of it (`note_caller`): then every free `s` holds was made
  /// before that record, in the caller's own order. The slot keeps it, and `*prerecorded`
  /// becomes the slot's old event (0 if none) for the caller to reuse; otherwise it is
  /// left alone.
  owner_id park(owner_id o, stream_ref const& s, stream_sync::handle* prerecorded = nullptr);
  /// Parks `o` without a record when its stream `s` (created, named by the current call,
  /// on-demand rule) has finished all its work: everything `o` holds free, and what it
  /// parked before, is then complete, and another stream takes it with no wait (until
  /// the next park that records). Returns the parked owner to move `o`'s free memory to,
  /// or 0 when `s` is not known idle (the caller parks as usual). `before`: what the call
  /// did before its resource's lock (null: nothing). Found idle then, the answer counts
  /// only when no other thread named `s` since this thread's last park, as for a
  /// prerecorded event (another thread's free in between may have work still pending);
  /// with an event recorded then, `s` is not asked again. Otherwise `s` is asked here,
  /// unless recent asks found it busy (`idle_back_off`). (Not synchronized memory: a
  /// neighbouring free of `s` would take that back at once, under the merging rule.)
  owner_id park_if_idle(owner_id o, stream_ref const& s, prepark const* before);
  /// Streams asked whether they were idle (`park_if_idle`), and how many parks found one so.
  [[nodiscard]] std::size_t idle_queries() const noexcept { return idle_queries_; }
  [[nodiscard]] std::size_t idle_parks() const noexcept { return idle_parks_; }
  /// The calling thread names `o`'s stream (a created stream, on-demand rule, several
  /// streams in use): records it as the thread of the stream's last call (whom a wanting
  /// stream may wait for) and tracks whether one thread alone has named it since the last
  /// park (which makes the parking thread the sole one), what lets `park` use a
  /// prerecorded event.
  void note_caller(owner_id o) noexcept {
    std::uintptr_t const me = thread_key_();
    slot& sl = slots_[o];
    sl.last_thread = me;
    if (sl.sole_thread != me) { sl.sole_thread = sl.sole_thread == 0 ? me : several_threads; }
  }
  /// The on-demand rule is in force and a second stream was seen: frees park.
  [[nodiscard]] bool parks_frees() const noexcept { return on_demand_ && several_streams_; }
  /// Memory is contended: a stream asked another for its memory, or the resource grew,
  /// within the last `contention_window` frees on created streams. Only then do frees
  /// park before anyone asks. Streams that each reuse their own memory (a PyTorch
  /// inference loop on two streams, once warm) then make no CUDA call per free; where
  /// streams compete for memory (they ask, or the pool grows) frees park as they free,
  /// so little waits unreachable.
  [[nodiscard]] bool contended_now() const noexcept { return window_ == 0 || frees_ < contended_until_; }
  /// A growth or a request for another stream's memory: contention for the next window.
  void note_contention() noexcept {
    // Saturating: a window near 2^64 ("always contended") must not wrap to "never".
    contended_until_ = window_ > ~std::uint64_t{0} - frees_ ? ~std::uint64_t{0} : frees_ + window_;
  }
  /// How many frees contention lasts after its last sign; 0: always (frees park whenever
  /// they pass the share, as before contention was tracked).
  void set_contention_window(std::uint64_t frees) noexcept { window_ = frees; }
  /// Always contended by default: the park minimum (park_policy) already keeps the
  /// records of streams that each reuse their own memory rare, and parked memory is what
  /// lets one stream's frees serve another without growth (PyTorch's two-stream loop:
  /// 0.66 GiB at PyTorch's step time, against 0.81 with a 4096-free window).
  static constexpr std::uint64_t default_contention_window = 0;
  /// True (once) when a `hand_over` since the last call answered `not_now` for a stream
  /// another thread is driving: that thread is likely to call, and park, within
  /// microseconds, so the caller may wait a little for `parks()` to change (without its
  /// lock) rather than grow.
  [[nodiscard]] bool take_asked_busy_stream() noexcept {
    bool const asked = asked_busy_stream_;
    asked_busy_stream_ = false;
    return asked;
  }
  /// How many parks so far; read without the resource's lock.
  [[nodiscard]] std::uint64_t parks() const noexcept { return parks_.load(std::memory_order_acquire); }
  /// The waiting for a park timed out: do not wait for `o`'s stream again until it calls.
  void forget_busy_threads() noexcept {
    for (auto& sl : slots_) {
      if (sl.wanted) { sl.last_thread = 0; }
    }
  }
  /// The owner holding `o`'s parked memory (0: none yet).
  [[nodiscard]] owner_id parked_of(owner_id o) const noexcept { return slots_[o].parked; }
  /// The stream owner `o`'s memory belongs to: `o` itself, or the stream a parked owner parks for.
  [[nodiscard]] owner_id stream_of(owner_id o) const noexcept { return slots_[o].parent != 0 ? slots_[o].parent : o; }

  enum class handover {
    ready,                    ///< `to` now waits for `from`'s frees: move from's free memory to `to`
    everything_synchronized,  ///< the device was synchronized: every free block is usable by all
    not_now                   ///< on-demand rule: `from` is asked to park; take nothing from it now
  };
  /// Makes stream `to` (on the calling thread) safe to use every block `from` holds free.
  handover hand_over(owner_id from, stream_ref const& to);

  /// Blocks until the device is idle; marks every slot clean. The caller then treats all
  /// free memory as synchronized.
  void synchronize_all();
  /// True while `o`'s free memory may belong to a graph being captured: freed into during
  /// a capture and not recorded since, or its stream is being captured now. Such memory
  /// does not go back to the upstream (the graph's nodes before the free still use it
  /// when launched); only `release()`, which synchronizes the device, returns it. Asks
  /// CUDA about `o`'s stream: call it only for a stream the calling thread may name.
  [[nodiscard]] bool held_by_capture(owner_id o) const;
  /// `o` freed during a capture and has not recorded since (asks CUDA nothing).
  [[nodiscard]] bool freed_in_capture(owner_id o) const noexcept { return slots_[o].freed_in_capture; }

  /// The eager rule is in force (a second stream was seen): created streams record their frees.
  [[nodiscard]] bool records_eagerly() const noexcept { return eager_; }
  /// True when the calling thread may name `o`'s stream (record on it, free on it) with
  /// no call naming it: the legacy default stream, or the caller's own default stream.
  /// A stream the user created may be gone (see the header comment).
  [[nodiscard]] bool nameable_here(owner_id o) const noexcept { return nameable_here(slots_[o].ref); }
  [[nodiscard]] bool nameable_here(stream_ref const& r) const noexcept {
    return r.thread_bound ? r.key == thread_key_() : r.handle == legacy_stream;
  }
  /// True when a call naming `caller` may name `s` to CUDA: it is the caller's stream, or
  /// one the calling thread may always name (`nameable_here`).
  [[nodiscard]] bool may_name(stream_ref const& s, stream_ref const& caller) const noexcept {
    return s.key == caller.key || nameable_here(s);
  }
  /// A stream the user created (neither the legacy nor a per-thread default stream): it
  /// may be destroyed after any call, so it is named only while a call names it.
  [[nodiscard]] static bool is_created(stream_ref const& s) noexcept {
    return !s.thread_bound && s.handle != legacy_stream;
  }
  [[nodiscard]] stream_ref const& ref(owner_id o) const noexcept { return slots_[o].ref; }
  [[nodiscard]] std::size_t limit() const noexcept { return slots_.size(); }
  [[nodiscard]] stream_sync& sync() const noexcept { return *sync_; }
  [[nodiscard]] std::shared_ptr<stream_sync> const& shared_sync() const noexcept { return sync_; }
  /// Counts of CUDA-facing calls made so far (for tests and statistics).
  [[nodiscard]] std::size_t records() const noexcept { return records_; }
  [[nodiscard]] std::size_t waits() const noexcept { return waits_; }

  /// The legacy default stream's handle as `stream_sync` is given it.
  static constexpr std::uintptr_t legacy_stream = 0;
  /// Slots beyond this many are recycled from streams that hold no free memory.
  static constexpr std::size_t soft_slot_limit = 1024;
  /// Owner ids are 16 bits, and 0xffff is kept free: fixed_size_blocks reads it as "no
  /// owner" (a stream in slot 0xffff that took over memory read as having found none).
  static constexpr std::size_t max_slot = 0xfffe;

 private:
  struct slot {
    stream_ref ref{};
    stream_sync::handle event = 0;
    bool in_use = false;
    bool dirty = false;     // freed into since the event was last recorded
    stream_sync::handle cover = 0;  // an event recorded after every free `dirty` does not flag
    bool wanted = false;    // another stream asked this stream to record (and park)
    std::size_t dirty_bytes = 0;  // on-demand rule: bytes freed since the last record
    owner_id parked = 0;    // a stream's slot: the owner its parked memory is in
    owner_id parent = 0;    // a parked owner's slot: the stream it parks for
    std::uintptr_t last_thread = 0;  // on-demand rule, several streams: the thread of its last call (note_caller)
    std::uintptr_t sole_thread = 0;  // the one thread that named it since its last park, or several_threads
    bool parked_complete = false;    // its stream was idle at its last park: its parked memory needs no wait
    idle_back_off idle_asks{};       // park_if_idle's asks under the lock
    bool freed_in_capture = false;   // freed into while captured, not recorded since: no other stream takes it
    bool spilled_unnamed = false;    // a cache of it went back unnamed, not recorded since: no other stream takes it
    std::uint64_t barrier_waited = 0;  // as a taker: the barrier record its stream last waited on (0: none)
  };
  static constexpr std::uintptr_t several_threads = 2;  // thread keys are odd

  template <typename HoldsMemory, typename Consolidate>
  owner_id create(stream_ref const& s, HoldsMemory& holds_memory, Consolidate& consolidate) {
    owner_id o = 0;
    if (slots_.size() >= next_idle_scan_) {
      o = idle_slot(holds_memory, true);
      // None idle: look again only once the slots grew by a quarter, so that streams that
      // keep their memory cost O(1) a new stream, not a scan of every slot each.
      next_idle_scan_ = o != 0 ? soft_slot_limit : slots_.size() + slots_.size() / 4;
    }
    if (o == 0 && slots_.size() > max_slot) {
      consolidate();  // every stream's free memory synchronized: their slots hold none
      o = idle_slot(holds_memory, false);
      next_idle_scan_ = soft_slot_limit;
    }
    if (o != 0) { retire(o); }
    return install(s, o);
  }
  /// A stream slot (not a parked owner: it goes with its stream) holding no memory, or 0;
  /// `unwanted`: nor asked for memory. Resumes where the last search ended.
  template <typename HoldsMemory>
  owner_id idle_slot(HoldsMemory& holds_memory, bool unwanted) {
    std::size_t const n = slots_.size();
    for (std::size_t step = 0; step + 1 < n; ++step) {
      std::size_t const i = 1 + (idle_scan_from_ - 1 + step) % (n - 1);
      slot const& sl = slots_[i];
      bool const idle = !holds_memory(static_cast<owner_id>(i)) && !(unwanted && sl.wanted) &&
                        (sl.parked == 0 || !holds_memory(sl.parked));
      if (sl.parent == 0 && idle) {
        idle_scan_from_ = i + 1 < n ? i + 1 : 1;
        return static_cast<owner_id>(i);
      }
    }
    return 0;
  }
  owner_id new_slot();
  owner_id install(stream_ref const& s, owner_id reuse);
  void retire(owner_id o) noexcept;
  void record_now(slot& sl, stream_ref const& s);
  /// Records `sl`'s event on `stream`, making the event first; false when either fails
  /// (a seam error is caught: the frees that call this have already let go of their block,
  /// and a free must not fail after that — the memory stays the stream's own instead).
  bool record_slot_event(slot& sl, stream_sync::handle stream) noexcept;
  /// Orders `to` after another thread's default stream through a record on the legacy stream.
  handover hand_over_through_legacy_stream(stream_ref const& to);
  /// After a record of the barrier on the legacy stream: every default stream's free
  /// memory is covered by it (see hand_over).
  void cover_default_streams_by_barrier() noexcept;
  /// Orders `to` after the barrier's latest record, unless it already waited on that record.
  void wait_on_barrier(stream_ref const& to);
  /// After a park of `o` by the calling thread: the slot is clean; returns its parked owner (made when new).
  owner_id parked_slot(owner_id o, stream_ref const& s);

  std::shared_ptr<stream_sync> sync_;
  thread_key_fn thread_key_;
  std::vector<slot> slots_;  // index = owner id; slot 0 stands for "synchronized"
  stream_sync::handle barrier_event_ = 0;  // recorded on the legacy default stream
  std::uint64_t barrier_records_ = 0;      // its records so far: the latest one's number
  address_map by_key_;       // stream key -> owner id
  std::size_t next_idle_scan_ = soft_slot_limit;  // slot count at which create looks for an idle slot
  std::size_t idle_scan_from_ = 1;                // where that search starts
  std::uintptr_t cached_key_ = address_map::empty_key;
  owner_id cached_owner_ = 0;
  std::size_t records_ = 0;
  std::size_t waits_ = 0;
  std::size_t idle_queries_ = 0;
  std::size_t idle_parks_ = 0;
  bool eager_ = false;  // eager rule, a second stream was seen: created streams record on every free
  bool on_demand_ = false;  // created streams record on demand and park (see the header comment)
  bool several_streams_ = false;  // a second stream was seen
  bool asked_busy_stream_ = false;  // see take_asked_busy_stream
  std::uint64_t frees_ = 0;            // frees on created streams (on-demand rule)
  std::uint64_t contended_until_ = 0;  // see contended_now
  std::uint64_t window_ = default_contention_window;
  std::atomic<std::uint64_t> parks_{0};
};

/// How long a search that asked a busy stream to park waits for it (see wait_for_asked_park).
inline constexpr std::chrono::microseconds park_wait{50};

/// After a search under `lock` found nothing and asked a stream that another thread drives
/// to park (`take_asked_busy_stream`): that thread parks at its next call, usually within
/// microseconds — far sooner, and cheaper in memory, than growing. Lets go of `lock`,
/// waits at most `park_wait` for any park, and takes the lock again. True when a park came
/// (search again); false when none was asked for or none came in time (the busy streams
/// are then not waited for again until they call).
template <typename Lock>
bool wait_for_asked_park(stream_owners& owners, Lock& lock) {
  if (!owners.take_asked_busy_stream()) { return false; }
  std::uint64_t const before = owners.parks();
  lock.unlock();
  auto const deadline = std::chrono::steady_clock::now() + park_wait;
  bool parked = false;
  while (!(parked = owners.parks() != before) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  lock.lock();
  if (!parked) { owners.forget_busy_threads(); }
  return parked;
}

/// When a created stream parks its frees before anyone asks for them (the on-demand rule,
/// several streams in use, memory contended): once it has freed more than
/// max(pool / `divisor`, `minimum`) bytes since its last record. The share bounds what
/// other streams cannot reach without asking (by default, with 8 streams, at most 1/128
/// of the pool); the minimum bounds how often a stream records, because a record costs
/// the same (~1 µs) whatever it covers: in a 0.4 GiB pool 1/1024 is 0.4 MiB, and a
/// stream freeing activations recorded at nearly every free.
struct park_policy {
  static constexpr std::size_t default_divisor = 1024;
  static constexpr std::size_t default_minimum = std::size_t{8} << 20;
  std::size_t divisor = default_divisor;  ///< at least 1
  std::size_t minimum = default_minimum;
  /// See stream_owners::contended_now (0: always contended).
  std::uint64_t contention_window = stream_owners::default_contention_window;
};

/// `block_pool` plus stream ownership: the stream-ordered coalescing allocator shared by
/// `pool_memory_resource` and the arena's global arena. Not thread-safe (its owner locks).
class stream_ordered_pool {
 public:
  /// `record_on_demand`: created streams follow the on-demand rule (see the header comment), else the eager one.
  explicit stream_ordered_pool(std::shared_ptr<stream_sync> sync, thread_key_fn thread_key = &this_thread_key,
                               bool record_on_demand = true, park_policy parks = {});

  /// A block for stream `s`: from s's own free blocks, then synchronized ones, then its
  /// own parked ones, then from other streams after an event wait — from parked memory
  /// or a live thread's default stream only the block needed (so streams do not pass
  /// their memory back and forth), otherwise all the other stream holds; a created
  /// stream not yet recorded is asked to park and gives nothing now. 0 when nothing
  /// fits: the caller grows or gives up. With a single stream this makes no
  /// `stream_sync` calls.
  std::uintptr_t allocate(std::size_t size, std::size_t alignment, stream_ref const& s) {
    owner_id const o = owner_of(s);
    if (owners_.note_use(o, s)) { park(o, s); }
    if (std::uintptr_t const a = blocks_.allocate(size, alignment, o)) { return a; }
    if (std::uintptr_t const a = blocks_.allocate(size, alignment, block_pool::synchronized)) { return a; }
    if (owner_id const p = owners_.parked_of(o)) {  // its own frees, parked: no wait
      if (std::uintptr_t const a = blocks_.allocate(size, alignment, p)) { return a; }
      if (std::uintptr_t const a = allocate_across_own_park(size, alignment, o, p)) { return a; }
    }
    return allocate_from_other_streams(size, alignment, s, o);
  }
  /// Frees the live block at `address` on stream `s`; returns its size (0: not ours, or
  /// not of `expected_size`: see block_pool::deallocate).
  /// `before`: what the call did on `s` before its lock (stream_owners::park and
  /// park_if_idle; a prerecorded event is swapped when used).
  std::size_t deallocate(std::uintptr_t address, stream_ref const& s,
                         std::size_t expected_size = block_pool::any_size, prepark* before = nullptr) {
    blocks_.prefetch_deallocate(address);  // its cache miss overlaps finding the owner
    owner_id const o = owner_of(s);
    std::size_t const size = blocks_.deallocate(address, o, expected_size);
    if (size != 0) { note_freed(o, s, size, before); }
    return size;
  }
  /// Makes room for `deallocate_reserved(address, s, o)` (block_pool::reserve_deallocate);
  /// returns the owner `o` it reserved for. Throws std::bad_alloc having given nothing
  /// up; false (and `o` unset) when no live block starts at `address`.
  bool reserve_deallocate(std::uintptr_t address, stream_ref const& s, owner_id& o) {
    owner_id const owner = owner_of(s);
    if (!blocks_.reserve_deallocate(address, owner)) { return false; }
    o = owner;
    return true;
  }
  /// As `deallocate`, after `reserve_deallocate` with nothing changed since: it cannot
  /// fail. The park a free may call for is made where host memory allows: a park cut
  /// short leaves the memory its stream's own (what it recorded, if anything, covers it),
  /// never the block unfreed.
  std::size_t deallocate_reserved(std::uintptr_t address, stream_ref const& s, owner_id o) noexcept {
    std::size_t const size = blocks_.deallocate(address, o);  // room was made: does not throw
    if (size != 0) { note_freed(o, s, size); }
    return size;
  }
  /// Frees the live block at `address` into stream `s`'s memory for a call that does not
  /// name `s` (an arena handing back another stream's superblocks; `s` may be destroyed):
  /// nothing is asked of or recorded on `s`, and the memory counts as freed since its
  /// last record, so other streams take it only through a later record or a device
  /// synchronization. Returns its size (0: not a live block).
  std::size_t deallocate_without_naming(std::uintptr_t address, stream_ref const& s) {
    owner_id const o = owner_of(s);
    std::size_t const size = blocks_.deallocate(address, o);
    if (size != 0) { owners_.mark_freed_unrecorded(o); }
    return size;
  }
  /// True when giving free memory back to the upstream now could take it from a graph
  /// being captured, or end a capture: `caller` (the stream the current call names) is
  /// being captured, or some stream freed memory during a capture and has not recorded
  /// since. A release synchronizes every stream first, which CUDA refuses then.
  [[nodiscard]] bool capture_may_hold_free_memory(stream_ref const& caller) const {
    return owners_.any_freed_in_capture() || owners_.sync().capturing(caller.handle);
  }

  /// Before growing in place for stream `s`: when the free block that growth would extend
  /// (the one ending at `end`) is memory s parked, it becomes s's own again (s uses it
  /// with no wait), so the growth merges with it and adds only what the request lacks.
  /// Left parked, it could not merge with the new memory: growth added a whole request
  /// behind it, and the block stayed behind as a fragment. (Another stream's parked
  /// memory is no case for this: `allocate` took it over before the caller grows.)
  void claim_parked_block_ending_at(std::uintptr_t end, stream_ref const& s);

  /// Adds a chunk the upstream allocated on stream `s`; its memory belongs to `s`.
  chunk_id add_chunk(std::uintptr_t base, std::size_t size, stream_ref const& s) {
    owner_id const o = owner_of(s);
    chunk_id const c = blocks_.add_chunk(base, size, o);
    owners_.note_acquired(o, s);
    owners_.note_contention();  // the pool grew: memory is short
    return c;
  }

  /// Makes room for `add_chunk(base, size, s)` of each size in `sizes`, one at a time
  /// (block_pool::reserve_add_chunk): it cannot fail then, as long as nothing else
  /// changes this pool first.
  void reserve_add_chunk(std::initializer_list<std::size_t> sizes, stream_ref const& s) {
    owner_id const o = owner_of(s);
    for (std::size_t size : sizes) { blocks_.reserve_add_chunk(size, o); }
  }

  /// Grows chunk `c` in place by `bytes` mapped for stream `s` (see block_pool::extend_chunk).
  void extend_chunk(chunk_id c, std::size_t bytes, stream_ref const& s) {
    owner_id const o = owner_of(s);
    blocks_.extend_chunk(c, bytes, o);
    owners_.note_acquired(o, s);
    owners_.note_contention();  // the pool grew: memory is short
  }
  /// Returns a withdrawn hole to the free memory of stream `s` (see block_pool::restore).
  std::size_t restore(std::uintptr_t address, stream_ref const& s) {
    owner_id const o = owner_of(s);
    std::size_t const size = blocks_.restore(address, o);
    owners_.note_acquired(o, s);
    return size;
  }

  /// Owner id of stream `s` (creating its slot when new).
  owner_id owner_of(stream_ref const& s) {
    // The stream of the previous call, again (the common case): its slot and exclusivity
    // were settled then, and a key always names the same kind of stream.
    owner_id o = 0;
    if (!owners_.cached(s, o)) {
      o = owners_.acquire(
          s, [this](owner_id x) { return blocks_.free_blocks(x) != 0; }, [this] { (void)synchronize_everything(); });
      // Another thread's default stream can only be waited for through its thread (or a
      // device synchronization): keep synchronized memory out of its hands.
      if (blocks_.exclusive(o) != s.thread_bound) { blocks_.set_exclusive(o, s.thread_bound); }
    }
    // Only once frees park (a second stream): before, nothing consults it, and a free made
    // before the second stream appeared precedes any prerecord, which reads that it has.
    if (owners_.parks_frees() && stream_owners::is_created(s)) { owners_.note_caller(o); }
    return o;
  }

  /// A free of more than this many bytes on a created stream parks that stream for
  /// certain (unless other threads named it too): its caller may record the event before
  /// taking its lock and pass it to `deallocate`. ~0 while frees do not park.
  [[nodiscard]] std::size_t park_certain_above() const noexcept {
    return owners_.parks_frees() && owners_.contended_now() ? park_above() : ~std::size_t{0};
  }

  /// Synchronizes the device when any stream holds free blocks, then makes every free
  /// block synchronized (usable by all, merged as far as possible). Returns whether it
  /// had to synchronize.
  bool synchronize_everything();

  /// The stream to give chunk `c` (which has no live blocks) back to the upstream on:
  /// the one stream its free blocks belong to, or — when they belong to several, or to
  /// another thread's default stream — the default stream after synchronizing everything.
  stream_ref return_stream(chunk_id c);
  /// As `return_stream`, but false (and no synchronization) when one would be needed, or
  /// while a capture may hold the memory (`stream_owners::held_by_capture`).
  /// `caller` is the stream the current call names: a created stream is usable only then.
  bool return_stream_without_sync(chunk_id c, stream_ref& out, stream_ref const& caller) const;
  /// As `return_stream_without_sync`, for giving `c` back to a parent pool rather than to
  /// CUDA: another thread's default stream is fine then (the parent only books the memory
  /// as that stream's; nothing names the stream until the parent hands it over).
  bool hand_back_stream(chunk_id c, stream_ref& out, stream_ref const& caller) const;
  /// When `hand_back_stream` refused `c`: the one stream whose own call could hand it
  /// back (it alone holds the chunk's free memory); false when several streams do, and
  /// only a synchronization returns it.
  bool sole_holder(chunk_id c, stream_ref& out) const;
  /// True when a capture may hold free memory of chunk `c`: a stream holding it freed
  /// during a capture and has not recorded since, or — asked only of a stream `caller`'s
  /// call may name — is being captured now. For a chunk `hand_back_stream` gives back:
  /// the parent marks the memory so (`stream_owners::mark_freed_in_capture`).
  [[nodiscard]] bool capture_may_hold(chunk_id c, stream_ref const& caller) const;

  /// How many times free memory has moved from one stream to another (a takeover, or
  /// every stream's memory synchronized): a chunk whose stream's call alone could hand it
  /// back may be another call's to hand back since.
  [[nodiscard]] std::size_t holder_changes() const noexcept { return holder_changes_; }

  [[nodiscard]] block_pool& blocks() noexcept { return blocks_; }
  [[nodiscard]] block_pool const& blocks() const noexcept { return blocks_; }
  [[nodiscard]] stream_owners& owners() noexcept { return owners_; }
  [[nodiscard]] stream_owners const& owners() const noexcept { return owners_; }

 private:
  std::uintptr_t allocate_from_other_streams(std::size_t size, std::size_t alignment, stream_ref const& s,
                                             owner_id o);
  /// Neither `o`'s free blocks nor those it parked (`p`) fit alone, but a run of the two
  /// may: its stream uses both with no wait. The run found becomes `o`'s unparked memory
  /// (until it next parks); the rest of `p` stays parked for other streams. Kept apart,
  /// a stream's memory was split into runs of two owners no request could span
  /// (bench_multistream's pool grew holding 1.4 GiB free in one stream's two owners, in
  /// blocks of up to 57 MiB, for 60 MiB requests).
  std::uintptr_t allocate_across_own_park(std::size_t size, std::size_t alignment, owner_id o, owner_id p) {
    if (blocks_.free_blocks(o) == 0 || blocks_.free_bytes(o) + blocks_.free_bytes(p) < size) { return 0; }
    return blocks_.allocate_across(size, alignment, o, p);
  }
  /// The streams whose free memory chunk `c` holds (parked memory counted as its stream's).
  [[nodiscard]] std::vector<owner_id> streams_holding(chunk_id c) const;
  /// Records on `o`'s stream `s` (or finds it idle) and moves everything `o` holds free
  /// to its parked owner.
  void park(owner_id o, stream_ref const& s, prepark* before = nullptr) {
    if (!owners_.can_park(o)) { return; }  // every slot taken: no query, no record, nothing counted
    owner_id p = owners_.park_if_idle(o, s, before);
    if (p == 0) { p = owners_.park(o, s, before != nullptr && before->event != 0 ? &before->event : nullptr); }
    if (p != 0) { blocks_.transfer(o, p); }
  }
  /// Books a free of `size` bytes whose block is back, and makes the park it calls for. A
  /// free must not fail then (its caller, told it failed, frees again and is refused, and
  /// in between the block may be handed out to another): out of host memory (a parked
  /// slot, its class arrays) or with a failed record, the park is cut short, and what it
  /// did not move stays `o`'s own, which its record, if any, covers (block_pool::transfer
  /// leaves every block indexed once).
  void note_freed(owner_id o, stream_ref const& s, std::size_t size, prepark* before = nullptr) noexcept {
    try {
      if (owners_.note_free(o, s, size, park_above())) { park(o, s, before); }
    } catch (...) {
    }
  }
  /// Freed bytes since its last record above which a stream parks (see park_policy).
  [[nodiscard]] std::size_t park_above() const noexcept {
    return std::max(blocks_.total_bytes() / parks_.divisor, parks_.minimum);
  }
  block_pool blocks_;
  stream_owners owners_;
  std::size_t holder_changes_ = 0;  // see holder_changes()
  park_policy parks_;
};

}  // namespace mrstack::detail
