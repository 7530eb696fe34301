// The logging adaptor: the CSV it writes is parsed back (by an independent reader here)
// and must match the calls made — counts, sizes, pointers, streams, thread ids, failures —
// single- and multi-threaded, synchronous and asynchronous, to files, streams and sinks.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/ostream_sink.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace mrstack;

namespace {

struct row {
  std::size_t thread = 0;
  int seconds_of_day = 0;
  int micros = 0;
  std::string action;
  std::uintptr_t pointer = 0;  // 0 for "(nil)"
  std::size_t size = 0;
  std::uintptr_t stream = 0;

  friend bool operator==(row const& a, row const& b) {
    return a.thread == b.thread && a.action == b.action && a.pointer == b.pointer && a.size == b.size &&
           a.stream == b.stream;
  }
};

std::ostream& operator<<(std::ostream& os, row const& r) {
  return os << r.thread << "," << r.action << ",0x" << std::hex << r.pointer << std::dec << "," << r.size << ",0x"
            << std::hex << r.stream << std::dec;
}

std::uint64_t parse_unsigned(std::string const& field, int base, std::string const& line) {
  INFO("line: " << line << " field: '" << field << "'");
  REQUIRE(!field.empty());
  std::size_t used = 0;
  std::uint64_t const v = std::stoull(field, &used, base);
  REQUIRE(used == field.size());
  return v;
}

/// Strict reader of the format the adaptor documents; every deviation fails the test.
std::vector<row> parse_log(std::string const& text) {
  std::istringstream in{text};
  std::string line;
  REQUIRE(std::getline(in, line));
  REQUIRE(line == "Thread,Time,Action,Pointer,Size,Stream");
  std::vector<row> rows;
  while (std::getline(in, line)) {
    INFO("line " << rows.size() + 2 << ": " << line);
    std::vector<std::string> fields;
    std::stringstream ls{line};
    for (std::string f; std::getline(ls, f, ',');) { fields.push_back(f); }
    REQUIRE(fields.size() == 6);
    row r;
    r.thread = parse_unsigned(fields[0], 10, line);
    auto const& t = fields[1];  // HH:MM:SS.uuuuuu
    REQUIRE(t.size() == 15);
    REQUIRE((t[2] == ':' && t[5] == ':' && t[8] == '.'));
    int const h = std::stoi(t.substr(0, 2));
    int const m = std::stoi(t.substr(3, 2));
    int const s = std::stoi(t.substr(6, 2));
    REQUIRE((h < 24 && m < 60 && s < 61));
    r.seconds_of_day = h * 3600 + m * 60 + s;
    r.micros = static_cast<int>(parse_unsigned(t.substr(9), 10, line));
    r.action = fields[2];
    REQUIRE((r.action == "allocate" || r.action == "allocate failure" || r.action == "free"));
    if (r.action == "allocate failure") {
      REQUIRE(fields[3] == "(nil)");
    } else {
      REQUIRE(fields[3].rfind("0x", 0) == 0);
      r.pointer = parse_unsigned(fields[3].substr(2), 16, line);
      REQUIRE(r.pointer != 0);
    }
    r.size = parse_unsigned(fields[4], 10, line);
    if (fields[5] != "0") {
      REQUIRE(fields[5].rfind("0x", 0) == 0);
      r.stream = parse_unsigned(fields[5].substr(2), 16, line);
      REQUIRE(r.stream != 0);
    }
    rows.push_back(r);
  }
  return rows;
}

std::string read_file(std::filesystem::path const& path) {
  std::ifstream in{path, std::ios::binary};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::filesystem::path temp_log(std::string const& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("mrstack_test_logging_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / (tag + ".csv");
}

int seconds_of_day_now() {
  std::time_t const t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  return local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec;
}

/// `s` lies in [from - 1, to + 1] seconds of the day (around midnight too). The second of
/// slack: std::time reads a coarse clock that may lag the adaptor's system_clock by a
/// tick, and a row stamped just after a second turned was once read as outside.
bool within(int s, int from, int to) {
  constexpr int day = 24 * 3600;
  from = (from + day - 1) % day;
  to = (to + 1) % day;
  return from <= to ? (s >= from && s <= to) : (s >= from || s <= to);
}

cudaStream_t fake_stream(std::uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

/// Checks that replaying `rows` in file order is a valid serial history: every free is of
/// a live pointer with its size, no allocate returns a live pointer.
void check_serial_history(std::vector<row> const& rows) {
  std::map<std::uintptr_t, std::size_t> live;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto const& r = rows[i];
    INFO("row " << i << ": " << r);
    if (r.action == "allocate") {
      REQUIRE(live.emplace(r.pointer, r.size).second);
    } else if (r.action == "free") {
      auto it = live.find(r.pointer);
      REQUIRE(it != live.end());
      REQUIRE(it->second == r.size);
      live.erase(it);
    }
  }
}

}  // namespace

TEST_CASE("logging: rows match the calls, in order, single thread (sync and async)") {
  bool const async = GENERATE(false, true);
  INFO("async " << async);
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
  std::ostringstream out;
  int const from = seconds_of_day_now();
  std::vector<row> expected;
  {
    logging_resource_adaptor log{sim, out, false, async};
    CHECK(log.name() == "logging");
    CHECK(log.upstream() == sim.get());
    CHECK(log.is_async() == async);
    CHECK(log.path().empty());
    auto const me = logging_resource_adaptor::current_thread_id();
    std::mt19937_64 rng{42};
    std::vector<std::pair<void*, std::size_t>> held;
    for (int i = 0; i < 500; ++i) {
      std::uintptr_t const stream_id = (i % 3 == 0) ? 0 : 0x1000 + static_cast<std::uintptr_t>(i % 5);
      if (held.empty() || rng() % 3 != 0) {
        std::size_t const bytes = 1 + rng() % 100000;
        void* p = log.allocate(bytes, fake_stream(stream_id));
        held.emplace_back(p, bytes);
        expected.push_back(row{me, 0, 0, "allocate", reinterpret_cast<std::uintptr_t>(p), bytes, stream_id});
      } else {
        std::size_t const k = rng() % held.size();
        auto [p, bytes] = held[k];
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        log.deallocate(p, bytes, fake_stream(stream_id));
        expected.push_back(row{me, 0, 0, "free", reinterpret_cast<std::uintptr_t>(p), bytes, stream_id});
      }
    }
    // A refusal is logged with a nil pointer, and the exception still reaches the caller.
    CHECK_THROWS_AS(log.allocate(std::size_t{2} << 30, fake_stream(0x77)), out_of_memory);
    expected.push_back(row{me, 0, 0, "allocate failure", 0, std::size_t{2} << 30, 0x77});
    // Zero bytes and null frees never reach the adaptor: nothing is logged for them.
    CHECK(log.allocate(0) == nullptr);
    log.deallocate(nullptr, 0);
    for (auto [p, bytes] : held) {
      log.deallocate(p, bytes);
      expected.push_back(row{me, 0, 0, "free", reinterpret_cast<std::uintptr_t>(p), bytes, 0});
    }
    log.flush();
    // flush() means everything so far is out, before the adaptor goes away.
    CHECK(parse_log(out.str()).size() == expected.size());
  }
  int const to = seconds_of_day_now();
  auto const rows = parse_log(out.str());
  REQUIRE(rows.size() == expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i);
    CHECK(rows[i] == expected[i]);
    CHECK(within(rows[i].seconds_of_day, from, to));
  }
  check_serial_history(rows);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("logging: the exact text of rows (hex pointer and stream, nil on failure)") {
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 20);
  std::ostringstream out;
  {
    logging_resource_adaptor log{sim, out};
    void* p = log.allocate(1000, fake_stream(0xabc0));
    log.deallocate(p, 1000);
    CHECK_THROWS_AS(log.allocate(std::size_t{4} << 20), out_of_memory);
    std::ostringstream hex_ptr;
    hex_ptr << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
    log.flush();
    std::string const text = out.str();
    auto const tid = std::to_string(logging_resource_adaptor::current_thread_id());
    std::vector<std::string> lines;
    std::istringstream in{text};
    for (std::string l; std::getline(in, l);) { lines.push_back(l); }
    REQUIRE(lines.size() == 4);
    auto tail = [](std::string const& l) { return l.substr(l.find(',', l.find(',') + 1) + 1); };  // after Time
    CHECK(lines[1].rfind(tid + ",", 0) == 0);
    CHECK(tail(lines[1]) == "allocate," + hex_ptr.str() + ",1000,0xabc0");
    CHECK(tail(lines[2]) == "free," + hex_ptr.str() + ",1000,0");
    CHECK(tail(lines[3]) == "allocate failure,(nil),4194304,0");
  }
}

TEST_CASE("logging: 8 threads — every row intact, each thread's rows in its own order, a valid history") {
  bool const async = GENERATE(false, true);
  std::size_t const queue = GENERATE(std::size_t{16}, logging_resource_adaptor::default_queue_capacity);
  if (!async && queue != logging_resource_adaptor::default_queue_capacity) { return; }
  INFO("async " << async << " queue " << queue);
  constexpr int threads = 8;
  constexpr int ops = 4000;
  auto const path = temp_log("threads_" + std::to_string(async) + "_" + std::to_string(queue));
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  std::vector<std::vector<row>> expected(threads);
  std::atomic<std::size_t> failures{0};
  {
    logging_resource_adaptor log{sim, path.string(), false, async, queue};
    CHECK(log.path() == path.string());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        auto const me = logging_resource_adaptor::current_thread_id();
        auto& mine = expected[static_cast<std::size_t>(t)];
        std::mt19937_64 rng{static_cast<std::uint64_t>(t) * 7919 + 1};
        std::vector<std::pair<void*, std::size_t>> held;
        std::uintptr_t const stream_id = 0x5000 + static_cast<std::uintptr_t>(t);
        for (int i = 0; i < ops; ++i) {
          auto const dice = rng() % 100;
          if (dice < 2) {
            std::size_t const bytes = (std::size_t{8} << 30) + rng() % 1000;  // more than the capacity: refused
            try {
              (void)log.allocate(bytes, fake_stream(stream_id));
            } catch (out_of_memory const&) {
              mine.push_back(row{me, 0, 0, "allocate failure", 0, bytes, stream_id});
              failures.fetch_add(1);
            }
          } else if (held.empty() || dice < 55) {
            std::size_t const bytes = 1 + rng() % 65536;
            void* p = log.allocate(bytes, fake_stream(stream_id));
            held.emplace_back(p, bytes);
            mine.push_back(row{me, 0, 0, "allocate", reinterpret_cast<std::uintptr_t>(p), bytes, stream_id});
          } else {
            std::size_t const k = rng() % held.size();
            auto [p, bytes] = held[k];
            held[k] = held.back();
            held.pop_back();
            log.deallocate(p, bytes, fake_stream(stream_id));
            mine.push_back(row{me, 0, 0, "free", reinterpret_cast<std::uintptr_t>(p), bytes, stream_id});
          }
        }
        for (auto [p, bytes] : held) {
          log.deallocate(p, bytes, fake_stream(stream_id));
          mine.push_back(row{me, 0, 0, "free", reinterpret_cast<std::uintptr_t>(p), bytes, stream_id});
        }
      });
    }
    for (auto& th : pool) { th.join(); }
    log.flush();
    std::size_t total = 0;
    for (auto const& e : expected) { total += e.size(); }
    CHECK(parse_log(read_file(path)).size() == total);  // complete after flush, adaptor alive
  }
  CHECK(failures.load() > 0);
  auto const rows = parse_log(read_file(path));
  std::map<std::size_t, std::vector<row>> by_thread;
  for (auto const& r : rows) { by_thread[r.thread].push_back(r); }
  REQUIRE(by_thread.size() == threads);
  std::size_t total = 0;
  for (auto const& mine : expected) {
    REQUIRE(!mine.empty());
    auto const& got = by_thread[mine.front().thread];
    REQUIRE(got.size() == mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      INFO("thread " << mine.front().thread << " row " << i);
      REQUIRE(got[i] == mine[i]);
    }
    total += mine.size();
  }
  CHECK(rows.size() == total);
  check_serial_history(rows);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("logging: the file name defaults from MRSTACK_LOG_FILE, and its absence is a clear error") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const path = temp_log("from_env");
  ::setenv("MRSTACK_LOG_FILE", path.string().c_str(), 1);
  {
    logging_resource_adaptor log{sim};
    CHECK(log.path() == path.string());
    void* p = log.allocate(256);
    log.deallocate(p, 256);
  }
  CHECK(parse_log(read_file(path)).size() == 2);
  ::unsetenv("MRSTACK_LOG_FILE");
  CHECK_THROWS_AS(logging_resource_adaptor(sim), logic_error);
  CHECK_THROWS_WITH(logging_resource_adaptor(sim), Catch::Contains("MRSTACK_LOG_FILE is unset"));
  ::setenv("MRSTACK_LOG_FILE", "", 1);  // set, but naming no file
  CHECK_THROWS_WITH(logging_resource_adaptor(sim), Catch::Contains("MRSTACK_LOG_FILE is set but empty"));
  ::unsetenv("MRSTACK_LOG_FILE");
}

