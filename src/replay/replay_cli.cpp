// mrstack-replay's command line: arguments, the header, the table, the verdict, --json.
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include <unistd.h>

namespace mrstack {

namespace {

char const* const usage_text =
    "usage: mrstack-replay LOG.csv[.gz] [--resource SPEC]... [--simulate] [--capacity SIZE]\n"
    "                      [--repeat N] [--json FILE]\n"
    "       mrstack-replay --list-resources\n"
    "\n"
    "Replays an allocation log (CSV Thread,Time,Action,Pointer,Size,Stream, plain or gzip:\n"
    "what mrstack's and RMM's logging adaptors write) against stacks and compares them.\n"
    "\n"
    "  -r, --resource SPEC  a stack to replay, top to bottom, e.g. 'binning > pool > cuda';\n"
    "                       give it several times to compare (default: pool > cuda,\n"
    "                       pool > vmm, binning > pool > cuda, arena > cuda, cuda_async,\n"
    "                       cuda)\n"
    "  --simulate           replace each stack's bottom by simulated memory, touching none\n"
    "                       (automatic when there is no CUDA device)\n"
    "  --capacity SIZE      memory of the simulated device (default: the GPU's, else 80GiB)\n"
    "  --repeat N           replay each stack N times; times are the median (default 1)\n"
    "  --warmup             before each timed run, replay once untimed on the same stack:\n"
    "                       time the steady state (a pool already grown), not growth\n"
    "  --json FILE          also write the results as a JSON list, one object per stack\n"
    "  --list-resources     every resource and parameter a spec can name\n"
    "  -h, --help           this text\n"
    "\n"
    "Exit status: 0 every stack replayed the whole log, 1 an allocation failed (or a stack\n"
    "broke), 2 unusable input or arguments.\n";

/// The default stacks, in the order shown; those naming a resource this build lacks are left out.
/// pool > vmm is the one stack that is both compact and fast (issue 6), so it is shown by default.
std::vector<std::string> const default_stacks = {"pool > cuda", "pool > vmm", "binning > pool > cuda", "arena > cuda",
                                                 "cuda_async", "cuda"};

struct usage_error {
  std::string what;
};

struct arguments {
  std::string log_path;
  std::vector<std::string> resources;
  bool simulate = false;
  std::optional<std::size_t> capacity;
  int repeat = 1;
  bool warmup = false;
  std::optional<std::string> json_path;
  bool list_resources = false;
  bool help = false;
};

arguments parse_arguments(std::vector<std::string> const& args) {
  arguments a;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (auto const eq = arg.find('='); eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    }
    auto value = [&]() -> std::string {
      if (inline_value) { return *inline_value; }
      if (i + 1 >= args.size()) { throw usage_error{arg + " needs a value"}; }
      return args[++i];
    };
    auto no_value = [&] {
      if (inline_value) { throw usage_error{arg + " takes no value"}; }
    };
    if (arg == "-r" || arg == "--resource") {
      a.resources.push_back(value());
    } else if (arg == "--simulate") {
      no_value();
      a.simulate = true;
    } else if (arg == "--capacity") {
      std::string const text = value();
      std::string why;
      auto const bytes = parse_size(text, &why);
      if (!bytes || *bytes == 0) { throw usage_error{"--capacity '" + text + "': " + (bytes ? "must be more than 0" : why)}; }
      a.capacity = bytes;
    } else if (arg == "--repeat") {
      std::string const text = value();
      char* end = nullptr;
      long const n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1 || n > 1000000) {
        throw usage_error{"--repeat '" + text + "': expected a whole number of runs, at least 1"};
      }
      a.repeat = static_cast<int>(n);
    } else if (arg == "--warmup") {
      no_value();
      a.warmup = true;
    } else if (arg == "--json") {
      a.json_path = value();
      if (a.json_path->empty()) { throw usage_error{"--json needs a file name"}; }
    } else if (arg == "--list-resources") {
      no_value();
      a.list_resources = true;
    } else if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw usage_error{"unknown option '" + arg + "'"};
    } else if (a.log_path.empty()) {
      a.log_path = arg;
    } else {
      throw usage_error{"one log at a time: '" + a.log_path + "' and '" + arg + "' were both given"};
    }
  }
  if (!a.help && !a.list_resources && a.log_path.empty()) { throw usage_error{"no log given"}; }
  return a;
}

