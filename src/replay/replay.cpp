// The replay engine: one parsed log, one stack, timed runs in the log's exact order.
#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include <cuda_runtime_api.h>

namespace mrstack {

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

bool device_present() {
  int count = 0;
  bool const ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

/// The streams one run uses, one per log stream.
class replay_streams {
 public:
  replay_streams(allocation_log const& log, bool real) {
    views_.resize(log.streams.size());
    for (std::size_t i = 0; i < log.streams.size(); ++i) {
      std::uint64_t const handle = log.streams[i];
      if (!real || handle == 0) {
        views_[i] = stream_view{};
      } else if (handle == 1) {
        views_[i] = stream_view::legacy();
      } else if (handle == 2) {
        views_[i] = stream_view::per_thread();
      } else {
        owned_.emplace_back();
        views_[i] = owned_.back().view();
      }
    }
  }
  [[nodiscard]] stream_view const* data() const noexcept { return views_.data(); }
  void synchronize() const {
    for (auto const& s : owned_) { s.synchronize(); }
  }

 private:
  std::vector<stream_view> views_;
  std::vector<stream> owned_;
};

/// State shared by the threads of one run. Events run one at a time in log order (the
/// sequence number hands them over with release/acquire), so the failure bookkeeping
/// needs no lock.
struct run_state {
  allocation_log const* log = nullptr;
  memory_resource* top = nullptr;
  stream_view const* streams = nullptr;
  std::vector<void*> pointers;         // by allocation index
  std::vector<bool> refused;           // by allocation index
  std::size_t failures = 0;
  std::uint32_t first_failure_event = 0;
  std::string first_failure_message;
  std::string error;
  std::atomic<std::uint32_t> next{0};  // the sequence number of the next event to run
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> done{0};    // progress for the monitor (single-thread runs)

  /// Runs event `i`. Returns false when the run must stop.
  bool run_event(std::uint32_t i) {
    log_event const e = log->events[i];
    try {
      if (e.action == log_action::allocate) {
        pointers[e.allocation] = top->allocate(e.bytes, streams[e.stream]);
      } else {
        top->deallocate(pointers[e.allocation], e.bytes, streams[e.stream]);  // nullptr after a refusal: a no-op
        pointers[e.allocation] = nullptr;
      }
    } catch (std::bad_alloc const& refusal) {
      pointers[e.allocation] = nullptr;
      refused[e.allocation] = true;
      if (failures++ == 0) {
        first_failure_event = i;
        first_failure_message = refusal.what();
      }
    } catch (std::exception const& broken) {
      error = "line " + std::to_string(log->event_lines[i]) + ": " + broken.what();
      return false;
    }
    return true;
  }
};

void run_single_thread(run_state& s) {
  auto const n = static_cast<std::uint32_t>(s.log->events.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    if (!s.run_event(i)) { break; }
    if ((i & 1023U) == 0) { s.done.store(i, std::memory_order_relaxed); }
  }
}

void run_multi_thread(run_state& s) {
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (auto const& own : s.log->events_by_thread) {
    workers.emplace_back([&s, &go, &own] {
      while (!go.load(std::memory_order_acquire)) { cpu_relax(); }
      for (std::uint32_t const i : own) {
        // Wait for our turn: spin briefly (the previous event is usually quick), then yield
        // the core, which matters when there are more log threads than cores.
        for (unsigned spins = 0; s.next.load(std::memory_order_acquire) != i; ++spins) {
          if (s.stop.load(std::memory_order_relaxed)) { return; }
          if (spins < 256) {
            cpu_relax();
          } else {
            std::this_thread::yield();
          }
        }
        if (!s.run_event(i)) { s.stop.store(true, std::memory_order_relaxed); }
        s.next.store(i + 1, std::memory_order_release);
        if (s.stop.load(std::memory_order_relaxed)) { return; }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& w : workers) { w.join(); }
}

/// Polls a run's progress and reports it until told to stop.
class progress_monitor {
 public:
  progress_monitor(replay_options const& options, run_state const& s, bool multi_thread) {
    if (!options.progress) { return; }
    thread_ = std::thread{[this, &options, &s, multi_thread] {
      std::size_t const total = s.log->events.size();
      std::unique_lock lock{mutex_};
      while (!wake_.wait_for(lock, std::chrono::milliseconds{200}, [this] { return finished_; })) {
        std::size_t const done = multi_thread ? s.next.load(std::memory_order_relaxed) : s.done.load(std::memory_order_relaxed);
        options.progress(done, total);
      }
    }};
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
  std::size_t peak_footprint = 0;
  std::size_t upstream_allocations = 0;
  std::size_t failures = 0;
  std::uint32_t first_failure_event = 0;
  std::string first_failure_message;
  std::vector<bool> refused;
  std::size_t leaks = 0;
  std::size_t leaked_bytes = 0;
  std::string error;
};

std::size_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  std::uint64_t value = 0;
  MRSTACK_CUDA_TRY(cudaMemPoolGetAttribute(pool, attr, &value));
  return static_cast<std::size_t>(value);
}

one_run run_once(allocation_log const& log, stack_spec const& spec, replay_options const& options, bool real_streams,
                 std::string& measured_by) {
  one_run out;
  build_options build;
  if (options.simulate) { build.percent_base = options.simulated_capacity; }
  resource_ptr top;
  try {
    top = build_stack(spec, build);
  } catch (spec_error const&) {
    throw;
  } catch (std::exception const& e) {
    out.error = std::string{"building the stack failed: "} + e.what();
    return out;
  }
  footprint_meter* meter = nullptr;
  for (memory_resource* layer = top.get(); layer != nullptr; layer = layer->upstream()) {
    if (auto* m = dynamic_cast<footprint_meter*>(layer)) { meter = m; }
  }
  auto* driver_pool = dynamic_cast<cuda_async_memory_resource*>(&bottom_of_stack(*top));
  auto* range = dynamic_cast<virtual_range_resource*>(&bottom_of_stack(*top));
  if (driver_pool != nullptr) {
    measured_by = "cuda_async pool's reserved high-water mark";
  } else if (range != nullptr) {
    measured_by = range->name() + "'s peak mapped physical memory";
  } else if (meter != nullptr) {
    measured_by = "footprint_meter above " + bottom_of_stack(*top).name();
  }
  // The footprint is the timed run's own: the peak restarts from what the stack holds
  // just before it (after a warm-up, what the warm-up left cached counts, since the stack
  // really holds it during the timed run; a higher transient peak of the warm-up does not).
  auto start_peak = [&] {
    if (driver_pool != nullptr) {
      std::uint64_t zero = 0;  // resets the high-water mark to what is reserved now
      MRSTACK_CUDA_TRY(cudaMemPoolSetAttribute(driver_pool->pool_handle(), cudaMemPoolAttrReservedMemHigh, &zero));
    } else if (range != nullptr) {
      range->reset_peak_mapped_bytes();
    } else if (meter != nullptr) {
      meter->reset_peak();
    }
  };
  replay_streams const streams{log, real_streams};
  bool const multi_thread = log.events_by_thread.size() > 1;
  auto prepare = [&](run_state& s) {
    s.log = &log;
    s.top = top.get();
    s.streams = streams.data();
    s.pointers.assign(log.allocation_count, nullptr);
    s.refused.assign(log.allocation_count, false);
  };
  // Whatever is still live after a pass (the log's leaks, or everything after a stop)
  // goes back before the next pass and before the stack is destroyed.
  auto free_leftovers = [&](run_state& s, bool count_leaks) {
    try {
      if (real_streams) { streams.synchronize(); }
      for (std::uint32_t a = 0; a < log.allocation_count; ++a) {
        if (s.pointers[a] == nullptr) { continue; }
        log_event const& e = log.events[log.allocation_events[a]];
        top->deallocate(s.pointers[a], e.bytes, streams.data()[e.stream]);
        s.pointers[a] = nullptr;
        if (count_leaks && s.error.empty()) {
          ++out.leaks;
          out.leaked_bytes += e.bytes;
        }
      }
      if (real_streams) { streams.synchronize(); }
    } catch (std::exception const& e) {
      if (s.error.empty()) { s.error = std::string{"after the replay: "} + e.what(); }
    }
  };
  if (options.warmup) {
    run_state warm;
    prepare(warm);
    if (multi_thread) {
      run_multi_thread(warm);
    } else {
      run_single_thread(warm);
    }
    free_leftovers(warm, false);
    if (!warm.error.empty()) {
      out.error = "in the warm-up run: " + warm.error;
      return out;
    }
  }
  try {
    start_peak();
  } catch (std::exception const& e) {
    out.error = std::string{"before the replay: "} + e.what();
    return out;
  }
  run_state s;
  prepare(s);
  {
    progress_monitor const monitor{options, s, multi_thread};
    auto const t0 = std::chrono::steady_clock::now();
    if (multi_thread) {
      run_multi_thread(s);
    } else {
      run_single_thread(s);
    }
    auto const t1 = std::chrono::steady_clock::now();
    out.seconds = std::chrono::duration<double>(t1 - t0).count();
  }
  try {
    if (real_streams) { streams.synchronize(); }
    if (driver_pool != nullptr) {
      out.peak_footprint = pool_attribute(driver_pool->pool_handle(), cudaMemPoolAttrReservedMemHigh);
    } else if (range != nullptr) {
      out.peak_footprint = range->peak_mapped_bytes();
      out.upstream_allocations = range->map_calls();
    } else if (meter != nullptr) {
      out.peak_footprint = meter->peak_bytes_held();
      out.upstream_allocations = meter->upstream_allocations();
    }
  } catch (std::exception const& e) {
    if (s.error.empty()) { s.error = std::string{"after the replay: "} + e.what(); }
  }
  free_leftovers(s, true);
  out.failures = s.failures;
  out.first_failure_event = s.first_failure_event;
  out.first_failure_message = std::move(s.first_failure_message);
  out.refused = std::move(s.refused);
  out.error = std::move(s.error);
  return out;
}

}  // namespace

stack_spec replay_spec_for(std::string const& spec_text, bool simulate, std::size_t simulated_capacity) {
  stack_spec spec = parse_stack_spec(spec_text);
  check_stack_spec(spec);
  auto const* bottom = find_resource(spec.layers.back().name);  // checked above: registered
  if (simulate && !bottom->is_simulation) {
    std::string const twin = bottom->simulation_twin.empty() ? "simulated" : bottom->simulation_twin;
    auto const* twin_entry = find_resource(twin);
    if (twin_entry == nullptr || twin_entry->capacity_parameter.empty()) {
      throw logic_error("mrstack-replay: " + bottom->name + "'s simulation twin '" + twin +
                        "' is not registered with a capacity parameter");
    }
    spec.layers.back() = spec_layer{
        twin, {spec_argument{twin_entry->capacity_parameter, std::to_string(simulated_capacity), 0, 0}}, 0};
  }
  bool const measured_by_bottom = find_resource(spec.layers.back().name)->reports_own_footprint;
  bool const has_meter = std::any_of(spec.layers.begin(), spec.layers.end(),
                                     [](spec_layer const& l) { return l.name == "footprint_meter"; });
  if (!measured_by_bottom && !has_meter) { spec.layers.insert(spec.layers.end() - 1, spec_layer{"footprint_meter", {}, 0}); }
  return spec;
}

bool footprint_is_lower_bound(std::string const& spec_text, bool simulate) {
  // Nothing but the meter above the bottom: the meter sees exactly the bytes asked.
  auto const built = replay_spec_for(spec_text, simulate, 1);
  return built.layers.size() == 2 && built.layers.front().name == "footprint_meter";
}

replay_result replay_stack(allocation_log const& log, std::string const& spec_text, replay_options const& options) {
  replay_result result;
  result.footprint_lower_bound = footprint_is_lower_bound(spec_text, options.simulate);
  result.resource = spec_text;
  result.simulated = options.simulate;
  stack_spec const spec = replay_spec_for(spec_text, options.simulate, options.simulated_capacity);
  result.built_as = to_string(spec);
  result.events = log.events.size();
  bool const real_streams = device_present();
  int const runs = std::max(1, options.repeat);
  std::vector<bool> refused_in_first_failing_run;
  for (int r = 0; r < runs; ++r) {
    one_run run = run_once(log, spec, options, real_streams, result.footprint_measured_by);
    if (!run.error.empty()) {
      result.error = std::move(run.error);
      break;
    }
    result.seconds.push_back(run.seconds);
    result.peak_footprint_bytes = std::max(result.peak_footprint_bytes, run.peak_footprint);
    result.upstream_allocations = std::max(result.upstream_allocations, run.upstream_allocations);
    result.leaks = run.leaks;
    result.leaked_bytes = run.leaked_bytes;
    if (run.failures > result.failures) {
      result.failures = run.failures;
      result.first_failure_line = log.event_lines[run.first_failure_event];
      result.first_failure_bytes = log.events[run.first_failure_event].bytes;
      result.first_failure_message = std::move(run.first_failure_message);
      refused_in_first_failing_run = std::move(run.refused);
    }
  }
  result.peak_live_bytes = result.failures == 0 ? log.peak_live_bytes
                                                : peak_live_bytes_without(log, refused_in_first_failing_run);
  if (!result.seconds.empty()) {
    std::vector<double> sorted = result.seconds;
    std::sort(sorted.begin(), sorted.end());
    std::size_t const mid = sorted.size() / 2;
    result.median_seconds = sorted.size() % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
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
