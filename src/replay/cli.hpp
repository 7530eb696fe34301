#pragma once
// Internal to mrstack-replay's command line: the parts replay_cli.cpp puts together
// (arguments, formatting and the table, JSON files, the verdict).
#include <mrstack/replay/replay.hpp>
#include <mrstack/replay/timeline.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace mrstack::replay_cli {

// ---- arguments (cli_arguments.cpp) ---------------------------------------------------

extern char const* const usage_text;

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
  replay_order order = replay_order::strict;
  unsigned workers = 0;
  bool expect_failures = false;
  std::optional<std::string> json_path;
  std::optional<std::string> timeline_path;
  std::size_t timeline_points = 2000;
  std::optional<std::string> shrink_path;
  std::optional<std::string> csv_path;  // --write-csv: convert the log, replay nothing
  log_limits limits;
  bool list_resources = false;
  bool help = false;
};

/// Throws usage_error.
arguments parse_arguments(std::vector<std::string> const& args);

// ---- formatting, the header and the table (cli_table.cpp) -----------------------------

std::string with_commas(std::size_t n);
/// `text` (a spec or a file name the user gave) as printed: a tab or newline (a shell's
/// quotes keep them) moved every table column after it or broke a line of the notes in
/// two, and other control characters could drive the terminal, so each is written escaped
/// (\t, \n, \r, \x1b), as wide as it prints.
std::string printable(std::string const& text);
std::string short_bytes(std::size_t bytes);
/// "1 thread", "20,000 threads".
std::string count_of(std::size_t n, char const* singular, char const* plural);
std::string short_seconds(double s);
std::string ns_text(double ns);
std::string ratio_text(double r);
std::string machine_description();
void list_resources(std::FILE* out);

/// What the header says about the memory the stacks replay on.
struct memory_setting {
  bool simulate = false;
  bool simulate_asked = false;
  std::size_t capacity = 0;
  device_report device;
};
void print_header(std::FILE* out, arguments const& a, allocation_log const& log, memory_setting const& memory);

struct table {
  std::vector<std::string> headings{"resource", "events", "wall time", "ns/event", "ns/call", "peak live", "peak footprint",
                                    "footprint/live", "leaks", "failures"};
  std::vector<std::size_t> widths;

  table(std::vector<std::string> const& labels, allocation_log const& log);
  [[nodiscard]] std::string row(std::vector<std::string> const& cells) const;
  [[nodiscard]] std::string cells_of(replay_result const& r, std::string const& label) const;
};

// ---- JSON (cli_json.cpp) --------------------------------------------------------------

/// Writes `text` to `path` through a temporary file in the same folder and a rename, so a
/// reader never sees half a file and a failed run leaves none. Errors name `path`.
void write_atomically(std::string const& path, std::string const& text);
/// One --json object.
std::string result_json(replay_result const& r, std::string const& log_path, bool warmup);
/// The --json file: a list of result_json objects.
std::string results_json(std::vector<replay_result> const& results, std::string const& log_path, bool warmup);
/// The --timeline file (docs/replay.md gives its schema).
std::string timeline_json(timeline const& t, std::vector<replay_result> const& results, std::string const& log_path,
                          bool warmup);

// ---- notes and the verdict (cli_verdict.cpp) -----------------------------------------

/// The notes under the table (errors, failures, leaks, lower bounds), empty when none.
std::string notes_text(std::vector<replay_result> const& results, allocation_log const& log, bool any_lower_bound,
                       bool simulate);
/// "verdict: fastest ... ; most compact ...": fastest by the time inside the allocator.
std::string verdict_text(std::vector<replay_result> const& results);

}  // namespace mrstack::replay_cli
