#include <mrstack/error.hpp>
#include <mrstack/adaptor/aligned_resource_adaptor.hpp>

#include <cstdio>
#include <limits>

namespace mrstack {


aligned_resource_adaptor::aligned_resource_adaptor(resource_ptr upstream, std::size_t alignment,
                                                   std::size_t threshold)
    : upstream_{std::move(upstream)}, alignment_{alignment}, threshold_{threshold} {
  if (upstream_ == nullptr) { throw logic_error("aligned: upstream resource is null"); }
  if (!detail::is_pow2(alignment_)) {
    throw logic_error("aligned: alignment " + std::to_string(alignment_) + " is not a power of two");
  }
  if (alignment_ < default_alignment) { alignment_ = default_alignment; }
}

std::size_t aligned_resource_adaptor::outstanding_over_aligned() const {
  std::size_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard lock{s.mutex};
    n += s.original.size();
  }
  return n;
}

void* aligned_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  std::size_t const align = effective_alignment(bytes, alignment);
  if (align <= default_alignment) { return upstream_->allocate(bytes, stream, alignment); }
  std::size_t const padding = align - default_alignment;
  if (bytes > std::numeric_limits<std::size_t>::max() - padding) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "aligned";
    info.detail = "the request plus " + std::to_string(padding) + " B of alignment padding overflows";
    throw out_of_memory(std::move(info));
  }
  void* const raw = upstream_->allocate(bytes + padding, stream, default_alignment);
  auto const original = reinterpret_cast<std::uintptr_t>(raw);
  std::uintptr_t const aligned = detail::align_up(original, align);
  bool inserted = false;
  try {
    shard& s = shard_for(aligned);
    std::lock_guard lock{s.mutex};
    inserted = s.original.insert(aligned, original);
  } catch (...) {
    upstream_->deallocate(raw, bytes + padding, stream, default_alignment);  // the table could not grow
    throw;
  }
  if (!inserted) {
    // Only a broken upstream hands out overlapping memory; say so rather than corrupt the table.
    upstream_->deallocate(raw, bytes + padding, stream, default_alignment);
    throw logic_error("aligned: the upstream handed out " + format_hex(original) + ", whose aligned address " +
                      format_hex(aligned) + " is already outstanding");
  }
  return reinterpret_cast<void*>(aligned);
}

void aligned_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment,
                                             stream_view stream) {
  std::size_t const align = effective_alignment(bytes, alignment);
  if (align <= default_alignment) {
    upstream_->deallocate(ptr, bytes, stream, alignment);
    return;
  }
  auto const aligned = reinterpret_cast<std::uintptr_t>(ptr);
  std::uintptr_t original = 0;
  {
    shard& s = shard_for(aligned);
    std::lock_guard lock{s.mutex};
    std::uintptr_t const* found = s.original.find(aligned);
    if (found == nullptr) {
      throw logic_error("aligned: deallocate of " + format_hex(aligned) + " (" + std::to_string(bytes) + " B, alignment " +
                        std::to_string(align) + "), which it did not hand out or was already freed");
    }
    original = *found;
    s.original.erase(aligned);
  }
  upstream_->deallocate(reinterpret_cast<void*>(original), bytes + (align - default_alignment), stream,
                        default_alignment);
}

}  // namespace mrstack
