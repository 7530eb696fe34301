// The per-thread order's buffers (src/adaptor/log_thread_buffers.cpp), in both formats:
// each belongs to one live thread and is appended to without a lock. Checked: flush()
// from another thread while threads log loses and repeats no row; threads that come and
// go adopt the buffers of exited ones instead of adding their own; a call made after the
// thread's exit hook (a later thread_local destructor) is still logged. Run under the
// tsan preset too (the owner's appends against the flusher's reads).
#include <catch2/catch.hpp>

#include <logged_threads.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/log/binary_log.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

logging_resource_adaptor per_thread_log(std::ostream& out, resource_ptr up, log_format format,
                                        std::size_t queue = 1024) {
  return logging_resource_adaptor{std::move(up), out, false, true, queue, log_order::per_thread, format};
}

}  // namespace

TEST_CASE("logging thread buffers: flush() while threads log loses and repeats no row") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  INFO("binary " << (format == log_format::binary));
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  std::ostringstream out;
  std::vector<std::vector<test::logged_call>> expected;
  {
    // A small queue: owners write their buffers out often, racing the flusher.
    auto log = per_thread_log(out, sim, format, 16);
    std::atomic<bool> done{false};
    std::thread flusher{[&] {
      while (!done.load()) { log.flush(); }
    }};
    expected = test::run_logged_threads(log, 4, 20000);
    done = true;
    flusher.join();
  }
  std::string const text = test::csv_of(out.str());
  test::check_rows_per_thread(text, expected);
  CHECK_NOTHROW(parse_allocation_log(text, "flushed"));
}

TEST_CASE("logging thread buffers: threads that come and go adopt exited threads' buffers") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  constexpr int threads = 300;
  {
    auto log = per_thread_log(out, sim, format);
    for (int t = 0; t < threads; ++t) {
      std::thread{[&log, t] {
        void* p = log.allocate(64 + static_cast<std::size_t>(t), test::fake_stream(0x7000 + static_cast<std::uintptr_t>(t)));
        log.deallocate(p, 64 + static_cast<std::size_t>(t), test::fake_stream(0x7000 + static_cast<std::uintptr_t>(t)));
      }}.join();
    }
    // One thread at a time: the first buffer serves them all (the main thread made none).
    CHECK(log.thread_buffer_count() == 1);
  }
  auto const parsed = parse_allocation_log(out.str(), "come_and_go");
  CHECK(parsed.events.size() == 2 * threads);
  CHECK(parsed.leaked_allocations.empty());
}

TEST_CASE("logging thread buffers: a call after the thread's exit hook is logged on its own") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  {
    auto log = per_thread_log(out, sim, format);
    std::thread{[&log] {
      thread_local test::freed_at_thread_exit late;  // before the logger's thread_locals
      void* p = log.allocate(48);
      late.log = &log;
      late.block = p;
      log.deallocate(log.allocate(16), 16);
    }}.join();
    std::thread{[&log] { log.deallocate(log.allocate(32), 32); }}.join();  // adopts the exited buffer
  }
  auto const parsed = parse_allocation_log(out.str(), "late");
  CHECK(parsed.events.size() == 6);
  CHECK(parsed.leaked_allocations.empty());
  CHECK(sim->allocation_count() == 0);
}
