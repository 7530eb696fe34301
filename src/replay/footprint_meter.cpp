#include <mrstack/replay/footprint_meter.hpp>

namespace mrstack {

footprint_meter::footprint_meter(resource_ptr upstream) : upstream_{std::move(upstream)} {
  if (!upstream_) { throw logic_error("footprint_meter: the upstream is null"); }
}

void* footprint_meter::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  void* const ptr = upstream_->allocate(bytes, stream, alignment);
  std::size_t const now = held_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
  calls_.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

void footprint_meter::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  upstream_->deallocate(ptr, bytes, stream, alignment);
  held_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace mrstack
