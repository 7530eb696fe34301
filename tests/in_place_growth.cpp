// in_place_growth over simulated_vmm, driving a simple reference pool core: growth in
// place, coalescing across what would have been chunk boundaries, release of exactly the
// untouched granules, hole reuse, release on out-of-memory and above a threshold, and the
// accounting (committed bytes == granules touched by live blocks after a release), over
// many random seeds.
#include <catch2/catch.hpp>

#include <mrstack/detail/in_place_growth.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <reference_core.hpp>

#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string_view>
#include <vector>

using namespace mrstack;
using mrstack::test::reference_core;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = 2 * MiB;

// The smallest pool that uses the policy the way a real pool does: allocate from the core,
// grow on a miss, notify after a free.
struct grown_pool {
  simulated_vmm_memory_resource vmm;
  reference_core core;
  detail::in_place_growth<reference_core> growth;
  std::map<std::uintptr_t, std::size_t> live;  // address -> size

  explicit grown_pool(std::size_t reserve = 1024 * G, std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                      detail::in_place_growth_options options = {}, std::size_t map_granules = 1)
      : vmm{reserve, G, capacity, map_granules}, growth{vmm, "grown_pool", options} {
    growth.start(core, 0);
  }
  ~grown_pool() {
    for (auto const& [p, n] : live) { core.deallocate(p, 0); }
  }

  std::uintptr_t base() const { return reinterpret_cast<std::uintptr_t>(vmm.range_base()); }

  std::uintptr_t allocate(std::size_t bytes, std::size_t alignment = 256) {
    std::size_t const size = detail::align_up(bytes, 256);
    std::uintptr_t p = core.allocate(size, alignment, 0);
    if (p == 0) {
      growth.grow(core, size, alignment, 0);
      p = core.allocate(size, alignment, 0);
      REQUIRE(p != 0);  // the policy promised room
    }
    REQUIRE(vmm.is_accessible(reinterpret_cast<void*>(p), size));  // never hand out unbacked memory
    REQUIRE(p % alignment == 0);
    live.emplace(p, size);
    return p;
  }

  void deallocate(std::uintptr_t p) {
    auto it = live.find(p);
    REQUIRE(it != live.end());
    REQUIRE(core.deallocate(p, 0) == it->second);
    live.erase(it);
    growth.after_deallocate(core);
  }

  /// The granules (as offsets / G) that live blocks touch.
  std::set<std::size_t> touched() const {
    std::set<std::size_t> out;
    for (auto const& [p, n] : live) {
      for (std::size_t g = (p - base()) / G; g <= (p - base() + n - 1) / G; ++g) { out.insert(g); }
    }
    return out;
  }

  /// Committed granules are exactly the touched ones (true right after a release).
  void check_exact() const {
    auto const t = touched();
    REQUIRE(vmm.committed_bytes() == t.size() * G);
    for (std::size_t g : t) { REQUIRE(vmm.is_committed(vmm.range_base() + g * G, G)); }
  }

  void check_consistent() const {
    INFO(core.check());
    REQUIRE(core.check().empty());
    REQUIRE(core.total_bytes() == growth.frontier_bytes());
    REQUIRE(core.withdrawn_bytes() == growth.hole_bytes());
    // What the core may hand out plus what is live is exactly what is committed.
    REQUIRE(vmm.committed_bytes() == core.free_bytes() + core.live_bytes());
    vmm.check_invariants();
  }
};

}  // namespace

TEST_CASE("in_place_growth: the pool grows at its end, and new memory merges with the free block there") {
  grown_pool pool;
  std::uintptr_t const a = pool.allocate(1 * MiB);
  CHECK(a == pool.base());
  CHECK(pool.growth.frontier_bytes() == G);
  // 1 MiB is left free at the end; 1.5 MiB does not fit there, so the pool grows, and the
  // block starts in the old memory and runs into the new: across the old chunk's end.
  std::uintptr_t const b = pool.allocate(3 * MiB / 2);
  CHECK(b == pool.base() + 1 * MiB);
  CHECK(pool.growth.frontier_bytes() == 2 * G);
  CHECK(pool.vmm.committed_bytes() == 2 * G);
  pool.check_consistent();
  // Free both: one free block spans both growth steps, so a block of the whole size fits
  // without growing.
  pool.deallocate(a);
  pool.deallocate(b);
  CHECK(pool.core.blocks().size() == 1);
  std::uintptr_t const whole = pool.allocate(2 * G);
  CHECK(whole == pool.base());
  CHECK(pool.growth.frontier_bytes() == 2 * G);
  CHECK(pool.growth.grow_count() == 2);
  pool.deallocate(whole);
  pool.check_consistent();
}

