// --timeline: the log's activity, and each stack sampled over one untimed replay.
#include "replay_run.hpp"

#include <mrstack/replay/timeline.hpp>

#include <algorithm>
#include <bit>
#include <new>

namespace mrstack {

std::vector<std::uint32_t> timeline_sample_events(std::size_t events, std::size_t points) {
  std::vector<std::uint32_t> samples;
  if (events == 0 || points == 0) { return samples; }
  std::size_t const count = std::min(events, points);
  samples.reserve(count);
  // Sample k (1..count) after event ceil(k * events / count) - 1: evenly spaced, the last
  // one after the last event.
  for (std::size_t k = 1; k <= count; ++k) {
    auto const after = static_cast<std::uint32_t>((k * events + count - 1) / count - 1);
    if (samples.empty() || samples.back() != after) { samples.push_back(after); }
  }
  return samples;
}

timeline log_timeline(allocation_log const& log, std::size_t points) {
  timeline t;
  t.events = log.events.size();
  t.sample_event = timeline_sample_events(log.events.size(), points);
  t.threads.resize(log.thread_names.size());
  for (std::size_t i = 0; i < t.threads.size(); ++i) { t.threads[i].name = log.thread_names[i]; }
  t.streams.resize(log.streams.size());
  for (std::size_t i = 0; i < t.streams.size(); ++i) { t.streams[i].name = log.stream_names[i]; }
  std::vector<std::size_t> buckets(64, 0);  // bucket b: sizes in [2^b, 2^(b+1))
  // The reader takes an allocation of 0 bytes at a real pointer (only a null one is
  // skipped): it has no power-of-two bucket (bit_width(0) - 1 would index before the
  // array), so it gets one of its own.
  std::size_t zero_byte_allocations = 0;
  std::size_t live = 0;  // cannot wrap: the reader refuses logs whose sums would
  std::size_t next_sample = 0;
  for (std::uint32_t i = 0; i < log.events.size(); ++i) {
    log_event const& e = log.events[i];
    activity& thread = t.threads[log.event_threads[i]];
    activity& stream = t.streams[e.stream];
    if (e.action == log_action::allocate) {
      live += e.bytes;
      ++thread.allocations;
      ++stream.allocations;
      thread.bytes_allocated += e.bytes;
      stream.bytes_allocated += e.bytes;
      if (e.bytes == 0) {
        ++zero_byte_allocations;
      } else {
        ++buckets[static_cast<std::size_t>(std::bit_width(e.bytes)) - 1];
      }
    } else {
      live -= e.bytes;
      ++thread.frees;
      ++stream.frees;
    }
    if (next_sample < t.sample_event.size() && t.sample_event[next_sample] == i) {
      t.live_bytes.push_back(live);
      ++next_sample;
    }
  }
  if (zero_byte_allocations != 0) { t.size_histogram.push_back({0, 0, zero_byte_allocations}); }
  for (std::size_t b = 0; b < 64; ++b) {
    if (buckets[b] == 0) { continue; }
    std::size_t const lo = std::size_t{1} << b;
    t.size_histogram.push_back({lo, b == 63 ? ~std::size_t{0} : (lo << 1) - 1, buckets[b]});
  }
  return t;
}

namespace {
/// The first refusal, with the stack's state at it where the stack can tell it.
replay_failure first_refusal(allocation_log const& log, std::uint32_t event, char const* what, memory_resource const& top) {
  replay_failure failure{log.event_lines[event], event, log.events[event].bytes, what, {}};
  try {
    failure.fragmentation = top.fragmentation();
  } catch (...) {
    // a broken introspection must not hide the refusal
  }
  return failure;
}
}  // namespace

timeline_stack sample_stack(allocation_log const& log, std::string const& spec, replay_options const& options,
                            std::vector<std::uint32_t> const& samples) {
  timeline_stack out;
  out.resource = spec;
  out.footprint_bytes.assign(samples.size(), std::nullopt);
  out.free_held_bytes.assign(samples.size(), std::nullopt);
  out.largest_free_block.assign(samples.size(), std::nullopt);
  stack_spec const built = replay_spec_for(spec, options.simulate, options.simulated_capacity);
  replay_detail::built_stack stack;
  try {
    stack = replay_detail::build_replay_stack(built, options);
  } catch (spec_error const&) {
    throw;
  } catch (std::exception const& e) {
    out.error = std::string{"building the stack failed: "} + e.what();
    return out;
  }
  replay_detail::replay_streams const streams{log, replay_detail::device_present()};
  memory_resource& top = *stack.top;
  std::vector<void*> pointers(log.allocation_count, nullptr);
  std::size_t next_sample = 0;
  for (std::uint32_t i = 0; i < log.events.size(); ++i) {
    log_event const& e = log.events[i];
    try {
      if (e.action == log_action::allocate) {
        pointers[e.allocation] = top.allocate(e.bytes, streams.data()[e.stream]);
      } else if (pointers[e.allocation] != nullptr) {
        top.deallocate(pointers[e.allocation], e.bytes, streams.data()[e.stream]);
        pointers[e.allocation] = nullptr;
      }
    } catch (std::bad_alloc const& refused) {
      if (e.action != log_action::allocate) {  // a free is never refused: the stack broke
        out.error = "line " + std::to_string(log.event_lines[i]) + ": a free threw " + refused.what();
        break;
      }
      if (!out.failure) { out.failure = first_refusal(log, i, refused.what(), top); }
    } catch (std::exception const& broken) {
      out.error = "line " + std::to_string(log.event_lines[i]) + ": " + broken.what();
      break;  // later samples stay null
    } catch (...) {
      out.error = "line " + std::to_string(log.event_lines[i]) + ": the stack threw an exception that is not a std::exception";
      break;
    }
    if (next_sample < samples.size() && samples[next_sample] == i) {
      try {
        fragmentation_info const f = top.fragmentation();
        out.footprint_bytes[next_sample] = stack.footprint_now();
        out.free_held_bytes[next_sample] = f.free_bytes;
        out.largest_free_block[next_sample] = f.largest_free_block;
      } catch (...) {
        out.error = "line " + std::to_string(log.event_lines[i]) + ": the stack's fragmentation() threw";
        break;
      }
      ++next_sample;
    }
  }
  for (std::uint32_t a = 0; a < log.allocation_count; ++a) {
    if (pointers[a] == nullptr) { continue; }
    log_event const& e = log.events[log.allocation_events[a]];
    try {
      top.deallocate(pointers[a], e.bytes, streams.data()[e.stream]);
    } catch (...) {
      // The stack broke: what is left goes with it.
    }
  }
  streams.synchronize();
  return out;
}

}  // namespace mrstack
