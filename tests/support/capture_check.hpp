#pragma once
// For GPU tests of graph capture: ends a stream's capture, which nothing the allocator did
// during it may have invalidated, and drops the graph.
#include <catch2/catch.hpp>

#include <mrstack/error.hpp>
#include <mrstack/stream.hpp>

#include <cuda_runtime_api.h>

namespace mrstack::test {

inline void check_capture_ends_cleanly(stream_view s) {
  cudaGraph_t graph = nullptr;
  cudaError_t const ended = cudaStreamEndCapture(s.value(), &graph);
  INFO("cudaStreamEndCapture: " << cudaGetErrorString(ended));
  CHECK(ended == cudaSuccess);
  if (graph != nullptr) { MRSTACK_CUDA_TRY(cudaGraphDestroy(graph)); }
}

}  // namespace mrstack::test
