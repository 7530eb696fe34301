// mrstack-replay, cases found in review: outputs that would overwrite each other, a log
// with nothing to time, a flag given a value, arguments refused only after the log was
// read, numbers with spaces, the table's cells and wording, logs joined together.
#include <catch2/catch.hpp>

#include "replay_tool_run.hpp"
#include "scratch_files.hpp"

#include <filesystem>
#include <fstream>
#include <string>

#include <zlib.h>

using test_support::run_tool;
using test_support::slurp;

namespace {

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";
std::string const small_log = header + "1,01:00:00.000001,allocate,0x1000,256,0\n1,01:00:00.000002,free,0x1000,256,0\n";

std::filesystem::path scratch() { return test_support::scratch_dir("mrstack_replay_cli_review_"); }

}  // namespace

TEST_CASE("mrstack-replay: a logging layer's file on an output's path, or on another stack's, is refused") {
  auto const log_path = test_support::write_file(scratch(), "outputs.csv", small_log);
  auto const shared = (scratch() / "shared.out").string();
  std::filesystem::remove(shared);
  // --json replaced the rows the logging layer wrote (or the timeline pass's logging layer
  // truncated the --timeline file's path), and the run exited 0.
  for (std::string const& output : {std::string{"--json"}, std::string{"--timeline"}}) {
    auto const c = run_tool({log_path, "--simulate", "-r", "logging(file=" + shared + ") > pool > cuda", output, shared});
    INFO(output << "\n" << c.out << c.err);
    CHECK(c.status == 2);
    CHECK_THAT(c.err, Catch::Contains("logs to '" + shared + "', also the " + output + " file"));
    CHECK_FALSE(std::filesystem::exists(shared));
  }
  // Another spelling of the same path is the same file.
  auto const dotted = (scratch() / "." / "shared.out").string();
  auto const spelled = run_tool({log_path, "--simulate", "-r", "logging(" + dotted + ") > cuda", "--json", shared});
  INFO(spelled.err);
  CHECK(spelled.status == 2);
  CHECK_THAT(spelled.err, Catch::Contains("also the --json file"));
  // Two stacks logging to one file: the second stack's log replaced the first's.
  auto const two = run_tool({log_path, "--simulate", "-r", "logging(file=" + shared + ") > pool > cuda", "-r",
                             "logging(file=" + shared + ") > arena > cuda"});
  INFO(two.out << two.err);
  CHECK(two.status == 2);
  CHECK_THAT(two.err, Catch::Contains("as --resource 'logging(file=" + shared + ") > pool > cuda' does"));
  CHECK_FALSE(std::filesystem::exists(shared));
  // Each output on its own path is fine, and the logging layer's rows are there.
  auto const json = (scratch() / "own.json").string();
  auto const apart = run_tool({log_path, "--simulate", "-r", "logging(file=" + shared + ") > cuda", "--json", json});
  INFO(apart.out << apart.err);
  CHECK(apart.status == 0);
  CHECK_THAT(slurp(shared), Catch::StartsWith(header));
  CHECK_THAT(slurp(json), Catch::StartsWith("["));
}

TEST_CASE("mrstack-replay: a log with no events names no fastest stack and no time per event") {
  // Every stack timed nothing, 0 ns: the first was "fastest (0.0 ns/call)".
  auto const log_path = test_support::write_file(scratch(), "no_events.csv", header);
  auto const json = (scratch() / "no_events.json").string();
  auto const c = run_tool({log_path, "--simulate", "-r", "cuda", "-r", "pool > cuda", "--json", json});
  INFO(c.out << c.err);
  CHECK(c.status == 0);
  CHECK_THAT(c.out, Catch::Contains("verdict: no stack is fastest (the log has no allocations or frees to time); "
                                    "both stacks replayed the whole log."));
  CHECK_THAT(c.out, !Catch::Contains("ns/call)"));
  std::string const written = slurp(json);
  CHECK_THAT(written, Catch::Contains("\"ns_per_event\": null, \"ns_per_call\": null"));
  CHECK_THAT(written, !Catch::Contains("\"ns_per_event\": 0"));
  // A log whose rows are all no-ops (a free of nullptr) has no events either.
  auto const no_ops = test_support::write_file(scratch(), "no_ops.csv", header + "1,01:00:00.1,free,0x0,0,0\n");
  auto const n = run_tool({no_ops, "--simulate", "-r", "cuda"});
  INFO(n.out << n.err);
  CHECK(n.status == 0);
  CHECK_THAT(n.out, Catch::Contains("no stack is fastest"));
}

TEST_CASE("mrstack-replay: --help takes no value, as every other flag") {
  auto const c = run_tool({"--help=yes"});
  CHECK(c.status == 2);
  CHECK_THAT(c.err, Catch::StartsWith("mrstack-replay: --help takes no value"));
  CHECK(run_tool({"--help"}).status == 0);
  CHECK(run_tool({"-h"}).status == 0);
}

