#include <mrstack/suballoc/fixed_size_memory_resource.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <limits>

#include <mrstack/detail/shard_spin_lock.hpp>
#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack {

namespace {

constexpr std::size_t granularity = 256;
// A thread's cache: at most 64 blocks or 64 MiB, but at least 4 blocks (fewer would
// spill or refill on nearly every call). Caches never make the resource hold more: they
// are emptied before it grows.
constexpr std::size_t max_cache_blocks = 64;
constexpr std::size_t min_cache_blocks = 4;
constexpr std::size_t max_cache_bytes = std::size_t{64} << 20;

std::size_t checked_block_size(resource_ptr const& upstream, std::size_t block_size) {
  if (!upstream) { throw logic_error("fixed_size: the upstream resource is null"); }
  if (block_size == 0 || block_size > fixed_size_memory_resource::max_block_size) {
    throw logic_error("fixed_size: block size " + std::to_string(block_size) + " B must be between 1 B and " +
                      format_bytes(fixed_size_memory_resource::max_block_size));
  }
  return detail::align_up(block_size, granularity);
}

std::size_t checked_blocks_per_chunk(std::size_t block_size, std::size_t blocks) {
  if (blocks == 0) { return 1; }
  if (blocks > fixed_size_memory_resource::max_chunk_bytes / block_size) {
    throw logic_error("fixed_size: a chunk of " + std::to_string(blocks) + " blocks of " + format_bytes(block_size) +
                      " exceeds " + format_bytes(fixed_size_memory_resource::max_chunk_bytes));
  }
  return blocks;
}

std::shared_ptr<detail::stream_sync> pick_sync(std::shared_ptr<detail::stream_sync> given, resource_ptr const& upstream) {
  return given ? std::move(given) : default_stream_sync(upstream->kind());
}

}  // namespace

fixed_size_memory_resource::fixed_size_memory_resource(resource_ptr upstream, std::size_t block_size,
                                                       std::size_t blocks_to_preallocate,
                                                       std::shared_ptr<detail::stream_sync> stream_sync)
    : upstream_{std::move(upstream)},
      block_size_{checked_block_size(upstream_, block_size)},
      block_alignment_{block_size_ & (~block_size_ + 1)},  // lowest set bit: the largest power of two dividing it
      blocks_per_chunk_{checked_blocks_per_chunk(block_size_, blocks_to_preallocate)},
      blocks_{block_size_, blocks_per_chunk_, pick_sync(std::move(stream_sync), upstream_)},
      cache_capacity_{std::clamp<std::size_t>(max_cache_bytes / block_size_, min_cache_blocks, max_cache_blocks)} {
  if (blocks_to_preallocate > 0) {
    std::string why;
    bool grown = false;
    try {
      grown = grow(blocks_per_chunk_, detail::stream_ref{}, why, true);
    } catch (...) {
      // No destructor runs for a constructor that throws: the chunk taken before the
      // failure (the synchronization of the first chunk, out of host memory) went nowhere.
      give_back_chunks_quietly();
      throw;
    }
    if (!grown) {
      allocation_failure info;
      info.requested_bytes = blocks_per_chunk_ * block_size_;
      info.resource = "fixed_size";
      info.footprint_bytes = 0;
      info.detail = "preallocating " + std::to_string(blocks_per_chunk_) + " blocks of " + format_bytes(block_size_) +
                    ": " + why;
      throw out_of_memory(std::move(info));
    }
  }
  try {
    ticket_ = detail::register_cache_owner(this);  // last: a thread may call back from now on
  } catch (...) {
    give_back_chunks_quietly();
    throw;
  }
}

void fixed_size_memory_resource::give_back_chunks_quietly() noexcept {
  try {
    return_all_chunks();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: fixed_size could not return its chunks: %s\n", e.what());
  }
}

fixed_size_memory_resource::~fixed_size_memory_resource() {
  detail::unregister_cache_owner(ticket_);  // no thread hands a cache back after this
  try {
    std::lock_guard lock{mutex_};
    take_back_caches();
    return_all_chunks();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: fixed_size destructor could not return its chunks: %s\n", e.what());
  }
}

