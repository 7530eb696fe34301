// vmm on a real device: the driver calls through the runtime's entry points, data
// integrity of memory mapped granule by granule, the driver-reported footprint
// (cudaMemGetInfo) while a pool-like workload fills more than half of the device in
// fragments, releases and refills it, and the return to the starting free memory.
#include <catch2/catch.hpp>

#include <mrstack/stream.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <memory>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

std::size_t device_free() {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

std::size_t device_total() {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));
  return total;
}

unsigned char pattern_of(std::size_t i) { return static_cast<unsigned char>(1 + (i * 37) % 254); }

// Reads 256 bytes at the start of every `stride` bytes of [p, p + bytes), plus the last 256,
// and checks each is `value`: every granule a block touches is sampled.
bool holds_pattern(void const* p, std::size_t bytes, unsigned char value, std::size_t stride) {
  std::size_t const row = std::min<std::size_t>(256, bytes);
  std::size_t const rows = (bytes - row) / stride + 1;
  std::vector<unsigned char> host(rows * row + row);
  MRSTACK_CUDA_TRY(cudaMemcpy2D(host.data(), row, p, stride, row, rows, cudaMemcpyDeviceToHost));
  MRSTACK_CUDA_TRY(cudaMemcpy(host.data() + rows * row, static_cast<unsigned char const*>(p) + bytes - row, row,
                              cudaMemcpyDeviceToHost));
  return std::all_of(host.begin(), host.end(), [&](unsigned char c) { return c == value; });
}

}  // namespace

TEST_CASE("vmm: reserves twice the device, at the driver's granularity") {
  vmm_memory_resource vmm;
  std::size_t const g = vmm_memory_resource::device_granularity();
  std::printf("vmm granularity %zu KiB, reserved %.1f GiB\n", g / KiB, static_cast<double>(vmm.range_bytes()) / (1 << 30));
  CHECK(vmm.granularity() == g);
  CHECK(detail::is_pow2(g));
  CHECK(vmm.range_bytes() >= 2 * device_total());
  CHECK(detail::is_aligned(vmm.range_base(), g));
  CHECK(vmm.name() == "vmm");
  CHECK(vmm.kind() == memory_kind::device);
  CHECK(vmm.mapped_bytes() == 0);
  int current = -1;
  MRSTACK_CUDA_TRY(cudaGetDevice(&current));
  CHECK(vmm.device() == current);
}

TEST_CASE("vmm: device_granularity answers for the current device, and refuses one past the count") {
  // Past the count the driver refused cuMemGetAllocationGranularity with an invalid device.
  int current = -1;
  int count = 0;
  MRSTACK_CUDA_TRY(cudaGetDevice(&current));
  MRSTACK_CUDA_TRY(cudaGetDeviceCount(&count));
  CHECK(vmm_memory_resource::device_granularity(-1) == vmm_memory_resource::device_granularity(current));
  if (count < 64) {
    CHECK_THROWS_AS(vmm_memory_resource::device_granularity(count), logic_error);
    CHECK_THROWS_WITH(vmm_memory_resource::device_granularity(count), Catch::Contains("does not exist"));
  }
}

TEST_CASE("vmm: as a plain upstream, memory is usable, holds data, and goes back to the driver") {
  std::size_t const before = device_free();
  {
    vmm_memory_resource vmm;
    std::size_t const g = vmm.granularity();
    stream s;
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::size_t bytes : {std::size_t{1}, 3 * MiB, 64 * MiB + 5, g}) {
      void* p = vmm.allocate(bytes);
      REQUIRE(vmm.owns(p));
      MRSTACK_CUDA_TRY(cudaMemsetAsync(p, pattern_of(blocks.size()), bytes, s.view().value()));
      blocks.emplace_back(p, bytes);
    }
    s.view().synchronize();
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      CHECK(holds_pattern(blocks[i].first, blocks[i].second, pattern_of(i), g));
    }
    std::size_t const committed = vmm.committed_bytes();
    CHECK(committed == g * (1 + detail::align_up(3 * MiB, g) / g + detail::align_up(64 * MiB + 5, g) / g + 1));
    CHECK(before - device_free() >= committed);
    for (auto const& [p, n] : blocks) { vmm.deallocate(p, n); }
    CHECK(vmm.mapped_bytes() == 0);
  }
  CHECK(device_free() + vmm_memory_resource::device_granularity() >= before);
}

