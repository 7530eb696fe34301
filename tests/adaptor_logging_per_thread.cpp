// The logging adaptor's per-thread order: each thread writes its own rows in runs, with a
// Stamp column; mrstack's log reader sorts by it. Checked: every call is a row, each
// thread's rows stand in its own order, and the sorted file is a valid serial history
// (the reader refuses the same rows unsorted); flush and the destructor write every
// buffer out; the reader's sort and its errors; the spec parameter.
#include <catch2/catch.hpp>

#include <logged_threads.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/error.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace mrstack;

namespace {

using test::check_rows_per_thread;
using test::split_row;

/// True when the rows, in file order, never allocate a live pointer or free one that is not live.
bool file_order_is_a_history(std::string const& text) {
  std::istringstream in{text};
  std::string line;
  std::getline(in, line);  // the header
  std::set<std::string> live;
  while (std::getline(in, line)) {
    auto const fields = split_row(line);
    bool const ok = fields[2] == "free" ? live.erase(fields[3]) == 1 : live.insert(fields[3]).second;
    if (!ok) { return false; }
  }
  return true;
}

}  // namespace

TEST_CASE("logging per thread: every call a row, each thread's in its own order, a valid history once sorted") {
  std::size_t const queue = GENERATE(std::size_t{16}, logging_resource_adaptor::default_queue_capacity);
  INFO("queue " << queue);
  constexpr int threads = 8;
  constexpr int ops = 5000;
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  std::ostringstream out;
  std::vector<std::vector<test::logged_call>> expected;
  std::size_t total = 0;
  {
    logging_resource_adaptor log{sim, out, false, true, queue, log_order::per_thread};
    CHECK(log.is_async());
    CHECK(log.order() == log_order::per_thread);
    expected = test::run_logged_threads(log, threads, ops);
    for (auto const& e : expected) { total += e.size(); }
    log.flush();  // every buffer out while the adaptor lives
    std::string const so_far = out.str();
    CHECK(static_cast<std::size_t>(std::count(so_far.begin(), so_far.end(), '\n')) == total + 1);
  }
  std::string const text = out.str();
  check_rows_per_thread(text, expected);
  // The reader sorts by Stamp: a valid history. Unsorted (the Stamp column renamed) the
  // same rows are read in file order, which is a history only when the threads happened
  // not to overlap (a loaded machine may run them one after another): the reader must
  // refuse it exactly when a free comes before its allocation or a reuse before its free.
  allocation_log const parsed = parse_allocation_log(text, "per-thread.csv");
  CHECK(parsed.events.size() == total);
  CHECK(parsed.leaked_allocations.empty());
  std::string unsorted = text;
  unsorted.replace(unsorted.find(",Stamp"), 6, ",Other");
  if (file_order_is_a_history(text)) {
    CHECK_NOTHROW(parse_allocation_log(unsorted, "unsorted.csv"));
  } else {
    CHECK_THROWS_AS(parse_allocation_log(unsorted, "unsorted.csv"), log_error);
  }
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("logging per thread: the destructor writes out what threads left in their buffers") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  {
    logging_resource_adaptor log{sim, out, false, true, logging_resource_adaptor::default_queue_capacity,
                                 log_order::per_thread};
    std::thread([&] { log.deallocate(log.allocate(100), 100); }).join();  // its thread is gone
    log.deallocate(log.allocate(200), 200);
  }
  auto const parsed = parse_allocation_log(out.str(), "left.csv");
  CHECK(parsed.events.size() == 4);
}

TEST_CASE("logging per thread: needs async, and the spec says so too") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  CHECK_THROWS_AS(logging_resource_adaptor(sim, out, false, false, 1024, log_order::per_thread), logic_error);
  auto const stack = make_stack("logging(file=/dev/null, async, per_thread) > simulated");
  auto const* log = dynamic_cast<logging_resource_adaptor const*>(stack.get());
  REQUIRE(log != nullptr);
  CHECK(log->order() == log_order::per_thread);
  auto const merged = make_stack("logging(file=/dev/null, async) > simulated");
  CHECK(dynamic_cast<logging_resource_adaptor const*>(merged.get())->order() == log_order::merged);
}

