// mrstack-replay's options: the usage text and the parser.
#include "cli.hpp"
#include "spec/spec_detail.hpp"

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/spec.hpp>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mrstack::replay_cli {

char const* const usage_text =
    "usage: mrstack-replay LOG[.gz] [--resource SPEC]... [--simulate] [--capacity SIZE]\n"
    "                      [--repeat N] [--warmup] [--order strict|per-thread] [--workers N]\n"
    "                      [--expect-failures] [--json FILE] [--timeline FILE]\n"
    "                      [--timeline-points N] [--shrink OUT.csv] [--max-log-bytes SIZE]\n"
    "                      [--max-line-bytes SIZE]\n"
    "       mrstack-replay LOG[.gz] --write-csv OUT.csv\n"
    "       mrstack-replay --list-resources\n"
    "\n"
    "Replays an allocation log (CSV Thread,Time,Action,Pointer,Size,Stream, plain or gzip:\n"
    "what mrstack's and RMM's logging adaptors write; or mrstack's binary log) against\n"
    "stacks and compares them.\n"
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
    "  --order ORDER        strict: the log's exact global order (default); per-thread:\n"
    "                       each log thread at full speed, a free waiting only for its own\n"
    "                       allocation, so threads contend as in the program\n"
    "  --workers N          at most N OS threads replay the log's threads (default: the\n"
    "                       machine's hardware threads)\n"
    "  --expect-failures    the log's 'allocate failure' rows are asked of each stack at\n"
    "                       their place: the stack must refuse them too (strict order)\n"
    "  --json FILE          also write the results as a JSON list, one object per stack\n"
    "  --timeline FILE      write each stack's footprint and fragmentation over the log,\n"
    "                       the size histogram and per-thread/stream activity (JSON)\n"
    "  --timeline-points N  samples in the timeline (default 2000)\n"
    "  --shrink OUT.csv     when the (one) stack refuses an allocation, write a much smaller\n"
    "                       log that fails the same way (use with --capacity)\n"
    "  --write-csv OUT.csv  check the log and write it as CSV (a binary log's rows as the\n"
    "                       logging adaptor writes them in per-thread order); no replay\n"
    "  --max-log-bytes SIZE refuse a log whose text is larger (default 4GiB)\n"
    "  --max-line-bytes SIZE refuse a log with a longer line (default 64KiB)\n"
    "  --list-resources     every resource and parameter a spec can name\n"
    "  -h, --help           this text\n"
    "\n"
    "Exit status: 0 every stack replayed the whole log (or --list-resources, --help, or\n"
    "--write-csv wrote its file), 1 an allocation failed (or a stack broke, threw something\n"
    "that is not a std::exception, or served an allocation the log records as refused;\n"
    "with --shrink also when the shrunk log was written, since the stack still fails),\n"
    "2 unusable input or arguments, or an output that could not be written.\n";

namespace {

/// strtol skipped leading spaces and refused trailing ones (--repeat " 5" ran, "5 " did not),
/// and parse_size took both: a number with spaces around it is refused by every option alike.
void check_no_surrounding_space(std::string const& option, std::string const& text) {
  auto const space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  if (!text.empty() && (space(text.front()) || space(text.back()))) {
    throw usage_error{option + " '" + text + "': the number has spaces around it; give it without them"};
  }
}

std::size_t positive_size(std::string const& option, std::string const& text) {
  check_no_surrounding_space(option, text);
  std::string why;
  auto const bytes = parse_size(text, &why);
  if (!bytes || *bytes == 0) { throw usage_error{option + " '" + text + "': " + (bytes ? "must be more than 0" : why)}; }
  return *bytes;
}

long whole_number(std::string const& option, std::string const& text, long most, char const* what) {
  check_no_surrounding_space(option, text);
  char* end = nullptr;
  long const n = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1 || n > most) {
    throw usage_error{option + " '" + text + "': expected a whole number of " + what + ", at least 1 and at most " +
                      std::to_string(most)};
  }
  return n;
}

std::string file_name(std::string const& option, std::string text) {
  if (text.empty()) { throw usage_error{option + " needs a file name"}; }
  return text;
}

/// An option that takes one value, given twice, would silently keep the last (--json a
/// --json b never writes a): refused, naming the option. -r is the one that repeats.
void check_given_once(std::set<std::string>& given, std::string const& option) {
  static std::set<std::string> const single = {"--capacity", "--repeat",          "--order",  "--workers",
                                              "--json",     "--timeline",        "--shrink", "--write-csv",
                                              "--timeline-points", "--max-log-bytes", "--max-line-bytes"};
  if (single.count(option) != 0 && !given.insert(option).second) {
    throw usage_error{option + " given twice: give it once"};
  }
}

/// Where a path leads, symbolic links and '..' resolved as far as the path exists, so that
/// two spellings of one file compare equal.
std::filesystem::path resolved(std::string const& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? std::filesystem::path{path}.lexically_normal() : p;
}

/// The files the logging layers of `spec` write (named `file=`, first positional, or
/// $MRSTACK_LOG_FILE); none for a spec that does not parse (its error comes later, in full).
std::vector<std::string> logging_files(std::string const& spec) {
  std::vector<std::string> files;
  stack_spec parsed;
  try {
    parsed = parse_stack_spec(spec);
  } catch (spec_error const&) {
    return files;
  }
  spec_resource const* entry = find_resource("logging");
  for (auto const& layer : parsed.layers) {
    if (layer.name != "logging" || entry == nullptr) { continue; }
    // The file as the builder will bind it: by name, or by position, where a bare flag
    // (`async`) takes none (`logging(async, x.csv)` logs to x.csv).
    std::string file;
    try {
      file = detail::argument_checker{parsed, nullptr, nullptr}.check(layer, *entry).text("file").value_or("");
    } catch (spec_error const&) {
      continue;  // refused when the stack is checked, with its own message
    }
    if (file.empty()) {
      if (char const* variable = std::getenv(logging_resource_adaptor::log_file_variable)) { file = variable; }
    }
    if (!file.empty()) { files.push_back(file); }
  }
  return files;
}

/// Each output is written whole by a rename over its path: an output on the log's path
/// would replace the log (--json onto the log destroys it), and two outputs on one path
/// would leave only the last written. Refused before anything is read or written.
void check_distinct_paths(arguments const& a) {
  std::vector<std::pair<char const*, std::string>> seen;
  if (!a.log_path.empty()) { seen.emplace_back("log", a.log_path); }
  for (auto const& [option, path] : {std::pair{"--json", &a.json_path}, std::pair{"--timeline", &a.timeline_path},
                                     std::pair{"--shrink", &a.shrink_path}, std::pair{"--write-csv", &a.csv_path}}) {
    if (!*path) { continue; }
    for (auto const& [earlier, earlier_path] : seen) {
      if (resolved(**path) != resolved(earlier_path)) { continue; }
      throw usage_error{std::string{option} + " '" + printable(**path) + "' is " +
                        (std::string{earlier} == "log" ? std::string{"the log itself"}
                                                       : "also the " + std::string{earlier} + " file") +
                        ": give each output its own path"};
    }
    seen.emplace_back(option, **path);
  }
  // A logging layer in a stack writes its file as it is built: on the log's path it
  // truncated the log before anything was read (it replaced a 3,001-line log with its own).
  // On an output's path, or on another stack's logging file, one of the two replaced the
  // other (--json over a logging layer's rows), and the run still exited 0.
  std::vector<std::pair<std::string, std::string>> logged;  // (spec, file) of the stacks before
  for (std::string const& spec : a.resources) {
    std::vector<std::string> const files = logging_files(spec);
    for (std::string const& file : files) {
      for (auto const& [option, path] : seen) {
        if (resolved(file) != resolved(path)) { continue; }
        if (std::string{option} == "log") {
          throw usage_error{"--resource '" + printable(spec) + "' logs to '" + printable(file) +
                            "', the log itself: the replay would overwrite it; give the logging layer another file"};
        }
        throw usage_error{"--resource '" + printable(spec) + "' logs to '" + printable(file) + "', also the " + option +
                          " file: give each output its own path"};
      }
      for (auto const& [earlier, earlier_file] : logged) {
        if (resolved(file) != resolved(earlier_file)) { continue; }
        throw usage_error{"--resource '" + printable(spec) + "' logs to '" + printable(file) + "', as --resource '" +
                          printable(earlier) +
                          "' does: the later stack's log would replace the earlier's; give each its own file"};
      }
    }
    for (std::string const& file : files) { logged.emplace_back(spec, file); }
  }
}

/// Why a logging layer could not open `file` for writing, or empty when it can. The layer
/// creates the missing folders and truncates the file as it is built, so the open is tried
/// as the layer would, then undone: an existing file is opened without truncating it, a
/// new one is removed again, and so are the folders made for it.
std::string cannot_open_for_writing(std::string const& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) { return std::strerror(EISDIR); }
    if (!S_ISREG(st.st_mode)) { return {}; }  // a device or FIFO: opening a FIFO would wait for its reader
    int const fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) { return std::strerror(errno); }
    ::close(fd);
    return {};
  }
  if (errno != ENOENT) { return std::strerror(errno); }  // a name too long, a file where a folder should be
  std::vector<std::filesystem::path> missing;  // folders to make, the deepest first
  for (auto folder = std::filesystem::path{file}.parent_path(); !folder.empty() && folder != folder.parent_path();
       folder = folder.parent_path()) {
    if (::stat(folder.c_str(), &st) == 0) { break; }
    if (errno != ENOENT) { return std::strerror(errno); }
    missing.push_back(folder);
  }
  std::string why;
  std::vector<std::filesystem::path> made;
  for (auto it = missing.rbegin(); it != missing.rend() && why.empty(); ++it) {
    if (::mkdir(it->c_str(), 0777) != 0) {
      why = std::strerror(errno);
    } else {
      made.push_back(*it);
    }
  }
  if (why.empty()) {
    int const fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      why = std::strerror(errno);
    } else {
      ::close(fd);
      ::unlink(file.c_str());
    }
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it) { ::rmdir(it->c_str()); }
  return why;
}

