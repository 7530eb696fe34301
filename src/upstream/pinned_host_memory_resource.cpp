#include <mrstack/upstream/pinned_host_memory_resource.hpp>

#include "cuda_util.hpp"
#include "device_scope.hpp"
#include "relaxed_capture_scope.hpp"

namespace mrstack {

pinned_host_memory_resource::pinned_host_memory_resource(int device) : device_{detail::checked_device(device, "pinned_host")} {}

void* pinned_host_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  // cudaHostAlloc returns page-aligned memory.
  detail::require_upstream_alignment(alignment, 4096, "pinned_host");
  detail::device_scope on_device{device_};
  void* ptr = nullptr;
  detail::relaxed_capture_scope const capture_safe;  // growth during a graph capture
  MRSTACK_ALLOC_TRY(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), bytes, "pinned_host");
  return ptr;
}

void pinned_host_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t, stream_view) {
  detail::device_scope on_device{device_};
  detail::relaxed_capture_scope const capture_safe;  // a pool's chunk going back during a capture
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaFreeHost(ptr));
}

}  // namespace mrstack