void fixed_size_memory_resource::reject(std::size_t bytes, std::size_t alignment) const {
  if (bytes > block_size_) {
    throw logic_error("fixed_size: request of " + format_bytes(bytes) + " exceeds its block size of " +
                      format_bytes(block_size_) + " (it serves one size only; use a pool or binning)");
  }
  throw logic_error("fixed_size: alignment " + std::to_string(alignment) + " exceeds the " +
                    std::to_string(block_alignment_) + " bytes its " + format_bytes(block_size_) +
                    " blocks are aligned to");
}

void fixed_size_memory_resource::reject_free_shape(void const* ptr, std::size_t bytes, std::size_t alignment) const {
  std::string const what = "fixed_size: deallocate of " + format_hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                           " with size " + std::to_string(bytes) + " B";
  if (bytes > block_size_) {
    throw logic_error(what + ": larger than its " + std::to_string(block_size_) +
                      " B blocks, so not one of them (nothing was changed)");
  }
  throw logic_error(what + " and alignment " + std::to_string(alignment) + ": its blocks are aligned to " +
                    std::to_string(block_alignment_) + " B, so not one of them (nothing was changed)");
}

// The hot path: a thread on the legacy or its own per-thread default stream pops from or
// pushes onto its own cache under its own lock. The shared lock (mutex_) is taken only to
// refill or spill a batch, for other streams, and to grow. Lock order: mutex_, then a
// cache's lock. A cache's lock also marks its owner as a reader of the chunk snapshot
// (the free check); `take_back_caches` takes every cache's lock, which is what lets
// replaced snapshots be freed afterwards.

struct fixed_size_memory_resource::thread_cache {
  explicit thread_cache(std::size_t capacity) : blocks{std::make_unique<detail::free_block[]>(capacity)} {}
  // Taken by its own thread on every cached call, by others only to take the cache back
  // (rare): a CAS to lock, a plain store to unlock.
  alignas(64) detail::shard_spin_lock lock;
  detail::stream_ref stream{};  // the stream every cached block was freed on (or taken for)
  std::size_t count = 0;
  std::uint32_t bypasses = 0;  // calls on other streams in a row while it kept a created stream's blocks
  std::unique_ptr<detail::free_block[]> blocks;  // a LIFO stack of `count` free blocks
};

void* fixed_size_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  if (bytes > block_size_ || alignment > block_alignment_) { reject(bytes, alignment); }
  detail::stream_ref const s = to_stream_ref(stream);
  if (caching_.load(std::memory_order_relaxed)) {
    if (thread_cache* c = my_cache()) {
      std::lock_guard lock{c->lock};
      if (c->count != 0 && c->stream.key == s.key) {
        c->bypasses = 0;
        detail::free_block const b = c->blocks[--c->count];
        b.state->store(detail::used_state, std::memory_order_relaxed);
        return reinterpret_cast<void*>(b.address);
      }
    }
    return refill_and_allocate(bytes, s);
  }
  std::lock_guard lock{mutex_};
  note_thread();
  if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
  return grow_and_allocate(bytes, s);
}

void fixed_size_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  if (bytes > block_size_ || alignment > block_alignment_) { reject_free_shape(ptr, bytes, alignment); }
  detail::stream_ref const s = to_stream_ref(stream);
  auto const a = reinterpret_cast<std::uintptr_t>(ptr);
  if (caching_.load(std::memory_order_relaxed)) {
    if (thread_cache* c = my_cache()) {
      std::unique_lock lock{c->lock};
      if (c->count < cache_capacity_ && (c->count == 0 || c->stream.key == s.key)) {
        detail::block_state* state = nullptr;
        auto const result = blocks_.check_free(a, state);
        if (result != detail::fixed_size_blocks::free_result::freed) {
          lock.unlock();
          reject_free(ptr, bytes, result);
        }
        c->stream = s;
        c->bypasses = 0;
        c->blocks[c->count++] = detail::free_block{a, state};
        return;
      }
    }
    spill_and_free(ptr, bytes, s);
    return;
  }
  std::lock_guard lock{mutex_};
  note_thread();
  auto const result = blocks_.deallocate(a, s);
  if (result != detail::fixed_size_blocks::free_result::freed) { reject_free(ptr, bytes, result); }
}