// ---- formatting ---------------------------------------------------------------------

std::string with_commas(std::size_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) { out += ','; }
    out += digits[i];
  }
  return out;
}

std::string short_bytes(std::size_t bytes) {
  char buf[32];
  double const b = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else if (bytes < (std::size_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  } else if (bytes < (std::size_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  }
  return buf;
}

std::string short_seconds(double s) {
  char buf[32];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  }
  return buf;
}

std::string ns_text(double ns) {
  if (ns >= 100) { return with_commas(static_cast<std::size_t>(std::llround(ns))); }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", ns);
  return buf;
}

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fx", r);
  return buf;
}

std::string json_escape(std::string const& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string json_number(double x) {
  if (!std::isfinite(x)) { return "null"; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

/// Writes `text` to `path` through a temporary file in the same folder and a rename, so a
/// reader never sees half a file and a failed run leaves none.
void write_atomically(std::string const& path, std::string const& text) {
  std::string const tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f{tmp, std::ios::binary | std::ios::trunc};
    if (!f) { throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno)); }
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int const saved = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(saved));
  }
}

/// JSON, built by appending (one "key": value after another) to stay readable.
class json_object {
 public:
  json_object& raw(char const* key, std::string const& value) {
    text_ += text_.empty() ? "{" : ", ";
    text_ += '"';
    text_ += key;
    text_ += "\": ";
    text_ += value;
    return *this;
  }
  json_object& string(char const* key, std::string const& value) {
    std::string quoted{"\""};
    quoted += json_escape(value);
    quoted += '"';
    return raw(key, quoted);
  }
  json_object& number(char const* key, double value) { return raw(key, json_number(value)); }
  json_object& integer(char const* key, std::size_t value) { return raw(key, std::to_string(value)); }
  json_object& boolean(char const* key, bool value) { return raw(key, value ? "true" : "false"); }
  json_object& null(char const* key) { return raw(key, "null"); }
  [[nodiscard]] std::string str() const { return text_ + "}"; }

 private:
  std::string text_;
};

std::string results_json(std::vector<replay_result> const& results, std::string const& log_path, bool warmup) {
  std::string out = "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto const& r = results[i];
    std::string seconds_list{"["};
    for (std::size_t k = 0; k < r.seconds.size(); ++k) {
      if (k > 0) { seconds_list += ", "; }
      seconds_list += json_number(r.seconds[k]);
    }
    seconds_list += "]";
    json_object o;
    o.string("resource", r.resource).string("built_as", r.built_as).string("log", log_path);
    o.boolean("simulated", r.simulated).boolean("warmup", warmup).integer("events", r.events).integer("failures", r.failures);
    if (r.failures > 0) {
      o.integer("first_failure_line", r.first_failure_line).integer("first_failure_bytes", r.first_failure_bytes);
      o.string("first_failure_message", r.first_failure_message);
    } else {
      o.null("first_failure_line").null("first_failure_bytes").null("first_failure_message");
    }
    o.number("seconds", r.median_seconds).raw("seconds_per_run", seconds_list).number("ns_per_event", r.ns_per_event);
    o.integer("peak_live_bytes", r.peak_live_bytes).integer("peak_footprint_bytes", r.peak_footprint_bytes);
    o.number("footprint_ratio", r.footprint_ratio()).string("footprint_measured_by", r.footprint_measured_by);
    o.boolean("footprint_lower_bound", r.footprint_lower_bound).integer("upstream_allocations", r.upstream_allocations);
    o.integer("leaks", r.leaks).integer("leaked_bytes", r.leaked_bytes);
    if (r.error.empty()) {
      o.null("error");
    } else {
      o.string("error", r.error);
    }
    out += "  " + o.str() + (i + 1 < results.size() ? ",\n" : "\n");
  }
  out += "]\n";
  return out;
}

// ---- the machine --------------------------------------------------------------------

