// mrstack-replay's text: numbers, the machine, the header and the table.
#include "cli.hpp"
#include "replay_run.hpp"

#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include <unistd.h>

namespace mrstack::replay_cli {

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
    // On to TiB and beyond, as the library's messages count (format_bytes): a failure note
    // said "1024000.00 GiB" beside the allocator's "1000.00 TiB".
    static constexpr char const* units[] = {"GiB", "TiB", "PiB", "EiB"};
    double value = b / (1 << 30);
    std::size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(units)) {
      value /= 1024.0;
      ++unit;
    }
    std::snprintf(buf, sizeof buf, "%.2f %s", value, units[unit]);
  }
  return buf;
}

std::string count_of(std::size_t n, char const* singular, char const* plural) {
  return with_commas(n) + " " + (n == 1 ? singular : plural);
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
  if (std::isnan(r)) { return "-"; }  // nothing was live: no ratio
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fx", r);
  return buf;
}

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
      std::string def = p.is_required ? "required" : (p.default_text.empty() ? "optional" : "default " + p.default_text);
      if (std::string const range = describe_range(p); !range.empty()) { def += "; " + range; }
      std::fprintf(out, "    %-18s %-6s %s (%s)\n", p.name.c_str(), to_string(p.type), p.doc.c_str(), def.c_str());
    }
  }
}

void print_header(std::FILE* out, arguments const& a, allocation_log const& log, memory_setting const& memory) {
  std::fprintf(out, "mrstack-replay %s\n", printable(a.log_path).c_str());
  std::fprintf(out, "  log:     %s (%s, %s) on %s and %s; peak live %s\n",
               count_of(log.events.size(), "event", "events").c_str(),
               count_of(log.allocation_count, "allocation", "allocations").c_str(),
               count_of(log.free_count(), "free", "frees").c_str(),
               count_of(log.thread_names.size(), "thread", "threads").c_str(),
               count_of(log.streams.size(), "stream", "streams").c_str(), short_bytes(log.peak_live_bytes).c_str());
  if (!log.recorded_failures.empty()) {
    std::fprintf(out, "           the log records %s (first at line %u): %s\n",
                 count_of(log.recorded_failures.size(), "allocation failure", "allocation failures").c_str(),
                 log.recorded_failures.front().line,
                 a.expect_failures ? "each stack must refuse them too (--expect-failures)"
                                   : "reported, not replayed (--expect-failures asks them)");
  }
  if (memory.simulate) {
    if (memory.simulate_asked) {
      std::fprintf(out, "  memory:  SIMULATED (%s);\n", a.shrink_path ? "--shrink replays on simulated memory" : "--simulate");
    } else {
      std::fprintf(out, "  memory:  SIMULATED: no CUDA device (%s);\n", memory.device.why_not.c_str());
    }
    std::fprintf(out, "           each stack's bottom is simulated(capacity=%s), touching no memory\n",
                 short_bytes(memory.capacity).c_str());
    if (!memory.device.available && log.streams.size() > 1) {
      std::fprintf(out, "           without a device the log's %s streams replay on one stream handle\n",
                   with_commas(log.streams.size()).c_str());
    }
  } else {
    std::fprintf(out, "  memory:  REAL device memory: %s (device %d, %s, %s free)\n", memory.device.name.c_str(),
                 memory.device.ordinal, short_bytes(memory.device.total_bytes).c_str(),
                 short_bytes(memory.device.free_bytes).c_str());
  }
  std::fprintf(out, "  machine: %s\n", machine_description().c_str());
  std::string runs{"one run per stack"};
  if (a.repeat > 1) { runs = std::string{"median of "}.append(with_commas(static_cast<std::size_t>(a.repeat))).append(" runs per stack"); }
  replay_options probe;
  probe.workers = a.workers;
  unsigned const workers = replay_detail::wanted_workers(log, probe);
  std::fprintf(out, "  timing:  %s%s; %s order on %s%s; ns/call is the time inside\n"
                    "           allocate/deallocate per event, ns/event the wall time per event\n",
               runs.c_str(), a.warmup ? ", each after an untimed warm-up run on the same stack" : "",
               to_string(a.order), count_of(workers, "worker thread", "worker threads").c_str(),
               log.thread_names.size() > workers ? " (the log's threads share them)" : "");
  std::fprintf(out, "\n");
}

std::string printable(std::string const& text) {
  std::string out;
  for (char const c : text) {
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

table::table(std::vector<std::string> const& labels, allocation_log const& log) {
  widths.resize(headings.size());
  for (std::size_t c = 0; c < headings.size(); ++c) { widths[c] = headings[c].size(); }
  for (auto const& r : labels) { widths[0] = std::max(widths[0], printable(r).size() + 1); }
  widths[1] = std::max(widths[1], with_commas(log.events.size()).size());
  widths[2] = std::max<std::size_t>(widths[2], 9);
  widths[3] = std::max<std::size_t>(widths[3], 8);
  widths[4] = std::max<std::size_t>(widths[4], 7);
  widths[5] = std::max<std::size_t>(widths[5], 10);
  // failures is last: "12 (line 3456)" may run past its heading without shifting a column.
}

std::string table::row(std::vector<std::string> const& cells) const {
  std::string out;
  for (std::size_t c = 0; c < cells.size(); ++c) {
    std::string const cell = printable(cells[c]);
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

std::string table::cells_of(replay_result const& r, std::string const& label) const {
  if (!r.error.empty()) { return row({label, "-", "-", "-", "-", "-", "-", "-", "-", "error"}); }
  std::string failures =
      r.failures == 0 ? "0" : with_commas(r.failures) + " (line " + std::to_string(r.first_failure_line) + ")";
  if (r.expected_failures_served > 0) {
    failures += ", served " + with_commas(r.expected_failures_served) + " expected (line " +
                std::to_string(r.first_served_expected_line) + ")";
  }
  // No events: nothing was timed, and a time per event is 0/0, not 0.
  auto const per_event = [&](double ns) { return r.events == 0 ? std::string{"-"} : ns_text(ns); };
  return row({label, with_commas(r.events), short_seconds(r.median_seconds), per_event(r.ns_per_event),
              per_event(r.ns_per_call), short_bytes(r.peak_live_bytes), short_bytes(r.peak_footprint_bytes),
              ratio_text(r.footprint_ratio()), with_commas(r.leaks), failures});
}

}  // namespace mrstack::replay_cli
