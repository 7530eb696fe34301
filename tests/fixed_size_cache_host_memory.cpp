// fixed_size's thread caches when host memory runs out: a cache is an optimization, so a
// thread that cannot make one allocates and frees through the shared stacks. Before, its
// first cached call threw std::bad_alloc: an allocation failed with 127 of 128 blocks
// free, and a free left its block live.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <string>
#include <thread>

using namespace mrstack;

TEST_CASE("fixed_size: a thread that cannot make its cache uses the shared stacks") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 4096, 128};
  mr.deallocate(mr.allocate(4096), 4096);  // the first thread
  std::string allocate_error = "none";
  std::string free_error = "none";
  std::thread second{[&] {
    void* p = mr.allocate(4096);  // a second thread: caches are on from now
    test::fail_host_allocations_from = 1;
    void* q = nullptr;
    try {
      q = mr.allocate(4096);
    } catch (std::exception const& e) {
      allocate_error = e.what();
    }
    try {
      mr.deallocate(p, 4096);
    } catch (std::exception const& e) {
      free_error = e.what();
    }
    test::fail_host_allocations_from = 0;
    if (q != nullptr) { mr.deallocate(q, 4096); }
  }};
  second.join();
  CHECK(allocate_error == "none");
  CHECK(free_error == "none");
  CHECK(mr.free_blocks() == mr.total_blocks());
}
