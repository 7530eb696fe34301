#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>
#include <vector>

#include <mrstack/suballoc/in_place_pool_growth.hpp>
#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack {

namespace {

constexpr std::size_t granularity = detail::block_pool::granularity;
constexpr std::size_t max_shards = 64;
// The largest block a pool hands out: a chunk's size counts granules in 32 bits.
constexpr std::size_t largest_block = detail::block_pool::max_chunk_size;

std::shared_ptr<detail::stream_sync> pick_sync(pool_options const& options, resource_ptr const& upstream) {
  if (!upstream) { throw logic_error("pool: the upstream resource is null"); }
  return options.stream_sync ? options.stream_sync : default_stream_sync(upstream->kind());
}

std::size_t shard_count(std::size_t asked) {
  std::size_t n = asked != 0 ? asked : std::max<std::size_t>(1, std::thread::hardware_concurrency());
  n = std::min(n, max_shards);
  std::size_t pow2 = 1;
  while (pow2 < n) { pow2 <<= 1U; }
  return pow2;
}

}  // namespace

pool_memory_resource::pool_memory_resource(resource_ptr upstream, std::size_t initial_size,
                                           std::optional<std::size_t> maximum_size, pool_options options)
    : upstream_{std::move(upstream)},
      maximum_size_{maximum_size},
      options_{std::move(options)},
      sync_{pick_sync(options_, upstream_)} {
  if (options_.growth_divisor == 0) { throw logic_error("pool: growth_divisor must be at least 1"); }
  if (!detail::is_pow2(options_.growth_granularity) || options_.growth_granularity < granularity) {
    throw logic_error("pool: growth_granularity " + std::to_string(options_.growth_granularity) +
                      " must be a power of two of at least 256");
  }
  if (initial_size > largest_block) {
    throw logic_error("pool: initial size " + format_bytes(initial_size) + " exceeds the largest chunk a pool manages (" +
                      format_bytes(largest_block) + ")");
  }
  std::size_t const initial = detail::align_up(initial_size, granularity);
  if (maximum_size_ && initial > *maximum_size_) {
    throw logic_error("pool: initial size " + format_bytes(initial) + " exceeds the maximum size " +
                      format_bytes(*maximum_size_));
  }
  if (options_.grow_in_place) {
    detail::in_place_growth_options growth;
    growth.initial_bytes = initial;
    growth.maximum_bytes = maximum_size_.value_or(std::numeric_limits<std::size_t>::max());
    growth.release_threshold = options_.release_threshold;
    growth_ = detail::in_place_pool_growth::detect(*upstream_, growth);
  }
  std::size_t const count = growth_ ? 1 : shard_count(options_.shards);
  shard_mask_ = count - 1;
  shards_ = std::make_unique<std::atomic<shard*>[]>(count);
  for (std::size_t i = 0; i < count; ++i) { shards_[i].store(nullptr, std::memory_order_relaxed); }
  shard& first = home_shard();  // the constructing thread's: a single-threaded program uses one shard
  if (growth_) {
    growth_->start(first.core);  // freshly mapped memory has no pending work: usable by every stream
    peak_pool_size_ = footprint();
  } else if (initial > 0) {
    detail::stream_ref const s = to_stream_ref(options_.initial_stream);
    void* base = upstream_->allocate(initial, options_.initial_stream, granularity);
    try {
      // Waiting for the upstream once makes the initial chunk usable by every stream.
      sync_->synchronize(s.handle);
    } catch (...) {
      upstream_->deallocate(base, initial, options_.initial_stream, granularity);
      throw;
    }
    first.core.blocks().add_chunk(reinterpret_cast<std::uintptr_t>(base), initial, detail::block_pool::synchronized);
    upstream_allocations_ = 1;
    held_bytes_ = initial;
    peak_pool_size_ = initial;
  }
  publish(first);
}

