// The first arena calls of a process build process-wide registries (of thread keys, of
// thread shard indices) from code that may not throw. Out of host memory there, a call
// must fail with std::bad_alloc, not end the process. A program of its own: the
// registries are built once per process, so this must be the first code to ask for them.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <new>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view on(std::uintptr_t s) { return stream_view{reinterpret_cast<cudaStream_t>(s)}; }
}  // namespace

TEST_CASE("arena first call: out of host memory at each allocation of a process's first calls, they throw") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.minimum_growth = 1 * MiB;
  o.shard_after_contentions = 0;  // a shard index is taken at once
  // Each host allocation of the calls fails in turn, until they run through.
  for (long k = 0;; ++k) {
    arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, o};
    void* large = nullptr;
    void* small = nullptr;
    bool threw = false;
    test::fail_host_allocation_in = k;
    try {
      large = mr.allocate(2 * MiB, on(0x1000));  // a stream-ordered block: the thread's key
      small = mr.allocate(4 * KiB, on(0x1000));  // a stream arena: the thread's shard index
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    test::fail_host_allocation_in = -1;
    INFO("host allocation " << k << " failed");
    CHECK(mr.check_invariants() == "");
    if (small != nullptr) { mr.deallocate(small, 4 * KiB, on(0x1000)); }
    if (large != nullptr) { mr.deallocate(large, 2 * MiB, on(0x1000)); }
    mr.release();
    CHECK(mr.held_bytes() == 0);
    if (!threw) { break; }
  }
}