fixed_size_memory_resource::thread_cache* fixed_size_memory_resource::cache_for_this_thread() {
  if (thread_cache* c = my_cache()) { return c; }
  // A cache is an optimization: with no host memory for one (or for the thread's table
  // of caches) the call uses the shared stacks. Thrown, it had failed an allocation with
  // free blocks in the stacks, and a free with the block left live, as std::bad_alloc.
  try {
    caches_.push_back(std::make_unique<thread_cache>(cache_capacity_));
  } catch (std::bad_alloc const&) {
    return nullptr;
  }
  bool recorded = false;
  try {
    recorded = detail::set_this_thread_cache(ticket_, caches_.back().get());
  } catch (std::bad_alloc const&) {
    recorded = false;
  }
  if (!recorded) {
    caches_.pop_back();
    return nullptr;
  }
  return caches_.back().get();
}

bool fixed_size_memory_resource::keeps_other_stream(thread_cache& c, detail::stream_ref const& s) const {
  std::lock_guard cache_lock{c.lock};
  if (c.count == 0 || c.stream.key == s.key || !detail::stream_owners::is_created(c.stream)) { return false; }
  // Spilled now, the blocks could not be recorded on their stream (this call does not
  // name it), and another stream could take them only once that stream records again.
  // A thread that alternates between streams keeps them for the stream it comes back to;
  // one that has moved on for good gives them back after `max_cache_bypasses` calls.
  return ++c.bypasses <= max_cache_bypasses;
}

void* fixed_size_memory_resource::refill_and_allocate(std::size_t bytes, detail::stream_ref const& s) {
  std::lock_guard lock{mutex_};
  blocks_.note_stream(s);
  thread_cache* const cache = cache_for_this_thread();
  if (cache == nullptr || keeps_other_stream(*cache, s)) {
    if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
    return grow_and_allocate(bytes, s);
  }
  thread_cache& c = *cache;
  {
    std::lock_guard cache_lock{c.lock};
    if (c.count != 0 && c.stream.key != s.key) { spill(c, 0, &s); }
    c.stream = s;
    // Half a cache at once: the shared lock is taken once per that many allocations.
    while (c.count < cache_capacity_ / 2) {
      detail::free_block const b = blocks_.take(s, cache_capacity_ / 2 - c.count);
      if (b.address == 0) { break; }
      c.blocks[c.count++] = b;
    }
    if (c.count != 0) {
      detail::free_block const b = c.blocks[--c.count];
      b.state->store(detail::used_state, std::memory_order_relaxed);
      return reinterpret_cast<void*>(b.address);
    }
  }
  return grow_and_allocate(bytes, s);
}

void fixed_size_memory_resource::spill_and_free(void* ptr, std::size_t bytes, detail::stream_ref const& s) {
  std::lock_guard lock{mutex_};
  // Refused before `s` becomes a stream in use (a slot would turn on the eager rule).
  if (auto const early = blocks_.state_of(reinterpret_cast<std::uintptr_t>(ptr));
      early != detail::fixed_size_blocks::free_result::freed) {
    reject_free(ptr, bytes, early);
  }
  blocks_.note_stream(s);
  thread_cache* const cache = cache_for_this_thread();
  if (cache == nullptr || keeps_other_stream(*cache, s)) {
    auto const result = blocks_.deallocate(reinterpret_cast<std::uintptr_t>(ptr), s);
    if (result != detail::fixed_size_blocks::free_result::freed) { reject_free(ptr, bytes, result); }
    return;
  }
  thread_cache& c = *cache;
  std::lock_guard cache_lock{c.lock};
  // The look above refused a bad free before anything moved (a spill would first have
  // emptied this thread's cache into the shared stacks); the check below, after the
  // spill, still decides for a block two threads free at once.
  // The spill first: it can still fail (no host memory for the stacks, or a record its
  // stream's thread was asked for, which may create an event), and it leaves the cache
  // and the stacks consistent when it does. Once the block is checked and marked free,
  // nothing may fail before it is stored (a failure after it lost the block for good,
  // and its second free was refused as a double free).
  if (c.count != 0 && c.stream.key != s.key) {
    spill(c, 0, &s);
  } else if (c.count >= cache_capacity_) {
    spill(c, cache_capacity_ / 2, &s);
  }
  detail::block_state* state = nullptr;
  auto const result = blocks_.check_free(reinterpret_cast<std::uintptr_t>(ptr), state);
  if (result != detail::fixed_size_blocks::free_result::freed) { reject_free(ptr, bytes, result); }
  c.stream = s;
  c.blocks[c.count++] = detail::free_block{reinterpret_cast<std::uintptr_t>(ptr), state};
}

