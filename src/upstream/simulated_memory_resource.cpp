#include <mrstack/error.hpp>
#include <mrstack/detail/coalescing_insert.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace mrstack {


simulated_memory_resource::simulated_memory_resource(std::size_t capacity, std::uintptr_t base, std::size_t range)
    : capacity_{capacity} {
  if (!detail::is_aligned(reinterpret_cast<void const*>(base), default_alignment) || range < default_alignment ||
      base == 0) {
    throw logic_error("simulated: base " + format_hex(base) + " must be non-zero and 256-byte aligned, range at least 256 B");
  }
  if (range > std::numeric_limits<std::uintptr_t>::max() - base) {
    // Past the top of the address space the range wrapped: it handed out nullptr and 0x100.
    throw logic_error("simulated: base " + format_hex(base) + " + range " + std::to_string(range) +
                      " B passes the top of the address space");
  }
  free_.emplace(base, detail::align_down(range, default_alignment));
}

void* simulated_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  std::size_t const align = std::max(alignment, default_alignment);
  // Rounding a size near SIZE_MAX up to 256 would wrap to a tiny span: refuse first.
  bool const impossible = bytes > std::numeric_limits<std::size_t>::max() - default_alignment;
  std::size_t const span = impossible ? 0 : detail::align_up(bytes, default_alignment);
  std::lock_guard lock{mutex_};
  auto refuse = [&](char const* why) -> void* {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "simulated";
    info.footprint_bytes = footprint_;
    if (capacity_ != std::numeric_limits<std::size_t>::max()) { info.limit_bytes = capacity_; }
    info.detail = why;
    throw out_of_memory(std::move(info));
  };
  if (impossible || span > capacity_ - std::min(capacity_, footprint_)) {
    return refuse("capacity reached");
  }
  // First fit in address order: the simulated upstream is called rarely under a pool, and
  // first fit keeps the fake address space compact.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    std::uintptr_t const start = detail::align_up(it->first, align);
    std::size_t const lead = start - it->first;
    if (lead > it->second || it->second - lead < span) { continue; }
    std::size_t const tail = it->second - lead - span;
    // The nodes that may fail for want of host memory are made first, before the free
    // range they come from changes: a failure then throws bad_alloc with nothing changed.
    // (Erasing the range first lost all of it when a node after failed, and every later
    // request was refused as if the fake address range were used up.)
    auto const live = live_.emplace(start, live_block{bytes, align}).first;
    try {
      if (tail > 0) { free_.emplace_hint(std::next(it), start + span, tail); }
    } catch (...) {
      live_.erase(live);
      throw;
    }
    if (lead > 0) {
      it->second = lead;  // the part below keeps its node
    } else {
      free_.erase(it);
    }
    footprint_ += span;
    peak_footprint_ = std::max(peak_footprint_, footprint_);
    ++total_allocations_;
    return reinterpret_cast<void*>(start);
  }
  return refuse("fake address range exhausted");
}

void simulated_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view) {
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  std::size_t const align = std::max(alignment, default_alignment);
  std::lock_guard lock{mutex_};
  auto it = live_.find(address);
  if (it == live_.end()) {
    throw logic_error("simulated: deallocate of " + format_hex(address) + " (" + std::to_string(bytes) +
                      " B), which it did not hand out or was already freed");
  }
  if (it->second.bytes != bytes || it->second.alignment != align) {
    throw logic_error("simulated: deallocate of " + format_hex(address) + " with size " + std::to_string(bytes) +
                      " B and alignment " + std::to_string(align) + ", but it was allocated with " +
                      std::to_string(it->second.bytes) + " B and alignment " + std::to_string(it->second.alignment) +
                      " (nothing was freed)");
  }
  std::size_t const span = detail::align_up(bytes, default_alignment);
  live_.erase(it);
  footprint_ -= span;
  insert_free(address, span);
}

void simulated_memory_resource::insert_free(std::uintptr_t begin, std::size_t size) {
  detail::insert_coalesced(free_, begin, size);
}

std::size_t simulated_memory_resource::footprint() const {
  std::lock_guard lock{mutex_};
  return footprint_;
}
std::size_t simulated_memory_resource::peak_footprint() const {
  std::lock_guard lock{mutex_};
  return peak_footprint_;
}
std::size_t simulated_memory_resource::allocation_count() const {
  std::lock_guard lock{mutex_};
  return live_.size();
}
std::size_t simulated_memory_resource::total_allocations() const {
  std::lock_guard lock{mutex_};
  return total_allocations_;
}
bool simulated_memory_resource::owns(void const* ptr) const {
  std::lock_guard lock{mutex_};
  return live_.count(reinterpret_cast<std::uintptr_t>(ptr)) != 0;
}

}  // namespace mrstack