TEST_CASE("mrstack-replay: a logging layer's file that cannot be opened is a bad argument, found before the log") {
  auto const log_path = test_support::write_file(scratch(), "unopenable.csv", small_log);
  // A file where a folder should be, and a name longer than a folder entry can be: the
  // stack failed as it was built, exit 1, as if the allocator had.
  auto const not_a_folder = test_support::write_file(scratch(), "not_a_folder", "");
  for (std::string const& file :
       {not_a_folder + "/x.csv", (scratch() / (std::string(300, 'x') + ".csv")).string()}) {
    auto const c = run_tool({log_path, "--simulate", "-r", "logging(file=" + file + ") > pool > simulated"});
    INFO(c.out << c.err);
    CHECK(c.status == 2);
    CHECK_THAT(c.err, Catch::Contains("logs to '" + file + "', which cannot be opened for writing"));
    CHECK(c.out.empty());  // refused before the log was read
  }
  // A file that can be opened is not left behind by the check, nor the folders made for it
  // (the log is missing, so nothing is built after the arguments are checked).
  auto const folder = scratch() / "made_for_the_log";
  std::filesystem::remove_all(folder);
  auto const file = (folder / "deeper" / "x.csv").string();
  auto const missing = run_tool({(scratch() / "no_such_log.csv").string(), "--simulate", "-r",
                                 "logging(file=" + file + ") > pool > simulated"});
  INFO(missing.err);
  CHECK(missing.status == 2);
  CHECK_THAT(missing.err, Catch::Contains("no_such_log.csv"));
  CHECK_FALSE(std::filesystem::exists(folder));
  // An existing file is opened, not truncated.
  auto const kept = test_support::write_file(scratch(), "kept.csv", "rows\n");
  auto const again = run_tool({(scratch() / "no_such_log.csv").string(), "--simulate", "-r",
                               "logging(file=" + kept + ") > pool > simulated"});
  CHECK(again.status == 2);
  CHECK(slurp(kept) == "rows\n");
}

TEST_CASE("mrstack-replay: a percentage out of range on the simulated device is refused before anything is printed") {
  auto const log_path = test_support::write_file(scratch(), "percent.csv", small_log);
  // arena's size=50% of 2^64-1 bytes is more than an arena can be: the error came after
  // the log was read and the table's header printed.
  auto const c = run_tool({log_path, "--simulate", "--capacity", "18446744073709551615", "-r", "arena > cuda"});
  INFO(c.out << c.err);
  CHECK(c.status == 2);
  CHECK(c.out.empty());
  CHECK_THAT(c.err, Catch::Contains("mrstack-replay: --resource: ") && Catch::Contains("50%"));
  // The same share of a device it fits replays.
  auto const fits = run_tool({log_path, "--simulate", "--capacity", "1GiB", "-r", "arena > cuda"});
  INFO(fits.out << fits.err);
  CHECK(fits.status == 0);
}

TEST_CASE("mrstack-replay: a number with spaces around it is refused by every option alike") {
  auto const log_path = test_support::write_file(scratch(), "spaces.csv", small_log);
  // --repeat " 5" ran while "5 " was refused; the sizes took both.
  for (std::string const option : {"--repeat", "--workers", "--capacity", "--max-log-bytes", "--max-line-bytes"}) {
    for (std::string const text : {" 5", "5 ", "\t5"}) {
      auto const c = run_tool({log_path, "--simulate", "-r", "cuda", option, text});
      INFO(option << " '" << text << "'\n" << c.out << c.err);
      CHECK(c.status == 2);
      CHECK_THAT(c.err, Catch::StartsWith("mrstack-replay: " + option + " '" + text + "': the number has spaces"));
    }
  }
  auto const points = run_tool({log_path, "--simulate", "-r", "cuda", "--timeline", (scratch() / "t.json").string(),
                                "--timeline-points", " 5"});
  CHECK(points.status == 2);
  CHECK_THAT(points.err, Catch::Contains("--timeline-points ' 5': the number has spaces"));
}

TEST_CASE("mrstack-replay: a tab or newline in a spec is printed escaped in the table") {
  auto const log_path = test_support::write_file(scratch(), "escaped.csv", small_log);
  auto const c = run_tool({log_path, "--simulate", "-r", "pool >\tcuda", "-r", "pool\n> cuda"});
  INFO(c.out << c.err);
  REQUIRE(c.status == 0);
  std::string const table = c.out.substr(c.out.find("resource"), c.out.find("verdict") - c.out.find("resource"));
  // The raw characters moved every column after them, or broke the row in two.
  CHECK(table.find('\t') == std::string::npos);
  std::size_t const heading_end = table.find('\n');
  std::size_t const first = table.find("pool >\\tcuda ");
  std::size_t const second = table.find("pool\\n> cuda ");
  REQUIRE(first != std::string::npos);
  REQUIRE(second != std::string::npos);
  // Each row is as long as the heading: its last cell ("0" failures) ends under "failures".
  CHECK(table.find('\n', first) - first == heading_end);
  CHECK(table.find('\n', second) - second == heading_end);
}

