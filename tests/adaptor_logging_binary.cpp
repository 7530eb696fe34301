// The logging adaptor's binary format (log/binary_log.hpp): per-thread order in 32-byte
// records. Checked: every call is a record and reads back as the CSV row it stands for,
// each thread's in its order, a valid history once merged by stamp; threads sharing a
// buffer are told apart; the decoder's exact text; every damaged layout refused with its
// byte offset; gzip, files, auto_flush, the spec and the constructor's rules.
#include <catch2/catch.hpp>

#include <logged_threads.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/error.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/log/binary_log.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include "../src/adaptor/log_thread_buffers.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>
#include <zlib.h>

using namespace mrstack;
namespace bl = mrstack::binary_log;

namespace {

logging_resource_adaptor binary_log_to(std::ostream& out, resource_ptr up, std::size_t queue = 1024) {
  return logging_resource_adaptor{std::move(up), out, false, true, queue, log_order::per_thread, log_format::binary};
}

/// A binary log built by hand: the header, then blocks of records.
class log_bytes {
 public:
  explicit log_bytes(std::int64_t start_wall_ns = 0, std::uint64_t clock = bl::clock_ns) {
    bl::file_header h{};
    std::memcpy(h.magic, bl::file_magic, 8);
    h.version = bl::format_version;
    h.record_size = bl::record_bytes;
    h.start_wall_ns = start_wall_ns;
    h.clock = clock;
    put(h);
  }
  log_bytes& block(std::vector<bl::record> const& records) {
    put(bl::block_magic);
    put(static_cast<std::uint32_t>(records.size()));
    for (auto const& r : records) { put(r); }
    return *this;
  }
  template <typename T>
  log_bytes& put(T const& v) {
    bytes.append(reinterpret_cast<char const*>(&v), sizeof v);
    return *this;
  }
  std::string bytes;
};

bl::record thread_record(std::uint64_t id) { return {std::uint64_t{3} << bl::kind_shift, id, 0, 0}; }
bl::record event(bl::kind k, std::uint64_t stamp, std::uint64_t ptr, std::uint64_t size, std::uint64_t stream) {
  return {stamp | std::uint64_t(k) << bl::kind_shift, ptr, size, stream};
}

/// The log_error `bytes` raise, or "" when they read.
std::string error_of(std::string const& bytes, log_limits const& limits = {}) {
  try {
    (void)parse_allocation_log(bytes, "damaged.bin", limits);
  } catch (log_error const& e) {
    return e.what();
  }
  return "";
}

/// The Stamp column of each row of a per-thread CSV text.
std::vector<std::uint64_t> stamps_of(std::string const& csv) {
  std::vector<std::uint64_t> stamps;
  std::istringstream in{csv};
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) { stamps.push_back(std::stoull(line.substr(line.rfind(',') + 1))); }
  return stamps;
}

