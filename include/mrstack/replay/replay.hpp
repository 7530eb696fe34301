#pragma once
/// Replaying an allocation log against a stack: the engine behind mrstack-replay and the
/// replay benchmark.
///
/// `replay_stack(log, spec, options)` builds the stack `spec` names (a fresh one for each
/// of `options.repeat` runs), replays every allocate/free event of the log in the log's
/// order and reports wall time, peak live bytes, peak footprint, failures and leaks.
///
/// - Threads: each distinct log thread replays on a thread of its own; a global sequence
///   number makes every event wait for the one before it, so the log's order across
///   threads is kept exactly (a log with one thread replays on the calling thread, with
///   no waiting at all).
/// - Streams: each distinct log stream is a stream created for the run (handle 0 is the
///   default stream, 1 the legacy and 2 the per-thread default stream, as CUDA numbers
///   them). With no CUDA device every log stream replays on the default stream handle.
/// - Footprint: a `footprint_meter` is inserted directly above the bottom upstream and
///   its peak is the stack's peak footprint. When the bottom is a real `cuda_async`, the
///   driver pool's own high-water mark (cudaMemPoolAttrReservedMemHigh) is used instead,
///   because the driver pools memory itself and no layer above can see that.
/// - Simulation (`options.simulate`): the bottom is replaced by its simulation twin
///   (`simulated`, or `simulated_vmm` for `vmm`) with `capacity=options.simulated_capacity`,
///   which touches no memory, so any log replays on any machine; percentages in the spec
///   are shares of that capacity. A bottom that is itself a simulation is kept as given.
/// - A refused allocation (`std::bad_alloc`, including `out_of_memory`) is counted, its
///   first line and message kept, and its free skipped; the replay goes on (`warmup`
///   runs' refusals are not counted: the timed run's are). Any other
///   exception stops the run and is reported in `error`. Allocations the log never frees
///   are freed after the clock stops and counted as leaks.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/spec.hpp>

namespace mrstack {

struct replay_options {
  bool simulate = false;
  std::size_t simulated_capacity = std::size_t{80} << 30;
  int repeat = 1;  ///< runs; the reported time is their median
  /// Before each timed run, replay the log once, untimed, on the same stack (and free what
  /// it leaves): the timed run then sees a stack in its steady state (a pool already
  /// grown). The peak footprint is the timed run's: what the stack held at its start (the
  /// warm-up's cached memory included) and any growth during it, not a transient warm-up peak.
  bool warmup = false;
  /// Called about five times a second from a monitor thread while a run is under way
  /// (events done, events in the log). Empty: no monitor thread.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

struct replay_result {
  std::string resource;            ///< the spec as given
  std::string built_as;            ///< the spec actually built (bottom replaced, meter inserted)
  bool simulated = false;
  std::size_t events = 0;          ///< events replayed per run (allocate + free rows)
  std::vector<double> seconds;     ///< wall time of each run
  double median_seconds = 0;
  double ns_per_event = 0;         ///< median_seconds / events
  std::size_t peak_live_bytes = 0; ///< most bytes live at once (refused allocations excluded)
  std::size_t peak_footprint_bytes = 0;
  std::string footprint_measured_by;  ///< "footprint_meter above simulated", "cuda_async pool reserved high"...
  /// Nothing but the meter sits above the bottom, so the footprint is just the bytes asked
  /// of the bottom: a lower bound that cannot show the bottom's own rounding or pooling
  /// (cudaMalloc's pages; under simulation, cuda_async's pool).
  bool footprint_lower_bound = false;
  std::size_t upstream_allocations = 0;  ///< calls that reached the bottom (when a meter measured them)
  std::size_t failures = 0;        ///< allocations refused (the most in any run)
  std::uint32_t first_failure_line = 0;
  std::size_t first_failure_bytes = 0;
  std::string first_failure_message;
  std::size_t leaks = 0;           ///< allocations the log never frees (that were made)
  std::size_t leaked_bytes = 0;
  std::string error;               ///< what stopped a run (a build failure, a contract violation)

  [[nodiscard]] bool complete() const noexcept { return failures == 0 && error.empty(); }
  [[nodiscard]] double footprint_ratio() const noexcept {
    return peak_live_bytes == 0 ? 0.0 : static_cast<double>(peak_footprint_bytes) / static_cast<double>(peak_live_bytes);
  }
};

/// The spec mrstack-replay builds for `spec`: with `simulate`, the bottom replaced by its
/// simulation twin with that capacity (unless it is a simulation already); then a footprint_meter above the bottom (unless the bottom is a
/// real cuda_async, measured by its pool instead). Throws `spec_error`.
stack_spec replay_spec_for(std::string const& spec, bool simulate, std::size_t simulated_capacity);

/// Whether replaying `spec` measures only a lower bound of its footprint (see
/// replay_result::footprint_lower_bound). Throws `spec_error`.
bool footprint_is_lower_bound(std::string const& spec, bool simulate);

/// Replays `log` against the stack `spec`. Throws `spec_error` for a bad spec; every other
/// failure is reported in the result.
replay_result replay_stack(allocation_log const& log, std::string const& spec, replay_options const& options);

/// What mrstack-replay says about the machine's CUDA device.
struct device_report {
  bool available = false;
  std::string name;          ///< "NVIDIA H200"
  int ordinal = 0;
  std::size_t total_bytes = 0;
  std::size_t free_bytes = 0;
  std::string why_not;       ///< without a device: why (the CUDA error)
};
device_report probe_device();

/// mrstack-replay's command line (tools/mrstack-replay.cpp is `main` around it); prints to
/// `out` and `err`, returns the exit status: 0 every stack replayed the whole log, 1 an
/// allocation failed (or a stack could not be built or broke), 2 unusable input or arguments.
int run_replay_tool(std::vector<std::string> const& args, std::FILE* out, std::FILE* err);

}  // namespace mrstack