TEST_CASE("in_place_growth: growth commits only what the free block at the end lacks") {
  grown_pool pool;
  std::uintptr_t const a = pool.allocate(MiB / 2);   // 1.5 MiB stays free at the end
  std::uintptr_t const b = pool.allocate(3 * MiB);   // 1.5 MiB short: one more granule, not two
  CHECK(b == a + MiB / 2);
  CHECK(pool.vmm.committed_bytes() == 2 * G);
  pool.deallocate(a);
  pool.deallocate(b);
  pool.check_consistent();
}

TEST_CASE("in_place_growth: release gives back exactly the granules no live block touches") {
  grown_pool pool;
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 40; ++i) { blocks.push_back(pool.allocate(700 * KiB)); }  // 28 MiB over 14 granules
  CHECK(pool.vmm.committed_bytes() == 14 * G);
  // Free a long middle stretch and scattered singles.
  for (int i = 5; i < 30; ++i) { pool.deallocate(blocks[static_cast<std::size_t>(i)]); }
  pool.deallocate(blocks[33]);
  pool.deallocate(blocks[39]);
  std::size_t const given_back = pool.growth.release(pool.core);
  CHECK(given_back > 0);
  CHECK(pool.core.releases_prepared == 1);  // the core got to wait for in-flight work first
  pool.check_exact();
  pool.check_consistent();
  CHECK(pool.vmm.mapped_bytes() == pool.vmm.committed_bytes());
  CHECK(pool.growth.release(pool.core) == 0);  // idempotent: nothing more to give
  for (std::size_t i : {0, 1, 2, 3, 4, 30, 31, 32, 34, 35, 36, 37, 38}) { pool.deallocate(blocks[i]); }
  pool.growth.release(pool.core);
  CHECK(pool.vmm.committed_bytes() == 0);
  CHECK(pool.vmm.mapped_bytes() == 0);
  pool.check_consistent();
}

TEST_CASE("in_place_growth: holes are reused before the frontier moves, committing only what is needed") {
  grown_pool pool;
  std::uintptr_t const head = pool.allocate(G);
  std::uintptr_t const middle = pool.allocate(10 * G);
  std::uintptr_t const tail = pool.allocate(G);
  pool.deallocate(middle);
  pool.growth.release(pool.core);
  CHECK(pool.growth.hole_bytes() == 10 * G);
  CHECK(pool.vmm.committed_bytes() == 2 * G);
  std::size_t const frontier = pool.growth.frontier_bytes();

  std::uintptr_t const small = pool.allocate(G + 1 * KiB);  // needs two granules of the hole
  CHECK(small == middle);
  CHECK(pool.growth.frontier_bytes() == frontier);
  CHECK(pool.vmm.committed_bytes() == 4 * G);
  CHECK(pool.growth.hole_bytes() == 8 * G);  // the rest stays a hole
  pool.check_consistent();

  // The rest of the hole, restored, merges with the free tail of the second granule, and
  // best fit starts the block there (lower address).
  std::uintptr_t const rest = pool.allocate(8 * G);
  CHECK(rest == small + G + 1 * KiB);
  CHECK(pool.growth.frontier_bytes() == frontier);
  CHECK(pool.growth.hole_count() == 0);
  pool.check_consistent();
  for (auto p : {head, small, rest, tail}) { pool.deallocate(p); }
  pool.growth.release(pool.core);
  CHECK(pool.vmm.committed_bytes() == 0);
}