pool_memory_resource::~pool_memory_resource() {
  if (growth_) {
    growth_.reset();  // gives up the claim: every granule goes back (after the device is idle)
    return;
  }
  struct chunk_return {
    std::uintptr_t base;
    std::size_t size;
    detail::stream_ref stream;
  };
  std::vector<chunk_return> returns;
  for_each_shard([&](shard& sh) {
    try {
      std::vector<detail::chunk_id> ids;
      sh.core.blocks().for_each_chunk(
          [&](detail::chunk_id c, detail::block_pool::chunk_info const&) { ids.push_back(c); });
      for (detail::chunk_id c : ids) {
        auto const info = sh.core.blocks().chunk(c);
        detail::stream_ref s{};
        try {
          s = sh.core.return_stream(c);
        } catch (std::exception const& e) {
          std::fprintf(stderr, "mrstack: pool destructor could not synchronize before returning memory: %s\n",
                       e.what());
        }
        returns.push_back({info.base, info.size, s});
      }
    } catch (std::exception const& e) {
      std::fprintf(stderr, "mrstack: pool destructor: %s\n", e.what());
    }
  });
  for (auto const& r : returns) {
    try {
      upstream_->deallocate(reinterpret_cast<void*>(r.base), r.size, to_stream_view(r.stream), granularity);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "mrstack: pool destructor could not return a chunk to its upstream: %s\n", e.what());
    }
  }
}

pool_memory_resource::shard& pool_memory_resource::home_shard() {
  // Thread keys are handed out in sequence, so consecutive threads land on consecutive shards.
  std::size_t const i = shard_mask_ == 0 ? 0 : static_cast<std::size_t>(detail::this_thread_key() >> 1U) & shard_mask_;
  if (shard* sh = shard_at(i)) { return *sh; }
  return create_shard(i);
}

pool_memory_resource::shard& pool_memory_resource::create_shard(std::size_t index) {
  std::lock_guard lock{creation_mutex_};
  if (shard* sh = shard_at(index)) { return *sh; }
  owned_shards_.push_back(std::make_unique<shard>(sync_));
  shard* sh = owned_shards_.back().get();
  shards_[index].store(sh, std::memory_order_release);
  return *sh;
}

void* pool_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  alignment = std::max(alignment, granularity);
  if (bytes > largest_block) {
    throw_out_of_memory(bytes, "request too large: a pool block is at most " + format_bytes(largest_block));
  }
  std::size_t const size = detail::align_up(bytes, granularity);
  detail::stream_ref const s = to_stream_ref(stream);
  shard& home = home_shard();
  std::uintptr_t a = 0;
  {
    std::lock_guard lock{home.mutex};
    a = home.core.allocate(size, alignment, s);
    publish(home);
  }
  if (a == 0) { return allocate_slow(bytes, size, alignment, s, home); }
  // Never under a shard's lock: shards are locked one at a time.
  if (shards_with_parks_.load(std::memory_order_relaxed) != 0) [[unlikely]] { serve_parks(s, home); }
  return reinterpret_cast<void*>(a);
}

void pool_memory_resource::serve_parks(detail::stream_ref const& s, shard const& home) {
  if (!detail::stream_owners::is_created(s)) { return; }
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    shard* sh = shard_at(i);
    if (sh == nullptr || sh == &home || !sh->parks_pending.load(std::memory_order_relaxed)) { continue; }
    std::lock_guard lock{sh->mutex};
    sh->core.park_if_wanted(s);
    publish(*sh);
  }
}

void* pool_memory_resource::allocate_slow(std::size_t bytes, std::size_t size, std::size_t alignment,
                                          detail::stream_ref const& s, shard& home) {
  // No hoarding: what other shards hold free is used before the pool grows.
  if (std::uintptr_t const a = allocate_from_other_shards(size, alignment, s, home)) { return reinterpret_cast<void*>(a); }
  std::string why = "no free block fits";
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard lock{home.mutex};
      std::uintptr_t a = home.core.allocate(size, alignment, s);  // freed meanwhile by another thread
      if (a == 0) { a = grow_and_allocate(size, alignment, s, home, why); }
      publish(home);
      if (a != 0) { return reinterpret_cast<void*>(a); }
    }
    // The upstream (or the maximum) refused: every shard synchronizes what its streams
    // hold and returns its wholly free chunks; then once more, everywhere.
    if (attempt == 1 || !trim_all_shards()) { break; }
    if (std::uintptr_t const a = allocate_from_other_shards(size, alignment, s, home)) {
      return reinterpret_cast<void*>(a);
    }
  }
  throw_out_of_memory(bytes, why);
}

std::uintptr_t pool_memory_resource::allocate_from_other_shards(std::size_t size, std::size_t alignment,
                                                                detail::stream_ref const& s, shard const& home) {
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    shard* sh = shard_at(i);
    if (sh == nullptr || sh == &home || sh->free_hint.load(std::memory_order_relaxed) < size) { continue; }
    std::lock_guard lock{sh->mutex};
    std::uintptr_t const a = sh->core.allocate(size, alignment, s);
    publish(*sh);
    if (a != 0) { return a; }
  }
  return 0;
}

