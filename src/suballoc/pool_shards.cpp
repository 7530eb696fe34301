// pool_memory_resource's thread shards: where each thread's blocks come from once several
// threads use the pool, and how slabs move between the shards and the global blocks.
// Lock order: a shard, then the global lock; never the other way round. A thread that
// holds a shard only ever *tries* another shard's lock.
#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include <mrstack/detail/in_place_pool_growth.hpp>

#include "pool_shards.hpp"

namespace mrstack {

namespace {

constexpr std::size_t granularity = detail::block_pool::granularity;
constexpr std::size_t slab_alignment = detail::page_owner_map::page_size;
constexpr std::size_t max_slab_growth = std::size_t{64} << 20;

}  // namespace

bool pool_memory_resource::second_thread_arrived() {
  if (options_.thread_shards == 0 || options_.shard_after_contentions != 0) { return false; }
  std::uintptr_t const me = detail::this_thread_key();
  std::uintptr_t first = first_thread_.load(std::memory_order_relaxed);
  if (first == me) { return false; }
  if (first == 0 && first_thread_.compare_exchange_strong(first, me, std::memory_order_relaxed)) { return false; }
  if (first == me) { return false; }
  return start_sharding();
}

void* pool_memory_resource::allocate_sharded(std::size_t bytes, std::size_t size, std::size_t alignment,
                                             detail::stream_ref const& s) {
  // Measured with the padding its alignment may need, as the slab it takes is: a 256 B
  // block aligned to 256 MiB took a 256 MiB slab, whose free bytes only its thread could
  // use while the block lived (another thread ran out of memory at the maximum with
  // them free, where the unsharded pool served it from the padding).
  if (size <= options_.shard_block_limit && alignment - granularity <= options_.shard_block_limit - size) {
    return allocate_in_shard(bytes, size, alignment, s);
  }
  return allocate_globally(bytes, size, alignment, s, nullptr);
}

bool pool_memory_resource::contended() {
  if (options_.thread_shards == 0) { return false; }
  // Already sharded: neither the shared counter nor start_sharding's lock (one more trip
  // through the contended lock for every contended free on the global blocks).
  if (sharded_.load(std::memory_order_acquire)) { return true; }
  if (contentions_.fetch_add(1, std::memory_order_relaxed) + 1 < options_.shard_after_contentions) { return false; }
  return start_sharding();
}

bool pool_memory_resource::start_sharding() noexcept {
  // Sharding is an optimization: when the shards cannot be made (no host memory), the
  // call goes on under the one lock. Thrown, it had failed a request the pool's free
  // memory could serve, and a contended free with std::bad_alloc, the block not freed.
  try {
    std::lock_guard lock{mutex_};
    if (shards_) { return true; }
    auto shards = std::make_unique<detail::pool_shard_set>(options_.thread_shards, core_.owners().shared_sync(),
                                                           options_.record_on_demand, options_.parks());
    reserve_slab_pages(*shards, 0, 0);
    shards_ = std::move(shards);
    sharded_.store(true, std::memory_order_release);
    return true;
  } catch (...) {
    return false;
  }
}

void* pool_memory_resource::allocate_in_shard(std::size_t bytes, std::size_t size, std::size_t alignment,
                                              detail::stream_ref const& s) {
  std::uint16_t const index = shards_->index_of_this_thread();
  detail::pool_shard* made = nullptr;
  try {
    made = &shards_->get(index);
  } catch (std::bad_alloc const&) {
    // No host memory for the thread's shard: the global blocks serve it, as unsharded.
    return allocate_globally(bytes, size, alignment, s, nullptr);
  }
  detail::pool_shard& shard = *made;
  std::lock_guard lock{shard.mutex};
  if (shard.should_give_back(s)) { give_back_free_slabs(shard, s); }
  if (std::uintptr_t const a = shard.core.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
  return refill_and_allocate(shard, index, bytes, size, alignment, s);
}

void* pool_memory_resource::refill_and_allocate(detail::pool_shard& shard, std::uint16_t index, std::size_t bytes,
                                                std::size_t size, std::size_t alignment, detail::stream_ref const& s) {
  // Slabs grow with the shard, as chunks grow with the pool (few slabs), up to a cap: a
  // slab must be carved whole out of the global blocks, and big ones strand the ends of
  // chunks that could not hold them.
  std::size_t const needed = detail::align_up(size + (alignment - granularity), slab_alignment);
  std::size_t const held = shard.core.blocks().total_bytes();
  // The cap wins over a minimum_growth above it (std::clamp's bounds must be ordered).
  std::size_t const least = std::min(detail::align_up(options_.minimum_growth, slab_alignment), max_slab_growth);
  std::size_t const slab = std::max(
      needed, std::clamp(detail::align_down(held / options_.growth_divisor, slab_alignment), least, max_slab_growth));
  // The shard's room for the slab first: a slab taken and then refused by the shard
  // must go back to the global blocks, whose free may itself want host memory (and the
  // slab, in neither, was lost). Reserved, add_chunk below cannot fail: nothing else
  // changes the shard while its lock is held. No host memory for the shard's books: the
  // global blocks serve the request, as for a shard that could not be made.
  try {
    shard.core.reserve_add_chunk({slab, needed}, s);
  } catch (std::bad_alloc const&) {
    return allocate_globally(bytes, size, alignment, s, &shard);
  }
  std::uintptr_t base = take_slab(slab, s, &shard, index);
  std::size_t taken = slab;
  if (base == 0 && slab > needed) {
    base = take_slab(needed, s, &shard, index);
    taken = needed;
  }
  if (base == 0) {  // no slab to be had: the request alone, from the global blocks (or out of memory)
    return allocate_globally(bytes, size, alignment, s, &shard);
  }
  try {
    shard.core.add_chunk(base, taken, s);
  } catch (...) {  // not for want of host memory (reserved above)
    return_slabs(nullptr, {detail::slab_return{base, taken, s}});
    throw;
  }
  std::uintptr_t const a = shard.core.allocate(size, alignment, s);
  if (a == 0) { throw logic_error("pool: a fresh slab of " + format_bytes(taken) + " could not serve " + format_bytes(size)); }
  return reinterpret_cast<void*>(a);
}

std::uintptr_t pool_memory_resource::take_slab(std::size_t bytes, detail::stream_ref const& s, detail::pool_shard* held,
                                              std::uint16_t index) {
  {
    std::lock_guard lock{mutex_};
    if (std::uintptr_t const a = core_.allocate(bytes, slab_alignment, s)) { return map_slab(a, bytes, index, s); }
  }
  drain_shards(s, false, held);
  std::unique_lock lock{mutex_};
  if (std::uintptr_t const a = core_.allocate(bytes, slab_alignment, s)) { return map_slab(a, bytes, index, s); }
  if (std::uintptr_t const a = retry_after_park(lock, bytes, slab_alignment, s)) { return map_slab(a, bytes, index, s); }
  // Growth only, never grow_and_allocate's fallbacks (synchronizing the device, returning
  // every free chunk): those are for a request nothing else can serve, and a slab is not
  // one. The caller tries a smaller slab, then the request alone from the global blocks,
  // whose path takes the fallbacks before out-of-memory. (At the maximum, every small
  // allocation whose shard wanted a slab had synchronized the device.)
  if (growth_) {
    // Growth in place that meets the maximum releases every free granule first, which
    // synchronizes the device: not for a slab the maximum cannot hold as new memory.
    if (maximum_size_ && bytes > *maximum_size_ - std::min(*maximum_size_, footprint())) { return 0; }
    try {
      growth_->grow(core_, bytes, slab_alignment, s);
    } catch (detail::growth_failure const&) {
      return 0;
    }
    ++upstream_allocations_;
    peak_pool_size_ = std::max(peak_pool_size_, footprint());
  } else if (std::string why; !grow(bytes + (slab_alignment - granularity), s, why)) {
    return 0;
  }
  if (std::uintptr_t const a = core_.allocate(bytes, slab_alignment, s)) { return map_slab(a, bytes, index, s); }
  return 0;
}

std::uintptr_t pool_memory_resource::map_slab(std::uintptr_t base, std::size_t bytes, std::uint16_t index,
                                              detail::stream_ref const& s) {
  // Mapped while the global lock is still held: from the moment the slab is a live global
  // block, a free of its address must reach the shard (which refuses it until the slab is
  // its chunk), never the global blocks, which would take it as the slab's own free.
  // Only entries are written: the levels of every address the global blocks hold were
  // made before (reserve_slab_pages). Made here, a level that could not be had sent the
  // slab back to the global blocks, and that free could want host memory too (a slab of
  // synchronized memory freed as its stream's): failing, the slab was lost, a live global
  // block no shard held. Reserving that free instead would not do: the reservation
  // itself needs host memory once the slab is taken.
  try {
    shards_->slabs.set(base, bytes, static_cast<std::uint16_t>(index + 1));
  } catch (...) {  // the levels are there: not reached
    (void)core_.deallocate(base, s, bytes);
    throw;
  }
  return base;
}

void pool_memory_resource::reserve_slab_pages(detail::pool_shard_set& shards, std::uintptr_t base,
                                              std::size_t bytes) const {
  if (bytes != 0) {
    shards.slabs.reserve(base, bytes);
  } else if (growth_) {
    // The one chunk grows in place up to the end of the range it may use.
    virtual_range const& range = growth_->policy().range();
    shards.slabs.reserve(reinterpret_cast<std::uintptr_t>(range.range_base()),
                         std::min(range.range_bytes(), detail::block_pool::max_chunk_size));
  } else {
    core_.blocks().for_each_chunk([&](detail::chunk_id, detail::block_pool::chunk_info const& info) {
      shards.slabs.reserve(info.base, info.size);
    });
  }
}

void* pool_memory_resource::allocate_globally(std::size_t bytes, std::size_t size, std::size_t alignment,
                                              detail::stream_ref const& s, detail::pool_shard* held) {
  {
    std::lock_guard lock{mutex_};
    if (std::uintptr_t const a = core_.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
  }
  drain_shards(s, false, held);
  {
    std::unique_lock lock{mutex_};
    if (std::uintptr_t const a = core_.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
    if (std::uintptr_t const a = retry_after_park(lock, size, alignment, s)) { return reinterpret_cast<void*>(a); }
    try {
      return grow_and_allocate(bytes, size, alignment, s);
    } catch (out_of_memory const&) {
      // Shards may still hold free slabs that only a synchronization frees up.
    }
  }
  drain_shards(s, true, held);
  // The caller's own shard may hold free memory of a stream no call names now (a created
  // stream another thread freed blocks on) in slabs that still hold live blocks: the
  // drain cannot return those, and the shard would not wait for that stream. Once the
  // device is idle it is everyone's, as the global blocks' is in grow_and_allocate (a
  // false out-of-memory with that memory free, tests/pool_arena_threads_review.cpp).
  if (held != nullptr && held->core.synchronize_everything()) {
    if (std::uintptr_t const a = held->core.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
  }
  std::lock_guard lock{mutex_};
  if (std::uintptr_t const a = core_.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
  return grow_and_allocate(bytes, size, alignment, s);
}

void pool_memory_resource::deallocate_in_shard(detail::pool_shard& shard, void* ptr, std::size_t bytes,
                                               std::size_t expected, detail::stream_ref const& s) {
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  std::size_t actual = 0;
  {
    std::lock_guard lock{shard.mutex};
    if (shard.core.deallocate(address, s, expected) != 0) {
      if (shard.should_give_back(s)) { give_back_free_slabs(shard, s); }
      return;
    }
    actual = shard.core.blocks().live_size(address);
  }
  throw_bad_free(ptr, bytes, actual);
}

void pool_memory_resource::give_back_free_slabs(detail::pool_shard& shard, detail::stream_ref const& s) noexcept {
  // Housekeeping on the way: a free that went through must not be reported as failed
  // (out of host memory here, the block was freed and the call threw: a retry was refused
  // as a double free), and an allocation the shard can serve must not fail for it. The
  // walk decides every slab before one leaves (collect_free_slabs), and a slab leaves
  // only once its free into the global blocks cannot fail (return_slabs), so a failure
  // leaves the slabs not yet back in the shard, which is asked to look again at its next call.
  try {
    return_slabs(&shard, collect_free_slabs(shard, s, false));
  } catch (...) {
    shard.asked_to_give_back.store(true, std::memory_order_relaxed);
  }
}

std::size_t pool_memory_resource::drain_shards(detail::stream_ref const& caller, bool may_synchronize,
                                               detail::pool_shard* held) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < shards_->count(); ++i) {
    detail::pool_shard* shard = shards_->existing(i);
    if (shard == nullptr) { continue; }
    std::unique_lock<detail::lean_mutex> lock;
    if (shard != held && !lock_for_drain(*shard, lock, may_synchronize, held)) {
      shard->asked_to_give_back.store(true, std::memory_order_relaxed);
      continue;
    }
    // Returned before the shard's lock goes (shard, then global): a slab is never out of
    // its shard and still a live global block when another thread looks.
    std::vector<detail::slab_return> const slabs = collect_free_slabs(*shard, caller, may_synchronize);
    return_slabs(shard, slabs);  // throws only with the slabs not returned still the shard's
    for (auto const& slab : slabs) { bytes += slab.size; }
  }
  return bytes;
}

bool pool_memory_resource::lock_for_drain(detail::pool_shard& shard, std::unique_lock<detail::lean_mutex>& lock,
                                          bool last_drain, detail::pool_shard const* held) {
  lock = std::unique_lock{shard.mutex, std::try_to_lock};
  if (lock.owns_lock() || !last_drain) { return lock.owns_lock(); }
  // The drain before out-of-memory takes every free slab back: a shard busy for a moment
  // (its thread allocating, or a thread reading statistics) had made the pool report
  // out-of-memory with the bytes free in that shard (a hostile test). Holding no shard,
  // wait for it; holding one, only try again for a while (two threads waiting for each
  // other's shard would deadlock). A while is a time, not a count of tries: on a loaded
  // machine a reader preempted while it held every shard outlasted 1024 yields, and a
  // request failed with a free slab there (1 in 80 in tests/suballocators_review_cases.cpp).
  if (held == nullptr) {
    lock.lock();
    return true;
  }
  drains_waiting_.fetch_add(1, std::memory_order_relaxed);  // statistics readers step aside
  auto const give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (!lock.try_lock() && std::chrono::steady_clock::now() < give_up) { std::this_thread::yield(); }
  drains_waiting_.fetch_sub(1, std::memory_order_relaxed);
  return lock.owns_lock();
}

std::vector<detail::slab_return> pool_memory_resource::collect_free_slabs(detail::pool_shard& shard,
                                                                          detail::stream_ref const& caller,
                                                                          bool may_synchronize) {
  slab_walks_.fetch_add(1, std::memory_order_relaxed);
  // Looked for now: asked again only by what this walk cannot return.
  shard.asked_to_give_back.store(false, std::memory_order_relaxed);
  shard.awaited_streams.clear();
  std::vector<detail::chunk_id> free_slabs;
  shard.core.blocks().for_each_chunk([&](detail::chunk_id c, detail::block_pool::chunk_info const& info) {
    if (info.live_blocks == 0) { free_slabs.push_back(c); }
  });
  // Every slab is decided before any leaves the shard: deciding allocates (the streams
  // holding a slab, the streams awaited), and a slab removed before a later decision
  // threw would be lost, neither the shard's nor the global blocks'. None leaves here:
  // return_slabs takes each out once its free into the global blocks is certain.
  struct going_back {
    detail::chunk_id chunk;
    detail::stream_ref stream;
    bool freed_in_capture;
  };
  std::vector<going_back> going;
  going.reserve(free_slabs.size());
  shard.awaited_streams.reserve(free_slabs.size());
  for (detail::chunk_id c : free_slabs) {
    detail::stream_ref stream{};
    bool held = false;
    if (may_synchronize) {
      stream = shard.core.return_stream(c);  // synchronized if need be: no capture holds it then
    } else if (!shard.core.hand_back_stream(c, stream, caller)) {
      // Its stream's own call can (none when several streams hold it: a synchronizing
      // drain, before out-of-memory or on release(), returns it then).
      detail::stream_ref holder;
      if (shard.core.sole_holder(c, holder) &&
          std::find(shard.awaited_streams.begin(), shard.awaited_streams.end(), holder.key) ==
              shard.awaited_streams.end()) {
        shard.awaited_streams.push_back(holder.key);
      }
      continue;
    } else {
      // A default stream's slab goes back even while a capture may hold its memory (freed
      // in the capture, not recorded since). The mark goes with it: booked in the global
      // blocks without it, the chunk went back to the upstream at the next growth with the
      // graph still to use it (tests/pool_capture_shards.cpp).
      held = shard.core.capture_may_hold(c, caller);
    }
    going.push_back({c, stream, held});
  }
  shard.holder_changes_at_walk = shard.core.holder_changes();  // after return_stream's synchronizations
  std::vector<detail::slab_return> slabs;
  slabs.reserve(going.size());
  for (auto const& g : going) {
    auto const info = shard.core.blocks().chunk(g.chunk);
    slabs.push_back({info.base, info.size, g.stream, g.freed_in_capture, g.chunk});
  }
  return slabs;
}

void pool_memory_resource::return_slabs(detail::pool_shard* shard, std::vector<detail::slab_return> const& slabs) {
  if (slabs.empty()) { return; }
  std::lock_guard lock{mutex_};
  for (auto const& slab : slabs) {
    // The global blocks' free of a slab may need host memory (its owner's index, an entry
    // in the class array of the block it merges into). Made before the slab leaves the
    // shard: out of host memory then, this slab and those after it are still the shard's
    // chunks, mapped to it, and the shard gives them back at a later call. Taken out
    // first and freed after, a failed free had left the slab a live global block that
    // no shard held, its memory lost until the pool was destroyed. Nothing changes the
    // global blocks between the reservation and the free (the global lock is held).
    detail::owner_id owner = 0;
    try {
      if (!core_.reserve_deallocate(slab.base, slab.stream, owner)) {
        throw logic_error("pool: a slab at " + format_hex(reinterpret_cast<void*>(slab.base)) +
                          " is not a live global block (internal error)");
      }
    } catch (std::bad_alloc const&) {
      if (shard != nullptr) { shard->asked_to_give_back.store(true, std::memory_order_relaxed); }
      throw;
    }
    // From here nothing fails. Unmapped only now, under the global lock: until the slab
    // is a free global block, a free of its address must reach the shard (which refuses
    // it), not the global blocks, where the slab is still a live block of that size.
    if (shard != nullptr) { (void)shard->core.blocks().remove_chunk(slab.chunk); }  // no live block: collected so
    shards_->slabs.assign(slab.base, slab.size, 0);  // mapped by map_slab: its levels exist
    (void)core_.deallocate_reserved(slab.base, slab.stream, owner);
    if (slab.freed_in_capture) { core_.owners().mark_freed_in_capture(owner); }
  }
  // No stream is named for all the slabs: the legacy one stands in (asking about it while
  // a blocking stream is being captured answers "capturing", and nothing is released).
  if (growth_) { growth_->after_deallocate(core_, detail::stream_ref{}); }
}

void pool_memory_resource::with_shard_totals(
    std::function<void(shard_totals const&)> const& read,
    std::function<void(detail::stream_ordered_pool const&)> const& each_shard) const {
  // Lock order as everywhere: shards, then the global lock. Every shard is only *tried*,
  // and on a busy one all are let go and taken again after a pause: a reader that waited
  // for a shard while holding the lower ones kept a shard's thread, whose last drain
  // before out-of-memory tries those, from ever getting them (a false out-of-memory in
  // 53 of 80 requests, a hostile test). After many rounds it waits, in order.
  std::vector<std::unique_lock<detail::lean_mutex>> locks;
  std::vector<detail::pool_shard const*> locked;  // the shards summed: those locked here
  std::unique_lock<detail::lean_mutex> global;
  for (int round = 0;; ++round) {
    if (global.owns_lock()) { global.unlock(); }
    locks.clear();
    locked.clear();
    while (round < 4096 && drains_waiting_.load(std::memory_order_relaxed) != 0) { std::this_thread::yield(); }
    bool all = true;
    for (std::size_t i = 0; all && sharded_.load(std::memory_order_acquire) && i < shards_->count(); ++i) {
      if (detail::pool_shard* shard = shards_->existing(i)) {
        if (round < 4096) {
          locks.emplace_back(shard->mutex, std::try_to_lock);
          all = locks.back().owns_lock();
        } else {
          locks.emplace_back(shard->mutex);
        }
        locked.push_back(shard);
      }
    }
    if (all) {
      // A shard made after the loop above looked may have taken its first slab from the
      // global blocks before the global lock was had: read now, that slab counted as a
      // used block (a whole slab of used bytes with no block live, found by a hostile
      // test). Under the global lock no shard takes a slab, so one unlocked shard is
      // enough to look again.
      global = std::unique_lock{mutex_};
      if (every_shard_in(locked)) { break; }
    }
    std::this_thread::yield();
  }
  shard_totals t;
  for (detail::pool_shard const* shard : locked) {
    auto const& b = shard->core.blocks();
    ++t.shards;
    t.slab_bytes += b.total_bytes();
    t.slabs += b.chunk_count();
    t.live_bytes += b.live_bytes();
    t.live_blocks += b.live_blocks();
    t.free_bytes += b.free_bytes();
    t.free_blocks += b.free_block_count();
    t.largest_free_block = std::max(t.largest_free_block, b.largest_free_block());
    t.events_recorded += shard->core.owners().records();
    t.stream_waits += shard->core.owners().waits();
    t.idle_parks += shard->core.owners().idle_parks();
    t.idle_queries += shard->core.owners().idle_queries();
    if (each_shard) { each_shard(shard->core); }
  }
  read(t);
}

bool pool_memory_resource::every_shard_in(std::vector<detail::pool_shard const*> const& locked) const {
  // Under the global lock: shards_ is set under it, and read only once sharded_ is set.
  if (!sharded_.load(std::memory_order_acquire)) { return true; }
  for (std::size_t i = 0; i < shards_->count(); ++i) {
    detail::pool_shard const* shard = shards_->existing(i);
    if (shard != nullptr && std::find(locked.begin(), locked.end(), shard) == locked.end()) { return false; }
  }
  return true;
}

std::string pool_memory_resource::check_shards() const {
  if (!sharded_.load(std::memory_order_acquire)) { return {}; }
  for (std::size_t i = 0; i < shards_->count(); ++i) {
    detail::pool_shard* shard = shards_->existing(i);
    if (shard == nullptr) { continue; }
    std::lock_guard lock{shard->mutex};
    std::string const broken = shard->core.blocks().check_invariants();
    if (!broken.empty()) { return "shard " + std::to_string(i) + ": " + broken; }
    std::string slab_error;
    shard->core.blocks().for_each_chunk([&](detail::chunk_id, detail::block_pool::chunk_info const& c) {
      if (!slab_error.empty()) { return; }
      std::lock_guard global{mutex_};
      if (core_.blocks().live_size(c.base) != c.size || shards_->slabs.find(c.base) != i + 1 ||
          shards_->slabs.find(c.base + c.size - 1) != i + 1) {
        slab_error = "shard " + std::to_string(i) + ": slab " + format_hex(reinterpret_cast<void*>(c.base)) + " of " +
                     format_bytes(c.size) + " is not a live global block mapped to it";
      }
    });
    if (!slab_error.empty()) { return slab_error; }
  }
  return {};
}

}  // namespace mrstack
