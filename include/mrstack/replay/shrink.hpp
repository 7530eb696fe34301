#pragma once
/// Shrinking a failing log: `mrstack-replay LOG -r SPEC --capacity SIZE --shrink OUT.csv`.
///
/// When the stack `spec` refuses an allocation replaying `log` (strict order, on the
/// calling thread, under `options`: simulated memory keeps it fast), `shrink_failing_log`
/// finds a much smaller log on which the same stack still refuses an allocation the same
/// way (the same exception type: `out_of_memory`, or another `std::bad_alloc`):
/// 1. the log is cut after the first refused allocation (what follows cannot matter);
/// 2. the units are allocation/free pairs (an allocation with its free, when the cut log
///    has it): removing a unit removes both, so every kept free follows its allocation;
/// 3. a first guess keeps only the allocations live at the refusal (and the refused one);
/// 4. delta debugging (ddmin: try halves, then complements, then finer pieces) removes
///    units while the stack still fails, down to a set where removing any one piece of
///    the final granularity makes it pass.
/// Every test replays the kept events on a fresh stack and stops at its first refusal.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>

namespace mrstack {

struct shrink_result {
  bool failed = false;        ///< the stack refused an allocation on the whole log
  std::string failure;        ///< how: "out_of_memory (line 123 of the log, 4.0 MiB)"
  std::vector<std::uint32_t> kept_events;  ///< indices into the log's events, in log order
  std::size_t kept_allocations = 0;
  std::size_t tests = 0;      ///< replays it took
  double seconds = 0;
};

/// Throws `spec_error` for a bad spec.
shrink_result shrink_failing_log(allocation_log const& log, std::string const& spec, replay_options const& options);

/// The events `events` of `log` as a log file (header and rows; pointers renumbered, one
/// per allocation; thread and stream ids as the log writes them; Time 0).
std::string failing_log_csv(allocation_log const& log, std::vector<std::uint32_t> const& events);

}  // namespace mrstack