TEST_CASE("mrstack-replay: counts are singular or plural, with thousands separators, and bytes go on to TiB") {
  auto const log_path = test_support::write_file(scratch(), "wording.csv", small_log);
  auto const one = run_tool({log_path, "--simulate", "-r", "cuda", "--workers", "1"});
  INFO(one.out << one.err);
  CHECK_THAT(one.out, Catch::Contains("  log:     2 events (1 allocation, 1 free) on 1 thread and 1 stream;"));
  CHECK_THAT(one.out, Catch::Contains("on 1 worker thread;"));
  auto const csv = (scratch() / "wording_out.csv").string();
  auto const wrote = run_tool({log_path, "--write-csv", csv});
  CHECK_THAT(wrote.out, Catch::Contains("(2 events, 1 thread)"));
  // 1,000 threads, each allocating once.
  std::string many = header;
  for (int t = 0; t < 1000; ++t) {
    many += std::to_string(t) + ",01:00:00.000001,allocate,0x" + std::to_string(1000 + t) + "000,256,0\n";
  }
  auto const many_path = test_support::write_file(scratch(), "many_threads.csv", many);
  auto const m = run_tool({many_path, "--simulate", "-r", "cuda"});
  INFO(m.out << m.err);
  CHECK_THAT(m.out, Catch::Contains("on 1,000 threads and 1 stream"));
  // A refused 1000 TiB: the note said "1024000.00 GiB" beside the allocator's "1000.00 TiB".
  auto const huge_path = test_support::write_file(
      scratch(), "huge.csv", header + "1,01:00:00.000001,allocate,0x1000,1099511627776000,0\n");
  auto const h = run_tool({huge_path, "--simulate", "--capacity", "1GiB", "-r", "cuda"});
  INFO(h.out << h.err);
  CHECK(h.status == 1);
  CHECK_THAT(h.out, Catch::Contains("(event 0, 1000.00 TiB): out of memory: simulated could not allocate 1000.00 TiB"));
  CHECK_THAT(h.out, !Catch::Contains("1024000.00 GiB"));
  CHECK_THAT(h.out, Catch::Contains("never frees 1 allocation (1000.00 TiB); it is freed after the clock stops"));
}

namespace {

void write_gzip(std::string const& path, std::string const& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("mrstack-replay: two logs joined together are reported as a repeated header") {
  // Two gzipped CSVs concatenated read as one text with the header on line 4: it was
  // reported as "bad Time 'Time'".
  auto const part = (scratch() / "part.csv.gz").string();
  write_gzip(part, small_log);
  std::ifstream in{part, std::ios::binary};
  std::string const bytes{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  auto const joined = test_support::write_file(scratch(), "joined.csv.gz", bytes + bytes);
  auto const c = run_tool({joined, "--simulate", "-r", "cuda"});
  INFO(c.out << c.err);
  CHECK(c.status == 2);
  CHECK_THAT(c.err, Catch::Contains("joined.csv.gz:4: line 4 repeats the header"));
  CHECK_THAT(c.err, !Catch::Contains("bad Time"));
  // A log with the Stamp column: "bad Stamp 'Stamp'".
  std::string const stamped = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n1,01:00:00.1,allocate,0x1000,256,0,1\n";
  auto const two = test_support::write_file(scratch(), "stamped.csv", stamped + stamped);
  auto const s = run_tool({two, "--simulate", "-r", "cuda"});
  INFO(s.out << s.err);
  CHECK(s.status == 2);
  CHECK_THAT(s.err, Catch::Contains("stamped.csv:3: line 3 repeats the header"));
}

TEST_CASE("mrstack-replay: a tab in a spec or file name is printed escaped in the notes and the verdict too") {
  // Only the table escaped them: the notes, the verdict and the header printed the raw tab.
  auto const log_path = test_support::write_file(scratch(), "tab\tin name.csv", small_log);
  auto const c = run_tool({log_path, "--simulate", "-r", "limiting(limit=100) >\tcuda", "-r", "tracking >\tcuda"});
  INFO(c.out << c.err);
  CHECK(c.status == 1);  // the limiting stack refused the allocation
  CHECK(c.out.find('\t') == std::string::npos);
  CHECK_THAT(c.out, Catch::Contains("mrstack-replay " + log_path.substr(0, log_path.find('\t')) + "\\tin name.csv\n"));
  CHECK_THAT(c.out, Catch::Contains("\n  limiting(limit=100) >\\tcuda: 1 allocation refused; the first at line 2"));
  CHECK_THAT(c.out, Catch::Contains("verdict: fastest tracking >\\tcuda ("));
  auto const two = run_tool({"one\tlog.csv", "other\nlog.csv"});
  CHECK(two.status == 2);
  CHECK_THAT(two.err, Catch::StartsWith("mrstack-replay: one log at a time: 'one\\tlog.csv' and 'other\\nlog.csv' were "
                                        "both given\n"));
}
