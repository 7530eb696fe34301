// Replays an allocation log against stacks under Google Benchmark, reporting the time per
// event: for profiling one stack on one workload (perf, nsys) with benchmark's statistics.
//
//   bench_replay [--log FILE] [--resource SPEC]... [--simulate] [--warmup] [--per-thread]
//                [benchmark flags]
//
// --log and --resource are taken out of argv before benchmark::Initialize (so they mix
// with --benchmark_* flags); without them the environment decides: MRSTACK_REPLAY_LOG
// (default: the sample log data/torch_resnet50_train.csv.gz) and MRSTACK_RESOURCE
// (default: pool > cuda, or cuda while no pool is registered). Several --resource give
// several benchmarks. Without a CUDA device (or with --simulate) every stack's bottom is
// simulated memory, and the benchmark's name says so.
//
// Each iteration replays the whole log on a freshly built stack, timed by the replay
// engine itself (manual time: building and tearing down the stack are not counted).
// --warmup times a second replay on the same stack instead (its steady state).
// --per-thread replays in per-thread order (each log thread at full speed) instead of strict.
// Counters: ns_per_event (mean, wall), ns_per_call (mean time inside the stack), events, peak_live_MiB, peak_footprint_MiB, footprint_ratio.
#include <benchmark/benchmark.h>

#include <mrstack/replay/replay.hpp>
#include <mrstack/spec_registry.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

struct bench_config {
  std::string log_path;
  std::vector<std::string> resources;
  bool simulate = false;
  bool warmup = false;
  bool per_thread = false;
};

/// A flag of ours used wrongly: its message, for main to print (exit status 2).
struct flag_error {
  std::string what;
};

/// Takes --log, --resource, --simulate, --warmup and --per-thread out of argv (both
/// "--x value" and "--x=value"). A value flag without a value, or with an empty one, is a
/// flag_error: an empty --log had fallen back to the default log without a word.
bench_config take_own_flags(int& argc, char** argv) {
  bench_config config;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    auto value_of = [&](char const* flag) -> std::optional<std::string> {
      std::string const f = flag;
      std::optional<std::string> value;
      if (arg == f) {
        if (i + 1 == argc) { throw flag_error{f + " needs a value (" + f + " VALUE or " + f + "=VALUE)"}; }
        value = argv[++i];
      } else if (arg.rfind(f + "=", 0) == 0) {
        value = arg.substr(f.size() + 1);
      }
      if (value && value->empty()) { throw flag_error{f + " has an empty value"}; }
      return value;
    };
    if (auto v = value_of("--log")) {
      config.log_path = *v;
    } else if (auto r = value_of("--resource")) {
      config.resources.push_back(*r);
    } else if (arg == "--simulate") {
      config.simulate = true;
    } else if (arg == "--warmup") {
      config.warmup = true;
    } else if (arg == "--per-thread") {
      config.per_thread = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (config.log_path.empty()) {
    char const* env = std::getenv("MRSTACK_REPLAY_LOG");
    config.log_path = env != nullptr && *env != '\0'
                          ? std::string{env}
                          : (std::filesystem::path{__FILE__}.parent_path().parent_path() / "data" /
                             "torch_resnet50_train.csv.gz")
                                .string();
  }
  if (config.resources.empty()) {
    char const* env = std::getenv("MRSTACK_RESOURCE");
    if (env != nullptr && *env != '\0') {
      config.resources.emplace_back(env);
    } else {
      config.resources.emplace_back(mrstack::find_resource("pool") != nullptr ? "pool > cuda" : "cuda");
    }
  }
  return config;
}

void replay_benchmark(benchmark::State& state, std::shared_ptr<mrstack::allocation_log const> log,
                      std::string const& spec, mrstack::replay_options const& options) {
  double total_seconds = 0;
  double total_ns_per_call = 0;
  mrstack::replay_result last;
  for (auto _ : state) {
    last = mrstack::replay_stack(*log, spec, options);
    if (!last.error.empty() || last.failures > 0) {
      state.SkipWithError(last.error.empty() ? ("allocation refused: " + last.first_failure_message).c_str()
                                             : last.error.c_str());
      return;
    }
    state.SetIterationTime(last.seconds.front());
    total_seconds += last.seconds.front();
    total_ns_per_call += last.ns_per_call;
  }
  double const events = static_cast<double>(log->events.size());
  state.counters["ns_per_event"] = total_seconds * 1e9 / (events * static_cast<double>(state.iterations()));
  state.counters["ns_per_call"] = total_ns_per_call / static_cast<double>(state.iterations());
  state.counters["events"] = events;
  state.counters["peak_live_MiB"] = static_cast<double>(last.peak_live_bytes) / (1 << 20);
  state.counters["peak_footprint_MiB"] = static_cast<double>(last.peak_footprint_bytes) / (1 << 20);
  state.counters["footprint_ratio"] = last.footprint_ratio();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(log->events.size()));
}

}  // namespace

int main(int argc, char** argv) {
  bench_config config;
  try {
    config = take_own_flags(argc, argv);
  } catch (flag_error const& e) {
    std::fprintf(stderr, "bench_replay: %s\n", e.what.c_str());
    return 2;
  }
  std::shared_ptr<mrstack::allocation_log const> log;
  try {
    log = std::make_shared<mrstack::allocation_log const>(mrstack::read_allocation_log(config.log_path));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "bench_replay: %s\n", e.what());
    return 2;
  }
  mrstack::replay_options options;
  options.simulate = config.simulate || !mrstack::probe_device().available;
  options.warmup = config.warmup;
  if (config.per_thread) { options.order = mrstack::replay_order::per_thread; }
  for (auto const& spec : config.resources) {
    try {
      (void)mrstack::replay_spec_for(spec, options.simulate, options.simulated_capacity);
    } catch (mrstack::spec_error const& e) {
      std::fprintf(stderr, "bench_replay: --resource: %s\n", e.what());
      return 2;
    }
    std::string const name = std::string{options.simulate ? "replay_simulated/" : "replay/"} + spec;
    benchmark::RegisterBenchmark(name.c_str(), [log, spec, options](benchmark::State& state) {
      replay_benchmark(state, log, spec, options);
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 2; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
