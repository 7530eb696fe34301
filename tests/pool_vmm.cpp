// pool > simulated_vmm through the resource interface: the pool finds the virtual-range
// capability and grows one chunk in place; memory across growth steps coalesces; release
// gives back exactly the granules no live block touches; the device running out makes the
// pool release before it fails; a threshold releases as frees pass it; several streams;
// and randomized traffic over many seeds keeps committed == touched after each release.
#include <catch2/catch.hpp>

#include <mrstack/detail/in_place_pool_growth.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <small_vmm.hpp>

#include <fake_stream_sync.hpp>

#include <map>
#include <memory>
#include <random>
#include <set>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = test::vmm_granule;
constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
auto const make_vmm = [](std::size_t capacity = unlimited, std::size_t map_granules = 1) {
  return test::make_small_vmm(capacity, map_granules);
};
using test::addr;

// Granules (offsets / G) that the given live blocks touch.
std::set<std::size_t> touched(virtual_range const& range, std::map<void*, std::size_t> const& live) {
  std::set<std::size_t> out;
  auto const base = reinterpret_cast<std::uintptr_t>(range.range_base());
  for (auto const& [p, n] : live) {
    std::size_t const span = detail::align_up(n, 256);
    for (std::size_t g = (addr(p) - base) / G; g <= (addr(p) - base + span - 1) / G; ++g) { out.insert(g); }
  }
  return out;
}

void check_exact(simulated_vmm_memory_resource const& vmm, std::map<void*, std::size_t> const& live) {
  auto const t = touched(vmm, live);
  REQUIRE(vmm.committed_bytes() == t.size() * G);
  for (std::size_t g : t) { REQUIRE(vmm.is_committed(vmm.range_base() + g * G, G)); }
}

}  // namespace

TEST_CASE("pool > simulated_vmm: the pool claims the range and grows one chunk in place") {
  auto vmm = make_vmm();
  pool_memory_resource pool{vmm};
  CHECK(pool.grows_in_place());
  CHECK(vmm->claimant() == "pool");
  CHECK(describe_stack(pool) == "pool > simulated_vmm");
  void* a = pool.allocate(MiB);
  CHECK(a == vmm->range_base());
  void* b = pool.allocate(3 * MiB / 2);  // runs across the first granule's end into the new one
  CHECK(addr(b) == addr(a) + MiB);
  CHECK(pool.chunk_count() == 1);
  CHECK(pool.pool_size() == 2 * G);
  CHECK(vmm->committed_bytes() == 2 * G);
  CHECK(vmm->is_accessible(b, 3 * MiB / 2));
  pool.deallocate(a, MiB);
  pool.deallocate(b, 3 * MiB / 2);
  // One free block spans both growth steps.
  void* whole = pool.allocate(2 * G);
  CHECK(whole == vmm->range_base());
  CHECK(pool.pool_size() == 2 * G);
  pool.deallocate(whole, 2 * G);
  CHECK(pool.check_invariants().empty());
}

TEST_CASE("pool > simulated_vmm: release() gives back exactly the granules no live block touches") {
  auto vmm = make_vmm();
  pool_memory_resource pool{vmm};
  std::map<void*, std::size_t> live;
  std::vector<void*> order;
  for (int i = 0; i < 60; ++i) {
    std::size_t const n = (i % 7 + 1) * 300 * KiB;
    void* p = pool.allocate(n);
    live.emplace(p, n);
    order.push_back(p);
  }
  for (std::size_t i = 10; i < 45; ++i) {
    pool.deallocate(order[i], live.at(order[i]));
    live.erase(order[i]);
  }
  std::size_t const before = vmm->committed_bytes();
  pool.release();
  CHECK(vmm->committed_bytes() < before);
  check_exact(*vmm, live);
  CHECK(pool.pool_size() == vmm->committed_bytes());
  CHECK(pool.free_bytes() + pool.used_bytes() == pool.pool_size());
  CHECK(pool.check_invariants().empty());
  for (auto const& [p, n] : live) { pool.deallocate(p, n); }
  pool.release();
  CHECK(vmm->committed_bytes() == 0);
  CHECK(pool.pool_size() == 0);
}

TEST_CASE("pool > simulated_vmm: a full device makes the pool release its free granules before failing") {
  auto vmm = make_vmm(10 * G);
  pool_memory_resource pool{vmm};
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) { blocks.push_back(pool.allocate(G)); }
  for (std::size_t i = 0; i < 8; i += 2) { pool.deallocate(blocks[i], G); }
  void* big = pool.allocate(5 * G);  // only fits once the four free granules go back
  CHECK(vmm->mapped_bytes() == 9 * G);
  try {
    (void)pool.allocate(2 * G);
    FAIL("allocated past the device");
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), Catch::Contains("pool could not allocate") && Catch::Contains("capacity reached"));
    CHECK(e.info().footprint_bytes == 9 * G);
  }
  pool.deallocate(big, 5 * G);
  for (std::size_t i = 1; i < 8; i += 2) { pool.deallocate(blocks[i], G); }
  CHECK(pool.check_invariants().empty());
}

