// A pool over a virtual range with a release threshold gives granules back from its
// deallocate path once frees pass the threshold. That release needs host memory (its
// holes); out of it, the free had gone through and the release's std::bad_alloc left the
// call all the same: a caller told its free failed frees again and is refused. A free
// must not fail once its block is back; the release is tried again by a later free. A
// grow out of host memory at any point leaves no granule committed outside the blocks.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <small_vmm.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <exception>
#include <optional>
#include <utility>
#include <vector>

using namespace mrstack;

TEST_CASE("pool > vmm: a free whose release runs out of host memory still succeeds, and frees once") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  constexpr std::size_t G = test::vmm_granule;
  bool ran_through = false;
  for (long n = 0; n < 64 && !ran_through; ++n) {
    INFO("host allocation " << n << " of the last free fails");
    auto vmm = test::make_small_vmm();
    pool_options options;
    options.release_threshold = 0;  // every free that leaves a whole granule free releases it
    pool_memory_resource pool{vmm, 0, std::nullopt, options};
    std::vector<void*> blocks;
    for (int i = 0; i < 4; ++i) { blocks.push_back(pool.allocate(2 * G)); }
    for (std::size_t i = 0; i + 1 < blocks.size(); ++i) { pool.deallocate(blocks[i], 2 * G); }
    std::size_t const committed = vmm->committed_bytes();
    test::fail_host_allocation_in = n;
    bool threw = false;
    try {
      pool.deallocate(blocks.back(), 2 * G);  // past the threshold: it releases
    } catch (std::exception const&) {
      threw = true;
    }
    ran_through = test::fail_host_allocation_in >= 0;
    test::fail_host_allocation_in = -1;
    CHECK_FALSE(threw);
    if (ran_through) { CHECK(vmm->committed_bytes() < committed); }  // it did release
    CHECK(pool.stats().used_bytes == 0);
    CHECK(pool.check_invariants().empty());
    pool.release();
    CHECK(vmm->committed_bytes() == 0);
  }
  CHECK(ran_through);
}

TEST_CASE("pool > vmm: a grow out of host memory at any point leaves no granule lost or unbacked") {
  // A grow commits and then gives the granules to the pool's blocks, whose books need host
  // memory: refused there, granules stayed committed in no block, or a hole's unneeded
  // rest was free memory with nothing behind it.
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  constexpr std::size_t G = test::vmm_granule;
  bool ran_through = false;
  for (long n = 0; n < 200 && !ran_through; ++n) {
    INFO("host allocation " << n << " of the grows fails");
    auto vmm = test::make_small_vmm();
    pool_memory_resource pool{vmm, 0, 16 * G};
    std::vector<void*> blocks;
    for (int i = 0; i < 6; ++i) { blocks.push_back(pool.allocate(2 * G)); }
    pool.deallocate(blocks[1], 2 * G);  // a stretch of 4 granules
    pool.deallocate(blocks[2], 2 * G);
    pool.deallocate(blocks[4], 2 * G);  // and one of 2
    blocks[1] = blocks[2] = blocks[4] = nullptr;
    pool.release();
    std::vector<std::pair<void*, std::size_t>> more;
    more.reserve(64);  // the failures are for the pool alone
    test::fail_host_allocation_in = n;
    for (std::size_t bytes : {3 * G, G / 2, 5 * G, 3 * G}) {  // part of a stretch, the frontier
      try {
        more.emplace_back(pool.allocate(bytes), bytes);
      } catch (std::exception const&) {
      }
    }
    ran_through = test::fail_host_allocation_in >= 0;
    test::fail_host_allocation_in = -1;
    CHECK(pool.check_invariants().empty());
    // Whatever the pool hands out now has memory behind it.
    for (int i = 0; i < 40; ++i) {
      void* p = nullptr;
      try {
        p = pool.allocate(G / 2);
      } catch (std::exception const&) {
        break;
      }
      REQUIRE(vmm->is_accessible(p, G / 2));
      more.emplace_back(p, G / 2);
    }
    for (auto const& [p, bytes] : more) { pool.deallocate(p, bytes); }
    for (void* p : blocks) {
      if (p != nullptr) { pool.deallocate(p, 2 * G); }
    }
    pool.release();
    CHECK(vmm->committed_bytes() == 0);  // none lost outside the pool's blocks
  }
  CHECK(ran_through);
}