TEST_CASE("in_place_growth: the smallest stretch of adjacent holes that fits is chosen") {
  grown_pool pool;
  std::vector<std::uintptr_t> b;
  for (int i = 0; i < 12; ++i) { b.push_back(pool.allocate(G)); }
  // Holes: [1,4) (three granules, released in two steps so it is two core holes) and [6,8) and [9,10).
  pool.deallocate(b[1]);
  pool.growth.release(pool.core);
  pool.deallocate(b[2]);
  pool.deallocate(b[3]);
  pool.deallocate(b[6]);
  pool.deallocate(b[7]);
  pool.deallocate(b[9]);
  pool.growth.release(pool.core);
  CHECK(pool.growth.hole_count() == 4);
  CHECK(pool.allocate(2 * G) == b[6]);       // [6,8) fits exactly; [1,4) would waste
  CHECK(pool.allocate(3 * G) == b[1]);       // only the two adjacent core holes together fit
  CHECK(pool.allocate(G / 2) == b[9]);
  CHECK(pool.growth.hole_count() == 0);
  CHECK(pool.growth.frontier_bytes() == 12 * G);
  pool.check_consistent();
}

TEST_CASE("in_place_growth: holes at the frontier are extended rather than skipped") {
  grown_pool pool;
  std::uintptr_t const a = pool.allocate(G);
  std::uintptr_t const b = pool.allocate(3 * G);
  pool.deallocate(b);
  pool.growth.release(pool.core);
  CHECK(pool.growth.hole_bytes() == 3 * G);
  std::uintptr_t const c = pool.allocate(5 * G);  // larger than the tail hole: hole + 2 granules more
  CHECK(c == b);
  CHECK(pool.growth.frontier_bytes() == 6 * G);
  CHECK(pool.vmm.committed_bytes() == 6 * G);
  pool.check_consistent();
  pool.deallocate(a);
  pool.deallocate(c);
}

TEST_CASE("in_place_growth: holes at the frontier are committed only as far as the request reaches") {
  grown_pool pool;
  std::uintptr_t const a = pool.allocate(G);
  std::uintptr_t const b = pool.allocate(4 * G);
  std::uintptr_t const c = pool.allocate(6 * G);
  pool.deallocate(c);
  pool.growth.release(pool.core);  // [5G, 11G): holes ending at the frontier
  pool.deallocate(b);              // [G, 5G): free and committed, right before them
  CHECK(pool.vmm.committed_bytes() == 5 * G);
  // 7 G fits in no hole alone; the free block at the end and 3 G of the holes hold it.
  // All 6 G of holes were committed, 3 G of them for nothing.
  std::uintptr_t const d = pool.allocate(7 * G);
  CHECK(d == b);
  CHECK(pool.vmm.committed_bytes() == 8 * G);
  CHECK(pool.growth.hole_bytes() == 3 * G);
  CHECK(pool.growth.frontier_bytes() == 11 * G);
  pool.check_consistent();
  pool.deallocate(d);
  pool.deallocate(a);
  pool.check_consistent();
}

TEST_CASE("in_place_growth: out of physical memory, the pool releases its free granules and retries") {
  grown_pool pool{1024 * G, 10 * G};
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) { blocks.push_back(pool.allocate(G)); }
  for (int i = 0; i < 8; i += 2) { pool.deallocate(blocks[static_cast<std::size_t>(i)]); }
  // 4 granules live, 4 free but committed, 2 left on the "device". 5 granules in one piece
  // only fit after the free ones are given back.
  std::uintptr_t const big = pool.allocate(5 * G);
  CHECK(pool.growth.release_count() == 1);
  CHECK(pool.vmm.mapped_bytes() == 9 * G);
  pool.check_consistent();
  // Past everything: a clear failure, and nothing changed.
  try {
    (void)pool.allocate(2 * G);
    FAIL("allocated past the device");
  } catch (detail::growth_failure const& e) {
    CHECK_THAT(e.what(), Catch::Contains("no physical memory") && Catch::Contains("capacity reached"));
  }
  pool.check_consistent();
  pool.deallocate(big);
  for (int i = 1; i < 8; i += 2) { pool.deallocate(blocks[static_cast<std::size_t>(i)]); }
}