std::string machine_description() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) { std::strcpy(host, "unknown"); }
  std::string cpu;
  std::ifstream info{"/proc/cpuinfo"};
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 1);
      cpu.erase(0, cpu.find_first_not_of(' '));
      break;
    }
  }
  std::string out = "host " + std::string{host};
  if (!cpu.empty()) { out += ", " + cpu; }
  out += ", " + std::to_string(std::thread::hardware_concurrency()) + " CPU threads";
  return out;
}

void list_resources(std::FILE* out) {
  std::fprintf(out, "Resources a stack spec can name (top > ... > bottom; see docs/spec.md):\n");
  for (auto const* r : registered_resources()) {
    std::fprintf(out, "\n  %s%s\n    %s\n", r->name.c_str(),
                 r->upstream == upstream_rule::none ? "  (bottom: takes no upstream)" : "", r->summary.c_str());
    for (auto const& p : r->parameters) {
      std::string const def = p.is_required ? "required" : (p.default_text.empty() ? "optional" : "default " + p.default_text);
      std::string const range = describe_range(p);
      std::string const accepts = range.empty() ? "" : "; " + range;
      std::fprintf(out, "    %-18s %-6s %s (%s%s)\n", p.name.c_str(), to_string(p.type), p.doc.c_str(), def.c_str(),
                   accepts.c_str());
    }
  }
}

bool names_registered(std::string const& spec) {
  try {
    auto const parsed = parse_stack_spec(spec);
    return std::all_of(parsed.layers.begin(), parsed.layers.end(),
                       [](spec_layer const& l) { return find_resource(l.name) != nullptr; });
  } catch (spec_error const&) {
    return false;
  }
}

// ---- the table ----------------------------------------------------------------------

struct table {
  std::vector<std::string> headings{"resource", "events", "wall time", "ns/event", "peak live", "peak footprint",
                                    "footprint/live", "leaks", "failures"};
  std::vector<std::size_t> widths;

  explicit table(std::vector<std::string> const& resources, allocation_log const& log) {
    widths.resize(headings.size());
    for (std::size_t c = 0; c < headings.size(); ++c) { widths[c] = headings[c].size(); }
    for (auto const& r : resources) { widths[0] = std::max(widths[0], r.size() + 1); }
    widths[1] = std::max(widths[1], with_commas(log.events.size()).size());
    widths[2] = std::max<std::size_t>(widths[2], 9);
    widths[3] = std::max<std::size_t>(widths[3], 8);
    widths[4] = std::max<std::size_t>(widths[4], 10);
    // failures is last: "12 (line 3456)" may run past its heading without shifting a column.
  }

  std::string row(std::vector<std::string> const& cells) const {
    std::string out;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      std::string const& cell = cells[c];
      std::size_t const pad = widths[c] > cell.size() ? widths[c] - cell.size() : 0;
      if (c == 0) {
        out += cell + std::string(pad, ' ');
      } else {
        out += "  " + std::string(pad, ' ') + cell;
      }
    }
    while (!out.empty() && out.back() == ' ') { out.pop_back(); }
    return out + "\n";
  }

  std::string cells_of(replay_result const& r, std::string const& label) const {
    if (!r.error.empty()) {
      return row({label, "-", "-", "-", "-", "-", "-", "-", "error"});
    }
    std::string const failures =
        r.failures == 0 ? "0" : with_commas(r.failures) + " (line " + std::to_string(r.first_failure_line) + ")";
    return row({label, with_commas(r.events), short_seconds(r.median_seconds), ns_text(r.ns_per_event),
                short_bytes(r.peak_live_bytes), short_bytes(r.peak_footprint_bytes), ratio_text(r.footprint_ratio()),
                with_commas(r.leaks), failures});
  }
};

/// Shows progress on a terminal: "replaying pool > cuda: 45% (4,092 of 9,094 events)".
struct terminal_progress {
  std::FILE* err;
  std::string label;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool shown = false;

  void operator()(std::size_t done, std::size_t total) {
    if (std::chrono::steady_clock::now() - start < std::chrono::seconds{1} || total == 0) { return; }
    std::fprintf(err, "\r  replaying %s: %3zu%% (%s of %s events)\033[K", label.c_str(), done * 100 / total,
                 with_commas(done).c_str(), with_commas(total).c_str());
    std::fflush(err);
    shown = true;
  }
};

