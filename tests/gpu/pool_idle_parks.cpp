// Parks of idle streams on a real device (design: docs/suballocators.md, "Stream-ordered
// reuse"). With two streams in use, a large free parks its stream. The pool first asks
// CUDA whether that stream has finished its work, but only a non-blocking stream not being
// captured into a graph:
// - idle, non-blocking: no event; the other stream takes the block at once, with no wait
//   and no growth;
// - blocking (created with default flags): never asked; the park records, and the other
//   stream waits on that event;
// - being captured: never asked (a query, even asking its flags, would end the capture),
//   and nothing parked or recorded (another stream cannot wait on an event recorded in a
//   capture): the capture ends cleanly, another stream grows rather than take the memory,
//   and takes it after the stream's first free after the capture.
// A busy non-blocking stream records, and the reuse waits for its work: covered by
// gpu_test_suballocators ("a block freed on one stream is reused on another only after its
// work"), whose freeing stream has a delayed write queued. A park leaves an error the
// program left pending for the program to read.
#include <catch2/catch.hpp>

#include <capture_check.hpp>

#include <mrstack/stream.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t block_bytes = std::size_t{64} << 20;  // above the 8 MiB a stream frees before it parks

struct handover {
  // Around a's free, then around b's allocation (b may park its own idle memory there:
  // a's search for 64 MiB asked b for the rest of b's first chunk).
  pool_memory_resource::statistics before, after_free, after_take;
  bool same_block = false;
  bool b_reads_its_own_bytes = false;
};

/// `a` writes a block and finishes; the block is freed on `a`, then `b` asks for as much.
handover free_on_a_then_allocate_on_b(pool_memory_resource& mr, stream_view a, stream_view b) {
  mr.deallocate(mr.allocate(256, b), 256, b);  // b is known: two streams in use, so frees park
  void* x = mr.allocate(block_bytes, a);
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, block_bytes, a.value()));
  a.synchronize();
  handover h;
  h.before = mr.stats();
  mr.deallocate(x, block_bytes, a);
  h.after_free = mr.stats();
  void* y = mr.allocate(block_bytes, b);
  h.after_take = mr.stats();
  h.same_block = x == y;
  MRSTACK_CUDA_TRY(cudaMemsetAsync(y, 0x55, block_bytes, b.value()));
  std::vector<unsigned char> host(block_bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), y, block_bytes, cudaMemcpyDeviceToHost, b.value()));
  b.synchronize();
  h.b_reads_its_own_bytes = std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == 0x55; });
  mr.deallocate(y, block_bytes, b);
  return h;
}

resource_ptr cuda();

/// A pool over cudaMalloc that streams a and b (non-blocking) have used: frees park.
struct two_streams_in_use {
  pool_memory_resource mr{cuda(), 0};
  stream a;
  stream b;
  two_streams_in_use() { mr.deallocate(mr.allocate(256, b), 256, b); }
};

resource_ptr cuda() { return std::make_shared<cuda_memory_resource>(); }

}  // namespace

TEST_CASE("gpu pool idle parks: an idle non-blocking stream parks with no event, and another stream takes it at once") {
  pool_memory_resource mr{cuda(), 0};
  stream a;  // non-blocking
  stream b;
  handover const h = free_on_a_then_allocate_on_b(mr, a, b);
  CHECK(h.same_block);
  CHECK(h.b_reads_its_own_bytes);
  CHECK(h.after_free.idle_parks > h.before.idle_parks);
  CHECK(h.after_free.events_recorded == h.before.events_recorded);
  CHECK(h.after_take.stream_waits == h.after_free.stream_waits);  // taken with no wait
  CHECK(h.after_take.events_recorded == h.after_free.events_recorded);
  CHECK(h.after_take.pool_size == h.before.pool_size);  // and no growth
}

TEST_CASE("gpu pool idle parks: a blocking stream is never asked; its park records and the taker waits") {
  pool_memory_resource mr{cuda(), 0};
  stream a{cudaStreamDefault};  // blocking: its later work also waits for the legacy stream's
  stream b;
  handover const h = free_on_a_then_allocate_on_b(mr, a, b);
  CHECK(h.same_block);
  CHECK(h.b_reads_its_own_bytes);
  // A query would have found it idle (its work is done) and parked it without an event.
  CHECK(h.after_free.idle_parks == h.before.idle_parks);
  CHECK(h.after_free.events_recorded > h.before.events_recorded);
  CHECK(h.after_take.stream_waits > h.after_free.stream_waits);
}