TEST_CASE("in_place_growth: a maximum caps what the pool commits") {
  detail::in_place_growth_options options;
  options.maximum_bytes = 4 * G + 1;  // rounds down to 4 granules
  options.initial_bytes = 3 * MiB;    // rounds up to 2
  grown_pool pool{1024 * G, std::numeric_limits<std::size_t>::max(), options};
  CHECK(pool.vmm.committed_bytes() == 2 * G);
  CHECK(pool.growth.maximum_bytes() == 4 * G);
  std::uintptr_t const a = pool.allocate(4 * G);
  CHECK_THROWS_WITH(pool.allocate(1), Catch::Contains("pass the maximum"));
  pool.deallocate(a);
  options.initial_bytes = 5 * G;
  CHECK_THROWS_WITH(grown_pool(1024 * G, std::numeric_limits<std::size_t>::max(), options),
                    Catch::Contains("above the maximum"));
}

TEST_CASE("in_place_growth: a release threshold returns free granules as frees pass it, without rescanning each free") {
  detail::in_place_growth_options options;
  options.release_threshold = 4 * G;
  grown_pool pool{1024 * G, std::numeric_limits<std::size_t>::max(), options};
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(pool.allocate(G)); }
  for (int i = 0; i < 4; ++i) { pool.deallocate(blocks[static_cast<std::size_t>(i)]); }
  CHECK(pool.growth.release_count() == 0);  // exactly at the threshold: kept
  pool.deallocate(blocks[4]);
  CHECK(pool.growth.release_count() == 1);
  CHECK(pool.vmm.committed_bytes() == 11 * G);
  // Free bytes that cannot be given back (half granules) do not trigger a release per free.
  std::vector<std::uintptr_t> halves;
  for (int i = 0; i < 24; ++i) { halves.push_back(pool.allocate(G / 2)); }
  std::size_t const releases = pool.growth.release_count();
  for (std::size_t i = 0; i < halves.size(); i += 2) { pool.deallocate(halves[i]); }  // 6 granules' worth, none whole
  CHECK(pool.growth.release_count() <= releases + 1);
  pool.check_consistent();
  for (std::size_t i = 1; i < halves.size(); i += 2) { pool.deallocate(halves[i]); }
  for (std::size_t i = 5; i < blocks.size(); ++i) { pool.deallocate(blocks[i]); }
  pool.growth.release(pool.core);
  CHECK(pool.vmm.committed_bytes() == 0);
}

TEST_CASE("in_place_growth: the range's claim is held for the policy's lifetime") {
  simulated_vmm_memory_resource vmm{64 * G};
  {
    reference_core core;
    detail::in_place_growth<reference_core> growth{vmm, "pool", {}};
    CHECK(vmm.claimant() == "pool");
    CHECK_THROWS_WITH(detail::in_place_growth<reference_core>(vmm, "second pool", {}),
                      Catch::Contains("already claimed by pool"));
    growth.grow(core, 3 * G, 256, 0);
    CHECK(vmm.committed_bytes() == 3 * G);
  }
  CHECK(vmm.claimant().empty());
  CHECK(vmm.mapped_bytes() == 0);  // the policy's end gave everything back
}