TEST_CASE("pool > simulated_vmm: the maximum size caps committed memory") {
  auto vmm = make_vmm();
  pool_memory_resource pool{vmm, 2 * G, 4 * G};
  CHECK(vmm->committed_bytes() == 2 * G);
  void* a = pool.allocate(4 * G);
  CHECK_THROWS_WITH(pool.allocate(1), Catch::Contains("maximum"));
  pool.deallocate(a, 4 * G);
}

TEST_CASE("pool > simulated_vmm: growth past what one chunk can hold is out_of_memory, with nothing committed") {
  // The default 1 TiB reserve is one granule more than the pool's one chunk can hold
  // (block_pool::max_chunk_size, 1 TiB - 256 B). Growth committed the granules first and
  // then failed to append them: block_pool's invalid_argument escaped allocate, and the
  // granules stayed committed, belonging to no block.
  auto vmm = std::make_shared<simulated_vmm_memory_resource>();
  pool_memory_resource pool{vmm};
  REQUIRE(vmm->range_bytes() > detail::block_pool::max_chunk_size);
  void* most = pool.allocate(vmm->range_bytes() - G);
  CHECK_THROWS_WITH(pool.allocate(1), Catch::Contains("one chunk of the pool can hold"));
  CHECK(vmm->committed_bytes() == vmm->range_bytes() - G);
  CHECK(pool.pool_size() == vmm->committed_bytes());
  pool.deallocate(most, vmm->range_bytes() - G);
  pool.release();
  CHECK(vmm->committed_bytes() == 0);
  CHECK(pool.check_invariants().empty());
}

TEST_CASE("pool > simulated_vmm: a release threshold gives granules back as frees pass it") {
  auto vmm = make_vmm();
  pool_options options;
  options.release_threshold = 4 * G;
  pool_memory_resource pool{vmm, 0, std::nullopt, options};
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(pool.allocate(G)); }
  for (std::size_t i = 0; i < 5; ++i) { pool.deallocate(blocks[i], G); }
  CHECK(vmm->committed_bytes() == 11 * G);
  for (std::size_t i = 5; i < 16; ++i) { pool.deallocate(blocks[i], G); }
  CHECK(vmm->committed_bytes() <= 4 * G);
}

TEST_CASE("pool > simulated_vmm: grow_in_place=false takes chunks like from any upstream") {
  auto vmm = make_vmm();
  pool_options options;
  options.grow_in_place = false;
  pool_memory_resource pool{vmm, 0, std::nullopt, options};
  CHECK_FALSE(pool.grows_in_place());
  void* p = pool.allocate(MiB);
  CHECK(vmm->claimant().empty());
  pool.deallocate(p, MiB);
}

TEST_CASE("pool > simulated: an ordinary upstream keeps the chunk behaviour") {
  pool_memory_resource pool{std::make_shared<simulated_memory_resource>()};
  CHECK_FALSE(pool.grows_in_place());
}

TEST_CASE("pool > simulated_vmm: destroying the pool gives every granule back and ends the claim") {
  auto vmm = make_vmm();
  {
    pool_memory_resource pool{vmm, 8 * G};
    (void)pool.allocate(3 * G);  // still live at destruction: the pool takes everything back anyway
    CHECK(vmm->committed_bytes() == 8 * G);
  }
  CHECK(vmm->mapped_bytes() == 0);
  CHECK(vmm->claimant().empty());
}

TEST_CASE("pool > simulated_vmm: several streams share one range; release waits and gives back their granules") {
  auto vmm = make_vmm();
  pool_memory_resource pool{vmm};
  auto const s1 = stream_view{reinterpret_cast<cudaStream_t>(0x1000)};
  auto const s2 = stream_view{reinterpret_cast<cudaStream_t>(0x2000)};
  void* a = pool.allocate(3 * G, s1);
  void* b = pool.allocate(3 * G, s2);
  pool.deallocate(a, 3 * G, s1);
  void* c = pool.allocate(G, s2);  // s1's free memory handed over to s2 (or grown): both fine
  pool.deallocate(b, 3 * G, s2);
  pool.release();
  std::map<void*, std::size_t> live{{c, G}};
  check_exact(*vmm, live);
  pool.deallocate(c, G, s2);
  CHECK(pool.check_invariants().empty());
}

