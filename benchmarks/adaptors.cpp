// What each adaptor adds to one allocate+free pair: every benchmark runs the same loop
// over the same base resource, bare or under one adaptor, so the difference is the
// adaptor's overhead. The base is the pool over the simulated upstream when the pool is
// built (a fast, realistic layer to sit on), else the system upstream. Memory is never
// touched, so no device is needed — unless MRSTACK_BENCH_DEVICE=1, which puts the pool
// over cudaMalloc on the current device (skipped, saying so, without one).
//
//   bench_adaptors --benchmark_min_time=0.2
//   bench_adaptors --benchmark_filter='/threads:2'   # contention with two threads
//   bench_adaptors --benchmark_filter='/1024/1/'     # 1..16 threads, each on its per-thread
//                                                    # default stream (the scaling runs)
//   MRSTACK_BENCH_DEVICE=1 bench_adaptors            # over pool > cuda
#include <benchmark/benchmark.h>

#include <mrstack/adaptor/aligned_resource_adaptor.hpp>
#include <mrstack/adaptor/failure_callback_resource_adaptor.hpp>
#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/adaptor/thread_safe_resource_adaptor.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#if __has_include(<mrstack/suballoc/pool_memory_resource.hpp>)
#include <mrstack/suballoc/pool_memory_resource.hpp>
#define MRSTACK_BENCH_HAVE_POOL 1
#else
#define MRSTACK_BENCH_HAVE_POOL 0
#endif

#include <spdlog/sinks/null_sink.h>

#include "span_rate.hpp"

#include <chrono>
#include <cstdlib>
#include <memory>

