// vmm IPC's exporting side when the heap runs out: a run's shareable descriptor, once
// made, is either the registry's (closed when its run is unmapped) or closed at once —
// never left open for the process's life.
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include "../src/upstream/vmm_ipc_registry.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <new>
#include <vector>

#include <host_allocation_failure.hpp>

using namespace mrstack;

TEST_CASE("vmm IPC export: out of host memory, a run's shareable descriptor is closed, not leaked") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto* const registry = new vmm_ipc::export_registry{};  // its server thread outlives the test
  constexpr std::size_t MiB = std::size_t{1} << 20;
  int made = -1;
  auto const exporter = [&](void* out, std::uint64_t) {
    made = fcntl(ends[1], F_DUPFD_CLOEXEC, 0);
    *static_cast<int*>(out) = made;
  };
  // The server started (its socket and thread), so what follows allocates only the books.
  (void)registry->add_export_with({{0, MiB, 1}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, exporter);
  bool ran_through = false;
  for (long n = 0; n < 64 && !ran_through; ++n) {
    INFO("host allocation " << n << " fails");
    std::uint64_t const run = 100 + static_cast<std::uint64_t>(n);
    std::vector<virtual_range_resource::mapped_run> const runs{{0, MiB, run}};
    made = -1;
    bool threw = false;
    test::fail_host_allocation_in = n;
    try {
      (void)registry->add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, exporter);
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    bool const failure_used = test::fail_host_allocation_in < 0;
    test::fail_host_allocation_in = -1;
    ran_through = !threw && !failure_used;
    if (made < 0) { continue; }  // failed before the descriptor was made
    // The registry's, if it kept the run: unmapping the run closes it.
    registry->forget_run(run);
    CHECK(fcntl(made, F_GETFD) == -1);
  }
  CHECK(ran_through);
  ::close(ends[0]);
  ::close(ends[1]);
}
