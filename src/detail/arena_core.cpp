#include <mrstack/detail/arena_core.hpp>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <limits>
#include <new>
#include <unordered_map>
#include <stdexcept>

#include <mrstack/detail/align.hpp>
#include <mrstack/detail/in_place_pool_growth.hpp>

namespace mrstack::detail {

// ---- size classes ------------------------------------------------------------------------------

unsigned arena_size_classes::class_of(std::size_t size) noexcept {
  std::size_t const units = size / 256;
  if (units <= 4) { return static_cast<unsigned>(units == 0 ? 0 : units - 1); }
  std::size_t const v = units - 1;
  auto const m = static_cast<unsigned>(std::bit_width(v) - 1);  // v in [2^m, 2^(m+1))
  auto const sub = static_cast<unsigned>((v >> (m - 2)) & 3U);
  return 4 + (m - 2) * 4 + sub;
}

std::size_t arena_size_classes::class_size(unsigned cls) noexcept {
  if (cls < 4) { return std::size_t{cls + 1} * 256; }
  unsigned const m = (cls - 4) / 4 + 2;
  unsigned const sub = (cls - 4) % 4;
  std::size_t const units = (std::size_t{1} << m) + (std::size_t{sub + 1} << (m - 2));
  return units * 256;
}

// ---- the thread's arena cache --------------------------------------------------------------------

namespace {

struct cache_entry {
  std::uint64_t core_id = 0;
  std::uintptr_t key = 0;
  void* arena = nullptr;
};
// Each thread remembers the arenas it used last, keyed by (arena_core id, stream key). Ids
// are never reused, so an entry of a destroyed arena_core can never be hit again.
thread_local std::array<cache_entry, 8> arena_cache{};
thread_local unsigned arena_cache_next = 0;
thread_local cache_entry arena_cache_last{};  // the entry hit last: a thread keeps to one stream
std::atomic<std::uint64_t> next_core_id{1};

// Arena cores alive now, so a thread that exits can hand its per-thread arenas' free
// superblocks back (nobody else will use that arena again). Leaked on purpose: threads
// may exit after static destruction.
struct live_core {
  arena_core* core = nullptr;
  unsigned hooks = 0;   // exit hooks calling it now, outside the lock
  bool dying = false;   // its destructor waits for `hooks` to reach 0: no hook starts on it
};
std::mutex& live_cores_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::condition_variable& live_cores_changed() {  // a hook let go of a core
  static auto* cv = new std::condition_variable;
  return *cv;
}
std::unordered_map<std::uint64_t, live_core>& live_cores() {
  static auto* cores = new std::unordered_map<std::uint64_t, live_core>;
  return *cores;
}

// Set once this thread's hook has begun: a call made after it (a thread_local destroyed
// later) or during it (an arena's upstream may be another arena, which the hook's
// thread_exiting hands chunks back to) takes the late_call path and must not touch the
// hook's list (trivially destructible: always valid).
thread_local bool exit_hook_done = false;
// The arena a call made after the hook uses (arena_core::late_call), instead of the cache.
thread_local cache_entry late_arena{};

struct thread_exit_hook {
  thread_exit_hook() = default;
  thread_exit_hook(thread_exit_hook const&) = delete;
  thread_exit_hook& operator=(thread_exit_hook const&) = delete;
  ~thread_exit_hook() {
    // First: calls from here on (those thread_exiting makes into an upstream arena among
    // them) find their arena by key as late calls, never through the cache (an arena
    // retired here may be another stream's soon) nor into `own` (remember).
    exit_hook_done = true;
    arena_cache = {};
    arena_cache_last = {};
    // The cores are pinned under the registry lock and called without it: thread_exiting
    // may hand a chunk to an upstream arena, whose first call on this thread took this
    // lock (a self-deadlock), and it takes its core's global lock, which another thread
    // may hold while its growth makes an upstream arena's first call here (lock order).
    {
      std::lock_guard lock{live_cores_mutex()};
      for (owned_arena& o : own) {
        auto const it = live_cores().find(o.entry.core_id);
        if (it == live_cores().end() || it->second.dying) { continue; }
        ++it->second.hooks;
        o.pinned = it->second.core;
      }
    }
    for (owned_arena const& o : own) {
      if (o.pinned == nullptr) { continue; }
      o.pinned->thread_exiting(o.entry.arena);
      std::lock_guard lock{live_cores_mutex()};
      if (--live_cores().find(o.entry.core_id)->second.hooks == 0) { live_cores_changed().notify_all(); }
    }
    own.clear();
  }
  /// Remembers the thread's per-thread-stream arena of an arena_core. Not the cache: a
  /// thread that used more streams than it holds had its own arena pushed out, and at
  /// its exit that arena was neither retired nor emptied (an arena and its spare
  /// superblocks left per such thread, tests/pool_arena_threads_review.cpp).
  void remember(cache_entry const& e) {
    auto const same = [&](owned_arena const& o) { return o.entry.core_id == e.core_id && o.entry.key == e.key; };
    if (std::any_of(own.begin(), own.end(), same)) { return; }
    std::lock_guard lock{live_cores_mutex()};
    std::erase_if(own, [](owned_arena const& o) { return !live_cores().contains(o.entry.core_id); });  // destroyed cores
    own.push_back({e, nullptr});
  }
  struct owned_arena {
    cache_entry entry;
    arena_core* pinned = nullptr;  // set by the destructor while its core cannot go away
  };
  // A member, alive while the destructor's body runs (a thread_local of its own might be
  // destroyed before the hook).
  std::vector<owned_arena> own;
};
thread_local thread_exit_hook exit_hook;

/// log2 of a valid superblock size (the map's region), checked before the map is made.
unsigned superblock_shift(std::size_t size) {
  if (!is_pow2(size) || size < (std::size_t{64} << 10) || size > (std::size_t{16} << 20)) {
    throw std::invalid_argument("arena: superblock size must be a power of two from 64 KiB to 16 MiB");
  }
  return static_cast<unsigned>(std::countr_zero(size));
}

}  // namespace

// ---- construction ----------------------------------------------------------------------------------

arena_core::arena_core(arena_upstream& upstream, options const& opts, std::shared_ptr<stream_sync> sync,
                       thread_key_fn thread_key)
    : opts_{opts},
      upstream_{upstream},
      id_{next_core_id.fetch_add(1, std::memory_order_relaxed)},
      sync_{sync},
      thread_key_{thread_key},
      global_{std::move(sync), thread_key},
      map_{superblock_shift(opts.superblock_size)} {
  if (opts_.max_small_size % 256 != 0 || opts_.max_small_size > opts_.superblock_size / 2) {
    throw std::invalid_argument("arena: the small-request limit must be a multiple of 256 and at most half a superblock");
  }
  if (opts_.max_size < opts_.superblock_size) {
    throw std::invalid_argument("arena: the maximum size must hold at least one superblock");
  }
  if (opts_.growth_divisor == 0) { throw std::invalid_argument("arena: the growth divisor must be at least 1"); }
  if (opts_.eager) { opts_.max_free_bytes = std::numeric_limits<std::size_t>::max(); }
  if (opts_.grow_in_place_over != nullptr && !opts_.eager) {
    in_place_growth_options growth;
    growth.maximum_bytes = opts_.max_size;
    growth.release_threshold = opts_.max_free_bytes;
    in_place_ = std::make_unique<in_place_pool_growth>(*opts_.grow_in_place_over, growth, "arena");  // claims the range
  }
  std::lock_guard lock{live_cores_mutex()};
  live_cores().emplace(id_, live_core{this});
}

arena_core::~arena_core() {
  {
    // An exiting thread's hook may be calling thread_exiting on this core without the
    // lock: no new one starts, and those running finish first.
    std::unique_lock lock{live_cores_mutex()};
    live_core& self = live_cores().find(id_)->second;  // references survive a rehash
    self.dying = true;
    live_cores_changed().wait(lock, [&] { return self.hooks == 0; });
    live_cores().erase(id_);
  }
  return_all_chunks();
  in_place_.reset();  // gives up the claim: every granule goes back
  for (depot_batch const& b : depot_) {
    if (b.event != 0) { sync_->destroy_event(b.event); }
  }
  for (stream_sync::handle const e : depot_events_) { sync_->destroy_event(e); }
  if (legacy_barrier_ != 0) { sync_->destroy_event(legacy_barrier_); }
}

void arena_core::thread_exiting(void* arena) noexcept {
  auto* a = static_cast<stream_arena*>(arena);
  try {
    std::lock_guard registry{registry_mutex_};  // registry, arena, global: as check_invariants
    // Only the exiting thread's own default-stream arena: no one will allocate from it
    // again. Read under the registry lock: a late call during this hook may have retired
    // it already, and another thread's stream taken it since.
    if (a->retired || !a->stream.thread_bound || a->stream.key != thread_key_()) { return; }
    // Blocks its stream freed during a capture wait for that stream's next call, and there
    // will be none: settled now, while this thread may still name its stream (otherwise
    // they, and their superblocks, stayed out of use until destruction).
    (void)settle_arena(*a, a->stream);  // an orphan it empties is retired below
    {
      std::lock_guard lock{a->mutex};
      if (!retire_if_empty(*a, a->stream)) {
        // Other threads still free its blocks: retired once they are all back (listed
        // once: a late call may have listed it already).
        std::uint32_t const index = arena_by_key_.find(a->stream.key);
        if (std::find(orphaned_arenas_.begin(), orphaned_arenas_.end(), index) == orphaned_arenas_.end()) {
          orphaned_arenas_.push_back(index);
          a->orphaned = true;
        }
      }
    }
    retire_emptied_orphans();
  } catch (...) {
    // Best effort: exhaustion reclaims it later anyway.
  }
}

// ---- stream arenas ---------------------------------------------------------------------------------

arena_core::stream_arena* arena_core::keyed_arena_for(stream_ref const& s, bool create) {
  if (arena_cache_last.core_id == id_ && arena_cache_last.key == s.key) {
    return static_cast<stream_arena*>(arena_cache_last.arena);
  }
  if (s.thread_bound && exit_hook_done) [[unlikely]] {
    // After the hook: the arena the late_call of allocate or deallocate pinned, never cached.
    if (late_arena.core_id == id_ && late_arena.key == s.key) { return static_cast<stream_arena*>(late_arena.arena); }
    return create ? create_arena(s) : find_arena(s);
  }
  for (auto const& e : arena_cache) {
    if (e.core_id == id_ && e.key == s.key) {
      arena_cache_last = e;
      return static_cast<stream_arena*>(e.arena);
    }
  }
  // Cached when found as when made: a thread that only frees on a stream whose arena
  // another thread made takes the registry lock once, not at every free.
  stream_arena* a = create ? create_arena(s) : find_arena(s);
  if (a == nullptr) { return nullptr; }
  cache_entry const entry{id_, s.key, a};
  // Constructs this thread's hook (thread_local objects are built on first use).
  if (s.thread_bound && !exit_hook_done) { exit_hook.remember(entry); }
  arena_cache_last = arena_cache[arena_cache_next++ % arena_cache.size()] = entry;
  return a;
}

arena_core::stream_arena* arena_core::create_arena(stream_ref const& s) {
  std::lock_guard lock{registry_mutex_};
  return find_or_create_arena_locked(s);
}

arena_core::stream_arena* arena_core::find_arena(stream_ref const& s) {
  std::lock_guard lock{registry_mutex_};
  std::uint32_t const found = arena_by_key_.find(s.key);
  return found == address_map::npos ? nullptr : arenas_[found].get();
}

arena_core::stream_arena* arena_core::find_or_create_arena_locked(stream_ref const& s) {
  std::uint32_t const found = arena_by_key_.find(s.key);
  if (found != address_map::npos) { return arenas_[found].get(); }
  if (!retired_arenas_.empty()) {
    std::uint32_t const index = retired_arenas_.back();
    stream_arena& a = *arenas_[index];
    arena_by_key_.insert(s.key, index);
    retired_arenas_.pop_back();
    std::lock_guard lock{a.mutex};  // statistics may be reading it
    a.stream = s;  // the rest as below: it was retired holding nothing (and never sharded)
    a.barrier_waited = 0;  // the old stream's waits order nothing on the new one
    a.retired = false;
    a.orphaned = false;
    a.creator_shard = this_thread_shard();
    streams_in_use_.fetch_add(1, std::memory_order_relaxed);
    return &a;
  }
  auto a = std::make_unique<stream_arena>();
  a->stream = s;
  a->creator_shard = this_thread_shard();
  // push_block and acquire_superblock add spares while holding superblocks off every
  // list: with this room (grown as the arena grows, in acquire_superblock) they never
  // allocate there.
  a->spares.reserve(spare_limit(*a) + 1);
  arenas_.push_back(std::move(a));
  arena_by_key_.insert(s.key, static_cast<std::uint32_t>(arenas_.size() - 1));
  streams_in_use_.fetch_add(1, std::memory_order_relaxed);
  return arenas_.back().get();
}

void arena_core::list_push(stream_arena& a, superblock& sb) noexcept {
  superblock*& head = a.lists[sb.cls];
  sb.prev = nullptr;
  sb.next = head;
  if (head != nullptr) { head->prev = &sb; }
  head = &sb;
  sb.listed = true;
}

void arena_core::list_remove(stream_arena& a, superblock& sb) noexcept {
  if (sb.prev != nullptr) {
    sb.prev->next = sb.next;
  } else {
    a.lists[sb.cls] = sb.next;
  }
  if (sb.next != nullptr) { sb.next->prev = sb.prev; }
  sb.prev = sb.next = nullptr;
  sb.listed = false;
}

std::uintptr_t arena_core::pop_block(stream_arena& a, superblock& sb, std::size_t size) noexcept {
  std::uint32_t index = 0;
  if (!sb.free_stack.empty()) {
    index = sb.free_stack.back();
    sb.free_stack.pop_back();
  } else {
    index = sb.bump++;
  }
  if (sb.free_count == sb.capacity) { --a.empty; }
  --sb.free_count;
  a.free_bytes -= sb.block_size;
  --a.free_blocks;
  sb.live_bits[index / 64] |= std::uint64_t{1} << (index % 64);
  if (!sb.units.empty()) { sb.units[index] = static_cast<std::uint16_t>(size / 256); }
  if (sb.free_count == 0) { list_remove(a, sb); }
  return sb.base + std::size_t{index} * sb.block_size;
}

void arena_core::push_block(stream_arena& a, superblock& sb, std::uint32_t index, stream_ref const& caller) {
  sb.live_bits[index / 64] &= ~(std::uint64_t{1} << (index % 64));
  sb.free_stack.push_back(static_cast<std::uint16_t>(index));
  ++sb.free_count;
  a.free_bytes += sb.block_size;
  ++a.free_blocks;
  if (!sb.listed) { list_push(a, sb); }
  if (sb.free_count == sb.capacity) {
    bool const alone = a.lists[sb.cls] == &sb && sb.next == nullptr;
    // A spare needs room (make_spare must not allocate): past a hand-back that failed, the
    // spares may have outgrown their reserve, and where no more can be had the superblock
    // stays empty in its class list (a spare pushed there had ended the process).
    bool room = a.spares.size() < a.spares.capacity();
    try {
      room = room || (a.spares.reserve(a.spares.size() + 1 + spare_limit(a)), true);
    } catch (std::bad_alloc const&) {
    }
    if ((alone && a.empty < opts_.empty_superblocks_kept && !a.orphaned) || !room) {
      ++a.empty;  // stays ready for its class
      a.over_bounds = a.over_bounds || !room;
      return;
    }
    list_remove(a, sb);
    make_spare(a, sb);
    // Spares run up to twice the number kept, then the excess goes back in one trip to
    // the global lock: an arena whose blocks are all being freed (a thread winding down
    // a phase) returns superblocks in batches, not one lock trip each. An orphan keeps none.
    // The block is free by now: a hand-back refused for host memory (state unchanged, the
    // spares kept for a later trip) does not fail the free, which a retry would repeat.
    try {
      if (a.orphaned || a.spares.size() > spare_limit(a)) {
        surrender_spares(a, a.orphaned ? 0 : opts_.empty_superblocks_kept, caller);
      }
    } catch (std::bad_alloc const&) {
      a.over_bounds = true;
    }
  }
}

void arena_core::reclass(stream_arena& a, superblock& sb, unsigned cls) {
  if (sb.cls == cls && sb.block_size != 0) { return; }  // wholly free already: nothing to reset
  a.free_bytes -= std::size_t{sb.capacity} * sb.block_size;
  a.usable_bytes -= std::size_t{sb.capacity} * sb.block_size;
  a.free_blocks -= sb.capacity;
  sb.cls = cls;
  sb.block_size = arena_size_classes::class_size(cls);
  sb.capacity = static_cast<std::uint32_t>(opts_.superblock_size / sb.block_size);
  sb.free_count = sb.capacity;
  sb.held_back = 0;
  sb.bump = 0;
  sb.free_stack.clear();
  sb.free_stack.reserve(sb.capacity);
  sb.live_bits.resize((sb.capacity + 63) / 64);  // all zero: no block of a free superblock is live
  bool const several_sizes = cls > 0 && sb.block_size - arena_size_classes::class_size(cls - 1) > 256;
  sb.units.resize(several_sizes ? sb.capacity : 0);  // written as blocks are handed out
  a.free_bytes += std::size_t{sb.capacity} * sb.block_size;
  a.usable_bytes += std::size_t{sb.capacity} * sb.block_size;
  a.free_blocks += sb.capacity;
}

arena_core::superblock* arena_core::acquire_superblock(stream_arena& a, unsigned cls) {
  if (!a.spares.empty()) {
    superblock* sb = a.spares.back();
    a.spares.pop_back();
    sb->spare = false;
    reclass(a, *sb, cls);
    ++a.empty;
    list_push(a, *sb);
    return sb;
  }
  // Several at once: one trip to the global lock for this superblock and up to
  // `spare_limit(a)` spares, so threads that grow at the same time seldom meet there.
  std::size_t const want = std::clamp<std::size_t>(spare_limit(a), 1, most_superblocks_per_trip);
  // Room for the spares this trip adds and for the limit it raises (push_block must not
  // allocate): reserved before anything moves, so a failure here changes nothing.
  a.spares.reserve(spare_limit(a) + want + 1);
  std::array<superblock*, most_superblocks_per_trip> got{};
  std::size_t n = take_from_depot(a, got.data(), want);
  if (n == 0) {
    // From the global arena, at most 2 x `empty_superblocks_kept`: each superblock there
    // is a block-pool allocation, perhaps after an event wait, all under the lock every
    // thread shares; larger trips held it so long that the others queued asleep.
    std::size_t const global_want = std::clamp<std::size_t>(2 * opts_.empty_superblocks_kept, 1, want);
    std::lock_guard lock{global_mutex_};
    try {
      while (n < global_want) {
        // Only the first may grow the global arena: the extras are spares, not a reason to
        // take more memory from the upstream.
        std::uintptr_t const addr = n == 0 ? global_allocate(opts_.superblock_size, opts_.superblock_size, a.stream)
                                           : global_.allocate(opts_.superblock_size, opts_.superblock_size, a.stream);
        if (addr == 0) { break; }
        try {
          superblock& sb = descriptor_for(addr);
          // Mapped before the global lock is let go: a large free naming `addr` (a stale
          // pointer's second free on another thread) takes this lock, and must find a
          // superblock here, not a global block it could free under this arena.
          sb.arena.store(&a, std::memory_order_release);
          map_.assign(addr, opts_.superblock_size, &sb);
          got[n++] = &sb;
        } catch (...) {
          global_deallocate(addr, a.stream);
          throw;
        }
      }
    } catch (...) {
      for (std::size_t i = 0; i < n; ++i) { release_descriptor_locked(*got[i], a.stream); }
      throw;
    }
  }
  if (n == 0) { return nullptr; }
  // reclass may throw (its vectors grow): the superblocks set up so far become spares
  // (the spares vector never grows past its reserve) and the rest go back, so none is lost.
  std::size_t ready = 0;
  try {
    for (; ready < n; ++ready) {
      superblock& sb = *got[ready];
      sb.block_size = 0;  // reclass sets it up (small frees wait for `a`'s lock, held here)
      sb.capacity = 0;
      sb.listed = false;
      sb.spare = false;
      reclass(a, sb, cls);
      ++a.superblocks;
    }
  } catch (...) {
    for (std::size_t i = 0; i < ready; ++i) { make_spare(a, *got[i]); }
    std::lock_guard lock{global_mutex_};
    for (std::size_t i = ready; i < n; ++i) { release_descriptor_locked(*got[i], a.stream); }
    throw;
  }
  for (std::size_t i = 1; i < n; ++i) { make_spare(a, *got[i]); }
  ++a.empty;
  list_push(a, *got[0]);
  return got[0];
}

void arena_core::make_spare(stream_arena& a, superblock& sb) noexcept {
  sb.spare = true;
  a.spares.push_back(&sb);  // within the room create_arena / reclaim_from reserved: no allocation
}

void arena_core::detach_superblock(stream_arena& a, superblock& sb) noexcept {
  map_.assign(sb.base, opts_.superblock_size, nullptr);
  leave_arena(a, sb);
}

void arena_core::release_descriptor_locked(superblock& sb, stream_ref const& s) {
  std::uintptr_t const base = sb.base;
  map_.assign(base, opts_.superblock_size, nullptr);  // mapped as it was taken
  sb.arena.store(nullptr, std::memory_order_release);
  sb.base = 0;
  idle_descriptors_.push_back(&sb);  // within the room descriptor_for reserved
  global_deallocate(base, s);
}

// ---- calls after the thread's exit hook ------------------------------------------------------------

// A thread_local destroyed after this thread's exit hook may still call on the thread's
// default stream. Through the cache such calls had used an arena retired meanwhile and
// taken by a new thread (whose just-freed block they got), or made one nobody retired (an
// arena and a superblock left per thread): tests/arena_thread_exit.cpp. So such a call
// finds its arena by key and pins it (retire_emptied_orphans passes it by); at its end the
// arena is retired as at the thread's exit, or left to the frees still due.
class arena_core::late_call {
 public:
  late_call(arena_core& core, stream_ref const& s) : core_{core} {
    std::lock_guard registry{core.registry_mutex_};
    arena_ = core.find_or_create_arena_locked(s);
    ++arena_->late_calls;
    late_arena = {core.id_, s.key, arena_};
  }
  ~late_call() {
    late_arena = outer_;
    core_.end_late_call(*arena_);
  }
 private:
  arena_core& core_;
  stream_arena* arena_ = nullptr;
  cache_entry const outer_ = late_arena;  // a late call into another arena (an upstream) puts it back
};

void arena_core::end_late_call(stream_arena& a) noexcept {
  try {
    std::lock_guard registry{registry_mutex_};  // registry, arena, global: as check_invariants
    if (--a.late_calls != 0) { return; }
    std::uint32_t const index = arena_by_key_.find(a.stream.key);
    std::lock_guard lock{a.mutex};
    if (retire_if_empty(a, a.stream)) {
      std::erase(orphaned_arenas_, index);  // the entry would name the arena once another stream has it
    } else if (std::find(orphaned_arenas_.begin(), orphaned_arenas_.end(), index) == orphaned_arenas_.end()) {
      orphaned_arenas_.push_back(index);  // blocks still out: retired once they are all back
      a.orphaned = true;
    }
  } catch (...) {
    // Best effort, as at the thread's exit: exhaustion reclaims its superblocks anyway.
  }
}

// ---- allocation -------------------------------------------------------------------------------------

std::uintptr_t arena_core::allocate(std::size_t size, std::size_t alignment, stream_ref const& s) {
  if (!s.thread_bound || !exit_hook_done) [[likely]] { return allocate_now(size, alignment, s); }
  late_call const late{*this, s};  // a thread_local's destructor, after this thread's exit hook
  return allocate_now(size, alignment, s);
}

std::uintptr_t arena_core::allocate_now(std::size_t size, std::size_t alignment, stream_ref const& s) {
  settle_held_back(s);
  return is_small(size, alignment) ? allocate_small(size, s) : allocate_large(size, alignment, s);
}

std::uintptr_t arena_core::allocate_small(std::size_t size, stream_ref const& s) {
  stream_arena* const a = arena_for(s);
  unsigned const cls = arena_size_classes::class_of(size);
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt == 1) { reclaim(s); }  // never while holding an arena lock: reclaim takes them all
    if (attempt == 2) { synchronize_everything(); }
    std::unique_lock lock{a->mutex, std::try_to_lock};
    if (!lock.owns_lock()) {
      lock.lock();
      note_contention(*a);
    }
    superblock* sb = a->lists[cls];
    if (sb == nullptr) { sb = acquire_superblock(*a, cls); }
    if (sb != nullptr) { return pop_block(*a, *sb, size); }
  }
  return 0;
}

