#pragma once
// Internal helpers for the CUDA upstreams (not installed).
#include <mrstack/error.hpp>
#include <mrstack/resource.hpp>

#include <string>
#include <vector>

namespace mrstack::detail {

/// Turns a failed CUDA allocation call into the right exception: `out_of_memory` (with the
/// device's free and total memory) for cudaErrorMemoryAllocation, `cuda_error` otherwise.
/// Clears the error so it does not stick to the next unrelated call.
[[noreturn]] void throw_allocation_failure(cudaError_t status, std::size_t bytes, std::string const& resource,
                                           char const* call, char const* file, int line);

/// Upstreams that take memory straight from the driver guarantee 256 bytes and no more.
void require_upstream_alignment(std::size_t alignment, std::size_t supported, char const* resource);

}  // namespace mrstack::detail

#define MRSTACK_ALLOC_TRY(call, bytes, resource)                                                   \
  do {                                                                                             \
    cudaError_t const mrstack_status_ = (call);                                                    \
    if (mrstack_status_ != cudaSuccess) {                                                          \
      ::mrstack::detail::throw_allocation_failure(mrstack_status_, (bytes), (resource), #call, __FILE__, __LINE__); \
    }                                                                                              \
  } while (0)

namespace mrstack::detail {

/// The devices (other than `device`) that can read and write `device`'s memory through
/// peer mappings (cudaDeviceCanAccessPeer). Empty with one device.
std::vector<int> peers_of(int device);

/// Lets every peer of `device` access memory cudaMalloc returns on `device`
/// (cudaDeviceEnablePeerAccess from each peer; "already enabled" is fine). Peer access is
/// a property of the peer's context, so this creates the peers' primary contexts.
/// Returns the peers it enabled.
std::vector<int> enable_peer_access_to(int device);

}  // namespace mrstack::detail
