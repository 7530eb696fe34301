// The per-device resource registry outlives static destruction: a static object's
// destructor (or a detached thread) that sets or reads a device's resource while the
// process exits found the registry destroyed, and the process crashed in its map (the
// first test's check is the process's exit: ctest sees a crash as a failure). Yet what it
// holds is let go at exit, so the resources' destructors run (the last test).
#include <catch2/catch.hpp>

#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/current.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>
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

// Run by the test below in a fresh process. Each device's resource is a tracking adaptor
// that reports its leaks when destroyed, and leaks a block. Device 1's is held by the
// registry alone: only the registry letting go at exit destroys it. Device 0's is one a
// scoped override replaced, which the static `restore` sets back while the process exits,
// after the registry let go: kept then, it would never be destroyed.
TEST_CASE("current child: leak through devices 0 and 1 and exit", "[.]") {
  for (int device : {0, 1}) {
    set_per_device_resource(device, std::make_shared<tracking_resource_adaptor>(
                                        std::make_shared<simulated_memory_resource>(), false, /*report_leaks=*/true));
    (void)get_per_device_resource(device)->allocate(256);  // leaked on purpose
  }
  restore.previous = set_per_device_resource(0, std::make_shared<simulated_memory_resource>());
  restore.armed = true;
}

TEST_CASE("current: the registry lets go of its resources at exit, so their destructors run") {
  // Made immortal to survive static destructors, the registry kept its resources too:
  // an asynchronous log lost its rows, a leak report was never printed; and a resource
  // set back during exit, after the registry let go, was kept for good.
  char path[] = "/tmp/mrstack_current_at_exit_XXXXXX";
  int const file = ::mkstemp(path);
  REQUIRE(file >= 0);
  posix_spawn_file_actions_t actions;
  REQUIRE(::posix_spawn_file_actions_init(&actions) == 0);
  REQUIRE(::posix_spawn_file_actions_adddup2(&actions, file, 2) == 0);  // the child's stderr
  char name[] = "current child: leak through devices 0 and 1 and exit";
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, name, nullptr};
  char* envp[] = {nullptr};
  pid_t child = 0;
  REQUIRE(::posix_spawn(&child, exe, &actions, nullptr, argv, envp) == 0);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(file);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  std::ifstream in{path};
  std::string const said{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  ::unlink(path);
  std::size_t reports = 0;
  for (auto at = said.find("mrstack leak report"); at != std::string::npos; at = said.find("mrstack leak report", at + 1)) {
    ++reports;
  }
  CHECK(reports == 2);
}
