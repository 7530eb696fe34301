#pragma once
// Internal (not installed): lets the calling thread make, for one scope, CUDA calls that a
// graph capture counts as "unsafe" without invalidating a capture under way.
#include <cuda_runtime_api.h>

namespace mrstack::detail {

/// While a stream is captured in global mode (CUDA's default, and PyTorch's), any thread
/// that calls cudaMalloc, cudaFree, cudaHostAlloc, cudaStreamSynchronize and the like gets
/// cudaErrorStreamCaptureUnsupported and the capture is invalidated; in thread-local mode
/// the capturing thread itself does (the driver's cuMemCreate and cuMemMap, which `vmm`
/// grows with, are allowed: tests/gpu/capture_growth.cpp). CUDA calls them unsafe because
/// the capture does not see them: a graph that relied on a cudaMalloc made during its
/// capture would not make it again when launched. mrstack makes such calls for itself, not
/// for the graph, so it makes them in relaxed mode, which lifts the rule for this thread
/// only (the thread's own mode is put back after):
/// - it grows a pool; memory a live block of the graph uses is never given back;
/// - it gives a wholly free chunk back (a pool growing, an arena past its free bound),
///   but never one whose free memory a capture may hold (`stream_owners::held_by_capture`:
///   freed during a capture and not recorded since, or of a stream being captured now);
/// - it synchronizes streams that are not being captured (the callers check first).
/// What relaxed mode cannot make legal, CUDA refuses whatever the mode and the capture
/// ends: a device synchronization, and any use of the legacy default stream while a
/// blocking stream is being captured (measured on an H200 with CUDA 13). mrstack avoids
/// the second (`stream_owners::hand_over` asks first) and makes the first only as a last
/// resort (see docs/suballocators.md, "Graph captures").
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
