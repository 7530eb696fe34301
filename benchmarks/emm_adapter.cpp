// What the EMM adapter adds to an allocate+free pair: its token table and lock, over a
// stand-in resource that returns the same address and does nothing else (so only the
// adapter is measured), next to that resource called directly. Single thread and 4
// threads (contention on the adapter's one mutex).
#include <benchmark/benchmark.h>

#include <mrstack/emm/adapter.hpp>

#include "span_rate.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace {

// Hands out one fixed address and frees nothing: the floor under the adapter.
class fixed_address_resource final : public mrstack::memory_resource {
 private:
  void* do_allocate(std::size_t, std::size_t, mrstack::stream_view) override { return address_; }
  void do_deallocate(void*, std::size_t, std::size_t, mrstack::stream_view) override {}
  std::string do_name() const override { return "fixed_address"; }
  mrstack::memory_kind do_kind() const noexcept override { return mrstack::memory_kind::none; }
  void* address_ = reinterpret_cast<void*>(std::uintptr_t{1} << 40);
};

void BM_resource_directly(benchmark::State& state) {
  auto mr = std::make_shared<fixed_address_resource>();
  for (auto _ : state) {
    void* p = mr->allocate(256);
    benchmark::DoNotOptimize(p);
    mr->deallocate(p, 256);
  }
}

std::shared_ptr<mrstack::emm::adapter> shared_adapter;

void BM_adapter_memalloc_free(benchmark::State& state) {
  if (state.thread_index() == 0) {
    shared_adapter = std::make_shared<mrstack::emm::adapter>(std::make_shared<fixed_address_resource>());
  }
  // Other threads wait for thread 0's setup at the start of the timed loop (Benchmark's barrier).
  mrstack::bench::span_rate rate;
  bool first = true;
  for (auto _ : state) {
    if (first) {
      rate.start();
      first = false;
    }
    auto m = shared_adapter->memalloc(256);
    benchmark::DoNotOptimize(m.token);
    benchmark::DoNotOptimize(shared_adapter->free(m.token));
  }
  rate.report(state, "pairs_per_s");  // all threads' pairs over the run's span
  if (state.thread_index() == 0) { state.counters["outstanding_after"] = static_cast<double>(shared_adapter->outstanding_count()); }
}

void BM_adapter_with_live_allocations(benchmark::State& state) {
  // The table's cost does not grow with how many allocations are live.
  mrstack::emm::adapter a{std::make_shared<fixed_address_resource>()};
  std::vector<std::uint64_t> live;
  for (long i = 0; i < state.range(0); ++i) { live.push_back(a.memalloc(256).token); }
  for (auto _ : state) {
    auto m = a.memalloc(256);
    benchmark::DoNotOptimize(a.free(m.token));
  }
  for (auto t : live) { (void)a.free(t); }
}

}  // namespace

BENCHMARK(BM_resource_directly);
BENCHMARK(BM_adapter_memalloc_free)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_adapter_with_live_allocations)->Arg(0)->Arg(1000)->Arg(1000000);
BENCHMARK_MAIN();