TEST_CASE("in_place_growth: randomized traffic, releases and thresholds, many seeds") {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng{seed};
    detail::in_place_growth_options options;
    if (rng() % 2 == 0) { options.release_threshold = (rng() % 16) * G; }
    if (rng() % 3 == 0) { options.growth_step = (1 + rng() % 8) * G; }
    std::size_t const capacity = rng() % 2 == 0 ? std::numeric_limits<std::size_t>::max() : (40 + rng() % 60) * G;
    std::size_t const per_run = rng() % 3 == 0 ? 4 : 1;
    grown_pool pool{512 * G, capacity, options, per_run};
    INFO("seed " << seed << " threshold " << options.release_threshold << " step " << options.growth_step
                 << " capacity " << capacity << " per_run " << per_run);
    std::vector<std::uintptr_t> order;
    for (int step = 0; step < 1500; ++step) {
      unsigned const what = static_cast<unsigned>(rng() % 100);
      if (what < 55 || order.empty()) {
        std::size_t const bytes = rng() % 4 == 0 ? 1 + rng() % (6 * G) : 1 + rng() % (256 * KiB);
        std::size_t const alignment = rng() % 10 == 0 ? std::size_t{4096} << (rng() % 10) : 256;
        try {
          order.push_back(pool.allocate(bytes, alignment));
        } catch (detail::growth_failure const&) {
          REQUIRE(capacity != std::numeric_limits<std::size_t>::max());  // only a full device refuses
        }
      } else if (what < 97) {
        std::size_t const i = rng() % order.size();
        pool.deallocate(order[i]);
        order[i] = order.back();
        order.pop_back();
      } else {
        pool.growth.release(pool.core);
        pool.check_exact();
      }
      pool.check_consistent();
      if (per_run == 1) { REQUIRE(pool.vmm.mapped_bytes() == pool.vmm.committed_bytes()); }
      REQUIRE(pool.vmm.mapped_bytes() <= capacity);
    }
    for (auto p : order) { pool.deallocate(p); }
    pool.growth.release(pool.core);
    CHECK(pool.vmm.committed_bytes() == 0);
    CHECK(pool.vmm.mapped_bytes() == 0);
    pool.check_consistent();
  }
}

namespace {

// A virtual range whose decommit the "driver" refuses on demand, leaving the granules
// committed (all of them, or all but the first), while range_.committed_bytes() keeps
// telling the truth.
class refusing_range final : public virtual_range {
 public:
  enum class refusal { none, all, all_but_first };
  refusal refuse = refusal::none;
  std::uintptr_t only_at = 0;  // refuse only a decommit starting here (0: any)

  explicit refusing_range(virtual_range& inner) : inner_{inner} {}
  [[nodiscard]] std::byte* range_base() const noexcept override { return inner_.range_base(); }
  [[nodiscard]] std::size_t range_bytes() const noexcept override { return inner_.range_bytes(); }
  [[nodiscard]] std::size_t granularity() const noexcept override { return inner_.granularity(); }
  void claim(std::string_view claimant) override { inner_.claim(claimant); }
  void unclaim() noexcept override { inner_.unclaim(); }
  std::size_t commit(void* ptr, std::size_t bytes) override { return inner_.commit(ptr, bytes); }
  std::size_t decommit(void* ptr, std::size_t bytes) override {
    if (only_at != 0 && reinterpret_cast<std::uintptr_t>(ptr) != only_at) { return inner_.decommit(ptr, bytes); }
    if (refuse == refusal::all_but_first && bytes > G) { (void)inner_.decommit(ptr, G); }
    if (refuse != refusal::none) { throw std::runtime_error("injected: the driver refused the decommit"); }
    return inner_.decommit(ptr, bytes);
  }
  [[nodiscard]] std::size_t committed_bytes() const noexcept override { return inner_.committed_bytes(); }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept override { return inner_.mapped_bytes(); }
  [[nodiscard]] bool owns(void const* ptr) const noexcept override { return inner_.owns(ptr); }

 private:
  virtual_range& inner_;
};

// Allocates from `core` as the pool does, growing it on a miss; the block must be backed.
std::uintptr_t allocate_growing(reference_core& core, detail::in_place_growth<reference_core>& growth,
                                simulated_vmm_memory_resource& vmm, std::size_t bytes) {
  std::uintptr_t p = core.allocate(bytes, 256, 0);
  if (p == 0) {
    growth.grow(core, bytes, 256, 0);
    p = core.allocate(bytes, 256, 0);
  }
  REQUIRE(p != 0);
  REQUIRE(vmm.is_accessible(reinterpret_cast<void*>(p), bytes));
  return p;
}

}  // namespace

