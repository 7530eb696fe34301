#include <mrstack/upstream/cuda_memory_resource.hpp>

#include "cuda_util.hpp"

namespace mrstack {

void* cuda_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  detail::require_upstream_alignment(alignment, default_alignment, "cuda");
  void* ptr = nullptr;
  MRSTACK_ALLOC_TRY(cudaMalloc(&ptr, bytes), bytes, "cuda");
  return ptr;
}

void cuda_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t, stream_view) {
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
}

}  // namespace mrstack
