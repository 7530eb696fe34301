// Cost of one allocate+free pair straight from each upstream: the baseline every
// suballocator is measured against. CUDA upstreams are skipped (with a message) without a device.
#include <benchmark/benchmark.h>

#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <memory>

namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename Make>
void allocate_free_pair(benchmark::State& state, Make make, bool needs_device) {
  if (needs_device && !have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto mr = make();
  auto const bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = mr->allocate(bytes);
    benchmark::DoNotOptimize(p);
    mr->deallocate(p, bytes);
  }
  state.counters["ns_per_pair"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_cuda(benchmark::State& s) { allocate_free_pair(s, [] { return std::make_unique<mrstack::cuda_memory_resource>(); }, true); }
void BM_cuda_async(benchmark::State& s) {
  allocate_free_pair(s, [] { return std::make_unique<mrstack::cuda_async_memory_resource>(); }, true);
}
void BM_system(benchmark::State& s) { allocate_free_pair(s, [] { return std::make_unique<mrstack::system_memory_resource>(); }, false); }
void BM_simulated(benchmark::State& s) {
  allocate_free_pair(s, [] { return std::make_unique<mrstack::simulated_memory_resource>(); }, false);
}

}  // namespace

// Wall time: cudaFree and cudaFreeAsync may block, which CPU time would not count.
BENCHMARK(BM_cuda)->Arg(1 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_cuda_async)->Arg(1 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_system)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_simulated)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime();
BENCHMARK_MAIN();
