// arena > simulated_vmm: over a virtual range the arena's global arena is one chunk grown
// in place (as the pool's): memory across growth steps merges, what it commits is what
// requests lacked, the maximum caps what is committed, free granules go back past
// max_free and on release(), and the claim ends with the arena. Also threads growing and
// shrinking it at once (no two live blocks overlap; run under the tsan preset), and
// grow_in_place=false / eager keeping the chunk behaviour.
#include <catch2/catch.hpp>

#include <mrstack/error.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <small_vmm.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = test::vmm_granule;
auto const make_vmm = [](std::size_t capacity = std::numeric_limits<std::size_t>::max()) {
  return test::make_small_vmm(capacity);
};
using test::addr;

arena_options small_options() {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 2;
  return o;
}

}  // namespace

TEST_CASE("arena > simulated_vmm: the arena claims the range and grows one chunk in place") {
  auto vmm = make_vmm();
  arena_memory_resource arena{vmm, 256 * MiB, small_options()};
  CHECK(arena.grows_in_place());
  CHECK(vmm->claimant() == "arena");
  CHECK(vmm->committed_bytes() == 0);  // nothing until first needed
  void* a = arena.allocate(3 * MiB);   // large: the global arena
  CHECK(a == vmm->range_base());
  CHECK(vmm->committed_bytes() == 2 * G);  // what the request lacked, in granules
  void* b = arena.allocate(3 * MiB);       // runs across the end into new granules
  CHECK(addr(b) == addr(a) + 3 * MiB);
  CHECK(vmm->committed_bytes() == 3 * G);
  CHECK(arena.held_bytes() == vmm->committed_bytes());
  CHECK(arena.stats().chunks == 1);
  arena.deallocate(a, 3 * MiB);
  arena.deallocate(b, 3 * MiB);
  // One free block spans both growth steps: no new granule for their sum.
  void* whole = arena.allocate(6 * MiB);
  CHECK(whole == vmm->range_base());
  CHECK(vmm->committed_bytes() == 3 * G);
  // Small blocks come from superblocks carved out of the same chunk.
  void* small = arena.allocate(4 * KiB);
  CHECK(addr(small) >= addr(vmm->range_base()));
  CHECK(addr(small) < addr(vmm->range_base()) + arena.held_bytes());
  arena.deallocate(small, 4 * KiB);
  arena.deallocate(whole, 6 * MiB);
  CHECK(arena.check_invariants() == "");
}

TEST_CASE("arena > simulated_vmm: the maximum caps what is committed, and the refusal says why") {
  auto vmm = make_vmm();
  arena_memory_resource arena{vmm, 16 * MiB, small_options()};
  void* a = arena.allocate(12 * MiB);
  try {
    (void)arena.allocate(8 * MiB);
    FAIL("the arena's maximum was passed");
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), Catch::Contains("arena"));
    CHECK_THAT(e.what(), Catch::Contains("maximum"));
  }
  CHECK(vmm->committed_bytes() <= 16 * MiB);
  arena.deallocate(a, 12 * MiB);
  CHECK(arena.check_invariants() == "");
}

TEST_CASE("arena > simulated_vmm: a full device makes the arena give free granules back before failing") {
  auto vmm = make_vmm(32 * MiB);  // the device: 16 granules
  arena_options o = small_options();
  arena_memory_resource arena{vmm, 1024 * MiB, o};
  void* a = arena.allocate(20 * MiB);
  void* b = arena.allocate(8 * MiB);
  arena.deallocate(a, 20 * MiB);  // free, still committed (below max_free)
  CHECK(vmm->committed_bytes() == 28 * MiB);
  // 24 MiB do not fit behind b: the 20 MiB in front of it go back and the request is
  // served past b from the granules that freed.
  void* c = nullptr;
  CHECK_NOTHROW(c = arena.allocate(24 * MiB));
  CHECK(vmm->committed_bytes() <= 32 * MiB);
  arena.deallocate(b, 8 * MiB);
  if (c != nullptr) { arena.deallocate(c, 24 * MiB); }
  CHECK(arena.check_invariants() == "");
}