TEST_CASE("logging: a file that cannot be opened is an error naming the path") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::string const bad = "/proc/version/cannot/be/here.csv";  // under a regular file
  CHECK_THROWS_WITH(logging_resource_adaptor(sim, bad), Catch::Contains(bad));
  CHECK_THROWS_AS(logging_resource_adaptor(sim, bad), std::runtime_error);
}

TEST_CASE("logging: a file another live adaptor writes is refused, naming it, and left as it was") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const path = temp_log("clash");
  {
    logging_resource_adaptor first{sim, path.string(), true};
    void* p = first.allocate(256);
    // The same file by another spelling of its path, and through MRSTACK_LOG_FILE (as two
    // stacks of one process configured from the environment would both name it).
    auto const other_spelling = (path.parent_path() / "." / path.filename()).string();
    CHECK_THROWS_AS(logging_resource_adaptor(sim, other_spelling), logic_error);
    CHECK_THROWS_WITH(logging_resource_adaptor(sim, other_spelling),
                      Catch::Contains(other_spelling) && Catch::Contains("already"));
    ::setenv("MRSTACK_LOG_FILE", path.string().c_str(), 1);
    CHECK_THROWS_AS(logging_resource_adaptor(sim), logic_error);
    ::unsetenv("MRSTACK_LOG_FILE");
    first.deallocate(p, 256);
  }
  CHECK(parse_log(read_file(path)).size() == 2);  // the first's rows, not truncated away
  // Once the first is gone, the file is free to be written again.
  CHECK_NOTHROW(logging_resource_adaptor(sim, path.string()));
  // A device is no log to truncate: any number may write to /dev/null.
  logging_resource_adaptor discard{sim, "/dev/null"};
  CHECK_NOTHROW(logging_resource_adaptor(sim, "/dev/null"));
}

