// Shrinking a failing log by delta debugging over allocation/free pairs.
#include "replay_run.hpp"

#include <mrstack/detail/format.hpp>
#include <mrstack/replay/shrink.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>
#include <optional>

namespace mrstack {

namespace {

using replay_detail::build_replay_stack;
constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

char const* refusal_kind(std::bad_alloc const& e) {
  return dynamic_cast<out_of_memory const*>(&e) != nullptr ? "out_of_memory" : "bad_alloc";
}

/// Replays subsets of the log on fresh stacks.
class failure_probe {
 public:
  failure_probe(allocation_log const& log, std::string const& spec, replay_options const& options)
      : log_{log},
        spec_{replay_spec_for(spec, options.simulate, options.simulated_capacity)},
        options_{options},
        streams_{log, replay_detail::device_present()},
        pointers_(log.allocation_count, nullptr),
        free_event_(log.allocation_count, none) {
    for (std::uint32_t i = 0; i < log.events.size(); ++i) {
      if (log.events[i].action == log_action::free) { free_event_[log.events[i].allocation] = i; }
    }
  }

  struct refusal {
    std::string kind;
    std::uint32_t event = 0;
  };

  /// The events of `units` (allocation indices) before `end`, in log order.
  [[nodiscard]] std::vector<std::uint32_t> events_of(std::vector<std::uint32_t> const& units, std::uint32_t end) const {
    std::vector<std::uint32_t> events;
    events.reserve(units.size() * 2);
    for (std::uint32_t const a : units) {
      events.push_back(log_.allocation_events[a]);
      if (free_event_[a] < end) { events.push_back(free_event_[a]); }
    }
    std::sort(events.begin(), events.end());
    return events;
  }

  /// Replays `events` on a fresh stack, each on its log stream's stream as a replay uses
  /// them (a stack that keeps streams' memory apart fails differently on one stream); the
  /// first refusal, if any.
  std::optional<refusal> first_refusal(std::vector<std::uint32_t> const& events) {
    ++tests_;
    auto const stack = build_replay_stack(spec_, options_);
    memory_resource& top = *stack.top;
    std::optional<refusal> found;
    std::vector<std::uint32_t> made;
    for (std::uint32_t const i : events) {
      log_event const& e = log_.events[i];
      try {
        if (e.action == log_action::allocate) {
          pointers_[e.allocation] = top.allocate(e.bytes, streams_.data()[e.stream]);
          made.push_back(e.allocation);
        } else if (pointers_[e.allocation] != nullptr) {
          top.deallocate(pointers_[e.allocation], e.bytes, streams_.data()[e.stream]);
          pointers_[e.allocation] = nullptr;
        }
      } catch (std::bad_alloc const& refused) {
        // Only an allocation is refused; a free that throws is a stack broken another way.
        if (e.action == log_action::allocate) { found = refusal{refusal_kind(refused), i}; }
        break;
      } catch (...) {
        break;  // broken another way (a std::exception or not): not the same failure
      }
    }
    for (std::uint32_t const a : made) {  // back to the stack before it goes
      if (pointers_[a] == nullptr) { continue; }
      log_event const& made_by = log_.events[log_.allocation_events[a]];
      try {
        top.deallocate(pointers_[a], made_by.bytes, streams_.data()[made_by.stream]);
      } catch (...) {
        // The stack broke; it goes with what it holds.
      }
      pointers_[a] = nullptr;
    }
    return found;
  }

  [[nodiscard]] std::size_t tests() const noexcept { return tests_; }