std::uintptr_t arena_core::allocate_large(std::size_t size, std::size_t alignment, stream_ref const& s) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt == 1 && reclaim(s) == 0) { continue; }
    // Retried even when this call found nothing to synchronize: another thread may have
    // just done it (between our attempts), which is as good.
    if (attempt == 2) { synchronize_everything(); }
    std::unique_lock lock{global_mutex_};
    // Only this search's asking counts: a superblock's search may have left the flag set.
    (void)global_.owners().take_asked_busy_stream();
    if (std::uintptr_t const p = global_.allocate(size, alignment, s)) { return note_large_alignment(p, alignment, s); }
    // A stream another thread drives was asked for its free memory: it parks at its next
    // call, usually sooner than growth would take, and without the footprint.
    if (wait_for_asked_park(global_.owners(), lock)) {
      if (std::uintptr_t const p = global_.allocate(size, alignment, s)) { return note_large_alignment(p, alignment, s); }
    }
    if (std::uintptr_t const p = global_allocate(size, alignment, s)) { return note_large_alignment(p, alignment, s); }
  }
  return 0;
}

bool arena_core::deallocate(std::uintptr_t p, std::size_t size, std::size_t alignment, stream_ref const& s) {
  if (!s.thread_bound || !exit_hook_done) [[likely]] { return deallocate_now(p, size, alignment, s); }
  late_call const late{*this, s};  // a thread_local's destructor, after this thread's exit hook
  return deallocate_now(p, size, alignment, s);
}