TEST_CASE("in_place_growth: a hole whose decommit failed is not counted twice against the maximum") {
  // The granules of a hole whose decommit failed stayed committed (and counted) while the
  // books called them a hole: reusing it committed and counted them again, so the pool
  // reported out of memory below its maximum.
  for (auto const refusal : {refusing_range::refusal::all, refusing_range::refusal::all_but_first}) {
    INFO("refusal " << static_cast<int>(refusal));
    simulated_vmm_memory_resource vmm{64 * G, G};
    refusing_range range{vmm};
    detail::in_place_growth_options options;
    options.maximum_bytes = 4 * G;
    reference_core core;
    detail::in_place_growth<reference_core> growth{range, "pool", options};
    growth.start(core, 0);
    auto const allocate = [&](std::size_t bytes) { return allocate_growing(core, growth, vmm, bytes); };
    std::vector<std::uintptr_t> blocks;
    for (int i = 0; i < 4; ++i) { blocks.push_back(allocate(G)); }
    CHECK(vmm.committed_bytes() == 4 * G);
    core.deallocate(blocks[1], 0);
    core.deallocate(blocks[2], 0);
    range.refuse = refusal;
    CHECK_THROWS_WITH(growth.release(core), Catch::Contains("refused"));
    range.refuse = refusing_range::refusal::none;
    CHECK(vmm.committed_bytes() == 4 * G);  // nothing given back: the books say so too
    CHECK(growth.hole_bytes() + vmm.committed_bytes() == 4 * G);
    CHECK(core.free_bytes() == 2 * G);
    // The pool reaches its maximum exactly, and not beyond.
    blocks[1] = allocate(G);
    blocks[2] = allocate(G);
    CHECK(vmm.committed_bytes() == 4 * G);
    CHECK_THROWS_AS(growth.grow(core, G, 256, 0), detail::growth_failure);
    CHECK(vmm.committed_bytes() == 4 * G);
    // A later release gives the granules back.
    core.deallocate(blocks[1], 0);
    core.deallocate(blocks[2], 0);
    CHECK(growth.release(core) == 2 * G);
    CHECK(vmm.committed_bytes() == 2 * G);
    CHECK(growth.hole_bytes() == 2 * G);
    core.deallocate(blocks[0], 0);
    core.deallocate(blocks[3], 0);
  }
}

TEST_CASE("in_place_growth: a grow whose release fails at one hole still uses the holes it gave back") {
  // The release a grow makes when it is out of room threw the first refused decommit out
  // of the grow, though the other holes had been given back and the request now fit.
  simulated_vmm_memory_resource vmm{64 * G, G};
  refusing_range range{vmm};
  detail::in_place_growth_options options;
  options.maximum_bytes = 5 * G;
  reference_core core;
  detail::in_place_growth<reference_core> growth{range, "pool", options};
  growth.start(core, 0);
  auto const allocate = [&](std::size_t bytes) { return allocate_growing(core, growth, vmm, bytes); };
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 4; ++i) { blocks.push_back(allocate(G)); }
  core.deallocate(blocks[0], 0);  // two free granules apart: 2 granules in one piece need the frontier,
  core.deallocate(blocks[2], 0);  // and 4 committed + 2 passes the maximum of 5 until one goes back
  range.refuse = refusing_range::refusal::all;
  range.only_at = blocks[2];
  std::uintptr_t const two = allocate(2 * G);  // threw the injected refusal before
  range.refuse = refusing_range::refusal::none;
  CHECK(vmm.committed_bytes() == 5 * G);
  CHECK(growth.release_count() == 1);
  // When even the second plan fails, both reasons are given.
  range.refuse = refusing_range::refusal::all;
  try {
    growth.grow(core, 4 * G, 256, 0);
    FAIL("grew past the maximum");
  } catch (detail::growth_failure const& e) {
    CHECK_THAT(e.what(), Catch::Contains("maximum") && Catch::Contains("releasing the free granules first failed") &&
                             Catch::Contains("injected"));
  }
  range.refuse = refusing_range::refusal::none;
  CHECK(vmm.committed_bytes() <= 5 * G);
  core.deallocate(two, 0);
  core.deallocate(blocks[1], 0);
  core.deallocate(blocks[3], 0);
}