/// A logging layer's file that cannot be opened failed the stack as it was built, after the
/// log was read: exit 1, a failure of the stack, where it is an argument that cannot work.
void check_logging_files_open(arguments const& a) {
  for (std::string const& spec : a.resources) {
    for (std::string const& file : logging_files(spec)) {
      if (std::string const why = cannot_open_for_writing(file); !why.empty()) {
        throw usage_error{"--resource '" + printable(spec) + "' logs to '" + printable(file) +
                          "', which cannot be opened for writing: " + why};
      }
    }
  }
}

/// Checks the options that only make sense together.
void check_combinations(arguments const& a, std::set<std::string> const& given) {
  if (!a.help && !a.list_resources && a.log_path.empty()) { throw usage_error{"no log given"}; }
  // Options that would otherwise be silently ignored: the sample count of a timeline not
  // written, or a log and options beside --list-resources, which replays nothing.
  if (given.count("--timeline-points") != 0 && !a.timeline_path) {
    throw usage_error{"--timeline-points needs --timeline: it is the timeline's number of samples"};
  }
  if (a.list_resources && !a.help && (!a.log_path.empty() || given.size() > 0 || !a.resources.empty() || a.simulate ||
                                      a.warmup || a.expect_failures)) {
    throw usage_error{"--list-resources takes no log and no other option: it only lists the resources"};
  }
  if (a.expect_failures && a.order != replay_order::strict) {
    throw usage_error{"--expect-failures asks each recorded failure at its place in the log: it needs --order strict"};
  }
  bool const replays = !a.resources.empty() || a.simulate || a.capacity || a.repeat != 1 || a.warmup ||
                       a.order != replay_order::strict || a.workers != 0 || a.expect_failures || a.json_path ||
                       a.timeline_path || a.shrink_path;
  if (a.csv_path && replays) {
    throw usage_error{"--write-csv converts the log and replays nothing: give it only the log (and the --max-* limits)"};
  }
  if (a.shrink_path && a.resources.size() != 1) {
    throw usage_error{"--shrink needs exactly one --resource: the stack whose failure to keep"};
  }
  check_distinct_paths(a);
  check_logging_files_open(a);
}

}  // namespace

