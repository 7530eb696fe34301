#include <mrstack/upstream/managed_memory_resource.hpp>

#include "cuda_util.hpp"
#include "device_scope.hpp"
#include "relaxed_capture_scope.hpp"

namespace mrstack {

managed_memory_resource::managed_memory_resource(int device) : device_{detail::checked_device(device, "managed")} {}

void* managed_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  detail::require_upstream_alignment(alignment, default_alignment, "managed");
  detail::device_scope on_device{device_};
  void* ptr = nullptr;
  detail::relaxed_capture_scope const capture_safe;  // growth during a graph capture
  MRSTACK_ALLOC_TRY(cudaMallocManaged(&ptr, bytes, cudaMemAttachGlobal), bytes, "managed");
  return ptr;
}

void managed_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t, stream_view) {
  detail::device_scope on_device{device_};
  detail::relaxed_capture_scope const capture_safe;  // a pool's chunk going back during a capture
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
}

}  // namespace mrstack