bool arena_core::deallocate_now(std::uintptr_t p, std::size_t size, std::size_t alignment, stream_ref const& s) {
  settle_held_back(s);
  if (!is_small(size, alignment)) {
    // Never the block pool's "any size": that would free whatever block starts at `p`.
    if (size == block_pool::any_size) { return false; }
    std::lock_guard lock{global_mutex_};
    if (map_.find(p) != nullptr) { return false; }  // inside a superblock: a small block, not a large one
    auto const aligned = large_alignments_.find(p);
    if ((aligned == large_alignments_.end() ? 256 : aligned->second) != alignment) { return false; }
    if (global_deallocate(p, s, size) == 0) { return false; }  // a large block's exact size, as it was handed out
    if (aligned != large_alignments_.end()) { large_alignments_.erase(aligned); }
    return true;
  }
  auto* const sb = map_.find(p);
  if (sb == nullptr) { return false; }
  // Read without the lock: a superblock holding a live block stays with its arena.
  stream_arena* const owner = sb->arena.load(std::memory_order_acquire);
  if (owner == nullptr) { return false; }
  if (owner->family != keyed_arena_for(s, false)) {
    // Another stream's arena: its stream may reuse the block at once, so this stream's
    // work on it must be finished first. A stream being captured into a graph cannot be
    // synchronized (CUDA refuses and ends the capture): the block waits for its first
    // call after the capture instead, as the pool keeps such frees (docs/suballocators.md).
    // A free to be refused is refused before: it neither synchronizes `s` nor makes an
    // arena for it (a second stream in use turns on the depot's event records).
    {
      std::lock_guard lock{owner->mutex};
      std::uint32_t index = 0;
      if (!live_block(*sb, owner, p, index) || small_size(*sb, index) != size) { return false; }
    }
    if (sync_->capturing(s.handle)) { return hold_back(*sb, owner, p, size, s); }
    sync_->synchronize(s.handle);
  }
  bool emptied_orphan = false;
  {
    std::lock_guard lock{owner->mutex};
    // Checked under the lock (the superblock is set up and reclassed under it): a foreign,
    // double or wrong-size free is refused, never pushed.
    std::uint32_t index = 0;
    if (!live_block(*sb, owner, p, index) || small_size(*sb, index) != size) { return false; }
    push_block(*owner, *sb, index, s);
    emptied_orphan = owner->orphaned && owner->superblocks == 0;
  }
  if (emptied_orphan) { after_orphan_emptied(); }
  return true;
}

