#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <limits>
#include <vector>

#include <mrstack/detail/in_place_pool_growth.hpp>
#include <mrstack/suballoc/stream_sync.hpp>

#include "pool_shards.hpp"

namespace mrstack {

namespace {

constexpr std::size_t granularity = detail::block_pool::granularity;

std::shared_ptr<detail::stream_sync> pick_sync(pool_options const& options, resource_ptr const& upstream) {
  if (!upstream) { throw logic_error("pool: the upstream resource is null"); }
  return options.stream_sync ? options.stream_sync : default_stream_sync(upstream->kind());
}

}  // namespace

pool_memory_resource::pool_memory_resource(resource_ptr upstream, std::size_t initial_size,
                                           std::optional<std::size_t> maximum_size, pool_options options)
    : upstream_{std::move(upstream)},
      maximum_size_{maximum_size},
      options_{std::move(options)},
      core_{pick_sync(options_, upstream_), &detail::this_thread_key, options_.record_on_demand, options_.parks()},
      spare_events_{core_.owners().shared_sync()} {
  if (options_.growth_divisor == 0) { throw logic_error("pool: growth_divisor must be at least 1"); }
  if (options_.park_divisor == 0) { throw logic_error("pool: park_divisor must be at least 1"); }
  if (options_.thread_shards > detail::pool_shard_set::max_shards) {
    throw logic_error("pool: thread_shards " + std::to_string(options_.thread_shards) + " exceeds " +
                      std::to_string(detail::pool_shard_set::max_shards));
  }
  if (!detail::is_pow2(options_.growth_granularity) || options_.growth_granularity < granularity ||
      options_.growth_granularity > detail::block_pool::max_chunk_size) {
    // Above the largest chunk, rounding a chunk up to it wrapped to 0 at the first growth.
    throw logic_error("pool: growth_granularity " + std::to_string(options_.growth_granularity) +
                      " must be a power of two from 256 to " + format_bytes(detail::block_pool::max_chunk_size));
  }
  std::size_t const initial = detail::align_up(initial_size, granularity);
  if (maximum_size_ && initial > *maximum_size_) {
    throw logic_error("pool: initial size " + format_bytes(initial) + " exceeds the maximum size " +
                      format_bytes(*maximum_size_));
  }
  if (initial > detail::block_pool::max_chunk_size) {
    // Checked before the upstream is asked: the initial chunk is one chunk, and past the
    // largest one the pool failed only after taking it (never given back).
    throw logic_error("pool: initial_size " + format_bytes(initial_size) + " exceeds the largest chunk a pool manages, " +
                      format_bytes(detail::block_pool::max_chunk_size));
  }
  if (options_.grow_in_place) {
    detail::in_place_growth_options growth;
    growth.initial_bytes = initial;
    growth.maximum_bytes = maximum_size_.value_or(std::numeric_limits<std::size_t>::max());
    growth.release_threshold = options_.release_threshold;
    if (auto* range = dynamic_cast<virtual_range*>(upstream_.get())) {
      check_whole_granules(initial, range->granularity());
      growth_ = std::make_unique<detail::in_place_pool_growth>(*range, growth);
    }
  }
  if (growth_) {
    growth_->start(core_);  // freshly mapped memory has no pending work: usable by every stream
    peak_pool_size_ = footprint();
  } else if (initial > 0) {
    detail::stream_ref const s = to_stream_ref(options_.initial_stream);
    void* base = upstream_->allocate(initial, options_.initial_stream, granularity);
    try {
      // Waiting for the upstream once makes the initial chunk usable by every stream.
      core_.owners().sync().synchronize(s.handle);
      core_.blocks().add_chunk(reinterpret_cast<std::uintptr_t>(base), initial, detail::block_pool::synchronized);
    } catch (...) {
      upstream_->deallocate(base, initial, options_.initial_stream, granularity);
      throw;
    }
    ++upstream_allocations_;
    peak_pool_size_ = initial;
  }
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
  try {
    std::vector<detail::chunk_id> ids;
    core_.blocks().for_each_chunk([&](detail::chunk_id c, detail::block_pool::chunk_info const&) { ids.push_back(c); });
    for (detail::chunk_id c : ids) {
      auto const info = core_.blocks().chunk(c);
      detail::stream_ref s{};
      try {
        s = core_.return_stream(c);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "mrstack: pool destructor could not synchronize before returning memory: %s\n", e.what());
      }
      returns.push_back({info.base, info.size, s});
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: pool destructor: %s\n", e.what());
  }
  for (auto const& r : returns) {
    try {
      upstream_->deallocate(reinterpret_cast<void*>(r.base), r.size, to_stream_view(r.stream), granularity);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "mrstack: pool destructor could not return a chunk to its upstream: %s\n", e.what());
    }
  }
}

