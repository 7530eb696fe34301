// Free memory split between owners that a stream may use: a request that spans a
// stream's own free block and a neighbour it parked is served from the two together
// (block_pool::allocate_across), and growth in place first takes the free block it
// extends (stream_ordered_pool::claim_free_block_ending_at), so neither leaves a fragment
// behind a growth. Over the fake event seam: what another stream takes is ordered after
// the work of the stream that freed it.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <stream_model.hpp>
#include <small_vmm.hpp>

#include <mrstack/detail/block_pool.hpp>
#include <mrstack/detail/in_place_pool_growth.hpp>
#include <mrstack/detail/stream_ordering.hpp>

#include <memory>

using namespace mrstack;
using detail::block_pool;
using detail::stream_ref;
using test::created;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t G = test::vmm_granule;
constexpr std::uintptr_t base = 0x700000000000;

/// Every free of at least `park_at` bytes parks its stream (no contention window).
detail::park_policy parks_from(std::size_t park_at) {
  detail::park_policy p;
  p.minimum = park_at - 1;
  p.contention_window = 0;
  return p;
}

}  // namespace

TEST_CASE("block_pool: allocate_across serves a run of two owners' neighbours and leaves the rest alone") {
  block_pool pool;
  constexpr detail::owner_id own = 1, partner = 2, other = 3;
  pool.add_chunk(base, 8 * MiB, own);
  std::uintptr_t const a = pool.allocate(1 * MiB, 256, own);     // [0, 1): partner's, alone
  std::uintptr_t const guard = pool.allocate(256, 256, own);     // keeps a apart from b
  std::uintptr_t const b = pool.allocate(1 * MiB, 256, own);     // partner's
  std::uintptr_t const c = pool.allocate(512 * KiB, 256, own);   // own
  std::uintptr_t const d = pool.allocate(1 * MiB, 256, own);     // another owner's
  pool.allocate(pool.largest_free_block(own), 256, own);         // the rest: live
  REQUIRE(pool.deallocate(a, partner) != 0);
  REQUIRE(pool.deallocate(b, partner) != 0);
  REQUIRE(pool.deallocate(c, own) != 0);
  REQUIRE(pool.deallocate(d, other) != 0);
  CHECK(pool.allocate(1536 * KiB, 256, own) == 0);  // no owner alone holds it
  // b + c is the only run of the two; d is a third owner's and stays out of it.
  CHECK(pool.allocate_across(2 * MiB, 256, own, partner) == 0);
  CHECK(pool.allocate_across(1536 * KiB, 256, own, partner) == b);
  CHECK(pool.free_bytes(partner) == 1 * MiB);  // a, untouched
  CHECK(pool.free_bytes(other) == 1 * MiB);
  CHECK(pool.free_bytes(own) == 0);
  CHECK(pool.allocate_across(512 * KiB, 256, own, partner) == 0);  // a alone: allocate's job, not a run
  CHECK(pool.check_invariants().empty());
  (void)guard;
}

TEST_CASE("pool streams: a request spanning a stream's free block and the one it parked takes both, no wait") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  detail::stream_ordered_pool core{fake, &detail::this_thread_key, true, parks_from(1 * MiB)};
  stream_ref const s1 = created(0x1000), s2 = created(0x2000);
  core.add_chunk(base, 4 * MiB, s1);
  core.add_chunk(base + 64 * MiB, 1 * MiB, s2);
  REQUIRE(core.allocate(1 * MiB, 256, s2) != 0);  // a second stream: frees park from now on
  std::uintptr_t const x = core.allocate(1 * MiB, 256, s1);
  std::uintptr_t const guard = core.allocate(256, 256, s1);
  std::uintptr_t const b = core.allocate(1 * MiB, 256, s1);
  std::uintptr_t const c = core.allocate(512 * KiB, 256, s1);
  REQUIRE(core.allocate(core.blocks().largest_free_block(), 256, s1) != 0);
  core.deallocate(x, s1);  // parks
  core.deallocate(b, s1);  // parks: b joins x's parked owner, apart from x
  core.deallocate(c, s1);  // below the park size: s1's own, next to b
  detail::owner_id const own = core.owner_of(s1);
  detail::owner_id const parked = core.owners().parked_of(own);
  REQUIRE(parked != 0);
  REQUIRE(core.blocks().free_bytes(parked) == 2 * MiB);
  REQUIRE(core.blocks().free_bytes(own) == 512 * KiB);
  std::size_t const waits = fake->waits;
  CHECK(core.allocate(1536 * KiB, 256, s1) == b);  // before: nothing fit, and the pool grew
  CHECK(fake->waits == waits);
  CHECK(core.blocks().free_bytes(parked) == 1 * MiB);  // x stays parked for other streams
  CHECK(core.blocks().check_invariants().empty());
  (void)guard;
}

TEST_CASE("in-place growth behind a block its stream parked merges with it and adds only what the request lacks") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto vmm = test::make_small_vmm(64 * G, 1);
  detail::stream_ordered_pool core{fake, &detail::this_thread_key, true, parks_from(G)};
  detail::in_place_growth_options options;
  options.initial_bytes = G;
  detail::in_place_pool_growth growth{*vmm, options};
  growth.start(core);
  stream_ref const s1 = created(0x1000), s2 = created(0x2000);
  REQUIRE(core.allocate(G, 256, s2) != 0);  // the initial granule: a second stream from now on
  growth.grow(core, 2 * G, 256, s1);
  REQUIRE(core.allocate(G, 256, s1) != 0);
  std::uintptr_t const tail = core.allocate(G, 256, s1);
  core.deallocate(tail, s1);  // parks: the frontier's block is s1's parked memory
  REQUIRE(core.blocks().free_bytes(core.owners().parked_of(core.owner_of(s1))) == G);
  REQUIRE(vmm->committed_bytes() == 3 * G);
  REQUIRE(core.allocate(3 * G, 256, s1) == 0);
  growth.grow(core, 3 * G, 256, s1);
  CHECK(vmm->committed_bytes() == 5 * G);  // before: 6 G, the parked granule left behind
  CHECK(core.allocate(3 * G, 256, s1) == tail);
  CHECK(core.blocks().free_bytes() == 0);
  CHECK(core.blocks().check_invariants().empty());
}
