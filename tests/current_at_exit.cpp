// The per-device resource registry outlives static destruction: a static object's
// destructor (or a detached thread) that sets or reads a device's resource while the
// process exits found the registry destroyed, and the process crashed in its map (the
// first test's check is the process's exit: ctest sees a crash as a failure). Yet what it
// holds is let go at exit, so the resources' destructors run (the last test).
#include <catch2/catch.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/current.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace mrstack;

namespace {

/// Puts device 0's previous resource back when the process exits, as a library that set
/// its own for a while would. Constructed before main, so destroyed after everything a
/// function-local static made later.
struct restore_at_exit {
  resource_ptr previous;
  bool armed = false;
  ~restore_at_exit() {
    if (!armed) { return; }
    set_per_device_resource(0, previous);
    (void)get_per_device_resource(0)->name();
  }
};
restore_at_exit restore;

}  // namespace

TEST_CASE("current: a device's resource set back from a static destructor at exit") {
  restore.previous = set_per_device_resource(0, std::make_shared<simulated_memory_resource>());
  restore.armed = true;
  CHECK(get_per_device_resource(0)->name() == "simulated");
}

// Run by the test below in a fresh process: device 0's resource is an asynchronous logging
// adaptor held by the registry alone, so only the registry letting it go at exit writes
// its rows out.
TEST_CASE("current child: log through device 0's resource and exit", "[.]") {
  char const* path = std::getenv("MRSTACK_TEST_LOG_FILE");
  REQUIRE(path != nullptr);
  set_per_device_resource(0, std::make_shared<logging_resource_adaptor>(std::make_shared<simulated_memory_resource>(),
                                                                       path, /*auto_flush=*/false, /*async=*/true));
  auto const mr = get_per_device_resource(0);
  for (int i = 0; i < 10; ++i) { mr->deallocate(mr->allocate(256), 256); }
}

TEST_CASE("current: the registry lets go of its resources at exit, so their destructors run") {
  // Made immortal to survive static destructors, the registry kept its resources too: an
  // asynchronous log lost every row (header only), a leak report was never printed.
  char path[] = "/tmp/mrstack_current_at_exit_XXXXXX";
  int const file = ::mkstemp(path);
  REQUIRE(file >= 0);
  ::close(file);
  std::string const env = std::string{"MRSTACK_TEST_LOG_FILE="} + path;
  char name[] = "current child: log through device 0's resource and exit";
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, name, nullptr};
  char* envp[] = {const_cast<char*>(env.c_str()), nullptr};
  pid_t child = 0;
  REQUIRE(::posix_spawn(&child, exe, nullptr, nullptr, argv, envp) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  std::ifstream in{path};
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) { ++lines; }
  ::unlink(path);
  CHECK(lines == 21);  // the header and 20 rows
}