void pool_memory_resource::check_whole_granules(std::size_t initial, std::size_t granule) const {
  // Growing in place maps whole granules: the initial size rounds up to them and the
  // maximum down. A maximum below one granule made a pool that refused every allocation
  // ("the maximum of 0 B"); an initial size that rounds past the maximum, or past the
  // reserved range, failed inside the growth code as std::invalid_argument, naming neither.
  std::string const upstream = upstream_->name() + "'s granules of " + format_bytes(granule);
  std::size_t const rounded = detail::align_up(initial, granule);
  if (maximum_size_) {
    std::size_t const usable = *maximum_size_ / granule * granule;
    if (usable == 0) {
      throw logic_error("pool: the maximum size " + format_bytes(*maximum_size_) + " is less than one of " +
                        upstream + ", the unit it grows in place by: give a maximum of at least one granule, or "
                        "grow_in_place=false");
    }
    if (rounded > usable) {
      throw logic_error("pool: the initial size " + format_bytes(initial) + ", rounded up to whole " + upstream +
                        ", passes the maximum size " + format_bytes(*maximum_size_) + " rounded down to them (" +
                        format_bytes(usable) + ")");
    }
  }
  // The caller found the range; the pool grows one chunk over it, at most max_chunk_size.
  auto const* range = dynamic_cast<virtual_range const*>(upstream_.get());
  if (range == nullptr) { return; }
  std::size_t const reserved = range->range_bytes() / granule * granule;
  std::size_t const one_chunk = detail::block_pool::max_chunk_size / granule * granule;
  if (rounded > std::min(reserved, one_chunk)) {
    std::string const limit = reserved <= one_chunk
                                  ? upstream_->name() + "'s reserve of " + format_bytes(range->range_bytes()) +
                                        ": raise its reserve=, or lower initial="
                                  : "the " + format_bytes(one_chunk) + " one chunk of the pool can hold";
    throw logic_error("pool: the initial size " + format_bytes(initial) + ", rounded up to whole " + upstream +
                      ", passes " + limit);
  }
}

void* pool_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  // One block never exceeds a chunk (block_pool::max_chunk_size, 1 TiB): a larger request,
  // or one whose alignment padding would not fit, is out of memory before any rounding
  // can wrap.
  if (bytes > detail::block_pool::max_chunk_size) {
    throw_out_of_memory(bytes, "request too large: one block is at most " +
                                   format_bytes(detail::block_pool::max_chunk_size));
  }
  if (alignment > detail::block_pool::max_chunk_size - bytes) {
    throw_out_of_memory(bytes, "alignment " + std::to_string(alignment) + " too large: a block and its alignment "
                               "padding must fit in one chunk, at most " + format_bytes(detail::block_pool::max_chunk_size));
  }
  if (maximum_size_) { refuse_past_maximum(bytes); }
  try {
    return allocate_checked(bytes, alignment, stream);
  } catch (out_of_memory const& e) {
    // The pool's refusal is made under the global lock, which comes after the shards' in
    // the lock order: the free memory in thread shards' slabs is added here, with no lock
    // held (it had read as "free 0 B" with megabytes free in slabs).
    if (!sharded_.load(std::memory_order_acquire) || e.info().resource != "pool") { throw; }
    throw_out_of_memory_counting_shards(e.info());
  } catch (std::length_error const& e) {
    // The block metadata's own limits (block_pool's node space, the stream slots): the
    // request was refused and nothing changed, so it is out of memory like any other.
    throw_out_of_memory_counting_shards(refusal(bytes, std::string{"its block bookkeeping is full: "} + e.what()));
  } catch (std::bad_alloc const& e) {
    throw_out_of_memory_counting_shards(
        refusal(bytes, std::string{"host memory for its block bookkeeping ran out: "} + e.what()));
  }
}

