#include <mrstack/suballoc/fixed_size_memory_resource.hpp>

#include <cstdio>
#include <limits>

#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack {

namespace {

constexpr std::size_t granularity = 256;

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
      blocks_{block_size_, blocks_per_chunk_, pick_sync(std::move(stream_sync), upstream_)} {
  if (blocks_to_preallocate > 0) {
    std::string why;
    if (!grow(blocks_per_chunk_, detail::stream_ref{}, why, true)) {
      allocation_failure info;
      info.requested_bytes = blocks_per_chunk_ * block_size_;
      info.resource = "fixed_size";
      info.footprint_bytes = 0;
      info.detail = "preallocating " + std::to_string(blocks_per_chunk_) + " blocks: " + why;
      throw out_of_memory(std::move(info));
    }
  }
}

fixed_size_memory_resource::~fixed_size_memory_resource() {
  try {
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

void* fixed_size_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  if (bytes > block_size_ || alignment > block_alignment_) { reject(bytes, alignment); }
  detail::stream_ref const s = to_stream_ref(stream);
  std::lock_guard lock{mutex_};
  if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
  return grow_and_allocate(bytes, s);
}

void fixed_size_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  if (bytes > block_size_ || alignment > block_alignment_) { reject(bytes, alignment); }
  detail::stream_ref const s = to_stream_ref(stream);
  std::lock_guard lock{mutex_};
  auto const result = blocks_.deallocate(reinterpret_cast<std::uintptr_t>(ptr), s);
  if (result != detail::fixed_size_blocks::free_result::freed) { reject_free(ptr, bytes, result); }
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
  std::size_t const free = blocks_.free_blocks();
  info.held_bytes = pool_size_;
  info.live_bytes = (blocks_.total_blocks() - free) * block_size_;
  info.free_bytes = free * block_size_;
  info.largest_free_block = free > 0 ? block_size_ : 0;
  info.free_blocks = free;
  blocks_.for_each_stream_share([&](detail::stream_ref const& r, std::size_t count) {
    info.streams.push_back(fragmentation_info::stream_share{r.thread_bound ? r.key : r.handle, r.thread_bound,
                                                            count * block_size_, block_size_, count});
  });
  return info;
}

void* fixed_size_memory_resource::grow_and_allocate(std::size_t bytes, detail::stream_ref const& s) {
  std::string why;
  if (grow(blocks_per_chunk_, s, why) || blocks_.synchronize_everything()) {
    if (std::uintptr_t const a = blocks_.allocate(s)) { return reinterpret_cast<void*>(a); }
  }
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "fixed_size";
  info.footprint_bytes = pool_size_;
  info.free_bytes = blocks_.free_blocks() * block_size_;
  info.largest_free_block = blocks_.free_blocks() > 0 ? block_size_ : 0;
  info.detail = why;
  throw out_of_memory(std::move(info));
}

bool fixed_size_memory_resource::grow(std::size_t blocks, detail::stream_ref const& s, std::string& why,
                                      bool at_construction) {
  stream_view const stream = to_stream_view(s);
  for (std::size_t n = blocks; n >= 1; n /= 2) {
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
      blocks_.add_blocks(first, n, s, at_construction);
      return true;
    } catch (out_of_memory const& e) {
      why = std::string{"upstream refused: "} + e.what();
    }
  }
  return false;
}

void fixed_size_memory_resource::return_all_chunks() {
  if (chunks_.empty()) { return; }
  detail::stream_ref const s = blocks_.return_stream();
  for (auto const& c : chunks_) { upstream_->deallocate(c.allocation, c.allocation_size, to_stream_view(s), granularity); }
  chunks_.clear();
  blocks_.clear();
  pool_size_ = 0;
}

void fixed_size_memory_resource::do_release() {
  {
    std::lock_guard lock{mutex_};
    if (blocks_.free_blocks() == blocks_.total_blocks()) { return_all_chunks(); }
  }
  upstream_->release();
}

std::size_t fixed_size_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  {
    std::lock_guard lock{mutex_};
    held = blocks_.free_blocks() * block_size_;
  }
  return held + upstream_->free_bytes_held();
}

std::size_t fixed_size_memory_resource::pool_size() const {
  std::lock_guard lock{mutex_};
  return pool_size_;
}
std::size_t fixed_size_memory_resource::free_bytes() const {
  std::lock_guard lock{mutex_};
  return blocks_.free_blocks() * block_size_;
}
std::size_t fixed_size_memory_resource::free_blocks() const {
  std::lock_guard lock{mutex_};
  return blocks_.free_blocks();
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
