// fixed_size (binning's bins) and the arena while a stream is captured into a CUDA graph,
// on a real device (the rules: docs/suballocators.md, "Graph captures"; the model test:
// tests/capture_fixed_size_arena.cpp).
// - fixed_size with two streams in use records an event at every free; into a capture
//   that event is one no other stream may wait on. So a free inside the capture records
//   nothing, the other stream grows rather than take the block, and the capture ends
//   cleanly; after the capture the stream's next free records and the block is taken.
// - the arena synchronizes a stream that frees another stream's small block; on a stream
//   being captured that call fails and ends the capture. So the block is held back until
//   that stream's first call after the capture, which synchronizes it then.
#include <catch2/catch.hpp>

#include <capture_check.hpp>

#include <mrstack/stream.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

TEST_CASE("gpu capture: fixed_size hands a block freed in a capture to another stream only after it") {
  fixed_size_memory_resource mr{std::make_shared<cuda_memory_resource>(), MiB, 4};
  stream a;
  stream b;
  std::vector<void*> held;  // b takes the first chunk: two streams in use, frees record
  for (std::size_t i = 0; i < mr.blocks_per_chunk(); ++i) { held.push_back(mr.allocate(MiB, b)); }
  void* x = mr.allocate(MiB, a);
  void* w = mr.allocate(MiB, a);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  // Relaxed: b's growth (cudaMalloc) is allowed while a is captured.
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(a.value(), cudaStreamCaptureModeRelaxed));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, MiB, a.value()));
  mr.deallocate(x, MiB, a);
  std::vector<void*> on_b;
  for (std::size_t i = 0; i < 2 * mr.blocks_per_chunk(); ++i) {
    void* p = nullptr;
    REQUIRE_NOTHROW(p = mr.allocate(MiB, b));  // before: a wait on an event recorded in the capture
    on_b.push_back(p);
    CHECK(p != x);
  }
  test::check_capture_ends_cleanly(a);
  mr.deallocate(w, MiB, a);  // records: a is no longer captured
  void* y = nullptr;
  for (std::size_t i = 0; i < 2 * mr.blocks_per_chunk() && y != x; ++i) {
    y = mr.allocate(MiB, b);
    on_b.push_back(y);
  }
  CHECK(y == x);
  for (void* p : on_b) { mr.deallocate(p, MiB, b); }
  for (void* p : held) { mr.deallocate(p, MiB, b); }
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
}

TEST_CASE("gpu capture: an arena's small block freed on a stream being captured waits for the capture's end") {
  arena_memory_resource arena{std::make_shared<cuda_memory_resource>(), std::size_t{256} * MiB};
  stream a;
  stream b;
  void* x = arena.allocate(4096, a);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(b.value(), cudaStreamCaptureModeGlobal));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0, 4096, b.value()));
  CHECK_NOTHROW(arena.deallocate(x, 4096, b));  // before: cudaStreamSynchronize(b) failed here
  void* during = arena.allocate(4096, a);
  CHECK(during != x);  // the graph's memset has not run: not reused yet
  test::check_capture_ends_cleanly(b);
  void* on_b = arena.allocate(256, b);  // b's first call after the capture gives x back
  void* after = arena.allocate(4096, a);
  CHECK(after == x);
  arena.deallocate(after, 4096, a);
  arena.deallocate(during, 4096, a);
  arena.deallocate(on_b, 256, b);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  CHECK(arena.check_invariants() == "");
}
