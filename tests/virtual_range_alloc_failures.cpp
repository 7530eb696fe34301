// virtual_range_resource (what vmm and simulated_vmm share) when the heap runs out in the
// middle of an operation: every allocation an operation makes is failed in turn, and after
// each failure the books must still agree with the backend and with themselves — no
// committed granule without an owner, no physical memory the books forgot, no addresses
// lost for the resource's life.
#include <catch2/catch.hpp>

#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <functional>
#include <new>

#include <host_allocation_failure.hpp>

using namespace mrstack;

namespace {

constexpr std::size_t G = 4096;
constexpr std::size_t granules = 16;

// Runs `op` on a fresh range prepared by `setup`, failing its n-th allocation, for every n
// until `op` runs through; after each failure the range must be sound: invariants hold,
// and once `cleanup` freed what is live, the whole capacity (the range's size) can be
// allocated — physical memory the books forgot, or addresses lost, would refuse it.
void for_every_failure(std::function<void(simulated_vmm_memory_resource&)> const& setup,
                       std::function<void(simulated_vmm_memory_resource&)> const& op,
                       std::function<void(simulated_vmm_memory_resource&)> const& cleanup) {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  for (long n = 0;; ++n) {
    simulated_vmm_memory_resource r{granules * G, G, granules * G, 4};
    setup(r);
    bool failed = false;
    test::fail_host_allocation_in = n;
    try {
      op(r);
    } catch (std::bad_alloc const&) {
      failed = true;
    }
    test::fail_host_allocation_in = -1;
    INFO("allocation " << n << " of the operation failed: " << failed);
    CHECK_NOTHROW(r.check_invariants());
    cleanup(r);
    CHECK(r.committed_bytes() == 0);
    void* whole = nullptr;
    CHECK_NOTHROW(whole = r.allocate(granules * G));
    if (whole != nullptr) { r.deallocate(whole, granules * G); }
    CHECK(r.mapped_bytes() == 0);
    if (!failed) { return; }
  }
}

}  // namespace

TEST_CASE("virtual_range allocation failures: an allocate that splits a free stretch") {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  for_every_failure(
      [&](simulated_vmm_memory_resource& r) {
        c = nullptr;
        a = r.allocate(2 * G);
        b = r.allocate(2 * G);
        r.deallocate(a, 2 * G);  // free: [0, 2G) and [4G, 16G)
      },
      [&](simulated_vmm_memory_resource& r) { c = r.allocate(G); },
      [&](simulated_vmm_memory_resource& r) {
        r.deallocate(b, 2 * G);
        if (c != nullptr) { r.deallocate(c, G); }
      });
}

TEST_CASE("virtual_range allocation failures: an allocate aligned past its free stretch's start") {
  void* a = nullptr;
  void* c = nullptr;
  for_every_failure(
      [&](simulated_vmm_memory_resource& r) {
        c = nullptr;
        a = r.allocate(G);  // free: [G, 16G)
      },
      [&](simulated_vmm_memory_resource& r) { c = r.allocate(G, stream_view{}, 4 * G); },  // lead and tail
      [&](simulated_vmm_memory_resource& r) {
        r.deallocate(a, G);
        if (c != nullptr) { r.deallocate(c, G, stream_view{}, 4 * G); }
      });
}

TEST_CASE("virtual_range allocation failures: a deallocate between two free stretches") {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  bool b_freed = false;
  for_every_failure(
      [&](simulated_vmm_memory_resource& r) {
        b_freed = false;
        a = r.allocate(G);
        b = r.allocate(G);
        c = r.allocate(G);
        r.deallocate(a, G);  // free: [0, G), b, [2G, ...) after c
      },
      [&](simulated_vmm_memory_resource& r) {
        r.deallocate(b, G);
        b_freed = true;
      },
      [&](simulated_vmm_memory_resource& r) {
        if (!b_freed) {
          try {
            r.deallocate(b, G);
          } catch (std::logic_error const&) {
            // freed already by the failed call (it threw after giving the block back)
          }
        }
        r.deallocate(c, G);
      });
}

TEST_CASE("virtual_range allocation failures: a sleep with contents kept, and its wake") {
  // Two blocks, two stretches to save and to record as asleep.
  void* a = nullptr;
  void* b = nullptr;
  auto setup = [&](simulated_vmm_memory_resource& r) {
    a = r.allocate(3 * G);
    b = r.allocate(G);
  };
  auto cleanup = [&](simulated_vmm_memory_resource& r) {
    if (r.asleep()) { r.wake(); }
    r.deallocate(a, 3 * G);
    r.deallocate(b, G);
  };
  for_every_failure(setup, [&](simulated_vmm_memory_resource& r) { r.sleep(true); }, cleanup);
  for_every_failure(
      [&](simulated_vmm_memory_resource& r) {
        setup(r);
        r.sleep(true);
      },
      [&](simulated_vmm_memory_resource& r) { r.wake(); }, cleanup);
}

TEST_CASE("virtual_range allocation failures: a decommit while asleep that splits an asleep stretch") {
  // The stretch was erased before its two remainders were recorded: a full heap between
  // forgot granules still committed for the claimant (wake would not map them back).
  for_every_failure(
      [&](simulated_vmm_memory_resource& r) {
        r.claim("test");
        (void)r.commit(r.range_base(), 3 * G);  // one run, one stretch [0, 3)
        r.sleep(true);
      },
      [&](simulated_vmm_memory_resource& r) { (void)r.decommit(r.range_base() + G, G); },
      [&](simulated_vmm_memory_resource& r) {
        r.wake();
        CHECK(r.committed_bytes() >= 2 * G);  // the granules not decommitted are back
        CHECK(r.is_committed(r.range_base(), G));
        CHECK(r.is_committed(r.range_base() + 2 * G, G));
        r.unclaim();
      });
}

TEST_CASE("virtual_range allocation failures: a claim") {
  // It marked the range claimed, then copied the claimant's name: a full heap between left
  // a claim nobody held (the claimant's constructor failed), refusing allocate for good.
  bool claimed = false;
  for_every_failure(
      [&](simulated_vmm_memory_resource&) { claimed = false; },
      [&](simulated_vmm_memory_resource& r) {
        r.claim("a pool whose name is longer than any small-string buffer holds");
        claimed = true;
      },
      [&](simulated_vmm_memory_resource& r) {
        if (claimed) { r.unclaim(); }
      });
}
