#pragma once
// GPU test workers: threads, each with created non-blocking streams of its own, allocate
// blocks of 4 KiB to 8 MiB from one resource, write a tag into each on its stream
// (cudaMemsetAsync), and read both ends back before freeing (a copy on the same stream).
// Some frees leave a late "poison" write queued on the block's stream (behind a
// host-function delay): a block handed to another stream before that write has run is
// overwritten by it after the new owner wrote its tag, and the new owner's read-back
// sees the poison. With `cross_stream_frees`, some blocks are freed on another of the
// thread's streams, ordered after the poison by an event wait (as a correct program
// must): the resource must then treat the block as that stream's. With `shared_streams`,
// every thread uses the same created streams instead (threads meeting on one stream).
#include <mrstack/error.hpp>
#include <mrstack/resource.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

namespace mrstack::test {

struct stream_worker_options {
  std::size_t threads = 16;
  std::size_t streams_per_thread = 4;
  int steps = 400;
  bool cross_stream_frees = false;
  /// > 0: this many created streams that every thread uses (not `streams_per_thread` of its own).
  std::size_t shared_streams = 0;
};

struct stream_worker_outcome {
  std::size_t blocks_checked = 0;
  std::size_t bad_blocks = 0;
  std::size_t cross_stream_frees = 0;
  std::size_t errors = 0;
};

namespace poisoned_detail {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr unsigned char poison = 0xEE;
constexpr std::size_t probe = 4 * KiB;  // bytes read back at each end of a block

inline void delay(cudaStream_t s, std::uintptr_t ms) {
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

/// Reads back both ends of `b` on its stream; true when every byte is its tag.
inline bool intact(live_block const& b, std::vector<unsigned char>& host) {
  std::size_t const n = std::min(b.bytes, probe);
  host.resize(2 * n);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), b.ptr, n, cudaMemcpyDeviceToHost, b.stream));
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data() + n, b.ptr + b.bytes - n, n, cudaMemcpyDeviceToHost, b.stream));
  MRSTACK_CUDA_TRY(cudaStreamSynchronize(b.stream));
  return std::all_of(host.begin(), host.end(), [&](unsigned char c) { return c == b.tag; });
}

/// Frees `b` on `other`, ordered after everything queued on b's stream (its poison).
inline void free_on_other_stream(memory_resource& mr, live_block const& b, cudaStream_t other) {
  cudaEvent_t done = nullptr;
  MRSTACK_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  MRSTACK_CUDA_TRY(cudaEventRecord(done, b.stream));
  MRSTACK_CUDA_TRY(cudaStreamWaitEvent(other, done, 0));
  MRSTACK_CUDA_TRY(cudaEventDestroy(done));  // released once the record completes
  mr.deallocate(b.ptr, b.bytes, stream_view{other});
}

struct counters {
  std::atomic<std::size_t> checked{0};
  std::atomic<std::size_t> bad{0};
  std::atomic<std::size_t> cross{0};
  std::atomic<std::size_t> errors{0};
};

inline std::vector<cudaStream_t> create_streams(std::size_t n) {
  std::vector<cudaStream_t> streams(n);
  for (auto& s : streams) { MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  return streams;
}

inline void destroy_streams(std::vector<cudaStream_t> const& streams) {
  for (auto s : streams) {
    MRSTACK_CUDA_TRY(cudaStreamSynchronize(s));
    MRSTACK_CUDA_TRY(cudaStreamDestroy(s));
  }
}

/// One thread's steps, on `shared` streams or (empty) on streams of its own.
inline void work(memory_resource& mr, stream_worker_options const& o, std::size_t t, counters& c,
                 std::vector<cudaStream_t> const& shared) {
  std::mt19937_64 rng{1234 + t};
  std::vector<cudaStream_t> const streams = shared.empty() ? create_streams(o.streams_per_thread) : shared;
  std::vector<live_block> live;
  std::vector<unsigned char> host;
  auto check_and_free = [&](std::size_t k) {
    live_block const b = live[k];
    live[k] = live.back();
    live.pop_back();
    c.checked.fetch_add(1);
    if (!intact(b, host)) { c.bad.fetch_add(1); }
    if (rng() % 3 == 0) {  // a late write still queued when the block is freed
      delay(b.stream, 2);
      MRSTACK_CUDA_TRY(cudaMemsetAsync(b.ptr, poison, b.bytes, b.stream));
    }
    cudaStream_t const other = streams[rng() % streams.size()];
    if (o.cross_stream_frees && other != b.stream && rng() % 4 == 0) {
      c.cross.fetch_add(1);
      free_on_other_stream(mr, b, other);
    } else {
      mr.deallocate(b.ptr, b.bytes, stream_view{b.stream});
    }
  };
  for (int i = 0; i < o.steps; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      std::size_t const bytes = 4 * KiB + rng() % (rng() % 4 == 0 ? 8 * MiB : 256 * KiB);
      cudaStream_t const s = streams[rng() % streams.size()];
      auto const tag = static_cast<unsigned char>(1 + rng() % 200);
      auto* p = static_cast<unsigned char*>(mr.allocate(bytes, stream_view{s}));
      MRSTACK_CUDA_TRY(cudaMemsetAsync(p, tag, bytes, s));
      live.push_back({p, bytes, s, tag});
    } else {
      check_and_free(rng() % live.size());
    }
  }
  while (!live.empty()) { check_and_free(live.size() - 1); }
  if (shared.empty()) { destroy_streams(streams); }
}

}  // namespace poisoned_detail

/// Runs the workers on `mr` and counts what their read-backs saw.
inline stream_worker_outcome run_poisoned_stream_workers(memory_resource& mr, stream_worker_options const& o = {}) {
  poisoned_detail::counters c;
  std::vector<cudaStream_t> const shared = poisoned_detail::create_streams(o.shared_streams);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < o.threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        poisoned_detail::work(mr, o, t, c, shared);
      } catch (std::exception const& e) {
        std::printf("thread %zu: %s\n", t, e.what());
        c.errors.fetch_add(1);
      }
    });
  }
  for (auto& w : workers) { w.join(); }
  poisoned_detail::destroy_streams(shared);
  return {c.checked.load(), c.bad.load(), c.cross.load(), c.errors.load()};
}

}  // namespace mrstack::test