void pool_memory_resource::refuse_past_maximum(std::size_t bytes) const {
  // A block larger than the maximum can never be held: refused before the pool grows for
  // it (growth returned free chunks and synchronized the device first, and the refusal
  // named neither the size nor the alignment). One whose worst-case alignment padding
  // passes the maximum may still fit a free block that happens to be aligned: that is
  // refused only where the pool would grow for it (refuse_padding_past_maximum).
  if (detail::align_up(bytes, granularity) > *maximum_size_) {
    throw_out_of_memory_counting_shards(
        refusal(bytes, "request larger than the maximum size " + format_bytes(*maximum_size_)));
  }
}

void pool_memory_resource::refuse_padding_past_maximum(std::size_t bytes, std::size_t size, std::size_t alignment) const {
  std::size_t const pad = alignment - granularity;
  if (maximum_size_ && size <= *maximum_size_ && pad > *maximum_size_ - size) {
    throw_out_of_memory(bytes, "alignment " + std::to_string(alignment) + " too large: no free block serves it, and " +
                                   "a new one with the up to " + format_bytes(pad) +
                                   " of padding it may need would exceed the maximum size " + format_bytes(*maximum_size_));
  }
}

allocation_failure pool_memory_resource::refusal(std::size_t bytes, std::string why) const {
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "pool";
  info.limit_bytes = maximum_size_;
  info.detail = std::move(why);
  return info;
}

void pool_memory_resource::throw_out_of_memory_counting_shards(allocation_failure info) const {
  try {
    statistics const st = stats();
    info.footprint_bytes = st.pool_size;
    info.free_bytes = st.free_bytes;
    info.largest_free_block = st.largest_free_block;
  } catch (std::exception const&) {
    // Statistics need host memory: after a host allocation failure the refusal goes out
    // without them rather than as another std::bad_alloc.
  }
  throw out_of_memory(std::move(info));
}

void* pool_memory_resource::allocate_checked(std::size_t bytes, std::size_t alignment, stream_view stream) {
  alignment = std::max(alignment, granularity);
  std::size_t const size = detail::align_up(bytes, granularity);
  detail::stream_ref const s = to_stream_ref(stream);
  if (sharded_.load(std::memory_order_acquire) || second_thread_arrived()) {
    return allocate_sharded(bytes, size, alignment, s);
  }
  std::unique_lock lock{mutex_, std::try_to_lock};
  if (!lock.owns_lock()) {
    if (contended()) { return allocate_sharded(bytes, size, alignment, s); }
    lock.lock();
  }
  if (std::uintptr_t const a = core_.allocate(size, alignment, s)) { return reinterpret_cast<void*>(a); }
  if (std::uintptr_t const a = retry_after_park(lock, size, alignment, s)) { return reinterpret_cast<void*>(a); }
  return grow_and_allocate(bytes, size, alignment, s);
}

std::uintptr_t pool_memory_resource::retry_after_park(std::unique_lock<detail::lean_mutex>& lock, std::size_t size,
                                                      std::size_t alignment, detail::stream_ref const& s) {
  return detail::wait_for_asked_park(core_.owners(), lock) ? core_.allocate(size, alignment, s) : 0;
}

