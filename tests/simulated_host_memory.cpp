// The simulated upstream when the host runs out of memory for an allocation's books (the
// node of a free range split off, or of the live block): the call throws bad_alloc and
// changes nothing, so the fake address range is whole after it. (A free whose range needs
// a new node and cannot get one still forgets its block and loses the range: callers such
// as the pool's release count on a free that cannot be refused, and the tests of their
// host-memory paths run through this upstream.)
#include <catch2/catch.hpp>

#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <host_allocation_failure.hpp>

#include <limits>
#include <new>
#include <utility>
#include <vector>

using namespace mrstack;

namespace {

/// One allocate with the host's allocations failing after `left` of them; the block, or
/// null when it threw bad_alloc for want of host memory (a refusal, `out_of_memory`,
/// propagates: with the range free it is a failure of the test).
void* allocate_with_host_allocations_left(simulated_memory_resource& sim, std::size_t bytes, long left) {
  test::host_allocations_left = left;
  void* p = nullptr;
  try {
    p = sim.allocate(bytes);
  } catch (out_of_memory const&) {
    test::host_allocations_left = -1;
    throw;
  } catch (std::bad_alloc const&) {
    p = nullptr;
  }
  test::host_allocations_left = -1;
  return p;
}

}  // namespace

TEST_CASE("simulated: an allocation whose books cannot grow changes nothing, and the range stays whole") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // A range of 64 KiB: when a failed split lost the free range it was cut from (it was
  // erased before the node of the rest was made), every later request was refused as
  // "fake address range exhausted" with nothing outstanding.
  simulated_memory_resource sim{std::numeric_limits<std::size_t>::max(), simulated_memory_resource::default_base,
                                64 << 10};
  std::vector<std::pair<void*, std::size_t>> held;
  // A hole below the top, so requests also split a range in the middle of the map.
  void* const low = sim.allocate(4096);
  held.emplace_back(sim.allocate(4096), 4096);
  sim.deallocate(low, 4096);
  for (std::size_t bytes : {1000, 4096, 8192, 20000}) {
    for (long left = 0; left < 64; ++left) {
      INFO(bytes << " B with " << left << " host allocations left");
      std::size_t const live = sim.allocation_count();
      std::size_t const footprint = sim.footprint();
      void* const p = allocate_with_host_allocations_left(sim, bytes, left);
      if (p != nullptr) {
        held.emplace_back(p, bytes);
        break;
      }
      REQUIRE(sim.allocation_count() == live);
      REQUIRE(sim.footprint() == footprint);
    }
  }
  for (auto const& [p, n] : held) { sim.deallocate(p, n); }
  CHECK(sim.footprint() == 0);
  // The whole range is free again, in one piece.
  void* const all = sim.allocate(64 << 10);
  sim.deallocate(all, 64 << 10);
}
