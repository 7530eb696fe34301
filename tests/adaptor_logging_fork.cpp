// The logging adaptor in a fork()'s child: the child holds copies of the parent's file
// buffer, thread buffers and queues, and its memory resources hand out the parent's
// addresses, so none of its rows may reach the parent's log. Checked in every mode: a
// child that logs thousands of calls, flushes and leaves with _exit neither hangs (the
// merged mode's writer thread does not exist in the child) nor writes a row — the
// parent's log holds exactly the parent's calls, once each, a valid history — and its
// flush() says why its rows are missing; its destructor leaves the parent's log alone.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

std::filesystem::path temp_log(std::string const& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("mrstack_test_logging_fork_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / (tag + ".log");
}

struct mode {
  char const* name;
  bool auto_flush;
  bool async;
  log_order order;
  log_format format;
};

/// The child's part: many calls (more than a queue, a thread buffer or a stdio buffer
/// holds), then flush(), which must refuse, naming the fork, then the destructor. Its exit
/// status says how it went.
[[noreturn]] void child_logs(std::optional<logging_resource_adaptor>& log) {
  for (int i = 0; i < 20000; ++i) { log->deallocate(log->allocate(64 + i % 7), 64 + i % 7); }
  int status = 3;  // flush() returned: the loss went unsaid
  try {
    log->flush();
  } catch (std::runtime_error const& e) {
    status = std::string{e.what()}.find("fork") != std::string::npos ? 0 : 4;
  } catch (...) {
    status = 5;
  }
  log.reset();
  ::_exit(status);
}

/// The child's exit status, or -1 when it had not ended after 20 s (then it is killed).
int wait_for(pid_t child) {
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t const done = ::waitpid(child, &status, WNOHANG);
    if (done == child) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return -1;
}

}  // namespace

TEST_CASE("logging: a fork()'s child that logs neither hangs nor writes into the parent's log") {
  auto const m = GENERATE(mode{"sync", false, false, log_order::merged, log_format::csv},
                          mode{"sync, auto_flush", true, false, log_order::merged, log_format::csv},
                          mode{"merged", false, true, log_order::merged, log_format::csv},
                          mode{"per-thread", false, true, log_order::per_thread, log_format::csv},
                          mode{"per-thread, auto_flush", true, true, log_order::per_thread, log_format::csv},
                          mode{"binary", false, true, log_order::per_thread, log_format::binary});
  INFO("mode " << m.name);
  auto const path = temp_log(std::string{"fork_"} + m.name);
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  int parent_calls = 0;
  {
    std::optional<logging_resource_adaptor> log{std::in_place, sim, path.string(), m.auto_flush, m.async, 16, m.order,
                                                m.format};
    // Rows the parent has not written out yet when it forks: the child holds copies of them.
    std::vector<void*> blocks;
    for (int i = 0; i < 8; ++i) {
      blocks.push_back(log->allocate(256));
      ++parent_calls;
    }
    pid_t const child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) { child_logs(log); }
    int const status = wait_for(child);
    CHECK(status == 0);  // -1: it hung; 3: flush() said nothing; else a crash or the wrong error
    for (void* b : blocks) {
      log->deallocate(b, 256);
      ++parent_calls;
    }
    CHECK_NOTHROW(log->flush());
  }
  std::string const text = read_log_text(path.string());
  auto const rows = std::count(text.begin(), text.end(), '\n') - 1;  // less the header
  CHECK(rows == parent_calls);
  CHECK_NOTHROW(parse_allocation_log(text, path.string()));
  std::filesystem::remove(path);
}