bool arena_core::hold_back(superblock& sb, stream_arena* owner, std::uintptr_t p, std::size_t size,
                           stream_ref const& s) {
  std::uint32_t index = 0;
  {
    std::lock_guard lock{owner->mutex};
    if (!live_block(sb, owner, p, index) || small_size(sb, index) != size) { return false; }
    sb.live_bits[index / 64] &= ~(std::uint64_t{1} << (index % 64));  // a second free is refused
    ++sb.held_back;  // not free either: the superblock stays with its arena
  }
  try {
    // The freeing thread's arena on `s` (perhaps its thread shard, made now) keeps it.
    stream_arena* const freeing = arena_for(s);
    std::lock_guard lock{freeing->mutex};
    freeing->freed_in_capture.push_back({&sb, index, freeing->held_back_total});
    ++freeing->held_back_total;
    if (freeing->freed_in_capture.size() == 1) { held_back_streams_.fetch_add(1, std::memory_order_relaxed); }
    return true;
  } catch (std::bad_alloc const&) {
    // Undone (one arena lock at a time, the freeing one let go): a failed free changes
    // nothing. Meanwhile the block was neither live nor free, so nothing else touched it,
    // and its superblock (not wholly free) stayed with `owner`.
    std::lock_guard lock{owner->mutex};
    --sb.held_back;
    sb.live_bits[index / 64] |= std::uint64_t{1} << (index % 64);
    throw;
  }
}