TEST_CASE("in-place growth behind synchronized memory gives one block a per-thread stream can use") {
  // The initial memory is synchronized and at the chunk's end; a per-thread default stream
  // is an exclusive owner, which never absorbs synchronized memory. Growth gave the new
  // granules to that stream: they did not merge with the end, and the request found no
  // block (the pool then merged them by synchronizing every stream; an arena failed).
  auto vmm = make_vmm();
  detail::stream_ordered_pool core{std::make_shared<test::fake_stream_sync>()};
  detail::in_place_growth_options options;
  options.initial_bytes = 2 * G;
  detail::in_place_pool_growth growth{*vmm, options};
  growth.start(core);
  detail::stream_ref const per_thread{detail::this_thread_key(), 2, true};
  growth.grow(core, 3 * G, 256, per_thread);
  CHECK(vmm->committed_bytes() == 3 * G);
  CHECK(core.blocks().largest_free_block() == 3 * G);
  CHECK(core.allocate(3 * G, 256, per_thread) == addr(vmm->range_base()));
  CHECK(core.blocks().check_invariants().empty());
}

TEST_CASE("pool > simulated_vmm: memory a stream freed is released, and reused by another stream, only after its work") {
  auto sync = std::make_shared<test::fake_stream_sync>();
  pool_options options;
  options.stream_sync = sync;
  auto vmm = make_vmm();
  pool_memory_resource pool{vmm, 0, std::nullopt, options};
  auto const h1 = std::uintptr_t{0x1000};
  auto const h2 = std::uintptr_t{0x2000};
  stream_view const s1{reinterpret_cast<cudaStream_t>(h1)};
  stream_view const s2{reinterpret_cast<cudaStream_t>(h2)};
  void* keep = pool.allocate(G, s1);
  void* a = pool.allocate(6 * G, s1);
  std::uint64_t const last_use = sync->enqueue(h1);  // a kernel on s1 still writing `a`
  pool.deallocate(a, 6 * G, s1);
  std::size_t const before = sync->sync_alls;
  pool.release();  // s1 holds free blocks: the pool must wait for s1 before unmapping them
  CHECK(sync->sync_alls == before + 1);
  CHECK(vmm->committed_bytes() == G);
  void* b = pool.allocate(4 * G, s2);  // lands in the released hole
  CHECK(addr(b) >= addr(a));
  CHECK(addr(b) < addr(a) + 6 * G);
  CHECK(sync->ordered_after(h2, h1, last_use));
  pool.deallocate(b, 4 * G, s2);
  pool.deallocate(keep, G, s1);
}

TEST_CASE("pool > simulated_vmm: randomized traffic over many seeds keeps the accounting exact") {
  for (unsigned seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng{seed};
    std::size_t const per_run = rng() % 2 == 0 ? 1 : 8;
    std::size_t const capacity = rng() % 3 == 0 ? (30 + rng() % 50) * G : unlimited;
    pool_options options;
    if (rng() % 2 == 0) { options.release_threshold = (rng() % 8) * G; }
    auto vmm = make_vmm(capacity, per_run);
    pool_memory_resource pool{vmm, 0, std::nullopt, options};
    INFO("seed " << seed << " per_run " << per_run << " capacity " << capacity << " threshold "
                 << options.release_threshold);
    std::map<void*, std::size_t> live;
    std::vector<void*> order;
    stream_view const streams[] = {stream_view{}, stream_view{reinterpret_cast<cudaStream_t>(0x1000)}};
    std::map<void*, stream_view> stream_of;
    for (int step = 0; step < 1500; ++step) {
      unsigned const what = static_cast<unsigned>(rng() % 100);
      if (what < 55 || order.empty()) {
        std::size_t const n = rng() % 5 == 0 ? 1 + rng() % (5 * G) : 1 + rng() % (200 * KiB);
        std::size_t const alignment = rng() % 8 == 0 ? std::size_t{512} << (rng() % 12) : 256;
        stream_view const s = streams[rng() % 2];
        try {
          void* p = pool.allocate(n, s, alignment);
          REQUIRE(detail::is_aligned(p, alignment));
          REQUIRE(vmm->is_accessible(p, n));
          live.emplace(p, n);
          order.push_back(p);
          stream_of[p] = s;
        } catch (out_of_memory const& e) {
          INFO(e.what());
          REQUIRE(capacity != unlimited);
        }
      } else if (what < 97) {
        std::size_t const i = rng() % order.size();
        void* p = order[i];
        pool.deallocate(p, live.at(p), stream_of.at(p));
        live.erase(p);
        order[i] = order.back();
        order.pop_back();
      } else {
        pool.release();
        check_exact(*vmm, live);
      }
      REQUIRE(pool.pool_size() == vmm->committed_bytes());
      REQUIRE(vmm->mapped_bytes() <= capacity);
      if (step % 100 == 0) { REQUIRE(pool.check_invariants().empty()); }
    }
    for (auto const& [p, n] : live) { pool.deallocate(p, n, stream_of.at(p)); }
    pool.release();
    CHECK(vmm->committed_bytes() == 0);
    CHECK(pool.check_invariants().empty());
  }
}