TEST_CASE("logging: bad construction arguments are logic errors") {
  std::ostringstream out;
  CHECK_THROWS_WITH(logging_resource_adaptor(nullptr, out), Catch::Contains("upstream"));
  auto sim = std::make_shared<simulated_memory_resource>();
  CHECK_THROWS_WITH(logging_resource_adaptor(sim, std::vector<spdlog::sink_ptr>{}), Catch::Contains("no sink"));
  CHECK_THROWS_WITH(logging_resource_adaptor(sim, out, false, true, 1000), Catch::Contains("1000"));
}

TEST_CASE("logging: auto_flush puts each row in the file before the call returns (sync)") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const path = temp_log("auto_flush");
  logging_resource_adaptor log{sim, path.string(), /*auto_flush=*/true};
  void* p = log.allocate(512);
  CHECK(parse_log(read_file(path)).size() == 1);
  log.deallocate(p, 512);
  CHECK(parse_log(read_file(path)).size() == 2);
}

TEST_CASE("logging: the header is in the file from construction, in every mode") {
  // A process that ends without destructors must leave a log that reads as one.
  auto sim = std::make_shared<simulated_memory_resource>();
  struct mode {
    bool async;
    log_order order;
    log_format format;
  };
  for (mode const m : {mode{false, log_order::merged, log_format::csv}, mode{true, log_order::merged, log_format::csv},
                       mode{true, log_order::per_thread, log_format::csv},
                       mode{true, log_order::per_thread, log_format::binary}}) {
    auto const path = temp_log("header");
    logging_resource_adaptor log{sim, path.string(), false, m.async, 1024, m.order, m.format};
    INFO("async " << m.async << ", per-thread " << (m.order == log_order::per_thread) << ", binary "
                  << (m.format == log_format::binary));
    auto const read = read_allocation_log(path.string());  // the header alone: a log of no events
    CHECK(read.events.empty());
  }
}

