#include "cuda_util.hpp"

namespace mrstack::detail {

void throw_allocation_failure(cudaError_t status, std::size_t bytes, std::string const& resource, char const* call,
                              char const* file, int line) {
  (void)cudaGetLastError();  // allocation failures are not sticky; do not let one leak into the next call
  if (status != cudaErrorMemoryAllocation) { throw_cuda_error(status, call, file, line); }
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = resource;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    info.detail = "device has " + format_bytes(free_bytes) + " free of " + format_bytes(total_bytes);
  } else {
    (void)cudaGetLastError();
  }
  throw out_of_memory(std::move(info));
}

void require_upstream_alignment(std::size_t alignment, std::size_t supported, char const* resource) {
  if (alignment > supported) {
    throw logic_error(std::string{resource} + ": alignment " + std::to_string(alignment) +
                      " is larger than the " + std::to_string(supported) +
                      " bytes it guarantees; put aligned(...) above it in the stack");
  }
}

}  // namespace mrstack::detail