TEST_CASE("vmm: giving memory back waits for kernels still writing it") {
  vmm_memory_resource vmm;
  stream s;
  std::size_t const bytes = 512 * MiB;
  void* p = vmm.allocate(bytes);
  for (int i = 0; i < 20; ++i) { MRSTACK_CUDA_TRY(cudaMemsetAsync(p, i, bytes, s.view().value())); }
  vmm.deallocate(p, bytes);  // unmaps: must not pull the memory from under the memsets
  CHECK(cudaStreamSynchronize(s.view().value()) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("vmm: running out of device memory is out_of_memory, and leaves nothing mapped") {
  std::size_t const before = device_free();
  vmm_memory_resource vmm{0, 64};  // 128 MiB per physical allocation: fewer calls before the device is full
  try {
    void* p = vmm.allocate(device_total() + vmm.granularity());
    vmm.deallocate(p, device_total() + vmm.granularity());
    FAIL("allocated more than the device has");
  } catch (out_of_memory const& e) {
    std::printf("expected: %s\n", e.what());
    CHECK_THAT(e.what(), Catch::Contains("cuMemCreate") && Catch::Contains("free of"));
  }
  CHECK(vmm.mapped_bytes() == 0);
  CHECK(device_free() + vmm.granularity() >= before);
}

TEST_CASE("vmm: memory cannot go through cudaIpcGetMemHandle, and IPC paths can tell") {
  vmm_memory_resource vmm;
  void* p = vmm.allocate(MiB);
  CHECK(is_virtual_range_address(p));
  CHECK(find_virtual_range(vmm, p) == &vmm);
  cudaIpcMemHandle_t handle{};
  cudaError_t const status = cudaIpcGetMemHandle(&handle, p);
  (void)cudaGetLastError();
  std::printf("cudaIpcGetMemHandle on vmm memory: %s\n", cudaGetErrorName(status));
  CHECK(status != cudaSuccess);
  void* plain = nullptr;
  MRSTACK_CUDA_TRY(cudaMalloc(&plain, MiB));
  CHECK_FALSE(is_virtual_range_address(plain));
  MRSTACK_CUDA_TRY(cudaFree(plain));
  vmm.deallocate(p, MiB);
}

TEST_CASE("pool > vmm: fills over half the device in fragments, keeps data, follows live bytes, gives it all back") {
  std::size_t const start_free = device_free();
  std::size_t const target = start_free / 100 * 55;
  std::size_t const slack = 64 * MiB;  // the driver's own bookkeeping (page tables) may move by this much
  std::mt19937_64 rng{2024};
  stream s;
  {
    auto const vmm_ptr = std::make_shared<vmm_memory_resource>();
    vmm_memory_resource& vmm = *vmm_ptr;
    std::size_t const g = vmm.granularity();
    pool_memory_resource pool{vmm_ptr};
    REQUIRE(pool.grows_in_place());
    struct fragment {
      void* p;
      std::size_t bytes;
      unsigned char value;
    };
    std::vector<fragment> live;
    std::size_t live_bytes = 0;
    std::size_t counter = 0;
    auto add = [&](std::size_t bytes) {
      void* p = pool.allocate(bytes, s);
      unsigned char const v = pattern_of(counter++);
      MRSTACK_CUDA_TRY(cudaMemsetAsync(p, v, bytes, s.view().value()));
      live.push_back({p, bytes, v});
      live_bytes += bytes;
    };
    auto all_intact = [&] {
      s.view().synchronize();
      std::size_t bad = 0;
      for (auto const& f : live) { bad += holds_pattern(f.p, f.bytes, f.value, g) ? 0 : 1; }
      return bad;
    };
    auto used_by_driver = [&] { return start_free - device_free(); };

    // 1. Fill: fragments from 1 KiB to 64 MiB, log-uniform, until 55% of free memory is live.
    while (live_bytes < target) {
      double const exponent = std::uniform_real_distribution<double>{10.0, 26.0}(rng);
      add(static_cast<std::size_t>(std::exp2(exponent)));
    }
    std::printf("filled: %zu fragments, %.2f GiB live, %.2f GiB committed, driver reports %.2f GiB used\n", live.size(),
                static_cast<double>(live_bytes) / (1 << 30), static_cast<double>(vmm.committed_bytes()) / (1 << 30),
                static_cast<double>(used_by_driver()) / (1 << 30));
    CHECK(all_intact() == 0);
    // The driver holds what vmm mapped (give or take its own page tables) ...
    CHECK(used_by_driver() + slack >= vmm.mapped_bytes());
    CHECK(used_by_driver() <= vmm.mapped_bytes() + slack);
    // ... and grown in place, the pool commits no more than the live bytes plus rounding.
    CHECK(vmm.committed_bytes() <= detail::align_up(live_bytes, g) + live.size() * 256 + g);
    CHECK(pool.chunk_count() == 1);

    // 2. Free 60% in random order, release: the footprint follows the live bytes.
    std::shuffle(live.begin(), live.end(), rng);
    while (live.size() > 0 && live.size() * 10 > counter * 4) {
      pool.deallocate(live.back().p, live.back().bytes, s);
      live_bytes -= live.back().bytes;
      live.pop_back();
    }
    std::size_t const before_release = used_by_driver();
    std::size_t const mapped_before = vmm.mapped_bytes();
    std::size_t const committed_before = vmm.committed_bytes();
    pool.release();
    std::size_t const given_back = committed_before - vmm.committed_bytes();
    std::printf("freed to %zu fragments (%.2f GiB live); release decommitted %.2f GiB and unmapped %.2f GiB; %.2f GiB "
                "committed, %.2f GiB mapped, driver reports %.2f GiB used\n",
                live.size(), static_cast<double>(live_bytes) / (1 << 30), static_cast<double>(given_back) / (1 << 30),
                static_cast<double>(mapped_before - vmm.mapped_bytes()) / (1 << 30),
                static_cast<double>(vmm.committed_bytes()) / (1 << 30), static_cast<double>(vmm.mapped_bytes()) / (1 << 30),
                static_cast<double>(used_by_driver()) / (1 << 30));
    CHECK(given_back > 0);
    CHECK(vmm.mapped_bytes() < mapped_before);
    CHECK(before_release - used_by_driver() + slack >= mapped_before - vmm.mapped_bytes());  // the driver got it back
    CHECK(used_by_driver() <= vmm.mapped_bytes() + slack);
    CHECK(all_intact() == 0);  // releasing never touched a live byte

    // 3. Refill to 55%: holes are reused, data stays intact.
    std::size_t const grown_before = pool.stats().upstream_allocations;
    while (live_bytes < target) {
      double const exponent = std::uniform_real_distribution<double>{10.0, 24.0}(rng);
      add(static_cast<std::size_t>(std::exp2(exponent)));
    }
    std::printf("refilled: %zu fragments; %zu growths; %.2f GiB committed, %.2f GiB live\n", live.size(),
                pool.stats().upstream_allocations - grown_before, static_cast<double>(vmm.committed_bytes()) / (1 << 30),
                static_cast<double>(live_bytes) / (1 << 30));
    CHECK(all_intact() == 0);
    CHECK(used_by_driver() <= vmm.mapped_bytes() + slack);

    // 4. Free everything in random order and release: back to where the device started.
    std::shuffle(live.begin(), live.end(), rng);
    for (auto const& f : live) { pool.deallocate(f.p, f.bytes, s); }
    live.clear();
    pool.release();
    CHECK(vmm.committed_bytes() == 0);
    CHECK(vmm.mapped_bytes() == 0);
    std::size_t const end_free = device_free();
    std::printf("all freed and released: device free %.3f GiB at start, %.3f GiB now (granule %zu KiB)\n",
                static_cast<double>(start_free) / (1 << 30), static_cast<double>(end_free) / (1 << 30), g / KiB);
    CHECK(end_free + g >= start_free);
  }
  CHECK(device_free() + vmm_memory_resource::device_granularity() >= start_free);
}
