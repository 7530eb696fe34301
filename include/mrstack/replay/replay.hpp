#pragma once
/// Replaying an allocation log against a stack: the engine behind mrstack-replay and the
/// replay benchmark.
///
/// `replay_stack(log, spec, options)` builds the stack `spec` names (a fresh one for each
/// of `options.repeat` runs), replays every allocate/free event of the log and reports
/// wall time, the time spent inside the stack's allocate/deallocate calls, peak live
/// bytes, peak footprint, failures and leaks.
///
/// - Time: `seconds` is the wall time of the whole run (waiting and hand-overs between
///   threads included); `ns_per_call` is the time inside allocate/deallocate alone, each
///   call timed with steady_clock less the clock's own cost (measured once per run), summed
///   over all threads and divided by the events. It is what the allocator costs; wall time
///   is what the replay cost.
/// - Order (`replay_order`): `strict` keeps the log's global order exactly: each event
///   waits for the one before it (a log with one thread replays on the calling thread,
///   with no waiting at all). `per_thread` replays each log thread at full speed, in its
///   own order; a free waits only for its own allocation (made on whatever thread), so
///   threads contend in the stack as they would in the program.
/// - Workers: the log's threads are multiplexed onto at most `options.workers` OS threads
///   (default: the machine's hardware threads), log thread t on worker t mod W; the calling
///   thread is worker 0. So a log with thousands of thread ids costs what its events cost,
///   not a thread each. A worker with nothing to run spins at most 128 times, yields 4
///   times, then sleeps on the run's gate (a mutex and condition variable, at most 2 ms a
///   sleep) until another worker makes progress: no unbounded spinning. In per-thread
///   order a log thread waiting for an allocation made elsewhere is parked until it is
///   made, so a worker's turn costs what it runs, not what waits. When the system refuses a thread, the run goes on
///   with the workers it got (`workers_note` says so); the calling thread alone always works.
///   Log threads that share a worker share its per-thread default stream.
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
///   first line, message and the stack's `fragmentation()` at that moment kept, and its
///   free skipped; the replay goes on (`warmup` runs' refusals are not counted: the timed
///   run's are). With `expect_failures` (strict order only), each `allocate failure` row
///   of the log is asked of the stack at its place in the log: the stack must refuse it
///   too; one it serves is counted in `expected_failures_served` (and freed at once). These
///   asks are not timed and not events. Any other
///   exception stops the run and is reported in `error`. Allocations the log never frees
///   are freed after the clock stops and counted as leaks.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/resource.hpp>
#include <mrstack/spec.hpp>

namespace mrstack {

enum class replay_order { strict, per_thread };
char const* to_string(replay_order order) noexcept;

struct replay_options {
  replay_order order = replay_order::strict;
  /// Most OS threads a run uses (the calling thread included); 0: the machine's hardware
  /// threads (at least 1).
  unsigned workers = 0;
  /// For tests: called before extra worker thread w (1, 2, ...) starts; whatever it throws
  /// counts as the system refusing that thread (the run goes on with fewer workers).
  std::function<void(unsigned w)> before_worker_start;
  bool expect_failures = false;
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
  double ns_per_event = 0;         ///< median_seconds / events (wall time)
  std::vector<double> ns_per_call_per_run;  ///< time inside allocate/deallocate per event, each run
  double ns_per_call = 0;          ///< their median: what the allocator costs per call
  replay_order order = replay_order::strict;
  unsigned workers = 1;            ///< OS threads the runs used
  std::string workers_note;        ///< why fewer workers ran than wanted (empty: as wanted)
  /// Most bytes live at once (refused allocations excluded): in strict order the log's
  /// own peak; in per-thread order the peak the replay reached (the most over its runs),
  /// since its interleaving of the threads is not the log's.
  std::size_t peak_live_bytes = 0;
  std::size_t peak_footprint_bytes = 0;
  std::string footprint_measured_by;  ///< "footprint_meter above simulated", "cuda_async pool reserved high"...
  /// Nothing but the meter sits above the bottom, so the footprint is just the bytes asked
  /// of the bottom: a lower bound that cannot show the bottom's own rounding or pooling
  /// (cudaMalloc's pages; under simulation, cuda_async's pool).
  bool footprint_lower_bound = false;
  std::size_t upstream_allocations = 0;  ///< the timed run's calls that reached the bottom (when a meter measured them)
  std::size_t failures = 0;        ///< allocations refused (the most in any run)
  std::uint32_t first_failure_line = 0;
  std::uint32_t first_failure_event = 0;  ///< index into the log's events
  std::size_t first_failure_bytes = 0;
  std::string first_failure_message;
  fragmentation_info first_failure_fragmentation;  ///< the stack's, just after the first refusal
  std::size_t expected_failures = 0;         ///< `allocate failure` rows asked (with expect_failures)
  std::size_t expected_failures_served = 0;  ///< of those, served by the stack: a mismatch
  std::uint32_t first_served_expected_line = 0;
  std::size_t leaks = 0;           ///< allocations the log never frees (that were made)
  std::size_t leaked_bytes = 0;
  std::string error;               ///< what stopped a run (a build failure, a contract violation)

  [[nodiscard]] bool complete() const noexcept {
    return failures == 0 && error.empty() && expected_failures_served == 0;
  }
  /// Peak footprint / peak live; NaN when nothing was ever live (no ratio says how well a
  /// stack fits nothing: the table prints "-", JSON null, and the verdict leaves it out).
  [[nodiscard]] double footprint_ratio() const noexcept {
    return peak_live_bytes == 0 ? std::numeric_limits<double>::quiet_NaN()
                                : static_cast<double>(peak_footprint_bytes) / static_cast<double>(peak_live_bytes);
  }
};

/// The spec mrstack-replay builds for `spec`: with `simulate`, the bottom replaced by its
/// simulation twin with that capacity (unless it is a simulation already); then a footprint_meter above the bottom (unless the bottom is a
/// real cuda_async, measured by its pool instead). Throws `spec_error`.
stack_spec replay_spec_for(std::string const& spec, bool simulate, std::size_t simulated_capacity);

/// Whether replaying `spec` measures only a lower bound of its footprint (see
/// replay_result::footprint_lower_bound). Throws `spec_error`.
bool footprint_is_lower_bound(std::string const& spec, bool simulate);

/// Replays `log` against the stack `spec`. Throws `spec_error` for a bad spec, and
/// `logic_error` for `expect_failures` with `per_thread` order; every other failure is
/// reported in the result.
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
