#include <mrstack/upstream/cuda_memory_resource.hpp>

#include "cuda_util.hpp"
#include "device_scope.hpp"
#include "relaxed_capture_scope.hpp"

namespace mrstack {

cuda_memory_resource::cuda_memory_resource(int device, bool peer_access) : device_{detail::checked_device(device, "cuda")} {
  if (peer_access) {
    if (device_ < 0) { throw logic_error("cuda(peer_access=true): no CUDA device to give peers access to"); }
    peers_ = detail::enable_peer_access_to(device_);
  }
}

void* cuda_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  detail::require_upstream_alignment(alignment, default_alignment, "cuda");
  detail::device_scope on_device{device_};
  void* ptr = nullptr;
  detail::relaxed_capture_scope const capture_safe;  // growth during a graph capture
  MRSTACK_ALLOC_TRY(cudaMalloc(&ptr, bytes), bytes, "cuda");
  return ptr;
}

void cuda_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t, stream_view) {
  // cudaFree finds the pointer's device itself; the scope keeps it from creating a
  // context on the caller's device when that one has none yet.
  detail::device_scope on_device{device_};
  detail::relaxed_capture_scope const capture_safe;  // a pool's chunk going back during a capture
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
}

}  // namespace mrstack