void pool_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  // Blocks do not record their alignment, but one the pointer lacks, or one that is not a
  // power of two, is not the alignment the block was allocated with (the arena and the
  // system upstream refuse these too; the pool had freed the block).
  if (!detail::is_pow2(alignment) || !detail::is_aligned(ptr, std::max(alignment, granularity))) {
    throw logic_error("pool: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                      " B (alignment " + std::to_string(alignment) + "), but " +
                      (detail::is_pow2(alignment) ? "the pointer is not aligned to it: its block was handed out with "
                                                    "another alignment"
                                                  : std::string{"the alignment is not a power of two"}) +
                      "; nothing was freed");
  }
  detail::stream_ref const s = to_stream_ref(stream);
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  // A size past the largest block cannot match one (and would wrap when rounded).
  std::size_t const expected = bytes > detail::block_pool::max_chunk_size ? 0 : detail::align_up(bytes, granularity);
  if (sharded_.load(std::memory_order_acquire)) {
    if (std::uint16_t const owner = shards_->slabs.find(address)) {
      deallocate_in_shard(shards_->get(owner - 1), ptr, bytes, expected, s);
      return;
    }
  }
  // A free that will park its stream asks whether the stream is idle, or records the
  // event, before the lock (see detail/spare_events.hpp): under the lock, every other
  // thread would wait out the CUDA call.
  detail::prerecorded_event event{spare_events_};
  // Acquire: a bound below ~0 was stored after a second stream appeared, so every free
  // made before that (whose memory this park may cover) happens before this record.
  if (bytes > park_certain_above_.load(std::memory_order_acquire) && detail::stream_owners::is_created(s)) {
    event.prepare(s.handle);
  }
  std::size_t actual = 0;  // the block's size, when the free is refused
  {
    std::unique_lock lock{mutex_, std::try_to_lock};
    if (!lock.owns_lock()) {
      (void)contended();
      lock.lock();
    }
    // Slabs are mapped and unmapped under this lock: looked up again here, the answer is
    // final (a slab carved since the first look must not be freed as a global block).
    if (sharded_.load(std::memory_order_acquire)) {
      if (std::uint16_t const owner = shards_->slabs.find(address)) {
        lock.unlock();
        deallocate_in_shard(shards_->get(owner - 1), ptr, bytes, expected, s);
        return;
      }
    }
    if (core_.deallocate(address, s, expected, event.get()) != 0) {
      if (growth_) { growth_->after_deallocate(core_, s); }
      if (std::size_t const above = core_.park_certain_above();
          above != park_certain_above_.load(std::memory_order_relaxed)) {
        park_certain_above_.store(above, std::memory_order_release);
      }
      return;
    }
    actual = core_.blocks().live_size(address);
  }
  throw_bad_free(ptr, bytes, actual);
}

