// The logging adaptor never loses a row silently: an output stream that fails is reported
// (at construction, at flush()), a thread that gets no memory for its queue still logs,
// and an impossible queue capacity is refused at construction.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <scratch_files.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

using namespace mrstack;

namespace {
/// What `f` throws (a std::exception), or "" when it returns. (Matchers joined with && warn
/// under GCC 12 beside this program's replaced operator new.)
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("logging: an output stream that fails is reported by flush(), in every mode") {
  // spdlog's ostream sink never looked at the stream: /dev/full took nothing, and flush()
  // returned with write_failure() empty.
  for (auto const order : {log_order::merged, log_order::per_thread}) {
    for (bool const async : {false, true}) {
      if (order == log_order::per_thread && !async) { continue; }
      CAPTURE(async, order == log_order::per_thread);
      std::ofstream out{"/dev/full"};
      REQUIRE(out.is_open());
      std::unique_ptr<logging_resource_adaptor> log;
      try {
        log = std::make_unique<logging_resource_adaptor>(std::make_shared<simulated_memory_resource>(), out, false,
                                                         async, std::size_t{1} << 16, order);
      } catch (std::runtime_error const& e) {  // the header's flush already failed: as good
        CHECK_THAT(e.what(), Catch::Contains("output stream failed"));
        continue;
      }
      log->deallocate(log->allocate(100), 100);
      CHECK_THROWS_WITH(log->flush(), Catch::Contains("output stream failed"));
      CHECK_THAT(log->write_failure(), Catch::Contains("output stream failed"));
    }
  }
  // A stream never opened is refused at construction (its header cannot be written).
  std::ofstream never{"/no/such/folder/alloc.csv"};
  REQUIRE(!never.is_open());
  std::string const refused = message_of([&] { logging_resource_adaptor{std::make_shared<simulated_memory_resource>(), never}; });
  CHECK_THAT(refused, Catch::Contains("cannot write the log's header"));
  CHECK_THAT(refused, Catch::Contains("output stream failed"));
}

TEST_CASE("logging: an impossible queue capacity is refused at construction") {
  std::ostringstream out;
  std::string const refused = message_of([&] {
    logging_resource_adaptor{std::make_shared<simulated_memory_resource>(), out, false, true, std::size_t{1} << 40};
  });
  CHECK_THAT(refused, Catch::Contains("queue capacity 1099511627776"));
  CHECK_THAT(refused, Catch::Contains("from 16 to 16777216"));
  // In every mode, as the spec refuses it: a synchronous log took any capacity.
  std::string const sync = message_of([&] {
    logging_resource_adaptor{std::make_shared<simulated_memory_resource>(), out, false, false, 17};
  });
  CHECK_THAT(sync, Catch::Contains("queue capacity 17"));
}

TEST_CASE("logging: a refused queue capacity leaves the log file as it was") {
  // The file was opened (so truncated, its folders made) before the capacity was checked:
  // a typo in the capacity emptied the log of an earlier run.
  auto const dir = test_support::scratch_dir("mrstack_logging_refused_");
  std::string const kept = test_support::write_file(dir, "earlier_run.csv", "an earlier run's log\n");
  std::string const refused = message_of([&] {
    logging_resource_adaptor{std::make_shared<simulated_memory_resource>(), kept, false, true, 17};
  });
  CHECK_THAT(refused, Catch::Contains("queue capacity 17"));
  CHECK(test_support::slurp(kept) == "an earlier run's log\n");
  std::string const unmade = (dir / "not_made" / "log.csv").string();
  CHECK_THAT(message_of([&] {
               logging_resource_adaptor{std::make_shared<simulated_memory_resource>(), unmade, false, true, 0};
             }),
             Catch::Contains("queue capacity 0"));
  CHECK(!std::filesystem::exists(dir / "not_made"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("logging: a thread that gets no memory for its queue still logs every row (merged order)") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // Its row was dropped and flush() said nothing: the log held the free of a block it
  // never allocated.
  std::ostringstream out;
  {
    logging_resource_adaptor log{std::make_shared<simulated_memory_resource>(), out, false, true};
    std::thread{[&] {
      test::fail_host_allocations_from = 64 << 10;  // a queue's slots: 128 KiB
      void* p = log.allocate(100);
      test::fail_host_allocations_from = 0;
      log.deallocate(p, 100);
    }}.join();
    log.flush();
    CHECK(log.write_failure().empty());
  }
  auto const parsed = parse_allocation_log(out.str(), "merged.csv");
  CHECK(parsed.events.size() == 2);
}