namespace {

using mrstack::resource_ptr;

bool on_device() {
  char const* v = std::getenv("MRSTACK_BENCH_DEVICE");
  return v != nullptr && *v != '\0' && *v != '0';
}

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

resource_ptr make_base() {
  resource_ptr bottom;
  if (on_device()) {
    bottom = std::make_shared<mrstack::cuda_memory_resource>();
  } else {
    bottom = std::make_shared<mrstack::simulated_memory_resource>();
  }
#if MRSTACK_BENCH_HAVE_POOL
  return std::make_shared<mrstack::pool_memory_resource>(std::move(bottom), std::size_t{256} << 20);
#else
  return on_device() ? bottom : std::make_shared<mrstack::system_memory_resource>();
#endif
}

char const* base_name() {
  if (on_device()) { return MRSTACK_BENCH_HAVE_POOL ? "pool>cuda" : "cuda"; }
  return MRSTACK_BENCH_HAVE_POOL ? "pool>simulated" : "system";
}

/// False (and the benchmark marked skipped) when the device base is asked for without a device.
bool base_available(benchmark::State& state) {
  if (on_device() && !have_device()) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// Shared by the threads of one benchmark: thread 0 builds it before the timed loop (whose
// start is a barrier for all threads) and drops it after (the end is a barrier too).
resource_ptr shared_resource;

/// For the statistics adaptor (thread 0, after the loop's closing barrier): how often a
/// thread found its headroom credit short (refills per pair, all threads' pairs), and the
/// peak it counted, in blocks. At a peak of k blocks only k threads at once can allocate
/// without a refill (see docs/adaptors.md), so the two explain its scaling.
void report_statistics(benchmark::State& state, mrstack::memory_resource* mr, double pairs_per_iteration = 1) {
  auto const* stats = dynamic_cast<mrstack::statistics_resource_adaptor const*>(mr);
  if (stats == nullptr) { return; }
  double const pairs = static_cast<double>(state.iterations()) * state.threads() * pairs_per_iteration;
  state.counters["refills_per_pair"] = static_cast<double>(stats->refills()) / pairs;
  state.counters["peak_blocks"] = static_cast<double>(stats->allocations_counter().peak);
}

template <typename Make>
void allocate_free_pair(benchmark::State& state, Make make) {
  if (!base_available(state)) { return; }
  if (state.thread_index() == 0) {
    shared_resource = make(make_base());
    state.SetLabel(mrstack::describe_stack(*shared_resource) + " (base " + base_name() + ")");
  }
  auto const bytes = static_cast<std::size_t>(state.range(0));
  // Second argument 1: each thread on its own per-thread default stream (so a
  // suballocator that shards by stream can scale); absent or 0: the legacy stream.
  bool const per_thread = state.range(1) != 0;
  mrstack::stream_view const stream = per_thread ? mrstack::stream_view::per_thread() : mrstack::stream_view{};
  mrstack::memory_resource* mr = nullptr;
  mrstack::bench::span_rate rate;
  for (auto _ : state) {
    if (mr == nullptr) {
      mr = shared_resource.get();
      rate.start();
    }
    void* p = mr->allocate(bytes, stream);
    benchmark::DoNotOptimize(p);
    mr->deallocate(p, bytes, stream);
  }
  rate.report(state, "pairs_per_s");  // the aggregate rate to compare (items_per_second reads high)
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  if (state.thread_index() == 0) {
    report_statistics(state, shared_resource.get());
    shared_resource.reset();
  }
}

/// As allocate_free_pair, but each iteration allocates `batch` blocks, then frees them
/// (last first): each thread's live blocks rise and fall, as a program's do from step to
/// step, where allocate_free_pair keeps every thread at one block or none. The threads'
/// steps do not line up, so the total live rises to its peak only now and then. Counts
/// `batch` pairs an iteration.
template <typename Make>
void allocate_free_batches(benchmark::State& state, Make make) {
  constexpr std::size_t batch = 16;
  if (!base_available(state)) { return; }
  if (state.thread_index() == 0) {
    shared_resource = make(make_base());
    state.SetLabel(mrstack::describe_stack(*shared_resource) + " (base " + base_name() + ", batches of 16)");
  }
  auto const bytes = static_cast<std::size_t>(state.range(0));
  mrstack::stream_view const stream = state.range(1) != 0 ? mrstack::stream_view::per_thread() : mrstack::stream_view{};
  mrstack::memory_resource* mr = nullptr;
  mrstack::bench::span_rate rate;
  void* live[batch];
  for (auto _ : state) {
    if (mr == nullptr) {
      mr = shared_resource.get();
      rate.start();
    }
    for (auto& p : live) { p = mr->allocate(bytes, stream); }
    benchmark::DoNotOptimize(live);
    for (std::size_t i = batch; i-- > 0;) { mr->deallocate(live[i], bytes, stream); }
  }
  rate.report(state, "pairs_per_s", batch);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
  if (state.thread_index() == 0) {
    report_statistics(state, shared_resource.get(), batch);
    shared_resource.reset();
  }
}

void BM_bare(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) { return base; });
}
void BM_bare_batches(benchmark::State& s) {
  allocate_free_batches(s, [](resource_ptr base) { return base; });
}
void BM_statistics_batches(benchmark::State& s) {
  allocate_free_batches(s, [](resource_ptr base) {
    return std::make_shared<mrstack::statistics_resource_adaptor>(std::move(base));
  });
}
void BM_limiting_batches(benchmark::State& s) {
  allocate_free_batches(s, [](resource_ptr base) {
    return std::make_shared<mrstack::limiting_resource_adaptor>(std::move(base), std::size_t{1} << 40);
  });
}
void BM_logging_sync(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(std::move(base), "/dev/null");
  });
}
void BM_logging_async(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(std::move(base), "/dev/null", false, true);
  });
}
// Per-thread order: each thread writes its own rows in runs (no merging writer).
void BM_logging_per_thread(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(std::move(base), "/dev/null", false, true,
                                                               mrstack::logging_resource_adaptor::default_queue_capacity,
                                                               mrstack::log_order::per_thread);
  });
}
// Binary records in per-thread order: as BM_logging_per_thread with no row formatted.
void BM_logging_binary(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(std::move(base), "/dev/null", false, true,
                                                               mrstack::logging_resource_adaptor::default_queue_capacity,
                                                               mrstack::log_order::per_thread,
                                                               mrstack::log_format::binary);
  });
}
// The same two with a sink that drops what it is given: what writing the buffers out
// through spdlog's file sink (its lock, its copy, the system call) adds to the above.
void BM_logging_per_thread_null_sink(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(
        std::move(base), std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::null_sink_mt>()}, false, true,
        mrstack::logging_resource_adaptor::default_queue_capacity, mrstack::log_order::per_thread);
  });
}
void BM_logging_binary_null_sink(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::logging_resource_adaptor>(
        std::move(base), std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::null_sink_mt>()}, false, true,
        mrstack::logging_resource_adaptor::default_queue_capacity, mrstack::log_order::per_thread,
        mrstack::log_format::binary);
  });
}
void BM_limiting(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::limiting_resource_adaptor>(std::move(base), std::size_t{1} << 40);
  });
}
void BM_statistics(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::statistics_resource_adaptor>(std::move(base));
  });
}
void BM_tracking(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::tracking_resource_adaptor>(std::move(base));
  });
}
void BM_tracking_stacks(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::tracking_resource_adaptor>(std::move(base), true);
  });
}
void BM_thread_safe(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::thread_safe_resource_adaptor>(std::move(base));
  });
}
void BM_aligned_passthrough(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::aligned_resource_adaptor>(std::move(base), 256);
  });
}
// Pass-through requests (below the 4096-byte threshold) once an over-aligned block was
// made: each free is then looked up in the adaptor's tables (docs/reliability.md).
void BM_aligned_checked_passthrough(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    auto al = std::make_shared<mrstack::aligned_resource_adaptor>(std::move(base), 4096, 4096);
    al->deallocate(al->allocate(4096), 4096);
    return al;
  });
}
void BM_aligned_4096(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::aligned_resource_adaptor>(std::move(base), 4096);
  });
}
void BM_retry(benchmark::State& s) {
  allocate_free_pair(s, [](resource_ptr base) {
    return std::make_shared<mrstack::failure_callback_resource_adaptor>(std::move(base), std::size_t{1});
  });
}