void pool_memory_resource::throw_bad_free(void* ptr, std::size_t bytes, std::size_t actual) const {
  if (actual == 0) {
    throw logic_error("pool: deallocate of " + format_hex(ptr) + " (" + std::to_string(bytes) +
                      " B), which this pool did not hand out or has already taken back");
  }
  throw logic_error("pool: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                    " B, but its block is " + std::to_string(actual) + " B; nothing was freed");
}

void* pool_memory_resource::grow_and_allocate(std::size_t bytes, std::size_t size, std::size_t alignment,
                                              detail::stream_ref const& s) {
  // Room to align inside a chunk the upstream only aligns to 256.
  std::size_t const pad = alignment - granularity;
  if (size > std::numeric_limits<std::size_t>::max() - pad) { throw_out_of_memory(bytes, "request too large"); }
  refuse_padding_past_maximum(bytes, size, alignment);
  if (growth_) { return grow_in_place_and_allocate(bytes, size, alignment, s); }
  std::size_t const needed = size + pad;
  auto retry = [&]() { return core_.allocate(size, alignment, s); };
  std::string why;
  if (grow(needed, s, why)) {
    if (std::uintptr_t const a = retry()) { return reinterpret_cast<void*>(a); }
    // Not expected (a chunk of `needed` holds the block wherever it starts); said, not silent.
    why = "a new chunk of at least " + format_bytes(needed) + " was taken, yet no free block served the request";
  }
  // The upstream (or the maximum) refused. Memory other threads' streams still hold
  // becomes usable once the device is idle; then wholly free chunks can make room.
  if (core_.synchronize_everything()) {
    if (std::uintptr_t const a = retry()) { return reinterpret_cast<void*>(a); }
  }
  (void)release_free_chunks();  // may already be empty: growth itself returned what it could
  if (grow(needed, s, why)) {
    if (std::uintptr_t const a = retry()) { return reinterpret_cast<void*>(a); }
  }
  throw_out_of_memory(bytes, why);
}

void* pool_memory_resource::grow_in_place_and_allocate(std::size_t bytes, std::size_t size, std::size_t alignment,
                                                       detail::stream_ref const& s) {
  auto retry = [&]() { return core_.allocate(size, alignment, s); };
  std::string why = "grown in place, yet no free block fits";
  try {
    // Growth releases free granules itself (and plans again) when the device is full.
    growth_->grow(core_, size, alignment, s);
    ++upstream_allocations_;
    peak_pool_size_ = std::max(peak_pool_size_, footprint());
    if (std::uintptr_t const a = retry()) { return reinterpret_cast<void*>(a); }
  } catch (detail::growth_failure const& e) {
    why = e.what();
  }
  // Other streams' free memory becomes usable once the device is idle.
  if (core_.synchronize_everything()) {
    if (std::uintptr_t const a = retry()) { return reinterpret_cast<void*>(a); }
  }
  throw_out_of_memory(bytes, why);
}

bool pool_memory_resource::grow(std::size_t needed, detail::stream_ref const& s, std::string& why) {
  std::size_t const pool_before = core_.blocks().total_bytes();
  // The bytes of wholly free chunks returned now join the new chunk, where the maximum
  // leaves room for them: the request alone is what must fit (with them added first, a
  // pool that had just returned everything refused a request that fitted: out-of-memory
  // at footprint 0, tests/suballocators_threads_misuse.cpp).
  std::size_t const released = options_.consolidate_on_growth ? release_free_chunks(false, s) : 0;
  std::size_t const pool = core_.blocks().total_bytes();
  std::size_t const cap = !maximum_size_ ? std::numeric_limits<std::size_t>::max()
                          : *maximum_size_ > pool ? detail::align_down(*maximum_size_ - pool, granularity)
                                                  : 0;
  if (needed > cap) {
    why = "the pool would exceed its maximum size";
    return false;
  }
  std::size_t want = std::max({std::min(needed + released, cap), pool_before / options_.growth_divisor,
                               options_.minimum_growth});
  // A chunk is at most max_chunk_size: clamping first keeps the rounding from wrapping.
  want = std::min(want, detail::align_down(detail::block_pool::max_chunk_size, options_.growth_granularity));
  // Never below the request (needed <= cap and <= max_chunk_size): the whole growth
  // granule under the largest chunk was, for requests just short of 1 TiB, and the pool
  // took a chunk that could not serve them.
  want = std::max(std::min(detail::align_up(want, options_.growth_granularity), cap), needed);
  for (std::size_t chunk = want;;) {
    try {
      void* base = upstream_->allocate(chunk, to_stream_view(s), granularity);
      if (!detail::is_aligned(base, granularity)) {
        upstream_->deallocate(base, chunk, to_stream_view(s), granularity);
        throw logic_error("pool: upstream " + upstream_->name() + " returned " + format_hex(base) +
                          ", which is not 256-byte aligned");
      }
      std::size_t const held = core_.blocks().total_bytes();
      try {
        // Sharded: a slab may be taken from the chunk, and mapping it must not fail.
        if (shards_) { reserve_slab_pages(*shards_, reinterpret_cast<std::uintptr_t>(base), chunk); }
        core_.add_chunk(reinterpret_cast<std::uintptr_t>(base), chunk, s);
      } catch (...) {
        // Refused by the block metadata (its node limit, host memory) or the page map,
        // which then changed nothing: the chunk goes back rather than leak. (A failure
        // after the chunk was added, recording an event, leaves it with the pool, which
        // returns it later.)
        if (core_.blocks().total_bytes() == held) { upstream_->deallocate(base, chunk, to_stream_view(s), granularity); }
        throw;
      }
      ++upstream_allocations_;
      peak_pool_size_ = std::max(peak_pool_size_, core_.blocks().total_bytes());
      return true;
    } catch (out_of_memory const& e) {
      why = std::string{"upstream refused: "} + e.what();
      if (chunk == needed) { return false; }
      chunk = std::max(needed, detail::align_down(chunk / 2, granularity));
    }
  }
}

std::size_t pool_memory_resource::release_free_chunks(bool may_synchronize, detail::stream_ref const& caller) {
  std::vector<detail::chunk_id> free_chunks;
  core_.blocks().for_each_chunk([&](detail::chunk_id c, detail::block_pool::chunk_info const& info) {
    if (info.live_blocks == 0) { free_chunks.push_back(c); }
  });
  std::size_t released = 0;
  for (detail::chunk_id c : free_chunks) {
    detail::stream_ref s{};
    if (may_synchronize) {
      s = core_.return_stream(c);
    } else if (!core_.return_stream_without_sync(c, s, caller)) {
      continue;
    }
    auto const info = core_.blocks().chunk(c);
    core_.blocks().remove_chunk(c);
    upstream_->deallocate(reinterpret_cast<void*>(info.base), info.size, to_stream_view(s), granularity);
    released += info.size;
  }
  return released;
}

void pool_memory_resource::do_release() {
  if (sharded_.load(std::memory_order_acquire)) { drain_shards({}, true, nullptr); }
  {
    std::lock_guard lock{mutex_};
    if (growth_) {
      growth_->release(core_);
    } else {
      release_free_chunks();
    }
  }
  upstream_->release();
}

std::size_t pool_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  try {
    with_shard_totals([&](shard_totals const& shards) { held = shards.free_bytes + core_.blocks().free_bytes(); });
  } catch (...) {
    return upstream_->free_bytes_held();  // a statistic: no lock could be had (out of memory)
  }
  return held + upstream_->free_bytes_held();
}