void fixed_size_memory_resource::spill(thread_cache& c, std::size_t keep, detail::stream_ref const* named) {
  // The oldest blocks go to the shared stacks as freed on the cache's stream (the most
  // recent stay: they are the likeliest to be warm). Draining another thread's cache
  // records nothing on its stream: see note_free in detail/stream_ordering.hpp. A stream
  // the user created records once for the whole batch (the eager rule: from the second
  // stream on), and only while the current call names it; otherwise its blocks go back
  // unrecorded, and another stream takes them only once that stream records again
  // (stream_owners::mark_spilled_unnamed; `keeps_other_stream` makes that rare).
  bool const is_named = named != nullptr && named->key == c.stream.key;
  std::size_t const move = c.count - std::min(keep, c.count);
  // A block must never be in both the cache and the shared stacks (it would be handed out
  // twice): room first, so no push fails half way for want of host memory; a push that
  // still throws (a failed record) has put its block in the stacks already.
  blocks_.reserve_free(c.stream, move);
  try {
    blocks_.push_free_batch(c.blocks.get(), move, c.stream, is_named);
  } catch (...) {
    drop_oldest(c, move);
    throw;
  }
  drop_oldest(c, move);
  c.bypasses = 0;
}

void fixed_size_memory_resource::drop_oldest(thread_cache& c, std::size_t n) noexcept {
  std::copy(c.blocks.get() + n, c.blocks.get() + c.count, c.blocks.get());
  c.count -= n;
}

bool fixed_size_memory_resource::take_back_caches(detail::stream_ref const* named) {
  bool moved = false;
  for (auto const& c : caches_) {
    std::lock_guard cache_lock{c->lock};
    moved = moved || c->count != 0;
    spill(*c, 0, named);
  }
  // Every cache's lock was taken once: no thread still reads a snapshot replaced before.
  blocks_.chunks().collect();
  return moved;
}

std::size_t fixed_size_memory_resource::cached_blocks() const {
  // The list of caches changes under mutex_ (a thread's first cached call adds its cache,
  // its exit erases it): walking it without mutex_ read caches being freed.
  std::lock_guard lock{mutex_};
  return cached_blocks_locked();
}

std::size_t fixed_size_memory_resource::cached_blocks_locked() const {
  std::size_t n = 0;
  for (auto const& c : caches_) {
    std::lock_guard cache_lock{c->lock};
    n += c->count;
  }
  return n;
}

void fixed_size_memory_resource::thread_exiting(void* cache) noexcept {
  auto* const c = static_cast<thread_cache*>(cache);
  std::lock_guard lock{mutex_};
  try {
    {
      std::lock_guard cache_lock{c->lock};
      spill(*c, 0, nullptr);
    }
    auto it = std::find_if(caches_.begin(), caches_.end(), [c](auto const& x) { return x.get() == c; });
    if (it != caches_.end()) { caches_.erase(it); }
  } catch (std::exception const& e) {
    // Out of host memory: the cache stays registered and is taken back before growth.
    std::fprintf(stderr, "mrstack: fixed_size could not take back an exiting thread's cache: %s\n", e.what());
  }
}

void fixed_size_memory_resource::reject_free(void const* ptr, std::size_t bytes,
                                             detail::fixed_size_blocks::free_result why) const {
  std::string const what = "fixed_size: deallocate of " + format_hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                           " with size " + std::to_string(bytes) + " B: ";
  std::string const blocks = " (its blocks are " + std::to_string(block_size_) + " B; nothing was changed)";
  if (why == detail::fixed_size_blocks::free_result::already_free) {
    throw logic_error(what + "that " + std::to_string(block_size_) + " B block is already free (a double free)" + blocks);
  }
  throw logic_error(what + "not a block it handed out" + blocks);
}

