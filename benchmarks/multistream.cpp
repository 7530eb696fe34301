// multistream: S threads (1, 2, 4, 8), each on its own non-blocking stream, share one
// stack. Each thread takes 20,000 random steps — allocate (1 B to 64 MiB, uniform) or
// free a random live block of its own, with equal odds — with the live bytes of all
// threads capped at 8 GiB (8 GiB / S per thread; an allocation that would pass the cap
// frees instead); then frees what it still holds. Reports:
//   calls_per_s   allocate-or-free calls per second, all threads together
//   peak_GiB      the most the stack held from the device at once (its footprint):
//                 a footprint_meter above cuda/simulated, the peak mapped memory of
//                 vmm/simulated_vmm, the driver pool's reserved high-water mark of cuda_async
//   peak_over_cap peak_GiB / 8 GiB
//   cuda_syncs_per_call, records_per_call, waits_per_call, cuda_sync_share: the CUDA
//                 stream-ordering calls of the timed runs (support/stream_sync_counters.hpp)
//
// Stacks are built from specs (mrstack::make_stack). With a GPU: pool > cuda, pool > vmm,
// arena > cuda, arena > vmm, cuda_async, on streams from cudaStreamCreateWithFlags(cudaStreamNonBlocking).
// Anywhere: the same suballocators over `simulated` / `simulated_vmm` (labelled
// .../simulated), on distinct fake stream handles (no CUDA call is made).
// multistream_one_thread/...: the same steps on the same S streams taken by one thread in
// turn, so the stack's cost with S streams is seen apart from what threads add. Its
// footprint is not the threaded one's: every stream's live set is there at once (threads
// on fewer cores than S run partly one after another), and a stream asked for memory is
// driven by the asking thread itself, so the pool grows instead of waiting for its park.
// --stack=LABEL=SPEC adds a stack of one's own (repeatable), e.g. to try a parameter; its
// footprint is read as the built-in stacks' are, so put footprint_meter above a cuda or
// simulated bottom.
#include <benchmark/benchmark.h>

#include <allocation_sequence.hpp>
#include <multistream_steps.hpp>
#include <threads_together.hpp>
#include <stream_sync_counters.hpp>

#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

using bench::live_cap;
using bench::make_steps;
using bench::step;
constexpr std::size_t GiB = std::size_t{1} << 30;

/// Reads the stack's peak footprint, wherever it is best measured.
class footprint_probe {
 public:
  explicit footprint_probe(memory_resource& top) {
    for (memory_resource* layer = &top; layer != nullptr; layer = layer->upstream()) {
      if (auto* m = dynamic_cast<footprint_meter*>(layer)) { meter_ = m; }
    }
    driver_pool_ = dynamic_cast<cuda_async_memory_resource*>(&bottom_of_stack(top));
    range_ = dynamic_cast<virtual_range_resource*>(&bottom_of_stack(top));
  }
  [[nodiscard]] bool has_source() const noexcept { return meter_ != nullptr || driver_pool_ != nullptr || range_ != nullptr; }
  void reset() {
    if (driver_pool_ != nullptr) {
      std::uint64_t zero = 0;
      MRSTACK_CUDA_TRY(cudaMemPoolSetAttribute(driver_pool_->pool_handle(), cudaMemPoolAttrReservedMemHigh, &zero));
    } else if (range_ != nullptr) {
      range_->reset_peak_mapped_bytes();
    } else if (meter_ != nullptr) {
      meter_->reset_peak();
    }
  }
  [[nodiscard]] std::size_t peak() const {
    if (driver_pool_ != nullptr) {
      std::uint64_t v = 0;
      MRSTACK_CUDA_TRY(cudaMemPoolGetAttribute(driver_pool_->pool_handle(), cudaMemPoolAttrReservedMemHigh, &v));
      return static_cast<std::size_t>(v);
    }
    if (range_ != nullptr) { return range_->peak_mapped_bytes(); }
    return meter_ != nullptr ? meter_->peak_bytes_held() : 0;
  }

 private:
  footprint_meter* meter_ = nullptr;
  cuda_async_memory_resource* driver_pool_ = nullptr;
  virtual_range_resource* range_ = nullptr;
};

// One non-blocking stream per thread; without a device, distinct fake handles (the
// simulated upstreams never hand them to CUDA).
std::vector<cudaStream_t> make_streams(std::size_t threads, bool device) {
  std::vector<cudaStream_t> streams(threads);
  for (std::size_t t = 0; t < threads; ++t) {
    if (device) {
      MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
    } else {
      streams[t] = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x10000} * (t + 1));
    }
  }
  return streams;
}

