// The suballocators on a real device: memory from each is written and read back on
// streams, and cross-stream reuse is correct — a block freed on stream A while A's
// writes to it are still queued (behind a 100 ms host-function delay, so they surely
// run late) must not be handed to stream B before they have run. B writes its own
// pattern, waits 300 ms on the device, then reads back: any byte of A's pattern means B
// got the block too early. A control run over a pool whose event seam does nothing
// ([.control]) shows the test can fail.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/suballoc/stream_sync.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/pinned_host_memory_resource.hpp>

#include <phase_gate.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t block_bytes = 64 * MiB;
constexpr std::uintptr_t writer_delay_ms = 100;  // A's writes run this late
constexpr std::uintptr_t reader_delay_ms = 300;  // B reads back this long after writing

/// Queues a host-side sleep on `s`: the work queued after it runs that much later.
void delay(stream_view s, std::uintptr_t ms) {
  MRSTACK_CUDA_TRY(cudaLaunchHostFunc(
      s.value(), [](void* arg) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(arg))); },
      reinterpret_cast<void*>(ms)));
}

void write_read(memory_resource& mr, std::size_t bytes, stream_view s) {
  auto* p = static_cast<unsigned char*>(mr.allocate(bytes, s));
  REQUIRE(detail::is_aligned(p, 256));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(p, 0x3c, bytes, s.value()));
  std::vector<unsigned char> host(bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDefault, s.value()));
  s.synchronize();
  CHECK(host.front() == 0x3c);
  CHECK(host[bytes / 2] == 0x3c);
  CHECK(host.back() == 0x3c);
  mr.deallocate(p, bytes, s);
}

void write_read_all(memory_resource& mr, std::vector<std::size_t> const& sizes) {
  stream s;
  for (std::size_t bytes : sizes) { write_read(mr, bytes, s); }
  write_read(mr, 4 * KiB, stream_view{});
  write_read(mr, 4 * KiB, stream_view::per_thread());
}

struct reuse_outcome {
  bool same_block = false;  ///< B got the very block A freed (else the test proved nothing)
  std::size_t wrong_bytes = 0;
};

/// The scenario, on `bytes` bytes: A writes 0xAA late and frees at once; B allocates,
/// writes 0x55, waits, reads back. With `ask_first` (the pool: streams record on demand):
/// when B's request finds A's memory unrecorded, it asks A and grows; A's next call (a
/// free) records after its queued write and parks the block, which B's next request takes
/// after a wait. (A large free may park at once: then B's first request takes it.)
reuse_outcome cross_stream_reuse(memory_resource& mr, std::size_t bytes, stream_view a, stream_view b,
                                 bool ask_first = false) {
  auto* x = static_cast<unsigned char*>(mr.allocate(bytes, a));
  void* small = ask_first ? mr.allocate(256, a) : nullptr;
  delay(a, writer_delay_ms);
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, bytes, a.value()));
  mr.deallocate(x, bytes, a);
  auto* y = static_cast<unsigned char*>(mr.allocate(bytes, b));
  void* probe = nullptr;
  if (ask_first && y != x) {  // A had not recorded yet: B's request asked it to, and grew
    probe = y;
    mr.deallocate(small, 256, a);  // A's call records after its queued write and parks x
    small = nullptr;
    y = static_cast<unsigned char*>(mr.allocate(bytes, b));
  }
  if (small != nullptr) { mr.deallocate(small, 256, a); }
  MRSTACK_CUDA_TRY(cudaMemsetAsync(y, 0x55, bytes, b.value()));
  delay(b, reader_delay_ms);
  std::vector<unsigned char> host(bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), y, bytes, cudaMemcpyDeviceToHost, b.value()));
  b.synchronize();
  a.synchronize();
  reuse_outcome out;
  out.same_block = x == y;
  for (unsigned char c : host) { out.wrong_bytes += c != 0x55 ? 1 : 0; }
  mr.deallocate(y, bytes, b);
  if (probe != nullptr) { mr.deallocate(probe, bytes, b); }
  return out;
}

/// With `both_known`, b uses the resource before the scenario, so a's free is covered by
/// an event (recorded while a is named) and b waits on it; otherwise a's free predates
/// the second stream and the handover synchronizes the device.
void check_reuse(memory_resource& mr, std::size_t bytes = block_bytes, bool both_known = false, bool ask_first = false) {
  stream a;
  stream b;
  if (both_known) { mr.deallocate(mr.allocate(256, b), 256, b); }
  reuse_outcome const r = cross_stream_reuse(mr, bytes, a, b, ask_first);
  INFO(mr.name() << ": " << r.wrong_bytes << " bytes of " << bytes << " overwritten by the previous stream's work");
  CHECK(r.same_block);
  CHECK(r.wrong_bytes == 0);
}

