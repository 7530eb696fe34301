// The per-device resource registry outlives static destruction: a static object's
// destructor (or a detached thread) that sets or reads a device's resource while the
// process exits found the registry destroyed, and the process crashed in its map.
// The test's check is the process's exit: ctest sees a crash as a failure.
#include <catch2/catch.hpp>

#include <mrstack/current.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>

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
