// The benchmarks' thread harness (benchmarks/support/threads_together.hpp): a preparation
// or a body that throws is reported, not the end of the program, and no threads is an
// error rather than a read of an empty list.
#include <catch2/catch.hpp>

#include "../benchmarks/support/threads_together.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

using mrstack::bench::run_threads_together;

TEST_CASE("threads_together: every thread runs its body once, after every preparation") {
  std::atomic<int> prepared{0};
  std::atomic<int> bodies{0};
  std::atomic<bool> early{false};
  std::string error;
  double const seconds = run_threads_together(
      4, [&](std::size_t t) { prepared.fetch_add(1); return static_cast<int>(t); },
      [&](std::size_t t, int& state) {
        if (prepared.load() != 4) { early = true; }
        CHECK(state == static_cast<int>(t));
        bodies.fetch_add(1);
      },
      error);
  CHECK(seconds >= 0);
  CHECK(bodies.load() == 4);
  CHECK_FALSE(early.load());
  CHECK(error.empty());
}

TEST_CASE("threads_together: a preparation that throws is reported, and its thread runs no body") {
  // Before, the exception left its std::thread and ended the program (std::terminate).
  std::atomic<int> bodies{0};
  std::string error;
  double const seconds = run_threads_together(
      3,
      [&](std::size_t t) {
        if (t == 1) { throw std::runtime_error("no memory for thread 1's slots"); }
        return 0;
      },
      [&](std::size_t, int&) { bodies.fetch_add(1); }, error);
  CHECK(seconds == -1);
  CHECK(error == "no memory for thread 1's slots");
  CHECK(bodies.load() == 2);
}

TEST_CASE("threads_together: a body that throws is reported with the first message") {
  std::string error;
  double const seconds = run_threads_together(
      2, [](std::size_t) { return 0; },
      [](std::size_t, int&) { throw std::runtime_error("a call failed"); }, error);
  CHECK(seconds == -1);
  CHECK(error == "a call failed");
}

TEST_CASE("threads_together: no threads is an error") {
  std::string error;
  CHECK(run_threads_together(0, [](std::size_t) { return 0; }, [](std::size_t, int&) {}, error) == -1);
  CHECK(error == "no threads to run");
}
