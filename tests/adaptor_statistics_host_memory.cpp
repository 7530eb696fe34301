// The statistics adaptor when the host runs out of memory for a new scope: the push
// throws bad_alloc with no scope opened, and the scopes before it work on.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <host_allocation_failure.hpp>

#include <new>

using namespace mrstack;
using mrstack::test::fail_host_allocations_from;

TEST_CASE("statistics: a push that cannot get host memory opens no scope and leaves the frames whole") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto sim = std::make_shared<simulated_memory_resource>();
  statistics_resource_adaptor stats{sim};
  void* p = stats.allocate(1000);
  // The frames are reserved for 8 scopes, their ids for the lifetime's alone: the first
  // push grows the ids (16 B). When that failed after the frame was added, the adaptor
  // held a frame without an id: the depth read 1, and a pop took the lifetime's id,
  // leaving none (UB at the next back()).
  fail_host_allocations_from = 16;
  bool bad_alloc = false;
  try {
    (void)stats.push_counters();
  } catch (std::bad_alloc const&) {
    bad_alloc = true;
  }
  fail_host_allocations_from = 0;
  CHECK(bad_alloc);
  CHECK(stats.scope_depth() == 0);
  CHECK_THROWS_AS(stats.pop_counters(), logic_error);
  // Scopes work on: a push, a free counted in it, the pop folding it back.
  (void)stats.push_counters();
  stats.deallocate(p, 1000);
  auto const region = stats.pop_counters();
  CHECK(region.bytes.value == -1000);
  CHECK(stats.scope_depth() == 0);
  CHECK(stats.bytes_counter() == statistics_resource_adaptor::counter{0, 1000, 1000});
}