bool fixed_size_memory_resource::holds_live_block(void const* ptr) const {
  std::lock_guard lock{mutex_};
  return blocks_.state_of(reinterpret_cast<std::uintptr_t>(ptr)) == detail::fixed_size_blocks::free_result::freed;
}

fragmentation_info fixed_size_memory_resource::do_fragmentation() const {
  fragmentation_info info;
  info.resource = "fixed_size";
  std::lock_guard lock{mutex_};
  std::size_t const free = blocks_.free_blocks() + cached_blocks_locked();
  info.held_bytes = pool_size_;
  info.live_bytes = (blocks_.total_blocks() - free) * block_size_;
  info.free_bytes = free * block_size_;
  info.largest_free_block = free > 0 ? block_size_ : 0;
  info.free_blocks = free;
  blocks_.for_each_stream_share([&](detail::stream_ref const& r, std::size_t count) {
    info.streams.push_back(fragmentation_info::stream_share{r.thread_bound ? r.key : r.handle, r.thread_bound,
                                                            count * block_size_, block_size_, count});
  });
  for (auto const& c : caches_) {
    std::lock_guard cache_lock{c->lock};
    if (c->count == 0) { continue; }
    auto const key = c->stream.thread_bound ? c->stream.key : c->stream.handle;
    auto it = std::find_if(info.streams.begin(), info.streams.end(), [&](auto const& x) {
      return x.stream == key && x.thread_bound == c->stream.thread_bound;
    });
    if (it == info.streams.end()) {
      info.streams.push_back(fragmentation_info::stream_share{key, c->stream.thread_bound, 0, block_size_, 0});
      it = std::prev(info.streams.end());
    }
    it->free_bytes += c->count * block_size_;
    it->free_blocks += c->count;
  }
  return info;
}

void* fixed_size_memory_resource::grow_and_allocate(std::size_t bytes, detail::stream_ref const& s) {
  // Free blocks sitting in threads' caches come back before the resource grows.
  if (take_back_caches(&s)) {
    if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
  }
  std::string why;
  if (grow(next_chunk_blocks(), s, why) || blocks_.synchronize_everything()) {
    if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
  }
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "fixed_size";
  info.footprint_bytes = pool_size_;
  info.free_bytes = blocks_.free_blocks() * block_size_;
  info.largest_free_block = blocks_.free_blocks() > 0 ? block_size_ : 0;
  // Under binning several fixed_size layers refuse alike: the block size says which bin.
  info.detail = "blocks of " + format_bytes(block_size_) + (why.empty() ? "" : "; " + why);
  throw out_of_memory(std::move(info));
}

std::size_t fixed_size_memory_resource::next_chunk_blocks() const noexcept {
  // Every growth rebuilds the chunk lookup (a snapshot of all chunks, for the lock-free
  // free checks): with chunks of a block or a few, n allocations cost O(n^2) (6,000 took
  // 1.4 s and 3 GB of heap churn). Past 64 chunks a chunk is at least 1/8 of what the
  // resource holds, so there are O(log n) of them; what it may hold unused stays under 1/8.
  if (chunks_.size() < 64) { return blocks_per_chunk_; }
  return std::min(std::max(blocks_per_chunk_, blocks_.total_blocks() / 8), largest_chunk_blocks_);
}