// The asynchronous logger's hot path on its own: bursts of pairs that fit in the ring
// (so the caller never waits for the writer), timed by hand; the flush that drains each
// burst is outside the timing. Compare with BM_logging_async, which is the sustained
// rate: there the writer thread's formatting bounds the pace once the ring is full.
void BM_logging_async_burst(benchmark::State& state) {
  if (!base_available(state)) { return; }
  auto base = make_base();
  mrstack::logging_resource_adaptor log{base, "/dev/null", false, true};
  state.SetLabel(mrstack::describe_stack(log) + " (base " + base_name() + ")");
  auto const bytes = static_cast<std::size_t>(state.range(0));
  constexpr int burst = 8192;  // 16384 records: a quarter of the default ring
  double timed_seconds = 0;
  for (auto _ : state) {
    auto const start = std::chrono::steady_clock::now();
    for (int i = 0; i < burst; ++i) {
      void* p = log.allocate(bytes);
      benchmark::DoNotOptimize(p);
      log.deallocate(p, bytes);
    }
    auto const stop = std::chrono::steady_clock::now();
    double const seconds = std::chrono::duration<double>(stop - start).count();
    state.SetIterationTime(seconds);  // one iteration is one burst
    timed_seconds += seconds;
    log.flush();
  }
  state.counters["ns_per_pair"] = timed_seconds * 1e9 / (static_cast<double>(state.iterations()) * burst);
}

}  // namespace

BENCHMARK(BM_logging_async_burst)->Arg(1 << 10)->UseManualTime();

// One thread: the overhead itself. Two threads (this machine's cores): what contention adds.
#define MRSTACK_ADAPTOR_BENCH(fn) BENCHMARK(fn)->Args({1 << 10, 0})->Threads(1)->Threads(2)->UseRealTime()
MRSTACK_ADAPTOR_BENCH(BM_bare);
MRSTACK_ADAPTOR_BENCH(BM_logging_sync);
MRSTACK_ADAPTOR_BENCH(BM_logging_async);
MRSTACK_ADAPTOR_BENCH(BM_logging_per_thread);
MRSTACK_ADAPTOR_BENCH(BM_logging_binary);
MRSTACK_ADAPTOR_BENCH(BM_limiting);
MRSTACK_ADAPTOR_BENCH(BM_statistics);
MRSTACK_ADAPTOR_BENCH(BM_tracking);
MRSTACK_ADAPTOR_BENCH(BM_tracking_stacks);
MRSTACK_ADAPTOR_BENCH(BM_thread_safe);
MRSTACK_ADAPTOR_BENCH(BM_aligned_passthrough);
MRSTACK_ADAPTOR_BENCH(BM_aligned_checked_passthrough);
MRSTACK_ADAPTOR_BENCH(BM_aligned_4096);
MRSTACK_ADAPTOR_BENCH(BM_retry);

// Scaling: 1 to 16 threads, each on its per-thread default stream; compare each adaptor's
// aggregate pairs_per_s with BM_bare's at the same thread count.
#define MRSTACK_ADAPTOR_SCALING(fn) \
  BENCHMARK(fn)->Args({1 << 10, 1})->Threads(1)->Threads(2)->Threads(4)->Threads(8)->Threads(16)->UseRealTime()
MRSTACK_ADAPTOR_SCALING(BM_bare);
MRSTACK_ADAPTOR_SCALING(BM_statistics);
MRSTACK_ADAPTOR_SCALING(BM_limiting);
MRSTACK_ADAPTOR_SCALING(BM_logging_async);
MRSTACK_ADAPTOR_SCALING(BM_logging_per_thread);
MRSTACK_ADAPTOR_SCALING(BM_logging_binary);
// What the file sink adds to the per-thread logs: one thread and 16 only.
BENCHMARK(BM_logging_per_thread_null_sink)->Args({1 << 10, 1})->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_logging_binary_null_sink)->Args({1 << 10, 1})->Threads(1)->Threads(16)->UseRealTime();
MRSTACK_ADAPTOR_SCALING(BM_tracking);
// Live blocks that rise and fall: the counting adaptors where the peak is not held steady.
BENCHMARK(BM_bare_batches)->Args({1 << 10, 1})->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_statistics_batches)->Args({1 << 10, 1})->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_limiting_batches)->Args({1 << 10, 1})->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK_MAIN();
