// What the expandable virtual-memory upstream costs on a device:
// - BM_vmm_first_touch: commit + decommit of N bytes (map/unmap every granule through the
//   driver), by granules per physical allocation — the price of a granule's first touch,
//   which a pool pays once and then amortizes over every reuse.
// - BM_cuda_malloc_free: cudaMalloc + cudaFree of the same sizes, the baseline.
// - BM_vmm_plain_upstream: allocate + deallocate straight from vmm (no pool above).
// - BM_pool_random/<upstream>: random_allocations over `pool > vmm` and `pool > cuda`:
//   random sizes, random frees, ns per call once warm (no driver call while timed).
// - BM_pool_replay/<upstream>: the ResNet-50 training log (data/), ns per event and the
//   peak footprint over peak live bytes; the first pass (growth, mapping) is reported apart.
// The simulated twin runs the same code without a device (BM_simulated_*), which shows
// the bookkeeping's own share of the cost.
#include <benchmark/benchmark.h>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include "../tests/support/alloc_log.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <limits>

#include <cuda_runtime_api.h>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename Range>
void first_touch(benchmark::State& state, Range& range) {
  auto const bytes = static_cast<std::size_t>(state.range(0));
  range.claim("benchmark");
  void* const p = range.range_base();
  for (auto _ : state) {
    range.commit(p, bytes);
    range.decommit(p, bytes);
  }
  range.unclaim();
  state.counters["maps_per_iter"] = static_cast<double>(range.map_calls()) / static_cast<double>(state.iterations());
  state.counters["ns_per_granule"] =
      benchmark::Counter(static_cast<double>(state.iterations() * (bytes / range.granularity())),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void BM_vmm_first_touch(benchmark::State& state) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  mrstack::vmm_memory_resource vmm{0, static_cast<std::size_t>(state.range(1))};
  first_touch(state, vmm);
}

void BM_simulated_first_touch(benchmark::State& state) {
  mrstack::simulated_vmm_memory_resource sim{std::size_t{1} << 40, 2 * MiB, std::numeric_limits<std::size_t>::max(),
                                             static_cast<std::size_t>(state.range(1))};
  first_touch(state, sim);
}

void BM_cuda_malloc_free(benchmark::State& state) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto const bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
    benchmark::DoNotOptimize(p);
    cudaFree(p);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void BM_vmm_plain_upstream(benchmark::State& state) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  mrstack::vmm_memory_resource vmm;
  auto const bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = vmm.allocate(bytes);
    benchmark::DoNotOptimize(p);
    vmm.deallocate(p, bytes);
  }
}

enum class upstream_kind { vmm, cuda, simulated_vmm };

std::shared_ptr<mrstack::memory_resource> make_upstream(upstream_kind kind) {
  switch (kind) {
    case upstream_kind::vmm: return std::make_shared<mrstack::vmm_memory_resource>();
    case upstream_kind::cuda: return std::make_shared<mrstack::cuda_memory_resource>();
    case upstream_kind::simulated_vmm: return std::make_shared<mrstack::simulated_vmm_memory_resource>();
  }
  return nullptr;
}