TEST_CASE("logging: several sinks each get every row") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream a;
  std::ostringstream b;
  bool const async = GENERATE(false, true);
  {
    logging_resource_adaptor log{sim,
                                 {std::make_shared<spdlog::sinks::ostream_sink_mt>(a),
                                  std::make_shared<spdlog::sinks::ostream_sink_mt>(b)},
                                 false,
                                 async};
    for (int i = 0; i < 100; ++i) {
      void* p = log.allocate(64 + static_cast<std::size_t>(i));
      log.deallocate(p, 64 + static_cast<std::size_t>(i));
    }
  }
  CHECK(a.str() == b.str());
  CHECK(parse_log(a.str()).size() == 200);
}

TEST_CASE("logging: the destructor drains the asynchronous queue") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const path = temp_log("drain");
  {
    logging_resource_adaptor log{sim, path.string(), false, true, 16};
    for (int i = 0; i < 10000; ++i) {
      void* p = log.allocate(256);
      log.deallocate(p, 256);
    }
  }
  auto const rows = parse_log(read_file(path));
  CHECK(rows.size() == 20000);
  check_serial_history(rows);
}

namespace {

/// Takes `good` messages, then fails every write as a full disk would (with `message`).
class failing_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit failing_sink(int good, std::string message = "No space left on device (a test's sink)",
                        bool throw_int = false)
      : good_{good}, message_{std::move(message)}, throw_int_{throw_int} {}

