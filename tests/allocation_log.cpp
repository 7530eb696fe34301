// The allocation-log reader: the format (header, extra columns, hex with or without 0x,
// CRLF, blank lines, gzip), every malformed-line kind with its line and column, the
// consistency checks, multi-thread order, a random-log model test, and the sample log.
#include <catch2/catch.hpp>

#include "scratch_files.hpp"

#include <mrstack/log/allocation_log.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>

#include <zlib.h>

using namespace mrstack;

namespace {

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";

/// The log must be refused at `line`:`column` with `what` in the message, the line quoted
/// and a caret under the column.
void require_log_error(std::string const& text, std::size_t line, std::size_t column, std::string const& what) {
  INFO("log:\n" << text);
  try {
    (void)parse_allocation_log(text, "test.csv");
    FAIL("no error for a bad log");
  } catch (log_error const& e) {
    std::string const message = e.what();
    INFO("message:\n" << message);
    CHECK(e.file() == "test.csv");
    CHECK(e.line() == line);
    CHECK(e.column() == column);
    std::string const where = "test.csv:" + std::to_string(line) + (column > 0 ? ":" + std::to_string(column) : "") + ": ";
    CHECK_THAT(message, Catch::StartsWith(where));
    CHECK_THAT(message, Catch::Contains(what));
    if (column > 0) {
      std::istringstream lines{text};
      std::string quoted;
      for (std::size_t i = 0; i < line; ++i) { std::getline(lines, quoted); }
      if (!quoted.empty() && quoted.back() == '\r') { quoted.pop_back(); }
      CHECK_THAT(message, Catch::EndsWith("\n  " + quoted + "\n  " + std::string(column - 1, ' ') + "^"));
    }
  }
}

std::filesystem::path scratch_dir() { return test_support::scratch_dir("mrstack_log_test_"); }

void write_gzip(std::filesystem::path const& path, std::string const& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("log: events, dense allocation indices, lines, streams, peak live and leaks") {
  std::string const text = header +
                           "1,01:00:00.000000,allocate,0x7f0000000000,1000,0\n"
                           "1,01:00:00.000010,allocate,7f0000000400,24,0x0\n"     // no 0x
                           "1,01:00:00.000020,free,0x7f0000000000,1000,0\n"
                           "1,01:00:00.000030,allocate,0x7f0000000000,500,0x55aa\n"  // reuse of a freed address
                           "1,01:00:00.000040,allocate failure,0x0,1099511627776,0\n"
                           "1,01:00:00.000050,free,0x7f0000000000,500,0x55aa\n";
  auto const log = parse_allocation_log(text, "t.csv");
  REQUIRE(log.events.size() == 5);
  CHECK(log.allocation_count == 3);
  CHECK(log.free_count() == 2);
  CHECK(log.events[0].action == log_action::allocate);
  CHECK(log.events[0].allocation == 0);
  CHECK(log.events[1].allocation == 1);
  CHECK(log.events[2].action == log_action::free);
  CHECK(log.events[2].allocation == 0);
  CHECK(log.events[3].allocation == 2);  // the same address again is a new allocation
  CHECK(log.events[4].allocation == 2);
  CHECK(log.event_lines == std::vector<std::uint32_t>{2, 3, 4, 5, 7});
  CHECK(log.streams == std::vector<std::uint64_t>{0, 0x55aa});
  CHECK(log.events[3].stream == 1);
  CHECK(log.events[4].stream == 1);
  CHECK(log.peak_live_bytes == 1024);
  CHECK(log.total_allocated_bytes == 1524);
  CHECK(log.leaked_allocations == std::vector<std::uint32_t>{1});
  CHECK(log.leaked_bytes == 24);
  REQUIRE(log.recorded_failures.size() == 1);
  CHECK(log.recorded_failures[0].line == 6);
  CHECK(log.recorded_failures[0].bytes == 1099511627776ull);
  CHECK(log.thread_names == std::vector<std::string>{"1"});
  CHECK(log.allocation_events == std::vector<std::uint32_t>{0, 1, 3});
  CHECK(log.line_count == 7);
  CHECK(sizeof(log_event) == 16);
}

TEST_CASE("log: header names ignore case, extra columns are ignored, CRLF and blank lines are fine") {
  std::string const text =
      "thread,TIME,action,pointer,size,stream,Extra,More\r\n"
      "7,12.5,allocate,0xA0,256,0,whatever,else\r\n"
      "\r\n"
      "   \n"
      "7,13,free,a0,256,0,x\r\n"
      "7,0:00:01,free,0x0,0,0\n"     // a free of nullptr: skipped
      "7,0:00:02,allocate,0,0,0\n"   // an allocation of nothing: skipped
      "7,0:00:03,allocate failure,(nil),4096,0\n";  // glibc's null pointer
  auto const log = parse_allocation_log(text);
  CHECK(log.events.size() == 2);
  CHECK(log.event_lines == std::vector<std::uint32_t>{2, 5});
  CHECK(log.skipped_null_rows == 2);
  REQUIRE(log.recorded_failures.size() == 1);
  CHECK(log.recorded_failures[0].bytes == 4096);
  CHECK(log.leaked_allocations.empty());
}

TEST_CASE("log: a NUL byte is refused by the parser itself, in any column, naming line and column") {
  // The file reader refused NUL bytes, but text handed to the parser directly (an extra
  // column's, or a Thread id's) was accepted: a log that mrstack-replay then refuses.
  std::string const extra = header + "1,0,allocate,0x10,64,0,a" + std::string(1, '\0') + "b\n1,0,free,0x10,64,0\n";
  try {
    (void)parse_allocation_log(extra, "extra.csv");
    FAIL("parsed a NUL byte in an extra column");
  } catch (log_error const& e) {
    CHECK(e.line() == 2);
    CHECK(e.column() == 25);
    CHECK_THAT(e.what(), Catch::StartsWith("extra.csv:2:25: a NUL byte at byte offset 63 of the text"));
  }
  std::string const thread = header + "1" + std::string(1, '\0') + ",0,allocate,0x10,64,0\n";
  CHECK_THROWS_WITH(parse_allocation_log(thread, "thread.csv"), Catch::StartsWith("thread.csv:2:2: a NUL byte"));
}

TEST_CASE("log: a UTF-8 byte order mark before the header is skipped") {
  // Spreadsheets and Windows editors save "CSV UTF-8" with a BOM; it used to be read as
  // part of the first header name, refused with "header column 1 is 'Thread', expected
  // 'Thread'" (the three bytes do not show).
  std::string const text = "\xEF\xBB\xBF" + header + "1,0,allocate,0x10,64,0\n1,0,free,0x10,64,0\n";
  auto const log = parse_allocation_log(text, "bom.csv");
  CHECK(log.events.size() == 2);
  CHECK(log.event_lines == std::vector<std::uint32_t>{2, 3});
  // The per-thread order's Stamp column is still found.
  auto const stamped = parse_allocation_log(
      "\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream,Stamp\n2,0,free,0x10,64,0,20\n1,0,allocate,0x10,64,0,10\n",
      "bom.csv");
  CHECK(stamped.event_lines == std::vector<std::uint32_t>{3, 2});
}

TEST_CASE("log: a thread id must be printable UTF-8 text, as JSON output needs") {
  // A thread id is opaque text, but --json and --timeline write it back into JSON, which
  // must be UTF-8: a log with a 0xff byte in its Thread column replayed, and the timeline
  // it wrote could not be read ("invalid start byte").
  auto const rows = [](std::string const& thread) {
    return header + thread + ",0,allocate,0x10,64,0\n" + thread + ",0,free,0x10,64,0\n";
  };
  require_log_error(rows("\xff\xfe"), 2, 1, "bad Thread: byte 0xff is not printable UTF-8 text");
  require_log_error(rows("w\x01"), 2, 2, "bad Thread: byte 0x01 is not printable UTF-8 text");
  require_log_error(rows("a\xc0\xaf"), 2, 2, "bad Thread: byte 0xc0");        // an overlong '/'
  require_log_error(rows("\xed\xa0\x80"), 2, 1, "bad Thread: byte 0xed");     // a UTF-16 surrogate
  require_log_error(rows("\xe2\x82"), 2, 1, "bad Thread: byte 0xe2");          // cut short
  require_log_error(rows("\x7f"), 2, 1, "bad Thread: byte 0x7f");
  // Text in any script, and the four-byte forms, are thread ids like any other.
  auto const log = parse_allocation_log(rows("w\xc3\xb6rker-\xe7\xba\xbf\xe7\xa8\x8b-\xf0\x9f\x98\x80"), "utf8.csv");
  REQUIRE(log.thread_names.size() == 1);
  CHECK(log.thread_names[0] == "w\xc3\xb6rker-\xe7\xba\xbf\xe7\xa8\x8b-\xf0\x9f\x98\x80");
}

TEST_CASE("log: every malformed line is an error naming file, line and column") {
  require_log_error("", 0, 0, "the log is empty: expected the header Thread,Time,Action,Pointer,Size,Stream");
  require_log_error("Thread,Time,Action,Address,Size,Stream\n", 1, 20,
                    "header column 4 is 'Address', expected 'Pointer'");
  require_log_error("1,01:00:00.000000,allocate,0x100,256,0\n", 1, 1, "header column 1 is '1', expected 'Thread'");
  require_log_error("Thread,Time,Action\n", 1, 19, "the header ends after 3 columns");
  require_log_error(header + "1,01:00:00,allocate,0x100,256\n", 2, 30, "expected 6 columns");
  require_log_error(header + ",01:00:00,allocate,0x100,256,0\n", 2, 1, "the Thread column is empty");
  require_log_error(header + "1,yesterday,allocate,0x100,256,0\n", 2, 3, "bad Time 'yesterday': expected a time of day such as");
  require_log_error(header + "1,1:0:00,allocate,0x100,256,0\n", 2, 3, "bad Time '1:0:00'");
  require_log_error(header + "1,1.,allocate,0x100,256,0\n", 2, 3, "bad Time '1.'");
  require_log_error(header + "1,01:00:00,alloc,0x100,256,0\n", 2, 12,
                    "bad Action 'alloc': expected allocate, free or allocate failure");
  require_log_error(header + "1,01:00:00,allocate,0xzz,256,0\n", 2, 21,
                    "bad Pointer '0xzz': expected a hexadecimal address");
  require_log_error(header + "1,01:00:00,allocate,,256,0\n", 2, 21, "bad Pointer ''");
  require_log_error(header + "1,01:00:00,allocate,0x11112222333344445,256,0\n", 2, 21, "bad Pointer");
  require_log_error(header + "1,01:00:00,allocate,0x100,-5,0\n", 2, 27, "bad Size '-5': expected a number of bytes");
  require_log_error(header + "1,01:00:00,allocate,0x100,12kb,0\n", 2, 27, "bad Size '12kb'");
  require_log_error(header + "1,01:00:00,allocate,0x100,99999999999999999999,0\n", 2, 27, "at most 18446744073709551615");
  require_log_error(header + "1,01:00:00,allocate,0x100,256,default\n", 2, 31,
                    "bad Stream 'default': expected a hexadecimal stream handle");
  require_log_error(header + "1,01:00:00,allocate,0x0,256,0\n", 2, 21, "an allocate row of 256 bytes has a null Pointer");
}

TEST_CASE("log: Time is a time of day; a null free with a size and absurd totals are errors") {
  require_log_error(header + "1,25:99:99,allocate,0x100,256,0\n", 2, 3, "bad Time '25:99:99'");
  require_log_error(header + "1,24:00:00,allocate,0x100,256,0\n", 2, 3, "bad Time '24:00:00'");
  require_log_error(header + "1,01:60:00,allocate,0x100,256,0\n", 2, 3, "bad Time '01:60:00'");
  require_log_error(header + "1,01:00:60.5,allocate,0x100,256,0\n", 2, 3, "bad Time '01:00:60.5'");
  CHECK(parse_allocation_log(header + "1,23:59:59.999999,allocate,0x100,256,0\n1,7:05:09,free,0x100,256,0\n")
            .events.size() == 2);
  require_log_error(header + "1,01:00:00,free,0x0,256,0\n", 2, 17,
                    "a free row of 256 bytes has a null Pointer: no allocation of that size returns null");
  CHECK(parse_allocation_log(header + "1,01:00:00,free,0x0,0,0\n").skipped_null_rows == 1);
  // Live bytes past 2^64 - 1 (each size alone is valid): refused, not wrapped.
  require_log_error(header + "1,0,allocate,0x100,18446744073709551615,0\n1,0,allocate,0x200,2,0\n", 3, 20,
                    "the log's bytes would pass 2^64 - 1: the sizes are absurd");
}

TEST_CASE("log: long lines are bounded, and messages quote at most 200 characters") {
  log_limits limits;
  limits.max_line_bytes = 1000;
  std::string const long_thread(5000, 't');
  std::string const text = header + long_thread + ",0,allocate,0x100,256,0\n";
  try {
    (void)parse_allocation_log(text, "test.csv", limits);
    FAIL("no error for an over-long line");
  } catch (log_error const& e) {
    std::string const message = e.what();
    CHECK(e.line() == 2);
    CHECK_THAT(message, Catch::Contains("the line is 5023 bytes long, more than the reader's limit of 1000"));
    CHECK(message.size() < 400);
  }
  // Within the limit, a bad field far into an 8,000-character line: the message stays short.
  limits.max_line_bytes = 1 << 20;
  std::string const bad = header + "1,0,allocate,0x100," + std::string(8000, '9') + "x,0\n";
  try {
    (void)parse_allocation_log(bad, "test.csv", limits);
    FAIL("no error for a bad size");
  } catch (log_error const& e) {
    std::string const message = e.what();
    CHECK_THAT(message, Catch::Contains("bad Size '999"));
    CHECK(message.size() < 600);
    CHECK(e.column() == 20);
  }
  // The default limit applies without options.
  CHECK_THROWS_WITH(parse_allocation_log(header + std::string(70000, '1') + ",0,allocate,0x100,256,0\n"),
                    Catch::Contains("more than the reader's limit of 65536"));
}

TEST_CASE("log: inconsistent logs are errors naming the lines involved") {
  std::string const a = "1,01:00:00,allocate,0x100,256,0\n";
  require_log_error(header + a + a, 3, 21,
                    "allocate of 0x100, which is still live: line 2 allocated it and no line freed it since");
  require_log_error(header + "1,01:00:00,free,0x100,256,0\n", 2, 17, "free of 0x100, which no earlier line allocated");
  std::string const f = "1,01:00:00,free,0x100,256,0\n";
  require_log_error(header + a + f + f, 4, 17,
                    "free of 0x100, which is not live: line 2 allocated it and line 3 already freed it");
  require_log_error(header + a + "1,01:00:00,free,0x100,255,0\n", 3, 23,
                    "free of 0x100 with Size 255, but line 2 allocated it with 256 bytes");
}

TEST_CASE("log: a multi-thread log keeps each thread's events and the global order") {
  std::string const text = header +
                           "10,1,allocate,0x100,256,0\n"   // event 0, thread 10
                           "20,2,allocate,0x200,512,0\n"   // event 1, thread 20
                           "10,3,free,0x200,512,0\n"       // event 2: thread 10 frees what 20 allocated
                           "30,4,allocate,0x300,768,0\n"   // event 3
                           "20,5,free,0x100,256,0\n"       // event 4
                           "10,6,free,0x300,768,0\n";      // event 5
  auto const log = parse_allocation_log(text);
  CHECK(log.thread_names == std::vector<std::string>{"10", "20", "30"});
  REQUIRE(log.events_by_thread.size() == 3);
  CHECK(log.events_by_thread[0] == std::vector<std::uint32_t>{0, 2, 5});
  CHECK(log.events_by_thread[1] == std::vector<std::uint32_t>{1, 4});
  CHECK(log.events_by_thread[2] == std::vector<std::uint32_t>{3});
  CHECK(log.event_threads == std::vector<std::uint32_t>{0, 1, 0, 2, 1, 0});
  CHECK(log.events[2].allocation == 1);
  CHECK(log.peak_live_bytes == 256 + 768);  // after event 3
}

TEST_CASE("log: random logs parse to what a simple model expects") {
  std::mt19937_64 rng{7};
  for (int round = 0; round < 50; ++round) {
    std::ostringstream text;
    text << header;
    std::map<std::uint64_t, std::size_t> live;  // address -> bytes
    std::vector<std::tuple<log_action, std::size_t, std::uint64_t, int>> expected;  // action, bytes, stream, thread
    std::size_t live_bytes = 0;
    std::size_t peak = 0;
    std::uint64_t next_address = 0x1000;
    int const events = 1 + static_cast<int>(rng() % 400);
    for (int i = 0; i < events; ++i) {
      int const thread = static_cast<int>(rng() % 4);
      std::uint64_t const stream = rng() % 3 == 0 ? 0 : 0xabc0 + rng() % 3;
      if (live.empty() || rng() % 2 == 0) {
        std::size_t const bytes = 1 + rng() % 100000;
        std::uint64_t const address = next_address;
        next_address += 0x100000;
        live[address] = bytes;
        live_bytes += bytes;
        peak = std::max(peak, live_bytes);
        text << thread << ",0:00:00." << i << ",allocate," << std::hex << (rng() % 2 ? "0x" : "") << address << ","
             << std::dec << bytes << ",0x" << std::hex << stream << std::dec << "\n";
        expected.emplace_back(log_action::allocate, bytes, stream, thread);
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        text << thread << "," << i << ",free,0x" << std::hex << it->first << std::dec << "," << it->second << ","
             << std::hex << stream << std::dec << "\n";
        expected.emplace_back(log_action::free, it->second, stream, thread);
        live_bytes -= it->second;
        live.erase(it);
      }
    }
    auto const log = parse_allocation_log(text.str());
    REQUIRE(log.events.size() == expected.size());
    CHECK(log.peak_live_bytes == peak);
    CHECK(log.leaked_allocations.size() == live.size());
    CHECK(log.leaked_bytes == live_bytes);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      auto const& [action, bytes, stream, thread] = expected[i];
      CHECK(log.events[i].action == action);
      CHECK(log.events[i].bytes == bytes);
      CHECK(log.streams[log.events[i].stream] == stream);
      CHECK(log.thread_names[log.event_threads[i]] == std::to_string(thread));
    }
    // peak_live_bytes_without(no allocation skipped) is the log's own peak
    CHECK(peak_live_bytes_without(log, std::vector<bool>(log.allocation_count, false)) == peak);
  }
}

TEST_CASE("log: peak live bytes without some allocations") {
  auto const log = parse_allocation_log(header +
                                        "1,0,allocate,0x100,100,0\n"
                                        "1,0,allocate,0x200,1000,0\n"
                                        "1,0,free,0x200,1000,0\n"
                                        "1,0,allocate,0x300,300,0\n");
  CHECK(log.peak_live_bytes == 1100);
  CHECK(peak_live_bytes_without(log, {false, true, false}) == 400);
  CHECK(peak_live_bytes_without(log, {true, true, true}) == 0);
}

TEST_CASE("log: files, plain and gzip; unreadable and damaged files are errors") {
  auto const dir = scratch_dir();
  std::string const text = header + "1,0,allocate,0x100,100,0\n1,0,free,0x100,100,0\n";
  {
    std::ofstream{dir / "plain.csv"} << text;
  }
  write_gzip(dir / "packed.csv.gz", text);
  auto const plain = read_allocation_log((dir / "plain.csv").string());
  auto const packed = read_allocation_log((dir / "packed.csv.gz").string());
  CHECK(plain.events.size() == 2);
  CHECK(packed.events.size() == 2);
  CHECK(packed.source == (dir / "packed.csv.gz").string());

  CHECK_THROWS_WITH(read_allocation_log((dir / "missing.csv").string()),
                    Catch::Contains("missing.csv: cannot open the log: No such file or directory"));

  // A gzip file cut in half.
  std::string big = header;
  for (int i = 0; i < 20000; ++i) { big += "1,0,allocate,0x" + std::to_string(100000 + i) + ",100,0\n"; }
  write_gzip(dir / "cut.csv.gz", big);
  auto const full_size = std::filesystem::file_size(dir / "cut.csv.gz");
  std::filesystem::resize_file(dir / "cut.csv.gz", full_size / 2);
  CHECK_THROWS_WITH(read_allocation_log((dir / "cut.csv.gz").string()), Catch::Contains("damaged or cut short"));

  // Bad lines in a gzip file name the file and line like plain ones.
  write_gzip(dir / "bad.csv.gz", header + "1,0,allocate,0x100,100,0\n1,0,free,0x100,99,0\n");
  try {
    (void)read_allocation_log((dir / "bad.csv.gz").string());
    FAIL("read a bad log");
  } catch (log_error const& e) {
    CHECK(e.line() == 3);
    CHECK(e.column() == 16);
    CHECK_THAT(e.what(), Catch::StartsWith((dir / "bad.csv.gz").string() + ":3:16: free of 0x100 with Size 99"));
  }

  {
    std::ofstream bin{dir / "binary.csv", std::ios::binary};
    bin << header << std::string("1,0,allocate\0,0x100,100,0\n", 26);
  }
  try {
    (void)read_allocation_log((dir / "binary.csv").string());
    FAIL("read binary data");
  } catch (log_error const& e) {
    CHECK(e.line() == 2);
    CHECK(e.column() == 13);
    CHECK_THAT(e.what(), Catch::Contains(":2:13: a NUL byte at byte offset 51 of the text: the log holds binary data"));
  }

  // Bytes after the gzip stream that are not another gzip stream.
  write_gzip(dir / "junk.csv.gz", text);
  {
    std::ofstream{dir / "junk.csv.gz", std::ios::binary | std::ios::app} << "junk";
  }
  CHECK_THROWS_WITH(read_allocation_log((dir / "junk.csv.gz").string()),
                    Catch::Contains("4 bytes of trailing garbage after the gzip stream"));
  // Two gzip streams one after another are one text (as gzip -d reads them).
  write_gzip(dir / "first.gz", header + "1,0,allocate,0x100,100,0\n");
  write_gzip(dir / "second.gz", "1,0,free,0x100,100,0\n");
  {
    std::ofstream both{dir / "both.csv.gz", std::ios::binary};
    both << std::ifstream{dir / "first.gz", std::ios::binary}.rdbuf() << std::ifstream{dir / "second.gz", std::ios::binary}.rdbuf();
  }
  CHECK(read_allocation_log((dir / "both.csv.gz").string()).events.size() == 2);

  // A small gzip file that expands past the limit is refused while it expands.
  write_gzip(dir / "bomb.csv.gz", header + std::string(1 << 20, '\n'));
  log_limits small;
  small.max_text_bytes = 100000;
  CHECK(std::filesystem::file_size(dir / "bomb.csv.gz") < 10000);
  CHECK_THROWS_WITH(read_allocation_log((dir / "bomb.csv.gz").string(), small),
                    Catch::Contains("larger than 100000 bytes, the reader's limit (raise it with --max-log-bytes)"));
  CHECK_THROWS_WITH(read_allocation_log((dir / "plain.csv").string(), log_limits{10, 1000}),
                    Catch::Contains("larger than 10 bytes"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("log: damaged gzip files are errors, never a crash or a silent success") {
  auto const dir = scratch_dir();
  std::string text = header;
  for (int i = 0; i < 2000; ++i) {
    text += "1,0,allocate,0x" + std::to_string(100000 + i) + ",100,0\n1,0,free,0x" + std::to_string(100000 + i) + ",100,0\n";
  }
  write_gzip(dir / "good.csv.gz", text);
  std::string packed;
  {
    std::ifstream f{dir / "good.csv.gz", std::ios::binary};
    packed.assign(std::istreambuf_iterator<char>{f}, std::istreambuf_iterator<char>{});
  }
  std::mt19937 rng{5};
  std::size_t refused = 0;
  for (int k = 0; k < 200; ++k) {
    std::string damaged = packed;
    for (int flips = 0; flips < 3; ++flips) {
      damaged[2 + rng() % (damaged.size() - 2)] = static_cast<char>(rng());  // keep the magic number
    }
    {
      std::ofstream{dir / "damaged.csv.gz", std::ios::binary | std::ios::trunc} << damaged;
    }
    try {
      auto const log = read_allocation_log((dir / "damaged.csv.gz").string());
      CHECK(log.events.size() <= 4000);  // a flip in a name or a stored block may still read
    } catch (log_error const& e) {
      ++refused;
      CHECK(std::string{e.what()}.size() < 1000);
    }
  }
  CHECK(refused > 150);  // the CRC catches nearly every damaged stream
  std::filesystem::remove_all(dir);
}

TEST_CASE("log: the sample log from PyTorch training ResNet-50") {
  auto const path = std::filesystem::path{__FILE__}.parent_path().parent_path() / "data" / "torch_resnet50_train.csv.gz";
  if (!std::filesystem::exists(path)) {
    WARN("sample log not found at " << path.string());
    return;
  }
  auto const log = read_allocation_log(path.string());
  CHECK(log.events.size() == 9094);
  CHECK(log.allocation_count == 4547);
  CHECK(log.free_count() == 4547);
  CHECK(log.thread_names.size() == 1);
  CHECK(log.streams.size() == 1);
  CHECK(log.leaked_allocations.empty());
  CHECK(log.recorded_failures.empty());
  // Peak live by a separate, simple reading of the same file.
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string text;
  char buf[4096];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) { text.append(buf, static_cast<std::size_t>(n)); }
  gzclose(f);
  std::istringstream lines{text};
  std::string line;
  std::getline(lines, line);
  std::map<std::string, std::size_t> live;
  std::size_t live_bytes = 0;
  std::size_t peak = 0;
  while (std::getline(lines, line)) {
    std::vector<std::string> cols;
    std::stringstream ss{line};
    for (std::string c; std::getline(ss, c, ',');) { cols.push_back(c); }
    std::size_t const bytes = std::stoull(cols[4]);
    if (cols[2] == "allocate") {
      live[cols[3]] = bytes;
      live_bytes += bytes;
      peak = std::max(peak, live_bytes);
    } else {
      live_bytes -= live.at(cols[3]);
      live.erase(cols[3]);
    }
  }
  CHECK(log.peak_live_bytes == peak);
  CHECK(peak > 0);
}
