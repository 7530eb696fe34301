// The pool on a real device under threads and streams: 16 threads, each with 4 streams
// of its own (non-blocking), allocate blocks of 4 KiB to 8 MiB, write a tag into each on
// its stream (cudaMemsetAsync), and read it back before freeing (a copy on the same
// stream). Some frees leave a late "poison" write queued on the freeing stream (behind a
// host-function delay): a block handed to another stream before that write has run is
// overwritten by it after the new owner wrote its tag, and the new owner's read-back
// sees the poison. Memory moves between streams and threads (takeover of other
// streams' free memory) and the pool grows; every read-back must see its own tag. A
// control ([.control]) runs the same over a pool whose event seam does nothing, and
// must see poison: the check can fail.
#include <catch2/catch.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/suballoc/stream_sync.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr unsigned char poison = 0xEE;
constexpr std::size_t probe = 4 * KiB;  // bytes read back at each end of a block

void delay(cudaStream_t s, std::uintptr_t ms) {
  MRSTACK_CUDA_TRY(cudaLaunchHostFunc(
      s, [](void* arg) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(arg))); },
      reinterpret_cast<void*>(ms)));
}

struct live_block {
  unsigned char* ptr;
  std::size_t bytes;
  cudaStream_t stream;
  unsigned char tag;
};

struct outcome {
  std::size_t blocks_checked = 0;
  std::size_t bad_blocks = 0;
  std::size_t errors = 0;
};

/// Reads back both ends of `b` on its stream; true when every byte is its tag.
bool intact(live_block const& b, std::vector<unsigned char>& host) {
  std::size_t const n = std::min(b.bytes, probe);
  host.resize(2 * n);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), b.ptr, n, cudaMemcpyDeviceToHost, b.stream));
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data() + n, b.ptr + b.bytes - n, n, cudaMemcpyDeviceToHost, b.stream));
  MRSTACK_CUDA_TRY(cudaStreamSynchronize(b.stream));
  for (unsigned char c : host) {
    if (c != b.tag) { return false; }
  }
  return true;
}

outcome run_threads(pool_memory_resource& pool, std::size_t threads, int steps) {
  std::atomic<std::size_t> checked{0};
  std::atomic<std::size_t> bad{0};
  std::atomic<std::size_t> errors{0};
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        std::mt19937_64 rng{1234 + t};
        std::vector<cudaStream_t> streams(4);
        for (auto& s : streams) { MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
        std::vector<live_block> live;
        std::vector<unsigned char> host;
        auto check_and_free = [&](std::size_t k) {
          live_block const b = live[k];
          live[k] = live.back();
          live.pop_back();
          checked.fetch_add(1);
          if (!intact(b, host)) { bad.fetch_add(1); }
          if (rng() % 3 == 0) {  // a late write still queued when the block is freed
            delay(b.stream, 2);
            MRSTACK_CUDA_TRY(cudaMemsetAsync(b.ptr, poison, b.bytes, b.stream));
          }
          pool.deallocate(b.ptr, b.bytes, stream_view{b.stream});
        };
        for (int i = 0; i < steps; ++i) {
          if (live.empty() || rng() % 100 < 55) {
            std::size_t const bytes = 4 * KiB + rng() % (rng() % 4 == 0 ? 8 * MiB : 256 * KiB);
            cudaStream_t const s = streams[rng() % streams.size()];
            auto const tag = static_cast<unsigned char>(1 + rng() % 200);
            auto* p = static_cast<unsigned char*>(pool.allocate(bytes, stream_view{s}));
            MRSTACK_CUDA_TRY(cudaMemsetAsync(p, tag, bytes, s));
            live.push_back({p, bytes, s, tag});
          } else {
            check_and_free(rng() % live.size());
          }
        }
        while (!live.empty()) { check_and_free(live.size() - 1); }
        for (auto s : streams) {
          MRSTACK_CUDA_TRY(cudaStreamSynchronize(s));
          MRSTACK_CUDA_TRY(cudaStreamDestroy(s));
        }
      } catch (std::exception const& e) {
        std::printf("thread %zu: %s\n", t, e.what());
        errors.fetch_add(1);
      }
    });
  }
  for (auto& w : workers) { w.join(); }
  return outcome{checked.load(), bad.load(), errors.load()};
}

}  // namespace

TEST_CASE("gpu pool threads: 16 threads x 4 streams keep their data through reuse, takeover and growth") {
  // Sharding when the threads contend (the default), and from the second thread on.
  for (std::size_t const after : {std::size_t{256}, std::size_t{0}}) {
    pool_options options;
    options.shard_after_contentions = after;
    auto upstream = std::make_shared<cuda_memory_resource>();
    pool_memory_resource pool{upstream, 0, std::nullopt, options};
    outcome const r = run_threads(pool, 16, 400);
    auto const st = pool.stats();
    std::printf("shard after %zu contentions: checked %zu blocks, %zu with foreign bytes; %zu chunks taken, %zu "
                "records, %zu waits, %zu shards\n",
                after, r.blocks_checked, r.bad_blocks, st.upstream_allocations, st.events_recorded, st.stream_waits,
                st.thread_shards);
    INFO("shard_after_contentions " << after);
    CHECK(r.errors == 0);
    CHECK(r.blocks_checked > 16 * 100);
    CHECK(r.bad_blocks == 0);
    CHECK(st.used_bytes == 0);
    CHECK(st.upstream_allocations > 1);  // it grew while running
    if (after == 0) { CHECK(st.thread_shards >= 2); }
    CHECK(pool.check_invariants() == "");
  }
}

TEST_CASE("gpu pool threads: control - without events the same run sees foreign bytes", "[.control]") {
  pool_options options;
  options.stream_sync = make_host_stream_sync();  // "every free is complete at once": wrong on a GPU
  auto upstream = std::make_shared<cuda_memory_resource>();
  pool_memory_resource pool{upstream, 0, std::nullopt, options};
  outcome const r = run_threads(pool, 16, 400);
  std::printf("control: checked %zu blocks, %zu with foreign bytes\n", r.blocks_checked, r.bad_blocks);
  CHECK(r.errors == 0);
  CHECK(r.bad_blocks > 0);
}
