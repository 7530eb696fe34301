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
#include <chrono>
#include <map>
#include <mutex>
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

TEST_CASE("gpu arena growth: 16 threads hand superblocks to one another with writes still queued") {
  // Each round a thread writes its pattern on its per-thread stream, waits there 60 ms,
  // reads back and checks; then queues a late write of its pattern 20 ms out and frees
  // everything at once. The superblocks go through the depot to other threads, whose
  // 60 ms windows a late write lands in unless they were ordered after it: their read-back
  // would show it. Two waves of threads: the second takes the first's batches after
  // their threads exited.
  auto cuda = std::make_shared<cuda_memory_resource>();
  arena_memory_resource mr{cuda, 4096 * MiB};  // max_free a quarter: the depot is used
  constexpr int threads = 16;
  constexpr int blocks = 48;  // 1 MiB each: 12 superblocks a thread
  constexpr std::size_t bytes = 1 * MiB;
  auto sleep_on = [](stream_view s, std::uintptr_t ms) {
    return ok(cudaLaunchHostFunc(
        s.value(), [](void* arg) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(arg))); },
        reinterpret_cast<void*>(ms)));
  };
  std::atomic<int> wrong{0};
  std::atomic<int> failures{0};
  std::mutex last_mutex;
  std::map<void*, int> last_freed_by;  // block -> the thread that freed it last
  std::atomic<int> taken_from_another{0};
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t, wave] {
        int const me = wave * threads + t;
        stream_view const s = stream_view::per_thread();
        std::vector<unsigned char> host(bytes * blocks);
        for (int round = 0; round < 4; ++round) {
          auto const pattern = static_cast<unsigned char>(1 + me * 4 + round);
          std::vector<void*> ys;
          for (int i = 0; i < blocks; ++i) { ys.push_back(mr.allocate(bytes, s)); }
          {
            std::lock_guard lock{last_mutex};
            for (void* y : ys) {
              auto const it = last_freed_by.find(y);
              if (it != last_freed_by.end() && it->second != me) { taken_from_another.fetch_add(1); }
            }
          }
          bool good = true;
          for (void* y : ys) { good = good && ok(cudaMemsetAsync(y, pattern, bytes, s.value())); }
          good = good && sleep_on(s, 60);
          for (int i = 0; i < blocks; ++i) {
            good = good && ok(cudaMemcpyAsync(host.data() + bytes * i, ys[i], bytes, cudaMemcpyDeviceToHost, s.value()));
          }
          good = good && ok(cudaStreamSynchronize(s.value()));
          for (std::size_t k = 0; k < host.size(); k += 4093) { wrong.fetch_add(host[k] != pattern ? 1 : 0); }
          good = good && sleep_on(s, 20);
          for (void* y : ys) { good = good && ok(cudaMemsetAsync(y, pattern, bytes, s.value())); }  // the late write
          for (void* y : ys) { mr.deallocate(y, bytes, s); }
          {
            std::lock_guard lock{last_mutex};
            for (void* y : ys) { last_freed_by[y] = me; }
          }
          if (!good) { failures.fetch_add(1); }
        }
        if (!ok(cudaStreamSynchronize(s.value()))) { failures.fetch_add(1); }
      });
    }
    for (auto& w : workers) { w.join(); }
  }
  INFO(taken_from_another.load() << " blocks taken where another thread freed them");
  CHECK(failures.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(taken_from_another.load() > 0);
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
