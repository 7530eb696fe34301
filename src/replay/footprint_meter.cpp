#include <mrstack/replay/footprint_meter.hpp>

namespace mrstack {

footprint_meter::footprint_meter(resource_ptr upstream) : upstream_{std::move(upstream)} {
  if (!upstream_) { throw logic_error("footprint_meter: the upstream is null"); }
}

void* footprint_meter::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  void* const ptr = upstream_->allocate(bytes, stream, alignment);
  raise_peak(held_.fetch_add(bytes) + bytes);
  calls_.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

void footprint_meter::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  upstream_->deallocate(ptr, bytes, stream, alignment);
  held_.fetch_sub(bytes);
}

}  // namespace mrstack
