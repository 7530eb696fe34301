#pragma once
// Internal (not installed): lets the calling thread make, for one scope, CUDA calls that a
// graph capture counts as "unsafe" without invalidating a capture under way.
#include <cuda_runtime_api.h>

namespace mrstack::detail {

/// While a stream is captured in global mode (CUDA's default, and PyTorch's), any thread
/// that calls cudaMalloc, cudaHostAlloc, cudaStreamSynchronize and the like gets
/// cudaErrorStreamCaptureUnsupported and the capture is invalidated; in thread-local mode
/// the capturing thread itself does (the driver's cuMemCreate and cuMemMap, which `vmm`
/// grows with, are allowed: tests/gpu/capture_growth.cpp). CUDA calls them unsafe because the capture does not
/// see them: a graph that relied on a cudaMalloc made during its capture would not make it
/// again when launched. mrstack makes such calls for itself, not for the graph: it grows
/// a pool whose memory stays allocated for every later launch (until `release()`, which is
/// the caller's to order, as PyTorch's allocator does for its graph pools), and it
/// synchronizes streams that are not being captured. So those calls are made in relaxed
/// mode, which lifts the rule for this thread only, and the thread's own mode is put back
/// after. Frees (cudaFree) are not relaxed: memory a graph may still use must not go back
/// while it can run. A device synchronization cannot be relaxed: CUDA refuses it during
/// any capture and ends that capture (measured on an H200 with CUDA 13).
/// Costs two cudaThreadExchangeStreamCaptureMode calls (a thread-local exchange);
/// without a usable CUDA runtime it does nothing.
class relaxed_capture_scope {
 public:
  relaxed_capture_scope() noexcept {
    exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
    if (!exchanged_) { (void)cudaGetLastError(); }
  }
  ~relaxed_capture_scope() {
    if (exchanged_) { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  }
  relaxed_capture_scope(relaxed_capture_scope const&) = delete;
  relaxed_capture_scope& operator=(relaxed_capture_scope const&) = delete;
  relaxed_capture_scope(relaxed_capture_scope&&) = delete;
  relaxed_capture_scope& operator=(relaxed_capture_scope&&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

}  // namespace mrstack::detail