void take_steps(memory_resource& mr, std::vector<step> const& steps, std::vector<void*>& ptrs, stream_view s) {
  for (auto const& st : steps) {
    if (st.allocate) {
      ptrs[st.slot] = mr.allocate(st.bytes, s);
    } else {
      mr.deallocate(ptrs[st.slot], st.bytes, s);
    }
  }
}

/// The stack of `spec`, or null after skipping the benchmark (no GPU for a device stack,
/// or a stack that cannot be built).
resource_ptr build_stack(benchmark::State& state, std::string const& spec, bool device) {
  if (device && !bench::have_device()) {
    state.SkipWithError("no CUDA device");
    return nullptr;
  }
  try {
    return make_stack(spec);
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return nullptr;
  }
}

/// The S streams' steps, one thread each, started together; seconds until the last
/// finished, or -1 with `error` set when a call failed.
double run_threads(memory_resource& mr, std::vector<std::vector<step>> const& steps,
                   std::vector<std::size_t> const& slots, std::vector<cudaStream_t> const& streams, std::string& error) {
  return bench::run_threads_together(
      steps.size(), [&](std::size_t t) { return std::vector<void*>(slots[t]); },
      [&](std::size_t t, std::vector<void*>& ptrs) { take_steps(mr, steps[t], ptrs, stream_view{streams[t]}); }, error);
}

