#pragma once
// Internal (not installed): makes a device current for a scope when it is not already.
#include <mrstack/error.hpp>

#include <cuda_runtime_api.h>

namespace mrstack::detail {

/// Switches to `device` for the scope and back at its end. Without a usable CUDA runtime
/// (no driver, no device) it does nothing, so host-only stacks still work on a CPU.
class device_scope {
 public:
  explicit device_scope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (current != device) {
      MRSTACK_CUDA_TRY(cudaSetDevice(device));
      previous_ = current;
    }
  }
  ~device_scope() {
    if (previous_ >= 0) { MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaSetDevice(previous_)); }
  }
  device_scope(device_scope const&) = delete;
  device_scope& operator=(device_scope const&) = delete;
  device_scope(device_scope&&) = delete;
  device_scope& operator=(device_scope&&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace mrstack::detail
