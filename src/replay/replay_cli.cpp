// mrstack-replay's command line: reads the log, replays each stack, prints the table, the
// notes and the verdict, and writes --json, --timeline and --shrink. The parts are in
// cli_arguments.cpp, cli_table.cpp, cli_json.cpp and cli_verdict.cpp.
#include "cli.hpp"

#include <mrstack/replay/shrink.hpp>
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>

#include <unistd.h>

namespace mrstack {

using namespace replay_cli;

namespace {

/// The default stacks, in the order shown; those naming a resource this build lacks are left out.
/// pool > vmm is the one stack that is both compact and fast, so it is shown by default.
std::vector<std::string> const default_stacks = {"pool > cuda", "pool > vmm", "binning > pool > cuda", "arena > cuda",
                                                 "cuda_async", "cuda"};

bool names_registered(std::string const& spec) {
  try {
    auto const parsed = parse_stack_spec(spec);
    return std::all_of(parsed.layers.begin(), parsed.layers.end(),
                       [](spec_layer const& l) { return find_resource(l.name) != nullptr; });
  } catch (spec_error const&) {
    return false;
  }
}

/// Shows progress on a terminal: "replaying pool > cuda: 45% (4,092 of 9,094 events)".
struct terminal_progress {
  std::FILE* err;
  std::string label;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool shown = false;

