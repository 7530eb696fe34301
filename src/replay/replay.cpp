// The replay engine: one parsed log, one stack, timed runs (the schedulers are in
// replay_workers.cpp).
#include "replay_run.hpp"
#include "spec/spec_detail.hpp"

#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include <cuda_runtime_api.h>

namespace mrstack {

char const* to_string(replay_order order) noexcept {
  return order == replay_order::strict ? "strict" : "per-thread";
}

namespace replay_detail {

bool device_present() {
  int count = 0;
  bool const ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

std::size_t built_stack::footprint_now() const {
  if (driver_pool != nullptr) { return driver_pool->reserved_bytes(); }
  if (range != nullptr) { return range->mapped_bytes(); }
  return meter != nullptr ? meter->bytes_held() : 0;
}

void built_stack::start_peak() const {
  if (driver_pool != nullptr) {
    driver_pool->reset_peak_reserved_bytes();
  } else if (range != nullptr) {
    range->reset_peak_mapped_bytes();
  } else if (meter != nullptr) {
    meter->reset_peak();
  }
}

std::size_t built_stack::peak() const {
  if (driver_pool != nullptr) { return driver_pool->peak_reserved_bytes(); }
  if (range != nullptr) { return range->peak_mapped_bytes(); }
  return meter != nullptr ? meter->peak_bytes_held() : 0;
}

std::size_t built_stack::upstream_calls() const {
  if (driver_pool != nullptr) { return 0; }
  if (range != nullptr) { return range->map_calls(); }
  return meter != nullptr ? meter->upstream_allocations() : 0;
}

built_stack build_replay_stack(stack_spec const& spec, replay_options const& options) {
  build_options build;
  if (options.simulate) { build.percent_base = options.simulated_capacity; }
  built_stack b;
  b.top = build_stack(spec, build);
  for (memory_resource* layer = b.top.get(); layer != nullptr; layer = layer->upstream()) {
    if (auto* m = dynamic_cast<footprint_meter*>(layer)) { b.meter = m; }
  }
  b.driver_pool = dynamic_cast<cuda_async_memory_resource*>(&bottom_of_stack(*b.top));
  b.range = dynamic_cast<virtual_range_resource*>(&bottom_of_stack(*b.top));
  if (b.driver_pool != nullptr) {
    b.measured_by = "cuda_async pool's reserved high-water mark";
  } else if (b.range != nullptr) {
    b.measured_by = b.range->name() + "'s peak mapped physical memory";
  } else if (b.meter != nullptr) {
    b.measured_by = "footprint_meter above " + bottom_of_stack(*b.top).name();
  }
  return b;
}

}  // namespace replay_detail

namespace {

using namespace replay_detail;

/// Polls a run's progress and reports it until told to stop.
class progress_monitor {
 public:
  progress_monitor(replay_options const& options, run_state const& s, bool strict) {
    if (!options.progress) { return; }
    try {
      thread_ = std::thread{[this, &options, &s, strict] {
        std::size_t const total = s.log->events.size();
        std::unique_lock lock{mutex_};
        while (!wake_.wait_for(lock, std::chrono::milliseconds{200}, [this] { return finished_; })) {
          std::size_t const done = strict ? s.next.load(std::memory_order_relaxed) : s.done.load(std::memory_order_relaxed);
          try {
            options.progress(std::max(done, s.done.load(std::memory_order_relaxed)), total);
          } catch (...) {
            return;  // a report that throws ends the reports, not the program (this is its own thread)
          }
        }
      }};
    } catch (...) {
      // No thread for the monitor (refused, or no memory for it): the replay runs without
      // progress reports.
    }
  }
  ~progress_monitor() {
    if (!thread_.joinable()) { return; }
    {
      std::lock_guard lock{mutex_};
      finished_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  progress_monitor(progress_monitor const&) = delete;
  progress_monitor& operator=(progress_monitor const&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool finished_ = false;
  std::thread thread_;
};

struct one_run {
  double seconds = 0;
  double ns_per_call = 0;
  unsigned workers = 1;
  std::string workers_note;
  std::size_t peak_footprint = 0;
  std::size_t upstream_allocations = 0;
  std::size_t failures = 0;
  std::uint32_t first_failure_event = 0;
  std::string first_failure_message;
  fragmentation_info first_failure_fragmentation;
  std::size_t expectations = 0;
  std::size_t expectations_served = 0;
  std::uint32_t first_served_line = 0;
  std::vector<bool> refused;
  std::size_t reached_peak_live = 0;  ///< per-thread order: the peak the replay reached
  std::size_t leaks = 0;
  std::size_t leaked_bytes = 0;
  std::string error;
};

/// Whatever is still live after a pass (the log's leaks, or everything after a stop) goes
/// back before the next pass and before the stack is destroyed.
void free_leftovers(run_state& s, replay_streams const& streams, bool real_streams, one_run* count_leaks) {
  try {
    if (real_streams) { streams.synchronize(); }
    for (std::uint32_t a = 0; a < s.log->allocation_count; ++a) {
      // Made and never freed: a leak even when the stack answered 0 bytes with nullptr
      // (counted by the pointer, such allocations were missing from the leaks).
      if (s.states[a].load(std::memory_order_relaxed) != allocation_state::made) { continue; }
      s.states[a].store(allocation_state::freed, std::memory_order_relaxed);
      log_event const& e = s.log->events[s.log->allocation_events[a]];
      if (s.pointers[a] != nullptr) { s.top->deallocate(s.pointers[a], e.bytes, streams.data()[e.stream]); }
      s.pointers[a] = nullptr;
      if (count_leaks != nullptr && s.error.empty()) {
        ++count_leaks->leaks;
        count_leaks->leaked_bytes += e.bytes;
      }
    }
    if (real_streams) { streams.synchronize(); }
  } catch (std::exception const& e) {
    if (s.error.empty()) { s.error = std::string{"after the replay: "} + e.what(); }
  } catch (...) {  // a stack may throw anything: reported as in the run, never out of replay_stack
    if (s.error.empty()) { s.error = "after the replay: the stack threw an exception that is not a std::exception"; }
  }
}

one_run run_once(allocation_log const& log, stack_spec const& spec, replay_options const& options, bool real_streams,
                 std::string& measured_by) {
  one_run out;
  built_stack stack;
  try {
    stack = build_replay_stack(spec, options);
  } catch (spec_error const&) {
    throw;
  } catch (std::exception const& e) {
    out.error = std::string{"building the stack failed: "} + e.what();
    return out;
  }
  measured_by = stack.measured_by;
  replay_streams const streams{log, real_streams};
  unsigned const workers = wanted_workers(log, options);
  double const clock_cost = measure_clock_cost_ns();
  if (options.warmup) {
    run_state warm;
    warm.prepare(log, stack.top.get(), streams.data());
    (void)run_events(warm, options.order, workers, options.before_worker_start);
    free_leftovers(warm, streams, real_streams, nullptr);
    if (!warm.error.empty()) {
      out.error = "in the warm-up run: " + warm.error;
      return out;
    }
  }
  // The footprint is the timed run's own: the peak restarts from what the stack holds
  // just before it (after a warm-up, what the warm-up left cached counts, since the stack
  // really holds it during the timed run; a higher transient peak of the warm-up does not).
  std::size_t upstream_calls_before = 0;  // the warm-up's calls are not the timed run's
  try {
    stack.start_peak();
    upstream_calls_before = stack.upstream_calls();
  } catch (std::exception const& e) {
    out.error = std::string{"before the replay: "} + e.what();
    return out;
  }
  run_state s;
  s.prepare(log, stack.top.get(), streams.data());
  s.expect_failures = options.expect_failures;
  s.clock_cost_ns = clock_cost;
  s.count_live = options.order == replay_order::per_thread;
  {
    progress_monitor const monitor{options, s, options.order == replay_order::strict};
    auto const t0 = std::chrono::steady_clock::now();
    schedule_outcome const outcome = run_events(s, options.order, workers, options.before_worker_start);
    auto const t1 = std::chrono::steady_clock::now();
    out.seconds = std::chrono::duration<double>(t1 - t0).count();
    if (!log.events.empty()) { out.ns_per_call = outcome.inside_ns / static_cast<double>(log.events.size()); }
    out.workers = outcome.workers;
    out.workers_note = outcome.workers_note;
  }
  try {
    if (real_streams) { streams.synchronize(); }
    out.peak_footprint = stack.peak();
    out.upstream_allocations = stack.upstream_calls() - upstream_calls_before;
  } catch (std::exception const& e) {
    if (s.error.empty()) { s.error = std::string{"after the replay: "} + e.what(); }
  }
  free_leftovers(s, streams, real_streams, &out);
  out.failures = s.failures;
  out.first_failure_event = s.first_failure_event;
  out.first_failure_message = std::move(s.first_failure_message);
  out.first_failure_fragmentation = std::move(s.first_failure_fragmentation);
  out.expectations = s.expectations_checked;
  out.expectations_served = s.expectations_served;
  out.first_served_line = s.first_served_line;
  out.refused = s.refused();
  out.reached_peak_live = s.live_peak.load(std::memory_order_relaxed);
  out.error = std::move(s.error);
  return out;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t const mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace

/// The bottom's arguments that its simulation twin also takes, with the same type (vmm's
/// `reserve` and `map_granules` for simulated_vmm), as the twin's arguments: dropped, a
/// simulated `vmm(map_granules=1)` ran as the default and `vmm(reserve=1GiB)` never ran out.
std::vector<spec_argument> arguments_the_twin_shares(stack_spec const& spec, spec_resource const& bottom,
                                                     spec_resource const& twin) {
  spec_arguments const bound = detail::argument_checker{spec, nullptr, nullptr}.check(spec.layers.back(), bottom);
  std::vector<spec_argument> shared;
  for (spec_parameter const& p : twin.parameters) {
    if (p.name == twin.capacity_parameter) { continue; }
    auto const same = std::find_if(bottom.parameters.begin(), bottom.parameters.end(), [&](spec_parameter const& b) {
      return b.name == p.name && b.type == p.type;
    });
    if (same == bottom.parameters.end()) { continue; }
    // A 0 the bottom takes but the twin's range refuses means the bottom's default (vmm's
    // reserve=0: twice the device's memory): the twin's default stands in for it. Copied,
    // `vmm(reserve=0)` failed under --simulate, blaming a part the tool had added.
    if (p.type == param_type::size && bound.size(p.name) == std::optional<std::size_t>{0} && same->range.min == 0 &&
        p.range.min > 0) {
      continue;
    }
    // A named argument keeps its text (a percentage is resolved against the simulated
    // device, as the bottom's against the real one); a positional one its bound value.
    auto const named = std::find_if(spec.layers.back().arguments.begin(), spec.layers.back().arguments.end(),
                                    [&](spec_argument const& a) { return a.name == p.name; });
    std::optional<std::string> text;
    if (named != spec.layers.back().arguments.end()) {
      text = named->value;
    } else if (p.type == param_type::size) {
      if (auto v = bound.size(p.name)) { text = std::to_string(*v); }
    } else if (p.type == param_type::count) {
      if (auto v = bound.count(p.name)) { text = std::to_string(*v); }
    } else if (p.type == param_type::flag) {
      if (auto v = bound.flag(p.name)) { text = *v ? "true" : "false"; }
    } else if (p.type == param_type::text) {
      text = bound.text(p.name);
    }
    if (text) { shared.push_back(spec_argument{p.name, *text, 0, 0}); }
  }
  return shared;
}

stack_spec replay_spec_for(std::string const& spec_text, bool simulate, std::size_t simulated_capacity) {
  stack_spec spec = parse_stack_spec(spec_text);
  check_stack_spec(spec);
  std::size_t const bottom_column = spec.layers.back().column;
  auto const* bottom = find_resource(spec.layers.back().name);  // checked above: registered
  if (simulate && !bottom->is_simulation) {
    std::string const twin = bottom->simulation_twin.empty() ? "simulated" : bottom->simulation_twin;
    auto const* twin_entry = find_resource(twin);
    if (twin_entry == nullptr || twin_entry->capacity_parameter.empty()) {
      throw logic_error("mrstack-replay: " + bottom->name + "'s simulation twin '" + twin +
                        "' is not registered with a capacity parameter");
    }
    std::vector<spec_argument> arguments = arguments_the_twin_shares(spec, *bottom, *twin_entry);
    arguments.push_back(spec_argument{twin_entry->capacity_parameter, std::to_string(simulated_capacity), 0, 0});
    spec.layers.back() = spec_layer{twin, std::move(arguments), 0};
  }
  bool const measured_by_bottom = find_resource(spec.layers.back().name)->reports_own_footprint;
  bool const has_meter = std::any_of(spec.layers.begin(), spec.layers.end(),
                                     [](spec_layer const& l) { return l.name == "footprint_meter"; });
  if (!measured_by_bottom && !has_meter) {
    if (spec.layers.size() >= max_stack_layers) {
      // The meter would make one layer more than the builder allows; said here, of the
      // user's spec, instead of "65 layers" under a spec that has 64.
      detail::throw_spec_error(spec_text, bottom_column,
                               "the spec has " + std::to_string(spec.layers.size()) + " layers, the most allowed, and "
                               "mrstack-replay measures the footprint with a footprint_meter it adds above the "
                               "bottom: remove a layer, or write footprint_meter above the bottom in place of one");
    }
    spec.layers.insert(spec.layers.end() - 1, spec_layer{"footprint_meter", {}, 0});
  }
  return spec;
}

bool footprint_is_lower_bound(std::string const& spec_text, bool simulate) {
  // Nothing but the meter above the bottom: the meter sees exactly the bytes asked.
  auto const built = replay_spec_for(spec_text, simulate, 1);
  return built.layers.size() == 2 && built.layers.front().name == "footprint_meter";
}

replay_result replay_stack(allocation_log const& log, std::string const& spec_text, replay_options const& options) {
  if (options.expect_failures && options.order != replay_order::strict) {
    throw logic_error("mrstack-replay: expected failures are asked at their place in the log, so they need strict order");
  }
  replay_result result;
  result.order = options.order;
  result.footprint_lower_bound = footprint_is_lower_bound(spec_text, options.simulate);
  result.resource = spec_text;
  result.simulated = options.simulate;
  stack_spec const spec = replay_spec_for(spec_text, options.simulate, options.simulated_capacity);
  result.built_as = to_string(spec);
  result.events = log.events.size();
  bool const real_streams = replay_detail::device_present();
  int const runs = std::max(1, options.repeat);
  std::vector<bool> refused_in_first_failing_run;
  std::size_t reached_peak_live = 0;
  for (int r = 0; r < runs; ++r) {
    one_run run = run_once(log, spec, options, real_streams, result.footprint_measured_by);
    if (!run.error.empty()) {
      result.error = std::move(run.error);
      break;
    }
    result.seconds.push_back(run.seconds);
    result.ns_per_call_per_run.push_back(run.ns_per_call);
    if (r == 0 || run.workers < result.workers) {  // the fewest workers a run got, with that run's note
      result.workers = run.workers;
      result.workers_note = run.workers_note;
    }
    result.expected_failures = run.expectations;
    if (run.expectations_served > result.expected_failures_served) {
      result.expected_failures_served = run.expectations_served;
      result.first_served_expected_line = run.first_served_line;
    }
    result.peak_footprint_bytes = std::max(result.peak_footprint_bytes, run.peak_footprint);
    result.upstream_allocations = std::max(result.upstream_allocations, run.upstream_allocations);
    reached_peak_live = std::max(reached_peak_live, run.reached_peak_live);
    result.leaks = run.leaks;
    result.leaked_bytes = run.leaked_bytes;
    if (run.failures > result.failures) {
      result.failures = run.failures;
      result.first_failure_line = log.event_lines[run.first_failure_event];
      result.first_failure_event = run.first_failure_event;
      result.first_failure_fragmentation = std::move(run.first_failure_fragmentation);
      result.first_failure_bytes = log.events[run.first_failure_event].bytes;
      result.first_failure_message = std::move(run.first_failure_message);
      refused_in_first_failing_run = std::move(run.refused);
    }
  }
  if (options.order == replay_order::per_thread) {
    result.peak_live_bytes = reached_peak_live;  // its own interleaving, not the log's order
  } else {
    result.peak_live_bytes = result.failures == 0 ? log.peak_live_bytes
                                                  : peak_live_bytes_without(log, refused_in_first_failing_run);
  }
  if (!result.seconds.empty()) {
    result.median_seconds = median(result.seconds);
    result.ns_per_call = median(result.ns_per_call_per_run);
    if (result.events > 0) { result.ns_per_event = result.median_seconds * 1e9 / static_cast<double>(result.events); }
  }
  return result;
}

device_report probe_device() {
  device_report report;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    report.why_not = status != cudaSuccess ? std::string{"cudaGetDeviceCount: "} + cudaGetErrorName(status)
                                           : std::string{"no CUDA device"};
    (void)cudaGetLastError();
    return report;
  }
  status = cudaGetDevice(&report.ordinal);
  cudaDeviceProp prop{};
  if (status == cudaSuccess) { status = cudaGetDeviceProperties(&prop, report.ordinal); }
  if (status == cudaSuccess) { status = cudaMemGetInfo(&report.free_bytes, &report.total_bytes); }
  if (status != cudaSuccess) {
    report.why_not = std::string{"the device is not usable: "} + cudaGetErrorName(status);
    (void)cudaGetLastError();
    return report;
  }
  report.available = true;
  report.name = prop.name;
  return report;
}

}  // namespace mrstack