resource_ptr cuda() { return std::make_shared<cuda_memory_resource>(); }

}  // namespace

TEST_CASE("gpu suballocators: memory from each resource is written and read back on streams") {
  std::vector<std::size_t> const sizes{1, 256, 1000, 64 * KiB, 1 * MiB, 3 * MiB + 5};
  SECTION("pool over cuda") {
    pool_memory_resource mr{cuda(), 16 * MiB};
    write_read_all(mr, sizes);
  }
  SECTION("pool over cuda_async") {
    pool_memory_resource mr{std::make_shared<cuda_async_memory_resource>(), 0};
    write_read_all(mr, sizes);
  }
  SECTION("pool over pinned_host") {
    pool_memory_resource mr{std::make_shared<pinned_host_memory_resource>(), 8 * MiB};
    write_read_all(mr, sizes);
    auto* p = static_cast<unsigned char*>(mr.allocate(4 * KiB));
    std::memset(p, 7, 4 * KiB);  // host-accessible
    CHECK(p[4095] == 7);
    mr.deallocate(p, 4 * KiB);
  }
  SECTION("fixed_size over cuda") {
    fixed_size_memory_resource mr{cuda(), 4 * MiB, 8};
    write_read_all(mr, {1, 1000, 4 * MiB});
  }
  SECTION("binning over cuda") {
    binning_memory_resource mr{cuda(), 256, 1 * MiB};
    write_read_all(mr, sizes);
  }
  SECTION("arena over cuda") {
    arena_memory_resource mr{cuda(), 256 * MiB};
    write_read_all(mr, sizes);
    CHECK(mr.check_invariants() == "");
  }
}

TEST_CASE("gpu suballocators: a block freed on one stream is reused on another only after its work") {
  SECTION("pool over cuda (A records on demand, B waits on that event)") {
    pool_memory_resource mr{cuda(), 0};
    check_reuse(mr, block_bytes, false, true);
    CHECK(mr.stats().events_recorded >= 1);
    CHECK(mr.stats().stream_waits >= 1);
  }
  SECTION("pool over cuda, both streams known first") {
    pool_memory_resource mr{cuda(), 0};
    check_reuse(mr, block_bytes, true, true);
    CHECK(mr.stats().events_recorded >= 1);
    CHECK(mr.stats().stream_waits >= 1);
  }
  SECTION("pool over cuda, RMM's rule (an event at every free)") {
    pool_options eager;
    eager.record_on_demand = false;
    pool_memory_resource mr{cuda(), 0, std::nullopt, eager};
    check_reuse(mr, block_bytes, true);
    CHECK(mr.stats().stream_waits >= 1);
  }
  SECTION("pool over cuda_async (the pool outlives its streams)") {
    pool_memory_resource mr{std::make_shared<cuda_async_memory_resource>(), 0};
    check_reuse(mr, block_bytes, false, true);
    check_reuse(mr, block_bytes, true, true);
  }
  SECTION("fixed_size over cuda (one block, so B must take A's)") {
    fixed_size_memory_resource mr{cuda(), block_bytes, 1};
    check_reuse(mr);
  }
  SECTION("binning over cuda (a one-block bin)") {
    binning_memory_resource mr{cuda()};
    mr.add_bin(block_bytes, std::make_shared<fixed_size_memory_resource>(cuda(), block_bytes, 1), 256);
    check_reuse(mr);
  }
  SECTION("arena over cuda (large block; the arena holds little else)") {
    arena_memory_resource mr{cuda(), block_bytes + 4 * MiB};
    check_reuse(mr);
  }
}

TEST_CASE("gpu suballocators: an arena block freed on another stream waits for that stream") {
  arena_memory_resource mr{cuda(), 64 * MiB};
  stream a;
  stream b;
  std::size_t const bytes = 512 * KiB;  // a small block: from a's stream arena
  auto* x = static_cast<unsigned char*>(mr.allocate(bytes, a));
  a.synchronize();
  delay(b, writer_delay_ms);
  MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, bytes, b.value()));
  mr.deallocate(x, bytes, b);  // freed on b while b's write is still queued: must wait for b
  auto* y = static_cast<unsigned char*>(mr.allocate(bytes, a));
  CHECK(y == x);
  MRSTACK_CUDA_TRY(cudaMemsetAsync(y, 0x55, bytes, a.value()));
  delay(a, reader_delay_ms);
  std::vector<unsigned char> host(bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), y, bytes, cudaMemcpyDeviceToHost, a.value()));
  a.synchronize();
  b.synchronize();
  std::size_t wrong = 0;
  for (unsigned char c : host) { wrong += c != 0x55 ? 1 : 0; }
  CHECK(wrong == 0);
  mr.deallocate(y, bytes, a);
}

