#include <mrstack/upstream/system_memory_resource.hpp>

#include <algorithm>
#include <new>

namespace mrstack {

void* system_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  std::size_t const align = std::max(alignment, default_alignment);
  // The nothrow form: AddressSanitizer aborts on a failing throwing new even with
  // allocator_may_return_null=1, but lets the nothrow form return null.
  if (void* p = ::operator new(bytes, std::align_val_t{align}, std::nothrow)) { return p; }
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "system";
  info.detail = "the host's operator new refused";
  throw out_of_memory(std::move(info));
}

void system_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t alignment, stream_view) {
  ::operator delete(ptr, std::align_val_t{std::max(alignment, default_alignment)});
}

}  // namespace mrstack
