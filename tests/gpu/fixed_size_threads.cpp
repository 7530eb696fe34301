// fixed_size and binning with per-thread caches on a real device: a block one thread
// freed into its cache, with its write still queued, reaches another thread only after
// that write (the cache is taken back and the takeover is ordered); 16 threads on their
// per-thread default streams write, read back and free blocks of many sizes, handing some
// to other threads, with every byte checked.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <phase_gate.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

void delay(stream_view s, std::uintptr_t ms) {
  MRSTACK_CUDA_TRY(cudaLaunchHostFunc(
      s.value(), [](void* arg) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(arg))); },
      reinterpret_cast<void*>(ms)));
}

}  // namespace

TEST_CASE("gpu fixed_size threads: a cached block reaches another thread only after its queued write") {
  constexpr std::size_t block = 64 * MiB;
  auto mr = std::make_shared<fixed_size_memory_resource>(std::make_shared<cuda_memory_resource>(), block, 1);
  test::phase_gate gate;
  void* x = nullptr;
  void* y = nullptr;
  std::size_t wrong = 0;
  std::thread t1{[&] {
    auto const s = stream_view::per_thread();
    x = mr->allocate(block, s);
    delay(s, 100);
    (void)cudaMemsetAsync(x, 0xAA, block, s.value());
    mr->deallocate(x, block, s);  // into this thread's cache, the write still queued
    gate.advance(1);
    gate.wait_for(2);
    (void)cudaStreamSynchronize(cudaStreamPerThread);
  }};
  std::thread t2{[&] {
    auto const s = stream_view::per_thread();
    gate.wait_for(1);
    y = mr->allocate(block, s);  // the one block: taken back from t1's cache
    (void)cudaMemsetAsync(y, 0x55, block, s.value());
    delay(s, 300);
    std::vector<unsigned char> host(block);
    (void)cudaMemcpyAsync(host.data(), y, block, cudaMemcpyDeviceToHost, s.value());
    (void)cudaStreamSynchronize(cudaStreamPerThread);
    for (unsigned char c : host) { wrong += c != 0x55 ? 1 : 0; }
    mr->deallocate(y, block, s);
    (void)cudaStreamSynchronize(cudaStreamPerThread);
    gate.advance(2);
  }};
  t1.join();
  t2.join();
  CHECK(y == x);
  CHECK(wrong == 0);
  CHECK(mr->chunk_count() == 1);  // no growth: the block moved between the threads
}

TEST_CASE("gpu fixed_size threads: 16 threads write, check and free blocks through binning") {
  auto cuda = std::make_shared<cuda_memory_resource>();
  binning_memory_resource mr{cuda, 256, 1 * MiB, std::make_shared<pool_memory_resource>(cuda, 0)};
  constexpr int threads = 16;
  std::atomic<std::size_t> wrong{0};
  std::mutex exchange_mutex;
  std::vector<std::pair<void*, std::size_t>> exchange;  // freed by another thread than the allocating one
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto const s = stream_view::per_thread();
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 11};
      std::vector<unsigned char> host;
      for (int step = 0; step < 300; ++step) {
        std::size_t const bytes = 1 + rng() % (2 * MiB);
        auto const tag = static_cast<unsigned char>(t * 16 + step % 16);
        void* p = mr.allocate(bytes, s);
        MRSTACK_CUDA_TRY(cudaMemsetAsync(p, tag, bytes, s.value()));
        host.assign(bytes, 0);
        MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDeviceToHost, s.value()));
        MRSTACK_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
        for (unsigned char c : host) { wrong += c != tag ? 1 : 0; }
        if (step % 7 == 0) {
          std::lock_guard lock{exchange_mutex};
          exchange.emplace_back(p, bytes);
          continue;
        }
        mr.deallocate(p, bytes, s);  // reused at once on this stream, possibly while queued
        if (step % 5 == 0) {
          std::pair<void*, std::size_t> other{nullptr, 0};
          {
            std::lock_guard lock{exchange_mutex};
            if (!exchange.empty()) {
              other = exchange.back();
              exchange.pop_back();
            }
          }
          if (other.first != nullptr) { mr.deallocate(other.first, other.second, s); }
        }
      }
      MRSTACK_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
    });
  }
  for (auto& th : pool) { th.join(); }
  for (auto const& [p, bytes] : exchange) { mr.deallocate(p, bytes); }
  CHECK(wrong.load() == 0);
  CHECK(mr.fragmentation().live_bytes == 0);
  (void)KiB;
}