int run(arguments const& a, std::FILE* out, std::FILE* err) {
  // 1. Every spec is checked before the log is read and anything replays.
  std::vector<std::string> resources = a.resources;
  if (resources.empty()) {
    for (auto const& s : default_stacks) {
      if (names_registered(s)) { resources.push_back(s); }
    }
  }
  for (auto const& spec : resources) {
    try {
      check_stack_spec(parse_stack_spec(spec));
    } catch (spec_error const& e) {
      std::fprintf(err, "mrstack-replay: --resource: %s\n", e.what());
      return 2;
    }
  }

  // 2. Real or simulated memory.
  device_report const device = probe_device();
  bool const simulate = a.simulate || !device.available;
  std::size_t const capacity = a.capacity.value_or(device.available ? device.total_bytes : std::size_t{80} << 30);

  // 3. The log.
  allocation_log log;
  try {
    log = read_allocation_log(a.log_path);
  } catch (log_error const& e) {
    std::fprintf(err, "mrstack-replay: %s\n", e.what());
    return 2;
  }

  // 4. The header.
  std::fprintf(out, "mrstack-replay %s\n", a.log_path.c_str());
  std::fprintf(out, "  log:     %s events (%s allocations, %s frees) on %zu thread%s and %zu stream%s; peak live %s\n",
               with_commas(log.events.size()).c_str(), with_commas(log.allocation_count).c_str(),
               with_commas(log.free_count()).c_str(), log.thread_names.size(), log.thread_names.size() == 1 ? "" : "s",
               log.streams.size(), log.streams.size() == 1 ? "" : "s", short_bytes(log.peak_live_bytes).c_str());
  if (!log.recorded_failures.empty()) {
    std::fprintf(out, "           the log records %zu allocation failure%s (first at line %u): reported, not replayed\n",
                 log.recorded_failures.size(), log.recorded_failures.size() == 1 ? "" : "s",
                 log.recorded_failures.front().line);
  }
  if (simulate) {
    if (a.simulate) {
      std::fprintf(out, "  memory:  SIMULATED (--simulate);\n");
    } else {
      std::fprintf(out, "  memory:  SIMULATED: no CUDA device (%s);\n", device.why_not.c_str());
    }
    std::fprintf(out, "           each stack's bottom is simulated(capacity=%s), touching no memory\n",
                 short_bytes(capacity).c_str());
    if (!device.available && log.streams.size() > 1) {
      std::fprintf(out, "           without a device the log's %zu streams replay on one stream handle\n", log.streams.size());
    }
  } else {
    std::fprintf(out, "  memory:  REAL device memory: %s (device %d, %s, %s free)\n", device.name.c_str(), device.ordinal,
                 short_bytes(device.total_bytes).c_str(), short_bytes(device.free_bytes).c_str());
  }
  std::fprintf(out, "  machine: %s\n", machine_description().c_str());
  if (a.repeat > 1 || a.warmup) {
    std::string runs{"one run per stack"};
    if (a.repeat > 1) { runs = std::string{"median of "}.append(std::to_string(a.repeat)).append(" runs per stack"); }
    std::fprintf(out, "  timing:  %s%s\n", runs.c_str(),
                 a.warmup ? ", each after an untimed warm-up run on the same stack" : "");
  }
  std::fprintf(out, "\n");

  // 5. Replay, one stack after another, printing each row as it is done.
  std::vector<std::string> labels;
  bool any_lower_bound = false;
  for (auto const& spec : resources) {
    bool const lower_bound = footprint_is_lower_bound(spec, simulate);
    any_lower_bound = any_lower_bound || lower_bound;
    labels.push_back(spec + (lower_bound ? "*" : ""));
  }
  table const t{labels, log};
  std::fputs(t.row(t.headings).c_str(), out);
  std::fflush(out);
  bool const tty = ::isatty(::fileno(err)) != 0;
  std::vector<replay_result> results;
  for (std::size_t i = 0; i < resources.size(); ++i) {
    replay_options options;
    options.simulate = simulate;
    options.simulated_capacity = capacity;
    options.repeat = a.repeat;
    options.warmup = a.warmup;
    auto progress = std::make_shared<terminal_progress>(terminal_progress{err, resources[i]});
    if (tty) {
      options.progress = [progress](std::size_t done, std::size_t total) { (*progress)(done, total); };
    }
    try {
      results.push_back(replay_stack(log, resources[i], options));
    } catch (spec_error const& e) {
      if (progress->shown) { std::fprintf(err, "\r\033[K"); }
      std::fprintf(err, "mrstack-replay: --resource: %s\n", e.what());
      return 2;
    }
    if (progress->shown) { std::fprintf(err, "\r\033[K"); }
    std::fputs(t.cells_of(results.back(), labels[i]).c_str(), out);
    std::fflush(out);
  }

  // 6. Notes and the verdict.
  std::string notes;
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto const& r = results[i];
    if (!r.error.empty()) { notes += "  " + r.resource + ": " + r.error + "\n"; }
    if (r.failures > 0) {
      notes += "  " + r.resource + ": " + with_commas(r.failures) + " allocation" + (r.failures == 1 ? "" : "s") +
               " refused; the first at line " + std::to_string(r.first_failure_line) + " (" +
               short_bytes(r.first_failure_bytes) + "): " + r.first_failure_message + "\n";
    }
  }
  if (log.leaked_allocations.size() > 0) {
    notes += "  leaks: the log never frees " + with_commas(log.leaked_allocations.size()) + " allocation" +
             (log.leaked_allocations.size() == 1 ? "" : "s") + " (" + short_bytes(log.leaked_bytes) +
             "); they are freed after the clock stops\n";
  }
  if (any_lower_bound) {
    notes += "  * nothing above the bottom, so the footprint is the bytes asked of it: a lower bound that\n";
    notes += simulate ? "    cannot show the bottom's own pooling or rounding (simulated, cuda_async is not the driver's\n"
                        "    pool: replay on a GPU to measure it); left out of 'most compact'\n"
                      : "    cannot show cudaMalloc's own page rounding; left out of 'most compact'\n";
  }
  if (!notes.empty()) { std::fprintf(out, "\n%s", notes.c_str()); }

  replay_result const* fastest = nullptr;
  replay_result const* compact = nullptr;
  std::size_t complete = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto const& r = results[i];
    if (!r.complete()) { continue; }
    ++complete;
    if (fastest == nullptr || r.ns_per_event < fastest->ns_per_event) { fastest = &r; }
    if (r.footprint_lower_bound) { continue; }  // an exact-fit lower bound would always "win"
    if (compact == nullptr || r.footprint_ratio() < compact->footprint_ratio() ||
        (r.footprint_ratio() == compact->footprint_ratio() && r.ns_per_event < compact->ns_per_event)) {
      compact = &r;
    }
  }
  std::string verdict = "\nverdict: ";
  if (complete == 0) {
    verdict += "no stack replayed the whole log.";
  } else {
    verdict += "fastest " + fastest->resource + " (" + ns_text(fastest->ns_per_event) + " ns/event)";
    if (compact != nullptr) {
      verdict += "; most compact " + compact->resource + " (" + ratio_text(compact->footprint_ratio()) + " of peak live)";
    }
    if (complete == results.size()) {
      verdict += results.size() == 1   ? "; it replayed the whole log."
                 : results.size() == 2 ? "; both stacks replayed the whole log."
                                       : "; all " + std::to_string(results.size()) + " stacks replayed the whole log.";
    } else {
      verdict += "; " + std::to_string(results.size() - complete) + " of " + std::to_string(results.size()) +
                 " stacks did not replay the whole log.";
    }
  }
  std::fprintf(out, "%s\n", verdict.c_str());

  // 7. --json, whole or not at all.
  if (a.json_path) {
    try {
      write_atomically(*a.json_path, results_json(results, a.log_path, a.warmup));
    } catch (std::exception const& e) {
      std::fprintf(err, "mrstack-replay: --json: %s\n", e.what());
      return 2;
    }
  }
  return complete == results.size() ? 0 : 1;
}

}  // namespace

int run_replay_tool(std::vector<std::string> const& args, std::FILE* out, std::FILE* err) {
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
    return run(a, out, err);
  } catch (std::exception const& e) {
    std::fprintf(err, "mrstack-replay: %s\n", e.what());
    return 2;
  }
}

}  // namespace mrstack