void pool_memory_resource::throw_out_of_memory(std::size_t bytes, std::string why) const {
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "pool";
  info.footprint_bytes = footprint();
  info.free_bytes = core_.blocks().free_bytes();
  info.largest_free_block = core_.blocks().largest_free_block();
  info.limit_bytes = maximum_size_;
  info.detail = std::move(why);
  throw out_of_memory(std::move(info));
}

std::size_t pool_memory_resource::footprint() const noexcept {
  return core_.blocks().total_bytes() - core_.blocks().withdrawn_bytes();
}

std::size_t pool_memory_resource::pool_size() const {
  std::lock_guard lock{mutex_};
  return footprint();
}
std::size_t pool_memory_resource::free_bytes() const { return stats().free_bytes; }
std::size_t pool_memory_resource::used_bytes() const { return stats().used_bytes; }
std::size_t pool_memory_resource::largest_free_block() const { return stats().largest_free_block; }
std::size_t pool_memory_resource::chunk_count() const {
  std::lock_guard lock{mutex_};
  return core_.blocks().chunk_count();
}

pool_memory_resource::statistics pool_memory_resource::stats() const {
  // A slab is a live global block, counted as the shard's free and live blocks instead.
  statistics st;
  with_shard_totals([&](shard_totals const& shards) { fill_stats(st, shards); });
  return st;
}