TEST_CASE("gpu pool idle parks: a stream being captured is never asked, and its capture survives the park") {
  two_streams_in_use f;
  auto& [mr, a, b] = f;
  void* x = mr.allocate(block_bytes, a);
  a.synchronize();
  auto const before = mr.stats();
  // Relaxed: the test thread's own calls are not restricted while the capture runs.
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(a.value(), cudaStreamCaptureModeRelaxed));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, block_bytes, a.value()));
  mr.deallocate(x, block_bytes, a);  // parks: a query, or even asking the stream's flags, would invalidate the capture
  test::check_capture_ends_cleanly(a);
  auto const after = mr.stats();
  CHECK(after.idle_queries > before.idle_queries);          // the free did come to park a
  CHECK(after.idle_parks == before.idle_parks);
  CHECK(after.events_recorded == before.events_recorded);  // nothing recorded into the capture
  a.synchronize();
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
}

TEST_CASE("gpu pool idle parks: memory freed while its stream is captured is not handed to another stream until after") {
  two_streams_in_use f;
  auto& [mr, a, b] = f;
  void* x = mr.allocate(block_bytes, a);
  void* w = mr.allocate(block_bytes, a);      // freed after the capture
  a.synchronize();
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(a.value(), cudaStreamCaptureModeRelaxed));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, block_bytes, a.value()));
  mr.deallocate(x, block_bytes, a);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(a.value(), &graph) == cudaSuccess);
  // Before: x's free had recorded an event inside the capture, and b's wait on it failed
  // ("invalid argument in cudaStreamWaitEvent"). Now b grows instead.
  void* y = nullptr;
  REQUIRE_NOTHROW(y = mr.allocate(block_bytes, b));
  CHECK(y != x);
  mr.deallocate(w, block_bytes, a);  // a's first call after the capture parks what it holds
  std::vector<void*> taken;
  std::size_t const pool_size = mr.pool_size();
  for (int i = 0; i < 4 && (taken.empty() || taken.back() != x); ++i) { taken.push_back(mr.allocate(block_bytes, b)); }
  CHECK(taken.back() == x);
  CHECK(mr.pool_size() == pool_size);  // taken, not grown for
  for (void* p : taken) { mr.deallocate(p, block_bytes, b); }
  mr.deallocate(y, block_bytes, b);
  MRSTACK_CUDA_TRY(cudaGraphDestroy(graph));
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("gpu pool idle parks: a park on another stream does not end a capture in global mode") {
  pool_memory_resource mr{cuda(), 0};
  stream c;  // captured, in global mode: CUDA's default and PyTorch's
  stream x;
  stream y;
  mr.deallocate(mr.allocate(256, y), 256, y);  // two streams in use
  void* on_c = mr.allocate(4096, c);
  void* on_x = mr.allocate(block_bytes, x);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  auto const before = mr.stats();
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(c.value(), cudaStreamCaptureModeGlobal));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(on_c, 0, 4096, c.value()));
  mr.deallocate(on_x, block_bytes, x);  // x is idle: asked, which must not be "unsafe" for c
  test::check_capture_ends_cleanly(c);
  CHECK(mr.stats().idle_parks > before.idle_parks);
  mr.deallocate(on_c, 4096, c);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
}

TEST_CASE("gpu pool idle parks: a stream being captured does not wait for parked memory, it grows") {
  two_streams_in_use f;
  auto& [mr, a, b] = f;
  void* x = mr.allocate(block_bytes, a);
  MRSTACK_CUDA_TRY(cudaLaunchHostFunc(
      a.value(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, block_bytes, a.value()));
  auto const records = mr.stats().events_recorded;
  mr.deallocate(x, block_bytes, a);  // a is busy (100 ms behind): parked under an event
  CHECK(mr.stats().events_recorded > records);
  // Relaxed: the growth (cudaMalloc) is then allowed while b is captured.
  MRSTACK_CUDA_TRY(cudaStreamBeginCapture(b.value(), cudaStreamCaptureModeRelaxed));
  void* y = nullptr;
  CHECK_NOTHROW(y = mr.allocate(block_bytes, b));  // before: cudaStreamWaitEvent into the capture threw
  if (y != nullptr) { MRSTACK_CUDA_TRY(cudaMemsetAsync(y, 0x55, block_bytes, b.value())); }
  test::check_capture_ends_cleanly(b);
  if (y != nullptr) { mr.deallocate(y, block_bytes, b); }
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  CHECK(mr.check_invariants() == "");
}


TEST_CASE("gpu pool idle parks: a park of a blocking stream leaves the program's pending CUDA error to the program") {
  // The idle check of a blocking stream asks its flags and, finding it blocking, cleared
  // the runtime's last error on the way out although none of its calls had failed.
  pool_memory_resource mr{cuda(), 0};
  stream a{cudaStreamDefault};
  stream b{cudaStreamDefault};
  mr.deallocate(mr.allocate(256, b), 256, b);  // two streams in use: a large free parks
  void* x = mr.allocate(block_bytes, a);
  void* too_much = nullptr;
  REQUIRE(cudaMalloc(&too_much, ~std::size_t{0} >> 1) == cudaErrorMemoryAllocation);  // the program's error, pending
  auto const before = mr.stats();
  mr.deallocate(x, block_bytes, a);
  CHECK(mr.stats().events_recorded > before.events_recorded);  // the free parked a, as above
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
}
