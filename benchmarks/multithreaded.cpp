// multithreaded: T threads (1, 2, 4, 8, 16) share one resource; each replays its own
// pre-generated sequence (random sizes in [1 B, 1 MiB], allocate with probability 0.73,
// otherwise free a random live block of its own) on its per-thread default stream.
// Reports calls_per_s: allocate-or-free calls per second, all threads together (wall
// time from a common start to the last thread's end), what the CUDA stream-ordering
// calls cost per call (support/stream_sync_counters.hpp), and upstream_calls_per_run: the
// suballocator's calls to its upstream (growth, give-back) in a timed run.
//
// multithreaded_one_stream/<name>: 16 threads, all naming one shared non-blocking stream.
// multithreaded_four_streams/<name>: 16 threads on 4 shared non-blocking streams (thread t
// on stream t mod 4), so that four threads meet on each and several streams are in use.
//
// Resources: <name>/cuda over the device (arena, pool, binning, fixed_size over cudaMalloc;
// cuda_async; cuda), skipped without a GPU; <name>/simulated, the suballocators over fake
// addresses, runs anywhere. Threads beyond the machine's cores measure contention, not speed.
// fixed_size's sequences are its own: the cap counts each of its blocks as a whole 1 MiB.
#include <benchmark/benchmark.h>

#include <allocation_sequence.hpp>
#include <stream_sync_counters.hpp>
#include <threads_together.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t allocations_per_thread = 20000;