  void operator()(std::size_t done, std::size_t total) {
    if (std::chrono::steady_clock::now() - start < std::chrono::seconds{1} || total == 0) { return; }
    std::fprintf(err, "\r  replaying %s: %3zu%% (%s of %s events)\033[K", printable(label).c_str(), done * 100 / total,
                 with_commas(done).c_str(), with_commas(total).c_str());
    std::fflush(err);
    shown = true;
  }
};

/// The stacks to replay, each checked before the log is read. Returns false (after saying
/// why) when one is not a valid spec.
bool stacks_to_replay(arguments const& a, memory_setting const& memory, std::vector<std::string>& resources,
                      std::FILE* err) {
  resources = a.resources;
  if (resources.empty()) {
    for (auto const& s : default_stacks) {
      if (names_registered(s)) { resources.push_back(s); }
    }
  }
  for (auto const& spec : resources) {
    try {
      // As it will be built: its simulated bottom and the footprint_meter the replay adds
      // (a 64-layer spec had its error only after the log was read).
      stack_spec const built = replay_spec_for(spec, memory.simulate, memory.capacity);
      if (memory.simulate) {
        // Percentages resolved against the simulated device, as the build will: one out of
        // its parameter's range had its error only after the log was read.
        build_options resolved;
        resolved.percent_base = memory.capacity;
        check_stack_spec(built, resolved);
      }
    } catch (spec_error const& e) {
      std::fprintf(err, "mrstack-replay: --resource: %s\n", e.what());
      return false;
    }
  }
  return true;
}

replay_options options_for(arguments const& a, memory_setting const& memory) {
  replay_options options;
  options.simulate = memory.simulate;
  options.simulated_capacity = memory.capacity;
  options.repeat = a.repeat;
  options.warmup = a.warmup;
  options.order = a.order;
  options.workers = a.workers;
  options.expect_failures = a.expect_failures;
  return options;
}

/// Replays every stack, printing the table a row at a time. Returns false (after saying
/// why) for a spec that cannot be built.
bool replay_all(arguments const& a, allocation_log const& log, memory_setting const& memory,
                std::vector<std::string> const& resources, std::vector<replay_result>& results, std::FILE* out,
                std::FILE* err) {
  std::vector<std::string> labels;
  bool any_lower_bound = false;
  for (auto const& spec : resources) {
    bool const lower_bound = footprint_is_lower_bound(spec, memory.simulate);
    any_lower_bound = any_lower_bound || lower_bound;
    labels.push_back(spec + (lower_bound ? "*" : ""));
  }
  table const t{labels, log};
  std::fputs(t.row(t.headings).c_str(), out);
  std::fflush(out);
  bool const tty = ::isatty(::fileno(err)) != 0;
  for (std::size_t i = 0; i < resources.size(); ++i) {
    replay_options options = options_for(a, memory);
    auto progress = std::make_shared<terminal_progress>(terminal_progress{err, resources[i]});
    if (tty) {
      options.progress = [progress](std::size_t done, std::size_t total) { (*progress)(done, total); };
    }
    try {
      results.push_back(replay_stack(log, resources[i], options));
    } catch (spec_error const& e) {
      if (progress->shown) { std::fprintf(err, "\r\033[K"); }
      std::fprintf(err, "mrstack-replay: --resource: %s\n", e.what());
      return false;
    }
    if (progress->shown) { std::fprintf(err, "\r\033[K"); }
    std::fputs(t.cells_of(results.back(), labels[i]).c_str(), out);
    std::fflush(out);
  }
  std::string const notes = notes_text(results, log, any_lower_bound, memory.simulate);
  if (!notes.empty()) { std::fprintf(out, "\n%s", notes.c_str()); }
  std::fprintf(out, "\n%s\n", verdict_text(results).c_str());
  return true;
}

/// --timeline: one more untimed pass per stack, sampled. Returns false after saying why
/// the file could not be written.
bool write_timeline(arguments const& a, allocation_log const& log, memory_setting const& memory,
                    std::vector<std::string> const& resources, std::vector<replay_result> const& results,
                    std::FILE* err) {
  timeline t = log_timeline(log, a.timeline_points);
  t.simulated = memory.simulate;
  t.capacity_bytes = a.capacity;
  replay_options options = options_for(a, memory);
  for (auto const& spec : resources) { t.stacks.push_back(sample_stack(log, spec, options, t.sample_event)); }
  try {
    write_atomically(*a.timeline_path, timeline_json(t, results, a.log_path, a.warmup));
  } catch (std::exception const& e) {
    std::fprintf(err, "mrstack-replay: --timeline: %s\n", e.what());
    return false;
  }
  return true;
}

/// --shrink: a smaller log on which the one stack fails the same way. Returns the exit status.
/// `replayed`: whether the replay above ran the whole log on the stack; when the shrink's own
/// probe (one cold replay in strict order) finds no refusal, that is the exit status.
int shrink(arguments const& a, allocation_log const& log, memory_setting const& memory, bool replayed,
           std::FILE* out, std::FILE* err) {
  replay_options options = options_for(a, memory);
  shrink_result s;
  try {
    s = shrink_failing_log(log, a.resources.front(), options);
  } catch (std::exception const& e) {
    // The stack cannot be built or broke (the replay above said so too): a failure of the
    // stack, exit 1, not unusable input.
    std::fprintf(out, "\nshrink: %s cannot be replayed to shrink the log: %s\n", printable(a.resources.front()).c_str(),
                 e.what());
    return 1;
  } catch (...) {
    std::fprintf(out, "\nshrink: %s cannot be replayed to shrink the log: it threw an exception that is not a "
                      "std::exception\n", printable(a.resources.front()).c_str());
    return 1;
  }
  if (!s.failed) {
    if (replayed) {
      std::fprintf(out, "\nshrink: %s refused nothing on this log: nothing to shrink (try a smaller --capacity)\n",
                   printable(a.resources.front()).c_str());
      return 0;
    }
    // The replay above failed (a broken stack, or refusals in per-thread order or warm) where
    // a cold strict replay refuses nothing: nothing to shrink, but not a success.
    std::fprintf(out, "\nshrink: a cold replay of %s in strict order refused nothing, so there is nothing to "
                      "shrink; the failure above is not a refusal of that replay\n",
                 printable(a.resources.front()).c_str());
    return 1;
  }
  try {
    write_atomically(*a.shrink_path, failing_log_csv(log, s.kept_events));
  } catch (std::exception const& e) {
    std::fprintf(err, "mrstack-replay: --shrink: %s\n", e.what());
    return 2;
  }
  std::fprintf(out,
               "\nshrink: kept %s of %s events (%s allocations) in %.2f s (%s replays); %s still fails with\n"
               "        %s; written to %s\n",
               with_commas(s.kept_events.size()).c_str(), with_commas(log.events.size()).c_str(),
               with_commas(s.kept_allocations).c_str(), s.seconds, with_commas(s.tests).c_str(),
               printable(a.resources.front()).c_str(), s.failure.c_str(), printable(*a.shrink_path).c_str());
  return 1;
}

/// Refuses an output that cannot be written (a folder, a missing or read-only folder)
/// before the replay: found after it, the replay (minutes on a large log) was wasted and
/// the outputs written before it (--json before --timeline) were left behind.
bool outputs_writable(arguments const& a, std::FILE* err) {
  for (auto const& [option, path] : {std::pair{"--json", &a.json_path}, std::pair{"--timeline", &a.timeline_path},
                                     std::pair{"--shrink", &a.shrink_path}}) {
    if (!*path) { continue; }
    std::error_code ec;
    std::filesystem::path const folder = std::filesystem::path{**path}.parent_path();
    char const* why = nullptr;
    auto const kind = std::filesystem::status(**path, ec).type();
    if (kind == std::filesystem::file_type::directory) {
      why = std::strerror(EISDIR);
    } else if (kind != std::filesystem::file_type::regular && kind != std::filesystem::file_type::not_found) {
      continue;  // a device or FIFO: written in place, its folder untouched
    } else if (::access(folder.empty() ? "." : folder.c_str(), W_OK) != 0) {
      why = std::strerror(errno);
    }
    if (why != nullptr) {
      std::fprintf(err, "mrstack-replay: %s: cannot write %s: %s\n", option, printable(**path).c_str(), why);
      return false;
    }
  }
  return true;
}

int run(arguments const& a, std::FILE* out, std::FILE* err) {
  memory_setting memory;
  memory.device = probe_device();
  // --shrink replays its stack hundreds of times: simulated memory keeps that fast.
  memory.simulate_asked = a.simulate || a.shrink_path.has_value();
  memory.simulate = memory.simulate_asked || !memory.device.available;
  memory.capacity = a.capacity.value_or(memory.device.available ? memory.device.total_bytes : std::size_t{80} << 30);
  std::vector<std::string> resources;
  if (!stacks_to_replay(a, memory, resources, err) || !outputs_writable(a, err)) { return 2; }
  allocation_log log;
  try {
    log = read_allocation_log(a.log_path, a.limits);
  } catch (log_error const& e) {
    std::fprintf(err, "mrstack-replay: %s\n", e.what());
    return 2;
  }
  print_header(out, a, log, memory);
  std::vector<replay_result> results;
  if (!replay_all(a, log, memory, resources, results, out, err)) { return 2; }
  // --json and --timeline, each whole or not at all.
  if (a.json_path) {
    try {
      write_atomically(*a.json_path, results_json(results, a.log_path, a.warmup));
    } catch (std::exception const& e) {
      std::fprintf(err, "mrstack-replay: --json: %s\n", e.what());
      return 2;
    }
  }
  if (a.timeline_path && !write_timeline(a, log, memory, resources, results, err)) { return 2; }
  bool const all_complete = std::all_of(results.begin(), results.end(), [](replay_result const& r) { return r.complete(); });
  if (a.shrink_path) { return shrink(a, log, memory, all_complete, out, err); }
  return all_complete ? 0 : 1;
}

/// --write-csv: the log's text, checked as a log, written whole or not at all.
int write_csv(arguments const& a, std::FILE* out, std::FILE* err) {
  std::string text;
  allocation_log log;
  try {
    text = read_log_text(a.log_path, a.limits);
    log = parse_allocation_log(text, a.log_path, a.limits);
  } catch (log_error const& e) {
    std::fprintf(err, "mrstack-replay: %s\n", e.what());
    return 2;
  }
  try {
    write_atomically(*a.csv_path, text);
  } catch (std::exception const& e) {
    std::fprintf(err, "mrstack-replay: --write-csv: %s\n", e.what());
    return 2;
  }
  std::fprintf(out, "mrstack-replay: wrote %s (%s, %s) as CSV to %s\n", printable(a.log_path).c_str(),
               count_of(log.events.size(), "event", "events").c_str(),
               count_of(log.thread_names.size(), "thread", "threads").c_str(), printable(*a.csv_path).c_str());
  return 0;
}

int run_tool(std::vector<std::string> const& args, std::FILE* out, std::FILE* err) {
  arguments a;
  try {
    a = parse_arguments(args);
  } catch (usage_error const& e) {
    std::fprintf(err, "mrstack-replay: %s\n\n%s", e.what.c_str(), usage_text);
    return 2;
  }
  if (a.help) {
    std::fputs(usage_text, out);
    return 0;
  }
  if (a.list_resources) {
    list_resources(out);
    return 0;
  }
  try {
    return a.csv_path ? write_csv(a, out, err) : run(a, out, err);
  } catch (std::exception const& e) {
    std::fprintf(err, "mrstack-replay: %s\n", e.what());
    return 2;
  } catch (...) {
    // Only a stack (a resource registered by the program embedding the tool) throws so.
    std::fprintf(err, "mrstack-replay: a stack threw an exception that is not a std::exception\n");
    return 1;
  }
}

}  // namespace

int run_replay_tool(std::vector<std::string> const& args, std::FILE* out, std::FILE* err) {
  int const status = run_tool(args, out, err);
  // The table and the verdict are the tool's result: when they could not be written
  // (stdout on a full disk, a closed pipe) the run did not do its work, whatever the
  // replay said; exit 0 there would report success with nothing shown.
  if (std::fflush(out) != 0 || std::ferror(out) != 0) {
    std::fprintf(err, "mrstack-replay: cannot write the output: %s\n", std::strerror(errno));
    return 2;
  }
  return status;
}

}  // namespace mrstack