bool pool_memory_resource::settle_before_growing(shard& home, std::size_t size) {
  // Other streams' memory was wanted but not yet parked (their next call parks it).
  // Growing instead is cheap while the footprint stays near what is live; past that,
  // one device synchronization hands all of it over at once.
  if (!home.core.parks_pending()) { return false; }
  auto const& b = home.core.blocks();
  std::size_t const held = b.total_bytes() - b.withdrawn_bytes();
  std::size_t const live = b.live_bytes() + size;
  if (held + size <= live + live / 8) { return false; }
  return home.core.synchronize_everything();
}

std::uintptr_t pool_memory_resource::grow_and_allocate(std::size_t size, std::size_t alignment,
                                                       detail::stream_ref const& s, shard& home, std::string& why) {
  if (settle_before_growing(home, size)) {
    if (std::uintptr_t const a = home.core.allocate(size, alignment, s)) { return a; }
  }
  if (growth_) { return grow_in_place_and_allocate(size, alignment, s, home, why); }
  // Room to align inside a chunk the upstream only aligns to 256.
  std::size_t const pad = alignment - granularity;
  if (size > largest_block - std::min(pad, largest_block)) {
    why = "request too large: with room to align it exceeds the largest chunk a pool manages";
    return 0;
  }
  std::size_t const needed = size + pad;
  auto retry = [&]() { return home.core.allocate(size, alignment, s); };
  if (grow(home, needed, s, why)) {
    if (std::uintptr_t const a = retry()) { return a; }
  }
  // The upstream (or the maximum) refused. Memory other streams still hold becomes
  // usable once the device is idle; then wholly free chunks can make room.
  if (home.core.synchronize_everything()) {
    if (std::uintptr_t const a = retry()) { return a; }
  }
  if (release_free_chunks(home) > 0 && grow(home, needed, s, why)) {
    if (std::uintptr_t const a = retry()) { return a; }
  }
  return 0;
}

std::uintptr_t pool_memory_resource::grow_in_place_and_allocate(std::size_t size, std::size_t alignment,
                                                                detail::stream_ref const& s, shard& home,
                                                                std::string& why) {
  auto retry = [&]() { return home.core.allocate(size, alignment, s); };
  why = "grown in place, yet no free block fits";
  try {
    // Growth releases free granules itself (and plans again) when the device is full.
    growth_->grow(home.core, size, alignment, s);
    upstream_allocations_.fetch_add(1, std::memory_order_relaxed);
    note_peak();
    if (std::uintptr_t const a = retry()) { return a; }
  } catch (detail::growth_failure const& e) {
    why = e.what();
  }
  // Other streams' free memory becomes usable once the device is idle.
  if (home.core.synchronize_everything()) {
    if (std::uintptr_t const a = retry()) { return a; }
  }
  return 0;
}

