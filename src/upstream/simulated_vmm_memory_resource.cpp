#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <iterator>

namespace mrstack {

namespace {
std::size_t checked_granularity(std::size_t granularity) {
  if (!detail::is_pow2(granularity) || granularity < default_alignment) {
    throw logic_error("simulated_vmm: granularity " + std::to_string(granularity) +
                      " B must be a power of two of at least 256 B");
  }
  return granularity;
}
constexpr std::size_t max_granules = simulated_vmm_memory_resource::max_granules;

std::size_t checked_reserve(std::size_t reserve, std::size_t granularity) {
  if (reserve == 0 || reserve > std::numeric_limits<std::size_t>::max() - granularity) {
    throw logic_error("simulated_vmm: reserve of " + std::to_string(reserve) + " B must be non-zero and representable");
  }
  std::size_t const rounded = detail::align_up(reserve, granularity);
  if (rounded / granularity > max_granules) {
    throw logic_error("simulated_vmm: reserve of " + format_bytes(reserve) + " in granules of " + format_bytes(granularity) +
                      " is " + std::to_string(rounded / granularity) + " granules, more than the " +
                      std::to_string(max_granules) + " it keeps books for: reserve less, or use a larger granularity");
  }
  return rounded;
}
std::size_t checked_map_granules(std::size_t map_granules) {
  if (map_granules == 0) { throw logic_error("simulated_vmm: map_granules must be at least 1"); }
  return map_granules;
}
}  // namespace

simulated_vmm_memory_resource::simulated_vmm_memory_resource(std::size_t reserve_bytes, std::size_t granularity,
                                                             std::size_t capacity, std::size_t map_granules)
    : virtual_range_resource("simulated_vmm", 0, checked_reserve(reserve_bytes, checked_granularity(granularity)),
                             granularity, checked_map_granules(map_granules), *this),
      capacity_{capacity} {}

simulated_vmm_memory_resource::~simulated_vmm_memory_resource() { release_everything(); }

std::uint64_t simulated_vmm_memory_resource::map(std::size_t offset, std::size_t bytes) {
  std::lock_guard lock{physical_mutex_};
  if (bytes > capacity_ - std::min(capacity_, held_)) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "simulated_vmm";
    info.footprint_bytes = held_;
    info.limit_bytes = capacity_;
    info.detail = bytes > capacity_
                      ? "a physical allocation of " + format_bytes(bytes) + " is larger than the whole capacity, " +
                            format_bytes(capacity_)
                      : "no simulated physical memory left for a physical allocation of " + format_bytes(bytes) +
                            " (capacity reached: " + format_bytes(held_) + " of " + format_bytes(capacity_) + " held)";
    throw out_of_memory(std::move(info));
  }
  auto const next = physical_.lower_bound(offset);
  bool const overlaps_next = next != physical_.end() && next->first < offset + bytes;
  bool const overlaps_prev = next != physical_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > offset;
  if (overlaps_next || overlaps_prev) {
    throw logic_error("simulated_vmm: map of offset " + std::to_string(offset) + " (+" + std::to_string(bytes) +
                      " B) over memory already mapped (the driver would refuse)");
  }
  std::uint64_t const handle = next_handle_++;
  physical_.emplace(offset, physical{bytes, handle, false});
  held_ += bytes;
  return handle;
}

void simulated_vmm_memory_resource::enable_access(std::size_t offset, std::size_t bytes) {
  std::lock_guard lock{physical_mutex_};
  // Like cuMemSetAccess: the whole stretch must be mapped, possibly by several allocations.
  std::size_t at = offset;
  auto it = physical_.find(offset);
  while (at < offset + bytes) {
    if (it == physical_.end() || it->first != at) {
      throw logic_error("simulated_vmm: access enabled on offset " + std::to_string(at) + ", which is not mapped");
    }
    it->second.accessible = true;
    at += it->second.bytes;
    ++it;
  }
  if (at != offset + bytes) { throw logic_error("simulated_vmm: access enabled on part of a physical allocation"); }
}

void simulated_vmm_memory_resource::unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) {
  std::lock_guard lock{physical_mutex_};
  auto const it = physical_.find(offset);
  if (it == physical_.end() || it->second.bytes != bytes || it->second.handle != handle) {
    throw logic_error("simulated_vmm: unmap of offset " + std::to_string(offset) + " (+" + std::to_string(bytes) +
                      " B, handle " + std::to_string(handle) + ") does not match one mapping (the driver would refuse)");
  }
  held_ -= bytes;
  physical_.erase(it);
}

void simulated_vmm_memory_resource::save_contents(stretches const& saved) {
  std::lock_guard lock{physical_mutex_};
  std::size_t total = 0;
  for (auto const& [offset, bytes] : saved) {
    if (!accessible_at(offset, bytes)) {
      throw logic_error("simulated_vmm: contents saved from offset " + std::to_string(offset) + " (+" +
                        std::to_string(bytes) + " B), which is not mapped and accessible (the copy would fault)");
    }
    total += bytes;
  }
  saved_.clear();
  for (auto const& [offset, bytes] : saved) { saved_.emplace(offset, bytes); }
  saved_bytes_ = total;
}

void simulated_vmm_memory_resource::restore_contents(stretches const& restored) {
  std::lock_guard lock{physical_mutex_};
  std::size_t total = 0;
  for (auto const& [offset, bytes] : restored) {
    auto it = saved_.upper_bound(offset);
    bool const inside = it != saved_.begin() && offset + bytes <= std::prev(it)->first + std::prev(it)->second;
    if (!inside) {
      throw logic_error("simulated_vmm: contents restored to offset " + std::to_string(offset) + " (+" +
                        std::to_string(bytes) + " B), which the sleep did not save");
    }
    if (!accessible_at(offset, bytes)) {
      throw logic_error("simulated_vmm: contents restored to offset " + std::to_string(offset) +
                        ", which is not mapped and accessible again");
    }
    total += bytes;
  }
  restored_bytes_ = total;
}

bool simulated_vmm_memory_resource::is_accessible(void const* ptr, std::size_t bytes) const {
  if (!owns(ptr)) { return false; }
  std::size_t const offset = reinterpret_cast<std::uintptr_t>(ptr) - reinterpret_cast<std::uintptr_t>(range_base());
  std::lock_guard lock{physical_mutex_};
  return accessible_at(offset, bytes);
}

bool simulated_vmm_memory_resource::accessible_at(std::size_t offset, std::size_t bytes) const {
  // Past the range nothing is mapped; checked first, as offset + bytes could wrap around.
  if (offset > range_bytes() || bytes > range_bytes() - offset) { return false; }
  std::size_t const end = offset + bytes;
  auto it = physical_.upper_bound(offset);
  if (it == physical_.begin()) { return false; }
  --it;
  std::size_t at = it->first;
  while (at < end) {
    if (it == physical_.end() || it->first != at || !it->second.accessible) { return false; }
    at += it->second.bytes;
    ++it;
  }
  return true;
}

}  // namespace mrstack
