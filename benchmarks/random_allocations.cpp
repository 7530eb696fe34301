// random_allocations: N allocations of random size in [1, M] with random frees (allocate
// with probability 0.73, otherwise free a random live block; the bytes live at once
// capped; everything freed by the end), N in {1e3, 1e4, 1e5}, M in {1, 4, 64, 256, 1024,
// 4096} MiB, one stream. Reports ns_per_call (one allocate or one free; read "95.1n" as
// 95.1 ns) and ns_per_pair.
//
// Resources:
//   <name>/cuda       over the device (cuda: cudaMalloc itself; cuda_async: cudaMallocAsync;
//                     pool, binning, arena, fixed_size over cudaMalloc). Skipped without a GPU.
//                     Live bytes are capped at 40% of the device's free memory (fixed-size
//                     and power-of-two bins can use twice what is asked); the arena takes 80%.
//   <name>/simulated  the same suballocators over the `simulated` upstream (fake addresses):
//                     runs anywhere, measures the algorithms alone. Cap 32 GiB, arena 64 GiB.
//   system/host       the C++ heap (operator new), for scale on a CPU machine (M <= 64 MiB).
// fixed_size replays a sequence of its own: each of its blocks is a whole M-byte block and
// the cap counts it so, so its steps depart from the others' once the cap binds.
// Every suballocator replays the sequence once untimed first (growth happens there).
// Raw cuda/cuda_async run one iteration (cudaMalloc at GiB sizes takes milliseconds).
#include <benchmark/benchmark.h>

#include <allocation_sequence.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <functional>
#include <map>
#include <string>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

enum class where { device, simulated, host };

std::size_t usage_cap(where w) { return w == where::device ? bench::device_free_memory() / 10 * 4 : 32 * GiB; }

resource_ptr upstream_for(where w) {
  switch (w) {
    case where::device: return std::make_shared<cuda_memory_resource>();
    case where::simulated: return std::make_shared<simulated_memory_resource>();
    case where::host: return std::make_shared<system_memory_resource>();
  }
  return nullptr;
}

resource_ptr make_resource(std::string const& name, where w, std::size_t max_bytes) {
  if (name == "cuda") { return std::make_shared<cuda_memory_resource>(); }
  if (name == "cuda_async") { return std::make_shared<cuda_async_memory_resource>(); }
  if (name == "system") { return std::make_shared<system_memory_resource>(); }
  resource_ptr up = upstream_for(w);
  if (name == "pool") { return std::make_shared<pool_memory_resource>(up, 0); }
  if (name == "binning") {
    // Power-of-two bins from 256 B to 4 MiB; larger requests go to a pool over the same upstream.
    auto large = std::make_shared<pool_memory_resource>(up, 0);
    return std::make_shared<binning_memory_resource>(up, 256, 4 * MiB, large);
  }
  if (name == "arena") {
    std::size_t const size = w == where::device ? bench::device_free_memory() / 10 * 8 : 64 * GiB;
    // Keeps what it took between runs, as the pool does: by default an arena gives back
    // what it holds free beyond a quarter of its size once a run has freed everything
    // (tens of GiB at 1e5 live blocks), and the next run would time cudaMalloc/cudaFree
    // of those chunks, not the arena.
    arena_options o;
    o.max_free_bytes = size;
    return std::make_shared<arena_memory_resource>(up, size, o);
  }
  if (name == "fixed_size") {
    return std::make_shared<fixed_size_memory_resource>(up, max_bytes, std::max<std::size_t>(1, 256 * MiB / max_bytes));
  }
  return nullptr;
}

bench::allocation_sequence const& sequence_for(std::size_t n, std::size_t max_bytes, std::size_t cap, bool fixed) {
  static std::map<std::tuple<std::size_t, std::size_t, std::size_t, bool>, bench::allocation_sequence> cache;
  auto key = std::make_tuple(n, max_bytes, cap, fixed);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto charge = [&](std::size_t bytes) { return fixed ? max_bytes : (bytes + 255) / 256 * 256; };
    it = cache.emplace(key, bench::make_sequence(n, max_bytes, cap, charge, n * 131 + max_bytes)).first;
  }
  return it->second;
}

void run(benchmark::State& state, std::string const& name, where w) {
  if (w == where::device && !bench::have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto const n = static_cast<std::size_t>(state.range(0));
  std::size_t const max_bytes = static_cast<std::size_t>(state.range(1)) * MiB;
  bool const fixed = name == "fixed_size";
  auto const& seq = sequence_for(n, max_bytes, usage_cap(w), fixed);
  resource_ptr mr;
  try {
    mr = make_resource(name, w, max_bytes);
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<void*> ptrs(seq.slots);
  stream_view const stream{};
  try {
    if (name != "cuda") { bench::replay(*mr, seq, ptrs, stream); }  // warm up: growth happens here
    for (auto _ : state) { bench::replay(*mr, seq, ptrs, stream); }
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["ns_per_call"] = benchmark::Counter(static_cast<double>(seq.ops.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["ns_per_pair"] = benchmark::Counter(static_cast<double>(seq.allocations),
                                                     benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  if (auto const* pool = dynamic_cast<pool_memory_resource const*>(mr.get())) {
    state.counters["pool_MiB"] = static_cast<double>(pool->stats().peak_pool_size) / MiB;
  }
}

void register_all() {
  std::vector<std::int64_t> const ns{1000, 10000, 100000};
  std::vector<std::int64_t> const ms{1, 4, 64, 256, 1024, 4096};
  struct entry {
    std::string name;
    where w;
    std::string upstream;
  };
  std::vector<entry> const entries{
      {"cuda", where::device, "cuda"},           {"cuda_async", where::device, "cuda"},
      {"pool", where::device, "cuda"},           {"binning", where::device, "cuda"},
      {"arena", where::device, "cuda"},          {"fixed_size", where::device, "cuda"},
      {"pool", where::simulated, "simulated"},   {"binning", where::simulated, "simulated"},
      {"arena", where::simulated, "simulated"},  {"fixed_size", where::simulated, "simulated"},
      {"system", where::host, "host"},
  };
  for (auto const& e : entries) {
    auto* b = benchmark::RegisterBenchmark(("random_allocations/" + e.name + "/" + e.upstream).c_str(),
                                           [e](benchmark::State& s) { run(s, e.name, e.w); });
    // Wall time: the rates below count time a call spends blocked (cudaFree waits for the
    // device), which CPU time would leave out.
    b->ArgNames({"N", "M_MiB"})->Unit(benchmark::kMillisecond)->UseRealTime();
    for (auto n : ns) {
      for (auto m : ms) {
        if (e.name == "fixed_size" && m > 256) { continue; }  // one block per request of up to M: sizes must fit
        if (e.name == "system" && m > 64) { continue; }
        b->Args({n, m});
      }
    }
    if (e.name == "cuda" || e.name == "cuda_async") { b->Iterations(1); }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
