// mrstack-replay's conclusions: the notes under the table and the verdict.
#include "cli.hpp"

#include <cmath>

namespace mrstack::replay_cli {

namespace {

std::string failure_note(replay_result const& r) {
  std::string note = "  " + printable(r.resource) + ": " + with_commas(r.failures) + " allocation" +
                     (r.failures == 1 ? "" : "s") + " refused; the first at line " +
                     std::to_string(r.first_failure_line) + " (event " + with_commas(r.first_failure_event) + ", " +
                     short_bytes(r.first_failure_bytes) + "): " + r.first_failure_message + "\n";
  fragmentation_info const& f = r.first_failure_fragmentation;
  if (!f.resource.empty()) {
    note += "    then " + f.resource + " held " + short_bytes(f.held_bytes) + ": " + short_bytes(f.live_bytes) + " live, " +
            short_bytes(f.free_bytes) + " free in " + with_commas(f.free_blocks) + " block" +
            (f.free_blocks == 1 ? "" : "s") + ", the largest " + short_bytes(f.largest_free_block) + "\n";
  }
  return note;
}

}  // namespace

std::string notes_text(std::vector<replay_result> const& results, allocation_log const& log, bool any_lower_bound,
                       bool simulate) {
  std::string notes;
  for (auto const& r : results) {
    if (!r.error.empty()) { notes += "  " + printable(r.resource) + ": " + r.error + "\n"; }
    if (r.failures > 0) { notes += failure_note(r); }
    if (r.expected_failures_served > 0) {
      notes += "  " + printable(r.resource) + ": served " + with_commas(r.expected_failures_served) + " of the " +
               with_commas(r.expected_failures) + " allocations the log records as refused; the first at line " +
               std::to_string(r.first_served_expected_line) + "\n";
    }
    if (!r.workers_note.empty()) { notes += "  " + printable(r.resource) + ": " + r.workers_note + "\n"; }
  }
  if (!log.leaked_allocations.empty()) {
    notes += "  leaks: the log never frees " + with_commas(log.leaked_allocations.size()) + " allocation" +
             (log.leaked_allocations.size() == 1 ? " (" : "s (") + short_bytes(log.leaked_bytes) +
             (log.leaked_allocations.size() == 1 ? "); it is" : "); they are") + " freed after the clock stops\n";
  }
  if (any_lower_bound) {
    notes += "  * nothing above the bottom, so the footprint is the bytes asked of it: a lower bound that\n";
    notes += simulate ? "    cannot show the bottom's own pooling or rounding (simulated, cuda_async is not the driver's\n"
                        "    pool: replay on a GPU to measure it); left out of 'most compact'\n"
                      : "    cannot show cudaMalloc's own page rounding; left out of 'most compact'\n";
  }
  return notes;
}

std::string verdict_text(std::vector<replay_result> const& results) {
  replay_result const* fastest = nullptr;
  replay_result const* compact = nullptr;
  std::size_t complete = 0;
  for (auto const& r : results) {
    if (!r.complete()) { continue; }
    ++complete;
    // The time inside the allocator, not the wall time: the replay's own hand-overs
    // between threads must not decide which allocator is fastest. A log with no events
    // timed nothing: every stack's 0 ns made the first one "fastest".
    if (r.events > 0 && (fastest == nullptr || r.ns_per_call < fastest->ns_per_call)) { fastest = &r; }
    if (r.footprint_lower_bound) { continue; }  // an exact-fit lower bound would always "win"
    if (std::isnan(r.footprint_ratio())) { continue; }  // nothing was live: nothing to fit
    if (compact == nullptr || r.footprint_ratio() < compact->footprint_ratio() ||
        (r.footprint_ratio() == compact->footprint_ratio() && r.ns_per_call < compact->ns_per_call)) {
      compact = &r;
    }
  }
  std::string verdict = "verdict: ";
  if (complete == 0) { return verdict + "no stack replayed the whole log."; }
  if (fastest != nullptr) {
    verdict += "fastest " + printable(fastest->resource) + " (" + ns_text(fastest->ns_per_call) + " ns/call)";
  } else {
    verdict += "no stack is fastest (the log has no allocations or frees to time)";
  }
  if (compact != nullptr) {
    verdict += "; most compact " + printable(compact->resource) + " (" + ratio_text(compact->footprint_ratio()) +
               " of peak live)";
  }
  if (complete == results.size()) {
    verdict += results.size() == 1   ? "; it replayed the whole log."
               : results.size() == 2 ? "; both stacks replayed the whole log."
                                     : "; all " + std::to_string(results.size()) + " stacks replayed the whole log.";
  } else {
    verdict += "; " + std::to_string(results.size() - complete) + " of " + std::to_string(results.size()) +
               " stacks did not replay the whole log.";
  }
  return verdict;
}

}  // namespace mrstack::replay_cli