arguments parse_arguments(std::vector<std::string> const& args) {
  arguments a;
  std::set<std::string> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (auto const eq = arg.find('='); eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    }
    check_given_once(given, arg);
    auto value = [&]() -> std::string {
      if (inline_value) { return *inline_value; }
      if (i + 1 >= args.size()) { throw usage_error{arg + " needs a value"}; }
      return args[++i];
    };
    auto flag = [&](bool& target) {
      if (inline_value) { throw usage_error{arg + " takes no value"}; }
      target = true;
    };
    if (arg == "-r" || arg == "--resource") {
      a.resources.push_back(value());
    } else if (arg == "--simulate") {
      flag(a.simulate);
    } else if (arg == "--capacity") {
      a.capacity = positive_size(arg, value());
    } else if (arg == "--repeat") {
      a.repeat = static_cast<int>(whole_number(arg, value(), 1000000, "runs"));
    } else if (arg == "--warmup") {
      flag(a.warmup);
    } else if (arg == "--order") {
      std::string const text = value();
      if (text != "strict" && text != "per-thread") {
        throw usage_error{"--order '" + text + "': expected strict or per-thread"};
      }
      a.order = text == "strict" ? replay_order::strict : replay_order::per_thread;
    } else if (arg == "--workers") {
      a.workers = static_cast<unsigned>(whole_number(arg, value(), 4096, "threads"));
    } else if (arg == "--expect-failures") {
      flag(a.expect_failures);
    } else if (arg == "--json") {
      a.json_path = file_name(arg, value());
    } else if (arg == "--timeline") {
      a.timeline_path = file_name(arg, value());
    } else if (arg == "--timeline-points") {
      a.timeline_points = static_cast<std::size_t>(whole_number(arg, value(), 1000000, "samples"));
    } else if (arg == "--shrink") {
      a.shrink_path = file_name(arg, value());
    } else if (arg == "--write-csv") {
      a.csv_path = file_name(arg, value());
    } else if (arg == "--max-log-bytes") {
      a.limits.max_text_bytes = positive_size(arg, value());
    } else if (arg == "--max-line-bytes") {
      a.limits.max_line_bytes = positive_size(arg, value());
    } else if (arg == "--list-resources") {
      flag(a.list_resources);
    } else if (arg == "-h" || arg == "--help") {
      flag(a.help);  // --help=x was help, its value dropped, where every other flag refuses one
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw usage_error{"unknown option '" + arg + "'"};
    } else if (a.log_path.empty()) {
      a.log_path = arg;
    } else {
      throw usage_error{"one log at a time: '" + printable(a.log_path) + "' and '" + printable(arg) +
                        "' were both given"};
    }
  }
  check_combinations(a, given);
  return a;
}

}  // namespace mrstack::replay_cli