bool fixed_size_memory_resource::grow(std::size_t blocks, detail::stream_ref const& s, std::string& why,
                                      bool at_construction) {
  stream_view const stream = to_stream_view(s);
  // Room first, so recording a chunk the upstream gave cannot fail (doubling: no copy per growth).
  if (chunks_.size() == chunks_.capacity()) { chunks_.reserve(std::max<std::size_t>(8, 2 * chunks_.size())); }
  for (std::size_t n = blocks; n >= 1;) {
    std::size_t const bytes = n * block_size_;
    try {
      void* allocation = upstream_->allocate(bytes, stream, granularity);
      std::size_t allocation_size = bytes;
      if (!detail::is_aligned(allocation, block_alignment_)) {
        // Ask again with room to align the first block; the slack is at most one alignment unit.
        upstream_->deallocate(allocation, bytes, stream, granularity);
        allocation_size = bytes + block_alignment_ - granularity;
        allocation = upstream_->allocate(allocation_size, stream, granularity);
      }
      auto const first = detail::align_up(reinterpret_cast<std::uintptr_t>(allocation), block_alignment_);
      chunks_.push_back(chunk{allocation, allocation_size, first, n});
      pool_size_ += allocation_size;
      if (at_construction) { blocks_.sync().synchronize(s.handle); }
      add_chunk_blocks(first, n, s, at_construction);
      return true;
    } catch (out_of_memory const& e) {
      why = std::string{"upstream refused: "} + e.what();
      n /= 2;
    } catch (logic_error const&) {
      // Past 64 chunks a chunk grows beyond the one asked for at construction, and an
      // upstream that serves sizes only up to a bound (a fixed_size under this one) refuses
      // that as a logic_error: the request is no misuse of ours, so ask less, down to the
      // chunk of construction (refused too, the error is the caller's), and keep under it.
      if (n <= blocks_per_chunk_) { throw; }
      n = std::max(blocks_per_chunk_, n / 2);
      largest_chunk_blocks_ = n;
    }
  }
  return false;
}

void fixed_size_memory_resource::add_chunk_blocks(std::uintptr_t first, std::size_t blocks,
                                                  detail::stream_ref const& s, bool synchronized) {
  std::size_t const before = blocks_.total_blocks();
  try {
    blocks_.add_blocks(first, blocks, s, synchronized);
  } catch (...) {
    // No host memory to record its blocks: the chunk went back. Kept, it was held and
    // counted in pool_size() with not one block that could be handed out, and every
    // such failure took another. (Once its blocks are in, a failed record after them
    // leaves a chunk that is usable: it stays.)
    if (blocks_.total_blocks() == before) {
      chunk const c = chunks_.back();
      try {
        upstream_->deallocate(c.allocation, c.allocation_size, to_stream_view(s), granularity);
        chunks_.pop_back();
        pool_size_ -= c.allocation_size;
      } catch (...) {
        // Refused too: it stays in the list and goes back at release or destruction (which
        // return every chunk, recorded blocks or not); the first error is the one to report.
      }
    }
    throw;
  }
}

void fixed_size_memory_resource::return_all_chunks() {
  if (chunks_.empty()) { return; }
  detail::stream_ref const s = blocks_.return_stream();
  // The blocks go first and each chunk leaves the list as it goes back: when the upstream
  // refuses one half way, no block of a returned chunk is handed out again and no chunk
  // is returned twice (at the next release or destruction); those left are retried then.
  blocks_.clear();
  while (!chunks_.empty()) {
    chunk const& c = chunks_.back();
    upstream_->deallocate(c.allocation, c.allocation_size, to_stream_view(s), granularity);
    pool_size_ -= c.allocation_size;
    chunks_.pop_back();
  }
}

void fixed_size_memory_resource::do_release() {
  {
    std::lock_guard lock{mutex_};
    take_back_caches();
    if (blocks_.free_blocks() == blocks_.total_blocks()) { return_all_chunks(); }
  }
  upstream_->release();
}

std::size_t fixed_size_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  try {
    std::lock_guard lock{mutex_};
    held = (blocks_.free_blocks() + cached_blocks_locked()) * block_size_;
  } catch (...) {
  }
  return held + upstream_->free_bytes_held();
}

std::size_t fixed_size_memory_resource::pool_size() const {
  std::lock_guard lock{mutex_};
  return pool_size_;
}
std::size_t fixed_size_memory_resource::free_bytes() const { return free_blocks() * block_size_; }
std::size_t fixed_size_memory_resource::free_blocks() const {
  std::lock_guard lock{mutex_};
  return blocks_.free_blocks() + cached_blocks_locked();
}
std::size_t fixed_size_memory_resource::total_blocks() const {
  std::lock_guard lock{mutex_};
  return blocks_.total_blocks();
}
std::size_t fixed_size_memory_resource::chunk_count() const {
  std::lock_guard lock{mutex_};
  return chunks_.size();
}

}  // namespace mrstack