/// Sets (or, with null, unsets) an environment variable for the duration of a test.
struct scoped_env {
  scoped_env(char const* name, char const* value) : name_{name} {
    if (char const* old = std::getenv(name)) { saved_ = old; }
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~scoped_env() {
    if (saved_) {
      setenv(name_, saved_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  char const* name_;
  std::optional<std::string> saved_;
};

/// Local time as UTC for the duration of a test (the Time column is local time).
struct utc_time_zone {
  utc_time_zone() {
    char const* tz = std::getenv("TZ");
    saved = tz == nullptr ? "" : tz;
    had = tz != nullptr;
    setenv("TZ", "UTC", 1);
    tzset();
  }
  ~utc_time_zone() {
    if (had) {
      setenv("TZ", saved.c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }
  std::string saved;
  bool had = false;
};

}  // namespace

TEST_CASE("logging binary: every call a record, read back as its CSV row, a valid history once merged") {
  std::size_t const queue = GENERATE(std::size_t{16}, logging_resource_adaptor::default_queue_capacity);
  INFO("queue " << queue);
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  std::ostringstream out;
  std::vector<std::vector<test::logged_call>> expected;
  std::size_t total = 0;
  {
    auto log = binary_log_to(out, sim, queue);
    CHECK(log.format() == log_format::binary);
    CHECK(log.order() == log_order::per_thread);
    expected = test::run_logged_threads(log, 8, 5000);
    for (auto const& e : expected) { total += e.size(); }
    log.flush();
    CHECK(out.str().size() >= bl::file_header_bytes + total * bl::record_bytes);
  }
  std::string const bytes = out.str();
  REQUIRE(is_binary_log(bytes));
  std::string const csv = binary_log_to_csv(bytes, "threads.bin");
  test::check_rows_per_thread(csv, expected);
  allocation_log const parsed = parse_allocation_log(bytes, "threads.bin");
  CHECK(parsed.events.size() == total);
  CHECK(parsed.leaked_allocations.empty());
  CHECK(parsed.thread_names.size() == 8);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("logging binary: more threads at once than full-size buffers: each its own, all told apart") {
  // Every thread lives until all have logged: none can adopt another's buffer.
  int const threads = static_cast<int>(detail::counter_shards) + 6;
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  std::vector<std::vector<test::logged_call>> expected(static_cast<std::size_t>(threads));
  {
    auto log = binary_log_to(out, sim);
    std::barrier all_logged{threads};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        auto const stream = test::fake_stream(0x7000 + static_cast<std::uintptr_t>(t));
        std::size_t const bytes = 64 + static_cast<std::size_t>(t);
        void* p = log.allocate(bytes, stream);
        void* q = log.allocate(bytes + 1, stream);
        log.deallocate(p, bytes, stream);
        expected[static_cast<std::size_t>(t)] = {{"allocate", reinterpret_cast<std::uintptr_t>(p), bytes},
                                                 {"allocate", reinterpret_cast<std::uintptr_t>(q), bytes + 1},
                                                 {"free", reinterpret_cast<std::uintptr_t>(p), bytes}};
        all_logged.arrive_and_wait();
        log.deallocate(q, bytes + 1, stream);
        expected[static_cast<std::size_t>(t)].push_back({"free", reinterpret_cast<std::uintptr_t>(q), bytes + 1});
      });
    }
    for (auto& th : pool) { th.join(); }
    CHECK(log.thread_buffer_count() == static_cast<std::size_t>(threads));
  }
  test::check_rows_per_thread(binary_log_to_csv(out.str(), "shared.bin"), expected);
  CHECK(parse_allocation_log(out.str(), "shared.bin").thread_names.size() == static_cast<std::size_t>(threads));
}

TEST_CASE("binary log: the decoder writes the per-thread CSV rows exactly") {
  utc_time_zone const utc;
  std::int64_t const start = std::int64_t{1'700'000'000} * 1'000'000'000 + 123'456'000;  // 22:13:20.123456 UTC
  log_bytes log{start};
  log.block({thread_record(81234), event(bl::kind::allocate, 1'000, 0x7f864d700000, 37632, 0),
             event(bl::kind::allocate_failure, 2'500'000'000, 0, 1099511627776, 0x55d1c2a3b4c0),
             thread_record(5), event(bl::kind::free, 2'500'000'001, 0x7f864d700000, 37632, 0)});
  std::string const expected =
      "Thread,Time,Action,Pointer,Size,Stream,Stamp\n"
      "81234,22:13:20.123457,allocate,0x7f864d700000,37632,0,1000\n"
      "81234,22:13:22.623456,allocate failure,(nil),1099511627776,0x55d1c2a3b4c0,2500000000\n"
      "5,22:13:22.623456,free,0x7f864d700000,37632,0,2500000001\n";
  CHECK(binary_log_to_csv(log.bytes, "hand.bin") == expected);
  auto const parsed = parse_allocation_log(log.bytes, "hand.bin");
  CHECK(parsed.events.size() == 2);
  CHECK(parsed.recorded_failures.size() == 1);
  CHECK(binary_log_to_csv(log_bytes{}.bytes, "empty.bin") == "Thread,Time,Action,Pointer,Size,Stream,Stamp\n");
}

TEST_CASE("binary log: tick stamps become nanoseconds through the points thread records carry") {
  constexpr std::uint64_t named = std::uint64_t{3} << bl::kind_shift;
  log_bytes log{0, bl::clock_ticks};
  // Points (3000 ticks, 1000 ns) and (6000, 3000); (7000, 2500) runs backwards and is left
  // out. Between points the rate of their segment, past the last the whole span's.
  log.block({{named, 7, 3000, 1000}, event(bl::kind::allocate, 1500, 0x1000, 16, 0),
             event(bl::kind::free, 3000, 0x1000, 16, 0)});
  log.block({{named, 7, 6000, 3000}, event(bl::kind::allocate, 4500, 0x2000, 16, 0),
             event(bl::kind::free, 9000, 0x2000, 16, 0)});
  log.block({{named, 7, 7000, 2500}});
  CHECK(stamps_of(binary_log_to_csv(log.bytes, "ticks.bin")) == std::vector<std::uint64_t>{500, 1000, 2000, 4500});
  CHECK(parse_allocation_log(log.bytes, "ticks.bin").events.size() == 4);
  // A point in a nanosecond log is damage; a stamp in a thread record is, in either.
  CHECK_THAT(error_of(log_bytes{}.block({{named, 7, 3000, 1000}, event(bl::kind::allocate, 5, 0x1000, 16, 0)}).bytes),
             Catch::Contains("byte offset 40: a thread record with a stamp, size or stream"));
  CHECK_THAT(error_of(log_bytes{0, bl::clock_ticks}.block({{named | 5, 7, 0, 0}}).bytes),
             Catch::Contains("byte offset 40: a thread record with a stamp"));
}

TEST_CASE("binary log: tick stamps convert exactly, and of points at equal ticks the smallest ns counts") {
  constexpr std::uint64_t named = std::uint64_t{3} << bl::kind_shift;
  // A 3.000000002 GHz counter: the point (9,000,000,006 ticks, 3e9 ns). The free's stamp,
  // 6,000,000,004 ticks, is exactly 2e9 ns; a rate rounded before the multiplication made
  // it 1,999,999,999, the allocation's stamp, and the log was refused as a free before
  // its allocation.
  log_bytes log{0, bl::clock_ticks};
  log.block({{named, 1, 9'000'000'006, 3'000'000'000}, event(bl::kind::allocate, 6'000'000'003, 0x1000, 64, 0)});
  log.block({{named, 2, 0, 0}, event(bl::kind::free, 6'000'000'004, 0x1000, 64, 0)});
  CHECK(stamps_of(binary_log_to_csv(log.bytes, "exact.bin")) == std::vector<std::uint64_t>{1'999'999'999, 2'000'000'000});
  CHECK(parse_allocation_log(log.bytes, "exact.bin").events.size() == 2);
  // Points (10, 100) and (10, 50), in that order in the file: (10, 50) is kept.
  log_bytes equal{0, bl::clock_ticks};
  equal.block({{named, 1, 10, 100}, event(bl::kind::allocate, 20, 0x1000, 64, 0)});
  equal.block({{named, 1, 10, 50}, event(bl::kind::free, 30, 0x1000, 64, 0)});
  CHECK(stamps_of(binary_log_to_csv(equal.bytes, "equal.bin")) == std::vector<std::uint64_t>{100, 150});
  // Far past the last point the stamp stops at the largest one (2^62 - 1).
  log_bytes far{0, bl::clock_ticks};
  far.block({{named, 1, 1, ~std::uint64_t{0}}, event(bl::kind::allocate, bl::stamp_mask, 0x1000, 64, 0)});
  CHECK(stamps_of(binary_log_to_csv(far.bytes, "far.bin")) == std::vector<std::uint64_t>{bl::stamp_mask});
}

TEST_CASE("logging binary: tick stamps where the kernel keeps time by the counter, else the monotonic clock") {
  bool const steady = GENERATE(false, true);
  INFO("MRSTACK_LOG_CLOCK=steady " << steady);
  scoped_env const env{"MRSTACK_LOG_CLOCK", steady ? "steady" : nullptr};
  std::string kernel_clock;
  std::ifstream{"/sys/devices/system/clocksource/clocksource0/current_clocksource"} >> kernel_clock;
#if defined(__x86_64__)
  bool const ticks = !steady && kernel_clock == "tsc";
#else
  bool const ticks = false;
#endif
  std::ostringstream out;
  {
    auto log = binary_log_to(out, std::make_shared<simulated_memory_resource>());
    void* p = log.allocate(64);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log.deallocate(p, 64);
  }
  bl::file_header header{};
  std::memcpy(&header, out.str().data(), sizeof header);
  CHECK(header.clock == (ticks ? bl::clock_ticks : bl::clock_ns));
  auto const stamps = stamps_of(binary_log_to_csv(out.str(), "clock.bin"));
  REQUIRE(stamps.size() == 2);
  // The 20 ms between the two calls, in nanoseconds whichever clock stamped them.
  CHECK(stamps[1] - stamps[0] >= 19'000'000);
  CHECK(stamps[1] - stamps[0] < 2'000'000'000);
}

TEST_CASE("logging binary: an MRSTACK_LOG_CLOCK it does not know is an error naming it, the file untouched") {
  // Any value but "steady" was taken as unset: MRSTACK_LOG_CLOCK=monotonic (or a misspelt
  // "Steady") stamped counter ticks while seeming to ask for the monotonic clock.
  auto const path = std::filesystem::temp_directory_path() / ("mrstack_log_clock_" + std::to_string(::getpid()) + ".bin");
  std::ofstream{path} << "an earlier run's log";
  auto sim = std::make_shared<simulated_memory_resource>();
  for (char const* value : {"monotonic", "Steady", "tsc"}) {
    INFO("MRSTACK_LOG_CLOCK=" << value);
    scoped_env const env{"MRSTACK_LOG_CLOCK", value};
    std::string message;
    try {
      logging_resource_adaptor log{sim, path.string(), false, true, 1024, log_order::per_thread, log_format::binary};
    } catch (logic_error const& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(std::string{"MRSTACK_LOG_CLOCK='"} + value + "'") && Catch::Contains("steady"));
    std::ifstream in{path};
    CHECK(std::string{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}} == "an earlier run's log");
    // CSV rows carry no clock choice: the variable is not theirs to refuse.
    std::ostringstream csv;
    CHECK_NOTHROW(logging_resource_adaptor{sim, csv, false, true, 1024, log_order::per_thread});
  }
  scoped_env const empty{"MRSTACK_LOG_CLOCK", ""};  // empty reads as unset
  std::ostringstream out;
  CHECK_NOTHROW(binary_log_to(out, sim));
  std::filesystem::remove(path);
}

TEST_CASE("binary log: a damaged layout is refused, naming the byte offset and what is wrong") {
  auto const good_block = std::vector<bl::record>{thread_record(1), event(bl::kind::allocate, 5, 0x1000, 16, 0)};
  auto expect = [](std::string const& bytes, std::string const& offset, std::string const& what) {
    std::string const message = error_of(bytes);
    INFO(message);
    CHECK(message.find("damaged.bin: binary log, byte offset " + offset + ": ") == 0);
    CHECK(message.find(what) != std::string::npos);
  };
  std::string const header = log_bytes{}.bytes;
  expect(header.substr(0, 20), "0", "the file header takes 32 bytes, the log has 20");
  std::string bad = header;
  bad[8] = 2;
  expect(bad, "8", "format version 2; this reader reads version 1");
  bad = header;
  bad[12] = 24;
  expect(bad, "12", "records of 24 bytes");
  bad = header;
  bad[24] = 2;
  expect(bad, "24", "clock 0x2: expected 0 (nanoseconds) or 1 (time-stamp counter ticks)");
  expect(header + "RBL", "32", "cut short: 3 bytes where a block header (8 bytes) was expected");
  expect(log_bytes{}.put(std::uint32_t{0x12345678}).put(std::uint32_t{1}).bytes, "32",
         "expected a block (magic 0x4b4c4252), found 0x12345678");
  expect(log_bytes{}.put(bl::block_magic).put(std::uint32_t{0}).bytes, "36", "a block of 0 records");
  std::string const whole = log_bytes{}.block(good_block).bytes;
  expect(whole.substr(0, whole.size() - 1), "32", "the block holds 2 records (64 bytes) but 63 bytes follow");
  expect(log_bytes{}.block({event(bl::kind::allocate, 5, 0x1000, 16, 0)}).bytes, "40",
         "a block's first record must name its thread");
  expect(log_bytes{}.block({{std::uint64_t{3} << bl::kind_shift | 7, 1, 0, 0}}).bytes, "40",
         "a thread record with a stamp, size or stream");
  // A second block after a good one: the offset counts from the file's start.
  expect(log_bytes{}.block(good_block).put(bl::block_magic).put(std::uint32_t{0}).bytes, "108", "a block of 0 records");
  // The CSV it stands for past the reader's limit.
  std::size_t const csv_bytes = binary_log_to_csv(whole, "whole.bin").size();
  std::string const limited = error_of(whole, log_limits{.max_text_bytes = csv_bytes - 1});
  CHECK(limited.find("larger than " + std::to_string(csv_bytes - 1) + " bytes, the reader's limit") != std::string::npos);
  CHECK(error_of(whole, log_limits{.max_text_bytes = csv_bytes}).empty());
  CHECK(error_of(whole).empty());
  // What reads as a log is still checked as one: a free of what is not live.
  std::string const message = error_of(log_bytes{}.block({thread_record(1), event(bl::kind::free, 5, 0x1000, 16, 0)}).bytes);
  CHECK(message.find("damaged.bin:2:") == 0);
}

TEST_CASE("logging binary: a file, gzip-compressed or not, read by path; auto_flush writes each record at once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const dir = std::filesystem::temp_directory_path();
  auto const path = dir / ("mrstack_binary_log_" + std::to_string(::getpid()) + ".bin");
  auto const gz_path = dir / ("mrstack_binary_log_" + std::to_string(::getpid()) + ".bin.gz");
  {
    logging_resource_adaptor log{sim,  path.string(), true, true, logging_resource_adaptor::default_queue_capacity,
                                 log_order::per_thread, log_format::binary};
    void* p = log.allocate(512);
    CHECK(std::filesystem::file_size(path) == bl::file_header_bytes + bl::block_header_bytes + 2 * bl::record_bytes);
    log.deallocate(p, 512);
    CHECK(std::filesystem::file_size(path) ==
          bl::file_header_bytes + 2 * (bl::block_header_bytes + 2 * bl::record_bytes));
  }
  auto const plain = read_allocation_log(path.string());
  CHECK(plain.events.size() == 2);
  std::ifstream in{path, std::ios::binary};
  std::string const bytes{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  gzFile gz = gzopen(gz_path.c_str(), "wb");
  REQUIRE(gz != nullptr);
  REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(gz);
  CHECK(read_log_text(gz_path.string()) == binary_log_to_csv(bytes, "x"));
  CHECK(read_allocation_log(gz_path.string()).events.size() == 2);
  std::filesystem::remove(path);
  std::filesystem::remove(gz_path);
}

TEST_CASE("logging binary: needs per-thread order; the spec's flag implies it") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  CHECK_THROWS_AS(logging_resource_adaptor(sim, out, false, true, 1024, log_order::merged, log_format::binary),
                  logic_error);
  CHECK_THROWS_AS(logging_resource_adaptor(sim, out, false, false, 1024, log_order::merged, log_format::binary),
                  logic_error);
  auto const stack = make_stack("logging(file=/dev/null, binary) > simulated");
  auto const* log = dynamic_cast<logging_resource_adaptor const*>(stack.get());
  REQUIRE(log != nullptr);
  CHECK(log->format() == log_format::binary);
  CHECK(log->order() == log_order::per_thread);
  CHECK(log->is_async());
  auto const csv = make_stack("logging(file=/dev/null, async, per_thread) > simulated");
  CHECK(dynamic_cast<logging_resource_adaptor const*>(csv.get())->format() == log_format::csv);
}

namespace {

/// Two threads handing blocks over as fast as they can: `from` allocates, `to` frees what
/// it was handed at once (so each free follows its allocation by a µs or less), run when
/// `log` is set; `done` once they are through. They live on until `leave` is set, so their
/// buffers are written out (with points of their own) only then.
struct tight_handoffs {
  explicit tight_handoffs(int count) {
    from = std::thread{[this, count] {
      while (log.load() == nullptr) { std::this_thread::yield(); }
      for (int i = 0; i < count; ++i) {
        void* p = log.load()->allocate(64);
        handed.store(p);
        while (handed.load() != nullptr) {}
      }
      done.store(true);
      while (!leave.load()) { std::this_thread::yield(); }
    }};
    to = std::thread{[this] {
      while (!done.load()) {
        if (void* p = handed.load()) {
          log.load()->deallocate(p, 64);
          handed.store(nullptr);
        }
      }
      while (!leave.load()) { std::this_thread::yield(); }
    }};
  }
  ~tight_handoffs() {
    leave.store(true);
    from.join();
    to.join();
  }
  tight_handoffs(tight_handoffs const&) = delete;
  tight_handoffs& operator=(tight_handoffs const&) = delete;
  std::atomic<logging_resource_adaptor*> log{nullptr};
  std::atomic<bool> done{false}, leave{false};
  std::atomic<void*> handed{nullptr};
  std::thread from, to;
};

tight_handoffs* preempted_handoffs = nullptr;
logging_resource_adaptor* preempted_log = nullptr;
std::atomic<int> preempted_reads{0};

}  // namespace

TEST_CASE("logging binary: a (ticks, ns) point read across a preemption does not bend the reader's line") {
  // A point whose counter reads straddled a preemption put its ticks far past its ns; the
  // reader's line through it pressed that stretch's stamps into a few ns, where an
  // allocation and the free of its block on another thread tied, the free sorted first and
  // the log was refused. The hook stands for the preemption, once: the handoffs run in it,
  // then it sleeps.
  std::optional<tight_handoffs> handoffs;
  handoffs.emplace(200);  // the threads first: the stretch from the log's start to the flush stays short
  std::ostringstream out;
  std::optional<logging_resource_adaptor> log;
  log.emplace(std::make_shared<simulated_memory_resource>(std::size_t{1} << 30), out, false, true, 1024,
              log_order::per_thread, log_format::binary);
  log->deallocate(log->allocate(64), 64);  // this thread's buffer: the flush below reads a point for it
  bl::file_header header{};
  std::memcpy(&header, out.str().data(), sizeof header);
  if (header.clock != bl::clock_ticks) {
    SUCCEED("the stamps are not counter ticks here (no point is read)");
    return;
  }
  preempted_handoffs = &*handoffs;
  preempted_log = &*log;
  preempted_reads.store(0);
  // A good point just before the preempted one, so that the preempted one's ns lies a few
  // µs past it while its ticks lie the hook's sleep past.
  log->flush();
  log->deallocate(log->allocate(64), 64);
  detail::tick_point_hook.store(+[] {
    if (preempted_reads.fetch_add(1) != 0) { return; }
    preempted_handoffs->log.store(preempted_log);
    while (!preempted_handoffs->done.load()) { std::this_thread::sleep_for(std::chrono::microseconds(100)); }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  });
  log->flush();
  detail::tick_point_hook.store(nullptr);
  REQUIRE(preempted_reads.load() >= 1);
  handoffs.reset();  // the threads leave: their buffers go out, with points read now
  log.reset();
  allocation_log const parsed = parse_allocation_log(out.str(), "preempted.bin");
  CHECK(parsed.events.size() == 2 * 2 + 2 * 200);
}