/// Forwards to its upstream and counts the calls: growth or give-back inside the timed
/// runs (a cudaMalloc or cudaFree under a suballocator's lock) is then seen, not guessed.
class counting_upstream final : public memory_resource {
 public:
  explicit counting_upstream(resource_ptr up) : up_{std::move(up)} {}
  [[nodiscard]] std::size_t calls() const noexcept { return calls_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    return up_->allocate(bytes, stream, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    up_->deallocate(p, bytes, stream, alignment);
  }
  std::string do_name() const override { return up_->name(); }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
  resource_ptr up_;
  std::atomic<std::size_t> calls_{0};
};

resource_ptr make_resource(std::string const& name, bool device, std::size_t budget,
                           std::shared_ptr<counting_upstream>& counted) {
  if (name == "cuda") { return std::make_shared<cuda_memory_resource>(); }
  if (name == "cuda_async") { return std::make_shared<cuda_async_memory_resource>(); }
  counted = std::make_shared<counting_upstream>(device ? resource_ptr{std::make_shared<cuda_memory_resource>()}
                                                       : resource_ptr{std::make_shared<simulated_memory_resource>()});
  resource_ptr up = counted;
  if (name == "arena") {
    // Keeps what it took between runs, as the pool does (by default it would give all but
    // 256 MiB back when a run frees everything, and the next run would grow again).
    arena_options o;
    o.max_free_bytes = budget;
    return std::make_shared<arena_memory_resource>(up, budget, o);
  }
  if (name == "pool") { return std::make_shared<pool_memory_resource>(up, 0); }
  if (name == "binning") {
    return std::make_shared<binning_memory_resource>(up, 256, 1 * MiB, std::make_shared<pool_memory_resource>(up, 0));
  }
  if (name == "fixed_size") { return std::make_shared<fixed_size_memory_resource>(up, 1 * MiB, 256); }
  return nullptr;
}

/// `shared_streams`: 0, each thread on its per-thread default stream; else thread t names
/// created stream t mod shared_streams.
void run(benchmark::State& state, std::string const& name, bool device, std::size_t shared_streams) {
  if (device && !bench::have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto const threads = static_cast<std::size_t>(state.range(0));
  // Memory: the arena gets 80% of free device memory; sequences cap live bytes at half of
  // that (size classes round up), split between the threads.
  std::size_t const budget = device ? bench::device_free_memory() / 10 * 8 : 64 * GiB;
  std::size_t const per_thread_cap = budget / 2 / threads;
  bool const fixed = name == "fixed_size";
  std::vector<bench::allocation_sequence> seqs;
  for (std::size_t t = 0; t < threads; ++t) {
    auto charge = [&](std::size_t bytes) { return fixed ? MiB : (bytes + 255) / 256 * 256 * 5 / 4; };
    seqs.push_back(bench::make_sequence(allocations_per_thread, 1 * MiB, per_thread_cap, charge, 1000 + t));
  }
  resource_ptr mr;
  std::shared_ptr<counting_upstream> counted;  // null for cuda and cuda_async
  try {
    mr = make_resource(name, device, budget, counted);
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::size_t calls = 0;
  for (auto const& s : seqs) { calls += s.ops.size(); }
  // The shared streams: non-blocking streams the threads name (fake handles without a GPU).
  std::vector<cudaStream_t> shared(shared_streams);
  for (std::size_t i = 0; i < shared_streams; ++i) {
    shared[i] = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x10000} * (i + 1));
    if (device) { MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&shared[i], cudaStreamNonBlocking)); }
  }
  std::string error;
  auto run_once = [&]() -> double {
    return bench::run_threads_together(
        threads, [&](std::size_t t) { return std::vector<void*>(seqs[t].slots); },
        [&](std::size_t t, std::vector<void*>& ptrs) {
          bench::replay(*mr, seqs[t], ptrs,
                        shared.empty() ? stream_view::per_thread() : stream_view{shared[t % shared.size()]});
        },
        error);
  };
  if (name != "cuda" && run_once() < 0) {  // warm up
    state.SkipWithError(("a thread's call failed: " + error).c_str());
    return;
  }
  stream_sync_profile const before = cuda_stream_sync_profile();
  std::size_t const upstream_before = counted ? counted->calls() : 0;
  double timed_seconds = 0;
  for (auto _ : state) {
    double const seconds = run_once();
    if (seconds < 0) {
      state.SkipWithError(("a thread's call failed: " + error).c_str());
      return;
    }
    state.SetIterationTime(seconds);
    timed_seconds += seconds;
  }
  state.counters["calls_per_s"] = benchmark::Counter(static_cast<double>(calls), benchmark::Counter::kIsIterationInvariantRate);
  if (counted) {
    state.counters["upstream_calls_per_run"] =
        static_cast<double>(counted->calls() - upstream_before) / static_cast<double>(state.iterations());
  }
  bench::report_stream_sync(state, before, static_cast<double>(calls) * static_cast<double>(state.iterations()),
                            static_cast<double>(threads), timed_seconds);
  mr.reset();
  for (cudaStream_t s : shared) {
    if (device) { (void)cudaStreamDestroy(s); }
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (std::string const name : {"arena", "pool", "binning", "fixed_size", "cuda_async", "cuda"}) {
    for (bool device : {true, false}) {
      if (!device && (name == "cuda" || name == "cuda_async")) { continue; }
      std::string const label = "multithreaded/" + name + (device ? "/cuda" : "/simulated");
      auto* b = benchmark::RegisterBenchmark(label.c_str(), [name, device](benchmark::State& s) { run(s, name, device, 0); });
      b->ArgName("threads")->UseManualTime()->Unit(benchmark::kMillisecond);
      for (std::int64_t t : {1, 2, 4, 8, 16}) { b->Arg(t); }
      if (name == "cuda" || name == "cuda_async") { b->Iterations(1); }
    }
  }
  // 16 threads naming one or four shared streams (instead of each its per-thread default stream).
  for (auto const& [group, streams] : {std::pair{"multithreaded_one_stream/", 1}, std::pair{"multithreaded_four_streams/", 4}}) {
    for (std::string const name : {"pool", "binning", "arena"}) {
      for (bool device : {true, false}) {
        std::string const label = group + name + (device ? "/cuda" : "/simulated");
        std::size_t const n = static_cast<std::size_t>(streams);
        auto* b = benchmark::RegisterBenchmark(label.c_str(), [name, device, n](benchmark::State& s) { run(s, name, device, n); });
        b->ArgName("threads")->UseManualTime()->Unit(benchmark::kMillisecond)->Arg(16);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