TEST_CASE("log reader: a Stamp column orders the rows; a bad stamp names its line and column") {
  std::string const header = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n";
  // Thread 2 reuses 0x1000 at the stamp thread 1 freed it: the free comes first.
  std::string const rows =
      "2,00:00:01.000000,allocate,0x1000,16,0,700\n"
      "2,00:00:01.000000,free,0x1000,16,0,900\n"
      "1,00:00:01.000000,allocate,0x1000,16,0,500\n"
      "1,00:00:01.000000,free,0x1000,16,0,700\n";
  auto const log = parse_allocation_log(header + rows, "stamped.csv");
  REQUIRE(log.events.size() == 4);
  CHECK(log.event_lines == std::vector<std::uint32_t>{4, 5, 2, 3});
  CHECK(log.events[0].action == log_action::allocate);
  CHECK(log.events[1].action == log_action::free);
  CHECK(log.line_count == 5);
  try {
    (void)parse_allocation_log(header + "1,00:00:01.000000,allocate,0x1000,16,0,12x\n", "bad.csv");
    FAIL("expected a log_error");
  } catch (log_error const& e) {
    CHECK(e.line() == 2);
    CHECK(e.column() == 40);
    CHECK(std::string{e.what()}.find("bad Stamp '12x'") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_allocation_log(header + "1,00:00:01.000000,allocate,0x1000,16,0\n", "short.csv"), log_error);
}

TEST_CASE("log reader: in a stamped log, a history error names the stamps that ordered it") {
  std::string const header = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n";
  auto message = [&](std::string const& rows) {
    try {
      (void)parse_allocation_log(header + rows, "stamped.csv");
    } catch (log_error const& e) {
      return std::string{e.what()};
    }
    return std::string{"no error"};
  };
  // Thread 2 frees 0x1000 (stamp 300) before thread 1 allocates it (stamp 400): above it
  // in the file, but after it in the order the checks follow.
  std::string const freed_first = message(
      "1,00:00:01.000000,allocate,0x1000,16,0,400\n"
      "2,00:00:01.000000,free,0x1000,16,0,300\n");
  INFO(freed_first);
  CHECK(freed_first.find("stamped.csv:3:") != std::string::npos);
  CHECK(freed_first.find("which no row stamped before it allocated: line 2 (Stamp 400) allocates it later") !=
        std::string::npos);
  CHECK(freed_first.find("this row's Stamp is 300") != std::string::npos);
  // A second free that comes first in the file but later by its stamp.
  std::string const twice = message(
      "2,00:00:01.000000,free,0x1000,16,0,900\n"
      "1,00:00:01.000000,allocate,0x1000,16,0,100\n"
      "1,00:00:01.000000,free,0x1000,16,0,200\n");
  INFO(twice);
  CHECK(twice.find("stamped.csv:2:") != std::string::npos);
  CHECK(twice.find("line 3 (Stamp 100) allocated it and line 4 (Stamp 200) already freed it") != std::string::npos);
  // A log without stamps keeps the file-order wording.
  std::string const plain = [] {
    try {
      (void)parse_allocation_log("Thread,Time,Action,Pointer,Size,Stream\n1,0,free,0x1000,16,0\n", "plain.csv");
    } catch (log_error const& e) {
      return std::string{e.what()};
    }
    return std::string{"no error"};
  }();
  CHECK(plain.find("which no earlier line allocated") != std::string::npos);
  CHECK(plain.find("Stamp") == std::string::npos);
}

TEST_CASE("logging per thread: auto_flush puts each row in the file before the call returns") {
  auto sim = std::make_shared<simulated_memory_resource>();
  // Named by the process: two runs at once (two checkouts' test suites) must not share it.
  auto const path =
      std::filesystem::temp_directory_path() / ("mrstack_per_thread_auto_flush_" + std::to_string(::getpid()) + ".csv");
  auto lines_in_file = [&] {
    std::ifstream in{path};
    std::string const text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
    return std::count(text.begin(), text.end(), '\n');
  };
  {
    logging_resource_adaptor log{sim, path.string(), true, true, logging_resource_adaptor::default_queue_capacity,
                                 log_order::per_thread};
    void* p = log.allocate(512);
    CHECK(lines_in_file() == 2);  // the header and the allocation
    log.deallocate(p, 512);
    CHECK(lines_in_file() == 3);
  }
  std::filesystem::remove(path);
}

TEST_CASE("log reader: at equal stamps one thread's rows keep their order; frees go first only across threads") {
  std::string const header = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n";
  // Thread 1 allocates and frees 0x1000 within one tick of a coarse clock (its own order
  // stands); thread 4 reuses 0x2000 at the tick thread 3 freed it (the free goes first).
  std::string const rows =
      "4,00:00:01.000000,allocate,0x2000,16,0,900\n"
      "2,00:00:01.000000,allocate,0x1000,16,0,700\n"
      "2,00:00:01.000000,free,0x1000,16,0,800\n"
      "1,00:00:01.000000,allocate,0x1000,16,0,500\n"
      "1,00:00:01.000000,free,0x1000,16,0,500\n"
      "3,00:00:01.000000,allocate,0x2000,16,0,100\n"
      "3,00:00:01.000000,free,0x2000,16,0,900\n";
  allocation_log log;
  REQUIRE_NOTHROW(log = parse_allocation_log(header + rows, "tie.csv"));
  CHECK(log.event_lines == std::vector<std::uint32_t>{7, 5, 6, 3, 4, 8, 2});
}