TEST_CASE("in_place_growth: a hole as large as an aligned request is reused without room for padding") {
  // Holes start on granule boundaries, so a block aligned to a divisor of the granule needs
  // no padding there: counting a whole alignment more asked a hole one granule larger,
  // committed that granule for nothing, and with the range used up refused the request.
  grown_pool pool{3 * G};
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 3; ++i) { blocks.push_back(pool.allocate(G)); }
  pool.deallocate(blocks[1]);
  (void)pool.growth.release(pool.core);
  CHECK(pool.growth.hole_bytes() == G);
  std::uintptr_t const aligned = pool.allocate(G, 4096);  // refused before: "range exhausted"
  CHECK(aligned == blocks[1]);
  CHECK(pool.vmm.committed_bytes() == 3 * G);
  pool.check_consistent();
  pool.deallocate(aligned);
  (void)pool.growth.release(pool.core);
  // A hole run with room for one granule after the padding an alignment past the granule
  // needs commits that granule and the padding's, no more.
  pool.deallocate(blocks[0]);
  pool.deallocate(blocks[2]);
  (void)pool.growth.release(pool.core);
  CHECK(pool.vmm.committed_bytes() == 0);
  std::uintptr_t const far = pool.allocate(G, 2 * G);
  CHECK(far % (2 * G) == 0);
  CHECK(pool.vmm.committed_bytes() == far - pool.base() + G);  // was 3 granules, whatever the padding
  pool.check_consistent();
  pool.deallocate(far);
}

TEST_CASE("in_place_growth: near the maximum the frontier is used when the holes that fit would pass it") {
  // The free block at the chunk's end holds part of a request, so the frontier can need
  // fewer granules than a stretch of holes that fits: trying the holes alone refused a
  // request that fitted under the maximum.
  detail::in_place_growth_options options;
  options.maximum_bytes = 5 * G;
  grown_pool pool{1024 * G, std::numeric_limits<std::size_t>::max(), options};
  std::uintptr_t const a = pool.allocate(G);
  std::uintptr_t const b = pool.allocate(2 * G);
  std::uintptr_t const s = pool.allocate(G / 4);
  std::uintptr_t const f = pool.allocate(5 * G / 4);
  CHECK(pool.vmm.committed_bytes() == 5 * G);
  pool.deallocate(b);
  (void)pool.growth.release(pool.core);
  pool.deallocate(f);                                    // free at the end: [3.25, 5) granules
  std::uintptr_t const u = pool.allocate(9 * G / 4);    // past the 2-granule hole: the frontier
  CHECK(u == s + G / 4);
  CHECK(pool.vmm.committed_bytes() == 4 * G);
  CHECK(pool.growth.hole_bytes() == 2 * G);
  std::uintptr_t const r = pool.allocate(3 * G / 2);    // the hole: 6 granules; the frontier: 5
  CHECK(r == u + 9 * G / 4);
  CHECK(pool.vmm.committed_bytes() == 5 * G);
  pool.check_consistent();
  pool.deallocate(a);
  pool.deallocate(s);
  pool.deallocate(u);
  pool.deallocate(r);
}

TEST_CASE("in_place_growth: a growth step stops at the maximum instead of refusing") {
  // A step past the maximum refused a request whose own granules fitted under it.
  detail::in_place_growth_options options;
  options.maximum_bytes = 3 * G;
  options.growth_step = 4 * G;
  grown_pool pool{1024 * G, std::numeric_limits<std::size_t>::max(), options};
  std::uintptr_t const a = pool.allocate(G);
  CHECK(pool.vmm.committed_bytes() == 3 * G);  // the step, as far as the maximum allows
  std::uintptr_t const b = pool.allocate(2 * G);
  CHECK(pool.growth.grow_count() == 1);
  pool.check_consistent();
  pool.deallocate(a);
  pool.deallocate(b);
}

