// What the expandable virtual-memory upstream costs on a device:
// - BM_vmm_first_touch: commit + decommit of N bytes (map/unmap every granule through the
//   driver), by granules per physical allocation — the price of a granule's first touch,
//   which a pool pays once and then amortizes over every reuse.
// - BM_cuda_malloc_free: cudaMalloc + cudaFree of the same sizes, the baseline.
// - BM_vmm_plain_upstream: allocate + deallocate straight from vmm (no pool above).
// The simulated twin runs the same code without a device (BM_simulated_*), which shows
// the bookkeeping's own share of the cost.
#include <benchmark/benchmark.h>

#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

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

void first_touch_args(benchmark::internal::Benchmark* b) {
  for (long per_run : {1, 16}) {
    for (long bytes : {2L << 20, 64L << 20, 1L << 30}) { b->Args({bytes, per_run}); }
  }
  b->ArgNames({"bytes", "map_granules"})->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_vmm_first_touch)->Apply(first_touch_args);
BENCHMARK(BM_simulated_first_touch)->Apply(first_touch_args);
BENCHMARK(BM_cuda_malloc_free)->Arg(2 << 20)->Arg(64 << 20)->Arg(1 << 30)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_vmm_plain_upstream)->Arg(1 << 10)->Arg(64 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
