#pragma once
// Reports what the suballocators' CUDA stream-ordering calls cost during a benchmark's
// timed runs (mrstack::cuda_stream_sync_profile), per allocator call: where the time of a
// multi-threaded or multi-stream run goes when it is not in the allocator's own code.
#include <benchmark/benchmark.h>

#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack::bench {

/// Adds counters to `state`: cuda_syncs_per_call (every stream-ordering call: event
/// creates, records, stream waits, synchronizations and idle queries, per allocate-or-free
/// call), records_per_call, waits_per_call,
/// queries_per_call (is a stream idle?), ns_per_record and ns_per_query, and
/// cuda_sync_share (the threads' time inside those calls over threads × wall time).
inline void report_stream_sync(benchmark::State& state, stream_sync_profile const& before, double calls,
                               double threads, double wall_seconds) {
  stream_sync_profile const d = cuda_stream_sync_profile().since(before);
  if (calls <= 0) { return; }
  state.counters["cuda_syncs_per_call"] = static_cast<double>(d.total_calls()) / calls;
  state.counters["records_per_call"] = static_cast<double>(d.calls[stream_sync_profile::record]) / calls;
  state.counters["waits_per_call"] = static_cast<double>(d.calls[stream_sync_profile::wait]) / calls;
  state.counters["queries_per_call"] = static_cast<double>(d.calls[stream_sync_profile::query]) / calls;
  if (std::uint64_t const n = d.calls[stream_sync_profile::record]) {
    state.counters["ns_per_record"] = static_cast<double>(d.nanoseconds[stream_sync_profile::record]) / static_cast<double>(n);
  }
  if (std::uint64_t const n = d.calls[stream_sync_profile::query]) {
    state.counters["ns_per_query"] = static_cast<double>(d.nanoseconds[stream_sync_profile::query]) / static_cast<double>(n);
  }
  if (wall_seconds > 0 && threads > 0) {
    state.counters["cuda_sync_share"] = static_cast<double>(d.total_nanoseconds()) * 1e-9 / (threads * wall_seconds);
  }
}

}  // namespace mrstack::bench