/// The same steps on the same streams, taken by ONE thread in turn (a step of stream 0,
/// one of stream 1, ...): the stack's own cost with S streams and no thread contending.
double run_one_thread(memory_resource& mr, std::vector<std::vector<step>> const& steps,
                      std::vector<std::size_t> const& slots, std::vector<cudaStream_t> const& streams, std::string& error) {
  std::vector<std::vector<void*>> ptrs(steps.size());
  for (std::size_t t = 0; t < steps.size(); ++t) { ptrs[t].resize(slots[t]); }
  std::vector<std::size_t> next(steps.size(), 0);
  auto const start = std::chrono::steady_clock::now();
  try {
    for (bool any = true; any;) {
      any = false;
      for (std::size_t t = 0; t < steps.size(); ++t) {
        if (next[t] == steps[t].size()) { continue; }
        any = true;
        step const& st = steps[t][next[t]++];
        if (st.allocate) {
          ptrs[t][st.slot] = mr.allocate(st.bytes, stream_view{streams[t]});
        } else {
          mr.deallocate(ptrs[t][st.slot], st.bytes, stream_view{streams[t]});
        }
      }
    }
  } catch (std::exception const& e) {
    error = e.what();
    return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run(benchmark::State& state, std::string const& spec, bool device, bool one_thread) {
  resource_ptr const mr = build_stack(state, spec, device);
  if (!mr) { return; }
  auto const threads = static_cast<std::size_t>(state.range(0));
  std::vector<std::vector<step>> steps(threads);
  std::vector<std::size_t> slots(threads);
  std::size_t calls = 0;
  for (std::size_t t = 0; t < threads; ++t) {
    steps[t] = make_steps(live_cap / threads, 7000 + t, slots[t]);
    calls += steps[t].size();
  }
  footprint_probe probe{*mr};
  if (!probe.has_source()) {
    state.SkipWithError("no footprint to read: put footprint_meter above a cuda or simulated bottom, e.g. "
                        "'arena > footprint_meter > cuda'");
    return;
  }
  std::vector<cudaStream_t> const streams = make_streams(threads, device);
  std::string error;
  auto run_once = [&]() -> double {
    return one_thread ? run_one_thread(*mr, steps, slots, streams, error) : run_threads(*mr, steps, slots, streams, error);
  };
  bool ok = run_once() >= 0;  // warm-up: what it leaves cached counts, its transient peak does not
  std::size_t peak = 0;
  if (ok) { probe.reset(); }
  stream_sync_profile const before = cuda_stream_sync_profile();
  double timed_seconds = 0;
  for (auto _ : state) {
    if (!ok) { break; }
    double const seconds = run_once();
    ok = seconds >= 0;
    if (ok) {
      state.SetIterationTime(seconds);
      timed_seconds += seconds;
    }
  }
  if (ok) { peak = probe.peak(); }
  for (cudaStream_t s : streams) { if (device) { (void)cudaStreamDestroy(s); } }
  if (!ok) {
    state.SkipWithError(("a thread's call failed: " + error).c_str());
    return;
  }
  state.counters["calls_per_s"] =
      benchmark::Counter(static_cast<double>(calls), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GiB"] = static_cast<double>(peak) / GiB;
  state.counters["peak_over_cap"] = static_cast<double>(peak) / live_cap;
  bench::report_stream_sync(state, before, static_cast<double>(calls) * static_cast<double>(state.iterations()),
                            one_thread ? 1.0 : static_cast<double>(threads), timed_seconds);
}

struct stack_entry {
  std::string label;
  std::string spec;
  bool device;
};

/// `--stack=LABEL=SPEC`: a stack of one's own, checked now (a bad spec or label is an error
/// naming it, not four skipped rows); on a GPU unless its bottom is simulated or `system`.
stack_entry parse_user_stack(std::string_view arg, std::vector<stack_entry> const& taken) {
  std::string_view const rest = arg.substr(std::string_view{"--stack="}.size());
  std::size_t const equals = rest.find('=');
  if (equals == std::string_view::npos || equals == 0 || equals + 1 == rest.size()) {
    throw std::invalid_argument("expected --stack=LABEL=SPEC, e.g. --stack='arena4=arena(growth_divisor=4) > footprint_meter > cuda'");
  }
  std::string label{rest.substr(0, equals)};
  std::string spec{rest.substr(equals + 1)};
  if (label.find('/') != std::string::npos) {
    throw std::invalid_argument("label '" + label + "' holds a '/', which separates a benchmark name's parts");
  }
  for (auto const& t : taken) {
    if (t.label == label) { throw std::invalid_argument("label '" + label + "' is already a stack's"); }
  }
  stack_spec const parsed = parse_stack_spec(spec);
  check_stack_spec(parsed);
  std::string const& bottom = parsed.layers.back().name;
  bool const device = bottom != "simulated" && bottom != "simulated_vmm" && bottom != "system";
  return {std::move(label), std::move(spec), device};
}

}  // namespace

int main(int argc, char** argv) {
  // The simulated device has 80 GiB, like a GPU of the class the targets are set on.
  std::vector<stack_entry> stacks = {
      {"pool>cuda", "pool > footprint_meter > cuda", true},
      {"pool>vmm", "pool > vmm", true},
      {"pool(eager_events)>cuda", "pool(eager_events) > footprint_meter > cuda", true},
      {"pool(eager_events)>vmm", "pool(eager_events) > vmm", true},
      // Fewer parks: one CUDA event per 1/64 of the pool freed instead of 1/1024.
      {"pool(park_divisor=64)>cuda", "pool(park_divisor=64) > footprint_meter > cuda", true},
      {"pool(park_divisor=64)>vmm", "pool(park_divisor=64) > vmm", true},
      {"arena>cuda", "arena > footprint_meter > cuda", true},
      {"arena>vmm", "arena > vmm", true},  // the global arena grown in place
      {"cuda_async", "cuda_async", true},
      {"pool>simulated", "pool > footprint_meter > simulated(capacity=80GiB)", false},
      {"pool>simulated_vmm", "pool > simulated_vmm(capacity=80GiB)", false},
      {"pool(eager_events)>simulated", "pool(eager_events) > footprint_meter > simulated(capacity=80GiB)", false},
      {"pool(eager_events)>simulated_vmm", "pool(eager_events) > simulated_vmm(capacity=80GiB)", false},
      {"pool(park_divisor=64)>simulated", "pool(park_divisor=64) > footprint_meter > simulated(capacity=80GiB)", false},
      {"arena>simulated", "arena > footprint_meter > simulated(capacity=80GiB)", false},
      {"arena>simulated_vmm", "arena > simulated_vmm(capacity=80GiB)", false},
  };
  // --stack=LABEL=SPEC (repeatable), taken out of argv before Google Benchmark reads it.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view const arg{argv[i]};
    if (!arg.starts_with("--stack=")) {
      argv[kept++] = argv[i];
      continue;
    }
    try {
      stacks.push_back(parse_user_stack(arg, stacks));
    } catch (std::exception const& e) {
      std::fprintf(stderr, "bench_multistream: %s: %s\n", argv[i], e.what());
      return 1;
    }
  }
  argc = kept;
  for (bool const one_thread : {false, true}) {
    for (auto const& s : stacks) {
      std::string const name = (one_thread ? "multistream_one_thread/" : "multistream/") + s.label;
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [spec = s.spec, device = s.device, one_thread](benchmark::State& st) {
        run(st, spec, device, one_thread);
      });
      b->ArgName("streams")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
      for (std::int64_t n : {1, 2, 4, 8}) { b->Arg(n); }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