 private:
  allocation_log const& log_;
  stack_spec spec_;
  replay_options options_;
  replay_detail::replay_streams streams_;  // outlive every stack of the probe
  std::vector<void*> pointers_;
  std::vector<std::uint32_t> free_event_;
  std::size_t tests_ = 0;
};

/// ddmin over `units`: the smallest set it finds on which `fails` holds. Each round splits
/// the set into n pieces and keeps one piece, or all but one, that still fails; when
/// neither does, it splits finer, up to single units.
template <class Fails>
std::vector<std::uint32_t> ddmin(std::vector<std::uint32_t> units, Fails&& fails) {
  std::size_t n = 2;
  while (units.size() >= 2) {
    std::size_t const piece = (units.size() + n - 1) / n;
    bool reduced = false;
    for (std::size_t start = 0; start < units.size() && !reduced; start += piece) {
      std::size_t const stop = std::min(units.size(), start + piece);
      std::vector<std::uint32_t> const only(units.begin() + static_cast<std::ptrdiff_t>(start),
                                            units.begin() + static_cast<std::ptrdiff_t>(stop));
      if (fails(only)) {
        units = only;
        n = 2;
        reduced = true;
      }
    }
    for (std::size_t start = 0; start < units.size() && !reduced && n > 2; start += piece) {
      std::size_t const stop = std::min(units.size(), start + piece);
      std::vector<std::uint32_t> rest(units.begin(), units.begin() + static_cast<std::ptrdiff_t>(start));
      rest.insert(rest.end(), units.begin() + static_cast<std::ptrdiff_t>(stop), units.end());
      if (fails(rest)) {
        units = std::move(rest);
        n = std::max<std::size_t>(n - 1, 2);
        reduced = true;
      }
    }
    if (reduced) { continue; }
    if (n >= units.size()) { break; }
    n = std::min(units.size(), n * 2);
  }
  return units;
}

}  // namespace

shrink_result shrink_failing_log(allocation_log const& log, std::string const& spec, replay_options const& options) {
  auto const t0 = std::chrono::steady_clock::now();
  shrink_result result;
  failure_probe probe{log, spec, options};
  std::vector<std::uint32_t> all(log.events.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) { all[i] = i; }
  auto const original = probe.first_refusal(all);
  if (original) {
    result.failed = true;
    log_event const& e = log.events[original->event];
    // Appended piece by piece: GCC 12's -Wrestrict misfires on a chain of + here.
    result.failure = original->kind;
    result.failure.append(" (line ").append(std::to_string(log.event_lines[original->event]));
    result.failure.append(" of the log, ").append(std::to_string(e.bytes)).append(" bytes)");
    std::uint32_t const end = original->event + 1;
    auto fails = [&](std::vector<std::uint32_t> const& units) {
      auto const r = probe.first_refusal(probe.events_of(units, end));
      return r && r->kind == original->kind;
    };
    // The units before the cut; the first guess: those live at the refusal.
    std::vector<std::uint32_t> units;
    std::vector<bool> live(log.allocation_count, false);
    for (std::uint32_t i = 0; i < end; ++i) {
      log_event const& ev = log.events[i];
      if (ev.action == log_action::allocate) { units.push_back(ev.allocation); }
      live[ev.allocation] = ev.action == log_action::allocate;
    }
    std::vector<std::uint32_t> live_units;
    for (std::uint32_t const a : units) {
      if (live[a]) { live_units.push_back(a); }
    }
    if (fails(live_units)) { units = std::move(live_units); }
    units = ddmin(std::move(units), fails);
    result.kept_allocations = units.size();
    result.kept_events = probe.events_of(units, end);
  }
  result.tests = probe.tests();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

std::string failing_log_csv(allocation_log const& log, std::vector<std::uint32_t> const& events) {
  std::string out = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (std::uint32_t const i : events) {
    log_event const& e = log.events[i];
    out += log.thread_names[log.event_threads[i]];
    out += e.action == log_action::allocate ? ",0,allocate," : ",0,free,";
    // One address per allocation, 4 KiB apart: unique, and plausible to a reader.
    out += format_hex((static_cast<unsigned long long>(e.allocation) + 1) << 12);
    out.append(",").append(std::to_string(e.bytes)).append(",").append(log.stream_names[e.stream]).append("\n");
  }
  return out;
}

}  // namespace mrstack