TEST_CASE("arena > simulated_vmm: free granules go back past max_free, and all of them on release()") {
  auto vmm = make_vmm();
  arena_options o = small_options();
  o.max_free_bytes = 8 * MiB;
  arena_memory_resource arena{vmm, 1024 * MiB, o};
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) { blocks.push_back(arena.allocate(4 * MiB)); }
  CHECK(vmm->committed_bytes() == 40 * MiB);
  void* kept = arena.allocate(4 * KiB);  // a superblock stays carved
  for (void* p : blocks) { arena.deallocate(p, 4 * MiB); }
  CHECK(vmm->committed_bytes() < 40 * MiB);  // passing 8 MiB free released granules
  CHECK(arena.stats().upstream_deallocations > 0);
  CHECK(arena.check_invariants() == "");
  arena.deallocate(kept, 4 * KiB);
  arena.release();
  CHECK(vmm->committed_bytes() == 0);
  CHECK(arena.held_bytes() == 0);
  // Holes are reused: growing again commits from the range's base.
  void* again = arena.allocate(4 * MiB);
  CHECK(again == vmm->range_base());
  arena.deallocate(again, 4 * MiB);
  CHECK(arena.check_invariants() == "");
}

TEST_CASE("arena > simulated_vmm: destroying the arena gives every granule back and ends the claim") {
  auto vmm = make_vmm();
  {
    arena_memory_resource arena{vmm, 256 * MiB, small_options()};
    (void)arena.allocate(5 * MiB);  // leaked on purpose
    (void)arena.allocate(1 * KiB);
    CHECK(vmm->committed_bytes() > 0);
  }
  CHECK(vmm->committed_bytes() == 0);
  CHECK(vmm->claimant().empty());
}

TEST_CASE("arena > simulated_vmm: grow_in_place=false and eager keep the chunk behaviour") {
  auto vmm = make_vmm();
  SECTION("grow_in_place=false") {
    arena_options o = small_options();
    o.grow_in_place = false;
    arena_memory_resource arena{vmm, 256 * MiB, o};
    CHECK_FALSE(arena.grows_in_place());
    CHECK(vmm->claimant().empty());
    void* a = arena.allocate(3 * MiB);
    CHECK(arena.stats().upstream_allocations == 1);
    arena.deallocate(a, 3 * MiB);
  }
  SECTION("eager") {
    arena_options o = small_options();
    o.eager = true;
    arena_memory_resource arena{vmm, 64 * MiB, o};
    CHECK_FALSE(arena.grows_in_place());
    CHECK(arena.held_bytes() >= 64 * MiB);
  }
  SECTION("the spec") {
    auto in_place = make_stack("arena(size=64MiB) > simulated_vmm(capacity=1GiB)");
    auto chunks = make_stack("arena(size=64MiB, grow_in_place=false) > simulated_vmm(capacity=1GiB)");
    CHECK(dynamic_cast<arena_memory_resource&>(*in_place).grows_in_place());
    CHECK_FALSE(dynamic_cast<arena_memory_resource&>(*chunks).grows_in_place());
  }
}

TEST_CASE("arena > simulated_vmm: 8 threads grow and shrink it at once; no two live blocks overlap") {
  auto vmm = make_vmm();
  arena_options o = small_options();
  o.max_free_bytes = 4 * MiB;  // granules go back all the time
  arena_memory_resource arena{vmm, 1024 * MiB, o};
  std::mutex live_mutex;
  std::map<std::uintptr_t, std::size_t> live;  // simulated memory cannot be written: check ranges
  std::atomic<int> overlaps{0};
  auto note = [&](void* p, std::size_t bytes) {
    std::lock_guard lock{live_mutex};
    auto const a = addr(p);
    auto next = live.lower_bound(a);
    if (next != live.end() && next->first < a + bytes) { overlaps.fetch_add(1); }
    if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > a) { overlaps.fetch_add(1); }
    live.emplace(a, bytes);
  };
  auto forget = [&](void* p) {
    std::lock_guard lock{live_mutex};
    live.erase(addr(p));
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 7};
      std::vector<std::pair<void*, std::size_t>> mine;
      auto const stream = t % 2 == 0 ? stream_view::per_thread() : stream_view{};
      for (int step = 0; step < 3000; ++step) {
        if (mine.empty() || rng() % 100 < 52) {
          std::size_t const bytes = rng() % 6 == 0 ? 64 * KiB + rng() % (6 * MiB) : 1 + rng() % (64 * KiB);
          void* p = arena.allocate(bytes, stream);
          note(p, bytes);
          mine.emplace_back(p, bytes);
        } else {
          std::size_t const i = rng() % mine.size();
          forget(mine[i].first);  // before the free: another thread may get it right after
          arena.deallocate(mine[i].first, mine[i].second, stream);
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (auto [p, bytes] : mine) {
        forget(p);
        arena.deallocate(p, bytes, stream);
      }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(overlaps.load() == 0);
  CHECK(arena.check_invariants() == "");
  CHECK(arena.stats().upstream_deallocations > 0);
  arena.release();
  CHECK(vmm->committed_bytes() == 0);
}
