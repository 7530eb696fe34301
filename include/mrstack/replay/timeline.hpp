#pragma once
/// What a stack held over a log: `mrstack-replay --timeline` (the file's schema is in
/// docs/replay.md).
///
/// `sample_timeline(log, specs, options, points)` replays the log once more per stack, in
/// strict log order on the calling thread, untimed, on a fresh stack, and after each of at
/// most `points` evenly spaced events (always including the last) records the stack's
/// footprint (what its bottom holds from the system: the footprint meter, the vmm-like
/// bottom's mapped bytes or the driver pool's reserved bytes) and its `fragmentation()`
/// (free bytes held, largest free block). A refused allocation does not stop the replay
/// (its free is skipped, as in timed runs); the first is recorded with the stack's
/// fragmentation at that moment. An error that stops the replay leaves the later samples
/// empty. The log's own activity (sizes, threads, streams) comes with it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

/// One refused allocation: where in the log, what was asked, and the stack's state then.
struct replay_failure {
  std::uint32_t line = 0;
  std::uint32_t event = 0;
  std::size_t bytes = 0;
  std::string message;
  fragmentation_info fragmentation;
};

struct timeline_stack {
  std::string resource;  ///< the spec as given
  std::vector<std::optional<std::size_t>> footprint_bytes;     ///< by sample; empty after a stop
  std::vector<std::optional<std::size_t>> free_held_bytes;
  std::vector<std::optional<std::size_t>> largest_free_block;
  std::optional<replay_failure> failure;  ///< the first refused allocation
  std::string error;                      ///< what stopped the replay, if anything did
};

struct activity {
  std::string name;  ///< a thread id or stream handle as the log writes it
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t bytes_allocated = 0;
};

struct size_bucket {
  std::size_t min_bytes = 0;  ///< a power of two (1 for the first); 0 for 0-byte allocations
  std::size_t max_bytes = 0;  ///< 2 * min_bytes - 1 (0 for 0-byte allocations)
  std::size_t allocations = 0;
};

struct timeline {
  std::vector<std::uint32_t> sample_event;  ///< the event after which each sample was taken
  std::vector<std::size_t> live_bytes;      ///< the log's live bytes at each sample
  std::vector<timeline_stack> stacks;
  std::vector<size_bucket> size_histogram;  ///< non-empty power-of-two buckets
  std::vector<activity> threads;
  std::vector<activity> streams;
  std::size_t events = 0;
  bool simulated = false;
  std::optional<std::size_t> capacity_bytes;  ///< --capacity, when given
};

/// At most `points` event indices, evenly spaced, the last event always among them (none
/// for an empty log). `points` must be at least 1.
std::vector<std::uint32_t> timeline_sample_events(std::size_t events, std::size_t points);

/// The log's sizes, threads and streams, and its live bytes at the samples.
timeline log_timeline(allocation_log const& log, std::size_t points);

/// Replays `log` on the stack `spec` and samples it at `samples` (see the header comment).
/// Throws `spec_error` for a bad spec.
timeline_stack sample_stack(allocation_log const& log, std::string const& spec, replay_options const& options,
                            std::vector<std::uint32_t> const& samples);

}  // namespace mrstack