bool pool_memory_resource::reserve(std::size_t bytes) noexcept {
  std::size_t held = held_bytes_.load(std::memory_order_relaxed);
  do {
    if (maximum_size_ && (bytes > *maximum_size_ || held > *maximum_size_ - bytes)) { return false; }
  } while (!held_bytes_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  return true;
}

void pool_memory_resource::note_peak() noexcept {
  std::size_t const now = footprint();
  std::size_t peak = peak_pool_size_.load(std::memory_order_relaxed);
  while (now > peak && !peak_pool_size_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
}

bool pool_memory_resource::grow(shard& sh, std::size_t needed, detail::stream_ref const& s, std::string& why) {
  std::size_t const shard_before = sh.core.blocks().total_bytes();
  std::size_t const released = options_.consolidate_on_growth ? release_free_chunks(sh, false, s) : 0;
  if (needed > largest_block - std::min(released, largest_block)) {
    why = "request too large: it exceeds the largest chunk a pool manages";
    return false;
  }
  needed += released;
  std::size_t const held = held_bytes_.load(std::memory_order_relaxed);
  std::size_t const cap = !maximum_size_ ? largest_block
                          : *maximum_size_ > held ? std::min(detail::align_down(*maximum_size_ - held, granularity), largest_block)
                                                  : 0;
  if (needed > cap) {
    why = "the pool would exceed its maximum size";
    return false;
  }
  std::size_t want = std::max({needed, shard_before / options_.growth_divisor, options_.minimum_growth});
  want = want > cap - std::min(cap, options_.growth_granularity) ? cap : detail::align_up(want, options_.growth_granularity);
  want = std::min(want, cap);
  for (std::size_t chunk = want;;) {
    if (!reserve(chunk)) {  // another shard grew meanwhile
      why = "the pool would exceed its maximum size";
      return false;
    }
    try {
      void* base = upstream_->allocate(chunk, to_stream_view(s), granularity);
      if (!detail::is_aligned(base, granularity)) {
        upstream_->deallocate(base, chunk, to_stream_view(s), granularity);
        throw logic_error("pool: upstream " + upstream_->name() + " returned " + format_hex(base) +
                          ", which is not 256-byte aligned");
      }
      sh.core.add_chunk(reinterpret_cast<std::uintptr_t>(base), chunk, s);
      upstream_allocations_.fetch_add(1, std::memory_order_relaxed);
      note_peak();
      return true;
    } catch (out_of_memory const& e) {
      held_bytes_.fetch_sub(chunk, std::memory_order_relaxed);
      why = std::string{"upstream refused: "} + e.what();
      if (chunk == needed) { return false; }
      chunk = std::max(needed, detail::align_down(chunk / 2, granularity));
    } catch (...) {
      held_bytes_.fetch_sub(chunk, std::memory_order_relaxed);
      throw;
    }
  }
}

std::size_t pool_memory_resource::release_free_chunks(shard& sh, bool may_synchronize, detail::stream_ref const& caller) {
  std::vector<detail::chunk_id> free_chunks;
  sh.core.blocks().for_each_chunk([&](detail::chunk_id c, detail::block_pool::chunk_info const& info) {
    if (info.live_blocks == 0) { free_chunks.push_back(c); }
  });
  std::size_t released = 0;
  for (detail::chunk_id c : free_chunks) {
    detail::stream_ref s{};
    if (may_synchronize) {
      s = sh.core.return_stream(c);
    } else if (!sh.core.return_stream_without_sync(c, s, caller)) {
      continue;
    }
    auto const info = sh.core.blocks().chunk(c);
    sh.core.blocks().remove_chunk(c);
    upstream_->deallocate(reinterpret_cast<void*>(info.base), info.size, to_stream_view(s), granularity);
    held_bytes_.fetch_sub(info.size, std::memory_order_relaxed);
    released += info.size;
  }
  return released;
}

bool pool_memory_resource::trim_all_shards() {
  bool changed = false;
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    changed = sh.core.synchronize_everything() || changed;
    if (!growth_) { changed = release_free_chunks(sh) > 0 || changed; }
    publish(sh);
  });
  return changed;
}

void pool_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t, stream_view stream) {
  detail::stream_ref const s = to_stream_ref(stream);
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  shard& home = home_shard();
  std::size_t freed = 0;
  {
    std::lock_guard lock{home.mutex};
    freed = home.core.deallocate(address, s);
    if (freed != 0) {
      if (growth_) { growth_->after_deallocate(home.core); }
      publish(home);
    }
  }
  // Not in the home shard: the block came from another shard (another thread's, or taken
  // from its free memory). Only the shard whose table holds it as live changes.
  for (std::size_t i = 0; freed == 0 && i <= shard_mask_; ++i) {
    shard* sh = shard_at(i);
    if (sh == nullptr || sh == &home) { continue; }
    std::lock_guard lock{sh->mutex};
    if (sh->core.blocks().live_size(address) == 0) { continue; }
    freed = sh->core.deallocate(address, s);
    publish(*sh);
  }
  if (freed != 0 && shards_with_parks_.load(std::memory_order_relaxed) != 0) [[unlikely]] { serve_parks(s, home); }
  if (freed == 0) {
    throw logic_error("pool: deallocate of " + format_hex(ptr) + " (" + std::to_string(bytes) +
                      " B), which this pool did not hand out or has already taken back");
  }
  if (bytes > largest_block || freed != detail::align_up(bytes, granularity)) {
    throw logic_error("pool: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                      " B, but its block is " + std::to_string(freed) + " B (freed anyway)");
  }
}

void pool_memory_resource::do_release() {
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    if (growth_) {
      growth_->release(sh.core);
    } else {
      release_free_chunks(sh);
    }
    publish(sh);
  });
  upstream_->release();
}

}  // namespace mrstack