// random_allocations: 1024 slots; each call frees the slot's block (if any) or allocates
// one of a random size (256 B .. 4 MiB, log-uniform). Counted per allocate or deallocate.
void BM_pool_random(benchmark::State& state, upstream_kind kind) {
  if (kind != upstream_kind::simulated_vmm && !have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto upstream = make_upstream(kind);
  mrstack::pool_memory_resource pool{upstream};
  std::mt19937_64 rng{42};
  constexpr std::size_t slots = 1024;
  constexpr std::size_t ops = std::size_t{1} << 16;
  std::vector<std::size_t> slot_of(ops);
  std::vector<std::size_t> size_of(ops);
  for (std::size_t i = 0; i < ops; ++i) {
    slot_of[i] = rng() % slots;
    size_of[i] = static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<double>{8.0, 22.0}(rng)));
  }
  std::vector<void*> ptr(slots, nullptr);
  std::vector<std::size_t> bytes(slots, 0);
  std::size_t i = 0;
  auto step = [&] {
    std::size_t const s = slot_of[i % ops];
    if (ptr[s] != nullptr) {
      pool.deallocate(ptr[s], bytes[s]);
      ptr[s] = nullptr;
    } else {
      bytes[s] = size_of[i % ops];
      ptr[s] = pool.allocate(bytes[s]);
    }
    ++i;
  };
  for (std::size_t k = 0; k < 4 * ops; ++k) { step(); }  // warm: the pool has grown to the working set
  std::size_t const growths = pool.stats().upstream_allocations;
  for (auto _ : state) { step(); }
  state.counters["growths_while_timed"] = static_cast<double>(pool.stats().upstream_allocations - growths);
  state.counters["ns_per_call"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["pool_MiB"] = static_cast<double>(pool.pool_size()) / MiB;
  for (std::size_t s = 0; s < slots; ++s) {
    if (ptr[s] != nullptr) { pool.deallocate(ptr[s], bytes[s]); }
  }
}

// Replays the ResNet-50 log: one pass per iteration on one pool; the first (cold) pass
// is timed apart and reported as first_pass_ns_per_event.
void BM_pool_replay(benchmark::State& state, upstream_kind kind) {
  if (kind != upstream_kind::simulated_vmm && !have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  mrstack::test::alloc_log log;
  try {
    log = mrstack::test::read_alloc_log(mrstack::test::data_dir() / "torch_resnet50_train.csv.gz");
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());  // e.g. no sample log where MRSTACK_DATA_DIR points
    return;
  }
  auto upstream = make_upstream(kind);
  mrstack::pool_memory_resource pool{upstream};
  std::vector<void*> address(log.allocation_count, nullptr);
  auto pass = [&] {
    for (auto const& e : log.events) {
      if (e.allocate) {
        address[e.id] = pool.allocate(e.bytes);
      } else {
        pool.deallocate(address[e.id], e.bytes);
      }
    }
  };
  auto const t0 = std::chrono::steady_clock::now();
  pass();
  double const first = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  for (auto _ : state) { pass(); }
  auto const events = static_cast<double>(log.events.size());
  state.counters["ns_per_event"] = benchmark::Counter(static_cast<double>(state.iterations()) * events,
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["first_pass_ns_per_event"] = first / events;
  double peak = static_cast<double>(pool.stats().peak_pool_size);
  if (auto const* range = dynamic_cast<mrstack::virtual_range_resource const*>(upstream.get())) {
    peak = static_cast<double>(range->peak_mapped_bytes());  // physical memory, stranded granules included
  }
  state.counters["footprint_over_peak_live"] = peak / static_cast<double>(log.peak_live_bytes);
}

void first_touch_args(benchmark::internal::Benchmark* b) {
  for (long per_run : {1, 16}) {
    for (long bytes : {2L << 20, 64L << 20, 1L << 30}) { b->Args({bytes, per_run}); }
  }
  b->ArgNames({"bytes", "map_granules"})->Unit(benchmark::kMicrosecond);
}

}  // namespace

// Wall time: mapping calls may sleep in the driver, which CPU time would not count.
BENCHMARK(BM_vmm_first_touch)->Apply(first_touch_args)->UseRealTime();
BENCHMARK(BM_simulated_first_touch)->Apply(first_touch_args)->UseRealTime();
BENCHMARK(BM_cuda_malloc_free)->Arg(2 << 20)->Arg(64 << 20)->Arg(1 << 30)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_vmm_plain_upstream)->Arg(1 << 10)->Arg(64 << 20)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_random, vmm, upstream_kind::vmm)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_random, cuda, upstream_kind::cuda)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_random, simulated_vmm, upstream_kind::simulated_vmm)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_replay, vmm, upstream_kind::vmm)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_replay, cuda, upstream_kind::cuda)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_pool_replay, simulated_vmm, upstream_kind::simulated_vmm)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