void pool_memory_resource::fill_stats(statistics& st, shard_totals const& shards) const {
  auto const& b = core_.blocks();
  st.pool_size = footprint();
  st.free_bytes = b.free_bytes() + shards.free_bytes;
  st.used_bytes = b.live_bytes() - shards.slab_bytes + shards.live_bytes;
  // A shard's block serves only requests up to the shard block limit (larger ones go to
  // the global blocks): the largest request the pool could serve without growing.
  st.largest_free_block = std::max(b.largest_free_block(), std::min(shards.largest_free_block, shard_request_limit()));
  st.chunks = b.chunk_count();
  st.live_blocks = b.live_blocks() - shards.slabs + shards.live_blocks;
  st.free_blocks = b.free_block_count() + shards.free_blocks;
  st.peak_pool_size = peak_pool_size_;
  st.upstream_allocations = upstream_allocations_;
  st.events_recorded = core_.owners().records() + spare_events_.records() + shards.events_recorded;
  st.stream_waits = core_.owners().waits() + shards.stream_waits;
  st.idle_parks = core_.owners().idle_parks() + shards.idle_parks;
  st.idle_queries = core_.owners().idle_queries() + spare_events_.queries() + shards.idle_queries;
  st.thread_shards = shards.shards;
  st.slab_bytes = shards.slab_bytes;
  st.slab_walks = slab_walks_.load(std::memory_order_relaxed);
}

std::string pool_memory_resource::check_invariants() const {
  {
    std::lock_guard lock{mutex_};
    std::string broken = core_.blocks().check_invariants();
    if (!broken.empty()) { return broken; }
  }
  return check_shards();
}

std::size_t pool_memory_resource::shard_request_limit() const noexcept {
  return detail::align_down(options_.shard_block_limit, granularity);
}

void detail::add_stream_fragmentation(detail::stream_ordered_pool const& core, fragmentation_info& info,
                                      std::size_t largest_request) {
  auto const& b = core.blocks();
  info.free_bytes += b.free_bytes();
  info.largest_free_block = std::max(info.largest_free_block, std::min(b.largest_free_block(), largest_request));
  info.free_blocks += b.free_block_count();
  // Owner 0 is memory every stream may use; the others are one stream each, or a stream's
  // parked memory (counted as that stream's). O(streams).
  auto const owners = std::min(b.owner_limit(), core.owners().limit());
  for (std::size_t o = 1; o < owners; ++o) {
    auto const id = static_cast<detail::owner_id>(o);
    if (b.free_blocks(id) == 0) { continue; }
    detail::stream_ref const& r = core.owners().ref(id);
    std::uintptr_t const stream = r.thread_bound ? r.key : r.handle;
    auto same = std::find_if(info.streams.begin(), info.streams.end(), [&](auto const& x) {
      return x.stream == stream && x.thread_bound == r.thread_bound;
    });
    if (same == info.streams.end()) {
      info.streams.push_back({stream, r.thread_bound, 0, 0, 0});
      same = std::prev(info.streams.end());
    }
    same->free_bytes += b.free_bytes(id);
    same->largest_free_block = std::max(same->largest_free_block, std::min(b.largest_free_block(id), largest_request));
    same->free_blocks += b.free_blocks(id);
  }
}

fragmentation_info pool_memory_resource::do_fragmentation() const {
  fragmentation_info info;
  info.resource = "pool";
  // The shards' free memory is read in the same snapshot as the global blocks: read
  // before it, a slab going back in between was counted free twice, in its shard and in
  // the global blocks (free + live exceeded held, tests/pool_arena_threads_review.cpp).
  with_shard_totals(
      [&](shard_totals const& shards) {
        info.held_bytes = footprint();
        info.live_bytes = core_.blocks().live_bytes() - shards.slab_bytes + shards.live_bytes;
        detail::add_stream_fragmentation(core_, info);
      },
      [&](detail::stream_ordered_pool const& shard) {
        detail::add_stream_fragmentation(shard, info, shard_request_limit());
      });
  return info;
}

}  // namespace mrstack