 private:
  void sink_it_(spdlog::details::log_msg const&) override {
    if (good_-- > 0) { return; }
    if (throw_int_) { throw 28; }  // ENOSPC, as a C library might
    throw std::runtime_error(message_);
  }
  void flush_() override {}
  int good_;
  std::string message_;
  bool throw_int_;
};

}  // namespace

TEST_CASE("logging: a failed write is reported by flush() in every mode, not only printed") {
  // spdlog's default handler printed a rate-limited line and flush() returned normally,
  // leaving a log cut short with nothing told to the program.
  struct mode {
    bool async;
    log_order order;
    log_format format;
  };
  for (auto const m : {mode{false, log_order::merged, log_format::csv}, mode{true, log_order::merged, log_format::csv},
                       mode{true, log_order::per_thread, log_format::csv},
                       mode{true, log_order::per_thread, log_format::binary}}) {
    INFO("async " << m.async << ", per-thread " << (m.order == log_order::per_thread) << ", binary "
                  << (m.format == log_format::binary));
    auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
    // Per-thread buffers reach the sink a buffer at a time: the header and none after.
    logging_resource_adaptor log{sim, std::vector<spdlog::sink_ptr>{std::make_shared<failing_sink>(1)}, false, m.async,
                                 logging_resource_adaptor::default_queue_capacity, m.order, m.format};
    CHECK(log.write_failure().empty());
    for (int i = 0; i < 100; ++i) { log.deallocate(log.allocate(64), 64); }  // the calls themselves go through
    CHECK_THROWS_WITH(log.flush(), Catch::Contains("a write failed, rows are missing from the log") &&
                                       Catch::Contains("No space left on device (a test's sink)"));
    CHECK_THAT(log.write_failure(), Catch::Contains("No space left on device"));
  }
  // A sink whose error says nothing still counts: an empty message was taken for "none failed".
  {
    auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
    logging_resource_adaptor log{sim, std::vector<spdlog::sink_ptr>{std::make_shared<failing_sink>(1, "")}};
    log.deallocate(log.allocate(64), 64);
    CHECK_THAT(log.write_failure(), Catch::Contains("no message"));
    CHECK_THROWS_WITH(log.flush(), Catch::Contains("a write failed, rows are missing from the log"));
  }
  // A sink that throws what is not a std::exception: spdlog rethrew it, out of the calls
  // that log (noexcept) and the writer thread, and the program ended.
  for (auto const m : {mode{false, log_order::merged, log_format::csv}, mode{true, log_order::merged, log_format::csv},
                       mode{true, log_order::per_thread, log_format::csv},
                       mode{true, log_order::per_thread, log_format::binary}}) {
    INFO("async " << m.async << ", per-thread " << (m.order == log_order::per_thread));
    auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
    logging_resource_adaptor log{sim, std::vector<spdlog::sink_ptr>{std::make_shared<failing_sink>(1, "", true)}, true,
                                 m.async, logging_resource_adaptor::default_queue_capacity, m.order, m.format};
    log.deallocate(log.allocate(64), 64);
    CHECK_THROWS_WITH(log.flush(), Catch::Contains("not a std::exception"));
  }
  // A header that cannot be written fails the constructor, as a path that cannot be opened does.
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
  CHECK_THROWS_WITH(logging_resource_adaptor(sim, std::vector<spdlog::sink_ptr>{std::make_shared<failing_sink>(0)}),
                    Catch::Contains("cannot write the log's header"));
  if (std::filesystem::exists("/dev/full")) {
    CHECK_THROWS_WITH(logging_resource_adaptor(sim, "/dev/full"), Catch::Contains("cannot write the log's header"));
  }
}