TEST_CASE("in_place_growth: out of physical memory the frontier is used when it needs fewer granules than the holes") {
  // As at the maximum: the free block at the chunk's end holds part of the request, so the
  // frontier can need fewer granules than the holes that fit. With the device full, trying
  // the holes alone (before and after the release) refused a request the device had room for.
  grown_pool pool{1024 * G, 5 * G};
  std::uintptr_t const a = pool.allocate(G);
  std::uintptr_t const b = pool.allocate(2 * G);
  std::uintptr_t const s = pool.allocate(G / 4);
  std::uintptr_t const f = pool.allocate(5 * G / 4);
  CHECK(pool.vmm.committed_bytes() == 5 * G);
  pool.deallocate(b);
  (void)pool.growth.release(pool.core);
  pool.deallocate(f);
  std::uintptr_t const u = pool.allocate(9 * G / 4);
  CHECK(pool.vmm.committed_bytes() == 4 * G);
  CHECK(pool.growth.hole_bytes() == 2 * G);
  std::uintptr_t const r = pool.allocate(3 * G / 2);  // the hole: 6 granules; the frontier: 5
  CHECK(r == u + 9 * G / 4);
  CHECK(pool.vmm.committed_bytes() == 5 * G);
  CHECK(pool.growth.hole_bytes() == 2 * G);
  pool.check_consistent();
  pool.deallocate(a);
  pool.deallocate(s);
  pool.deallocate(u);
  pool.deallocate(r);
}

TEST_CASE("in_place_growth: out of physical memory a growth step shrinks to what the request needs") {
  // The step is a preference: a device with room for the request's granules but not the
  // step's refused the request, before and after the release.
  detail::in_place_growth_options options;
  options.growth_step = 4 * G;
  grown_pool pool{1024 * G, 3 * G, options};
  std::uintptr_t const a = pool.allocate(G);
  CHECK(pool.vmm.committed_bytes() == G);  // the step did not fit the device
  std::uintptr_t const b = pool.allocate(2 * G);
  CHECK(pool.vmm.committed_bytes() == 3 * G);
  pool.check_consistent();
  pool.deallocate(a);
  pool.deallocate(b);
}

namespace {

// A core whose withdraw fails a consistency check (std::logic_error: a bug's symptom) at
// the range of the block at `bad_address`, right after choosing it, as block_pool's own
// checks do.
class inconsistent_core : public reference_core {
 public:
  std::uintptr_t bad_address = 0;
  template <typename Choose>
  std::size_t withdraw_free_ranges(Choose&& choose) {
    return reference_core::withdraw_free_ranges([&](std::uintptr_t address, std::size_t size, int owner) {
      range const r = choose(address, size, owner);
      if (r.length != 0 && address == bad_address) { throw std::logic_error("injected: the core's books disagree"); }
      return r;
    });
  }
};

}  // namespace

TEST_CASE("in_place_growth: a logic error in the release a grow makes propagates") {
  // The grow's release caught every exception and planned again: when that plan succeeded,
  // the core's logic_error (its books are wrong) was dropped without a word.
  simulated_vmm_memory_resource vmm{64 * G, G};
  inconsistent_core core;
  detail::in_place_growth_options options;
  options.maximum_bytes = 8 * G;
  detail::in_place_growth<inconsistent_core> growth{vmm, "inconsistent_core", options};
  growth.start(core, 0);
  growth.grow(core, 8 * G, 256, 0);
  std::uintptr_t const x = core.allocate(4 * G, 256, 0);
  std::uintptr_t const y = core.allocate(2 * G, 256, 0);
  std::uintptr_t const z = core.allocate(2 * G, 256, 0);
  REQUIRE((x != 0 && y != 0 && z != 0));
  core.deallocate(x, 0);
  core.deallocate(z, 0);
  core.bad_address = z;  // x is released, z is not: the frontier then has room for 6 granules
  CHECK_THROWS_WITH(growth.grow(core, 6 * G, 256, 0), Catch::Contains("injected: the core's books disagree"));
  CHECK(core.check().empty());
  CHECK(core.withdrawn_bytes() == growth.hole_bytes());
  CHECK(vmm.committed_bytes() == 4 * G);  // x given back, nothing committed for the grow
  core.bad_address = 0;
  core.deallocate(y, 0);
}