bool arena_core::live_block(superblock const& sb, stream_arena const* owner, std::uintptr_t p,
                            std::uint32_t& index) const noexcept {
  // The owner first: only while `owner` (whose lock the caller holds) has the superblock
  // are its fields stable. A stale free's caller holds the old owner's lock while another
  // arena may be setting the superblock up (a data race tsan found when base was read
  // first: tests/arena_threads_misuse.cpp).
  if (sb.arena.load(std::memory_order_acquire) != owner) { return false; }
  std::size_t const offset = p - sb.base;
  if (sb.block_size == 0 || offset >= opts_.superblock_size || offset % sb.block_size != 0) { return false; }
  index = static_cast<std::uint32_t>(offset / sb.block_size);
  return (sb.live_bits[index / 64] >> (index % 64) & 1U) != 0;
}

std::size_t arena_core::small_size(superblock const& sb, std::uint32_t index) noexcept {
  return sb.units.empty() ? sb.block_size : std::size_t{sb.units[index]} * 256;
}

std::uintptr_t arena_core::note_large_alignment(std::uintptr_t p, std::size_t alignment, stream_ref const& s) {
  if (alignment <= 256) { return p; }
  try {
    large_alignments_.insert_or_assign(p, alignment);
  } catch (...) {
    global_deallocate(p, s);  // a failed allocation leaves nothing behind
    throw;
  }
  return p;
}

}  // namespace mrstack::detail