TEST_CASE("gpu suballocators: arena superblocks one stream hands back reach another only after its work") {
  arena_options options;
  options.empty_superblocks_kept = 1;  // spares past two go to the depot
  arena_memory_resource mr{cuda(), 256 * MiB, options};
  stream a;
  stream b;
  mr.deallocate(mr.allocate(256, b), 256, b);  // two streams in use: a's batches get events
  constexpr std::size_t bytes = 1 * MiB;       // four to a superblock
  constexpr int blocks = 64;
  std::vector<unsigned char*> xs;
  for (int i = 0; i < blocks; ++i) { xs.push_back(static_cast<unsigned char*>(mr.allocate(bytes, a))); }
  delay(a, writer_delay_ms);
  for (auto* x : xs) { MRSTACK_CUDA_TRY(cudaMemsetAsync(x, 0xAA, bytes, a.value())); }
  for (auto* x : xs) { mr.deallocate(x, bytes, a); }  // a's writes are still queued
  std::vector<unsigned char*> ys;
  for (int i = 0; i < blocks; ++i) { ys.push_back(static_cast<unsigned char*>(mr.allocate(bytes, b))); }
  for (auto* y : ys) { MRSTACK_CUDA_TRY(cudaMemsetAsync(y, 0x55, bytes, b.value())); }
  delay(b, reader_delay_ms);
  std::vector<unsigned char> host(bytes * blocks);
  for (int i = 0; i < blocks; ++i) {
    MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data() + bytes * i, ys[i], bytes, cudaMemcpyDeviceToHost, b.value()));
  }
  b.synchronize();
  a.synchronize();
  std::size_t reused = 0;
  for (auto* y : ys) { reused += std::find(xs.begin(), xs.end(), y) != xs.end() ? 1 : 0; }
  std::size_t wrong = 0;
  for (unsigned char c : host) { wrong += c != 0x55 ? 1 : 0; }
  INFO(reused << " of " << blocks << " blocks reused; " << wrong << " bytes overwritten by a's late work");
  CHECK(reused > 0);
  CHECK(wrong == 0);
  for (auto* y : ys) { mr.deallocate(y, bytes, b); }
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("gpu suballocators: per-thread default streams of two threads") {
  // Thread 2 takes the block thread 1 freed while thread 1's write to it is still queued.
  // Thread 1's stream cannot be named from thread 2: the pool orders thread 2's stream
  // after an event on the legacy default stream, which waits for every blocking stream
  // (per-thread default streams are blocking). If that did not hold, 0xAA would show.
  pool_memory_resource mr{cuda(), 0};
  test::phase_gate gate;
  void* x = nullptr;
  void* y = nullptr;
  std::size_t wrong = 0;
  std::thread t1{[&] {
    auto const s = stream_view::per_thread();
    x = mr.allocate(block_bytes, s);
    delay(s, writer_delay_ms);
    (void)cudaMemsetAsync(x, 0xAA, block_bytes, s.value());
    mr.deallocate(x, block_bytes, s);
    gate.advance(1);
    gate.wait_for(2);
    (void)cudaStreamSynchronize(cudaStreamPerThread);
  }};
  std::thread t2{[&] {
    auto const s = stream_view::per_thread();
    gate.wait_for(1);
    y = mr.allocate(block_bytes, s);
    (void)cudaMemsetAsync(y, 0x55, block_bytes, s.value());
    delay(s, reader_delay_ms);
    std::vector<unsigned char> host(block_bytes);
    (void)cudaMemcpyAsync(host.data(), y, block_bytes, cudaMemcpyDeviceToHost, s.value());
    (void)cudaStreamSynchronize(cudaStreamPerThread);
    for (unsigned char c : host) { wrong += c != 0x55 ? 1 : 0; }
    mr.deallocate(y, block_bytes, s);
    (void)cudaStreamSynchronize(cudaStreamPerThread);
    gate.advance(2);
  }};
  t1.join();
  t2.join();
  CHECK(y == x);
  CHECK(wrong == 0);
  CHECK(mr.stats().events_recorded == 1);
  CHECK(mr.pool_size() == block_bytes);  // no growth: the memory moved between the threads
}

TEST_CASE("gpu suballocators: control - without the event wait the reuse test sees corruption", "[.control]") {
  pool_options options;
  options.stream_sync = make_host_stream_sync();  // "every free is complete at once": wrong on a GPU
  pool_memory_resource mr{cuda(), 0, std::nullopt, options};
  stream a;
  stream b;
  reuse_outcome const r = cross_stream_reuse(mr, block_bytes, a, b, true);
  INFO(r.wrong_bytes << " bytes overwritten");
  CHECK(r.same_block);
  CHECK(r.wrong_bytes > 0);
}
