// arena_memory_resource when host memory runs out during a free: the superblocks a free
// empties are handed back through tables that may need host memory. Such a free must
// still be a free (not a bad_alloc after the block went back, which a retry would repeat
// as a double free), and the spares left over must never end the process at a later free.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
}  // namespace

TEST_CASE("arena host memory: frees while host memory runs out free, and later frees do not end the process") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;  // four blocks a superblock
  o.empty_superblocks_kept = 1;  // spares past 2 go back
  o.max_free_bytes = 0;          // and their chunks with them
  o.minimum_growth = 1 * MiB;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, o};
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) { blocks.push_back(mr.allocate(256 * KiB, stream_view{})); }
  std::vector<void*> kept;  // blocks whose free failed: still live, freed again below
  bool books_agree = true;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    void* const p = blocks[i];
    test::fail_host_allocations_from = 1;
    try {
      mr.deallocate(p, 256 * KiB, stream_view{});
    } catch (std::bad_alloc const&) {
      kept.push_back(p);
    }
    test::fail_host_allocations_from = 0;
    std::size_t const freed = i + 1 - kept.size();
    books_agree = books_agree && mr.stats().small_live_bytes == 256 * KiB * (blocks.size() - freed);
  }
  CHECK(books_agree);  // a free that threw left its block live, one that returned freed it
  CHECK(mr.check_invariants() == "");
  for (void* p : kept) { mr.deallocate(p, 256 * KiB, stream_view{}); }  // not refused as double frees
  mr.release();  // with host memory again, everything the frees kept goes back
  CHECK(mr.stats().superblocks_in_arenas == 0);
  CHECK(mr.held_bytes() == 0);
}

TEST_CASE("arena host memory: a large free that runs out of host memory giving its chunk back still frees") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.max_free_bytes = 0;  // the free empties the chunk, which goes back at once
  o.minimum_growth = 4 * MiB;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, o};
  void* p = mr.allocate(2 * MiB, stream_view{}, 4096);
  bool threw = false;
  test::fail_host_allocations_from = 1;
  try {
    mr.deallocate(p, 2 * MiB, stream_view{}, 4096);
  } catch (std::bad_alloc const&) {
    threw = true;
  }
  test::fail_host_allocations_from = 0;
  CHECK_FALSE(threw);  // the block went back: the free succeeded
  CHECK(mr.stats().large_live_bytes == 0);
  CHECK(mr.check_invariants() == "");
  // Nothing of the block is left behind (its alignment was once remembered past the free,
  // refusing the next block there that is freed as handed out).
  void* q = mr.allocate(2 * MiB, stream_view{});
  CHECK_NOTHROW(mr.deallocate(q, 2 * MiB, stream_view{}));
  mr.release();
  CHECK(mr.held_bytes() == 0);
}
