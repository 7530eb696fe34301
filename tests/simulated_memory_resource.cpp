// The simulated upstream: distinct aligned addresses, exact footprint, checked frees,
// capacity, and address reuse — tested against a simple model.
#include <catch2/catch.hpp>

#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <map>
#include <random>

using namespace mrstack;

TEST_CASE("simulated: footprint, peak and counts are exact") {
  simulated_memory_resource sim;
  void* a = sim.allocate(1);
  void* b = sim.allocate(300);
  CHECK(sim.footprint() == 256 + 512);
  CHECK(sim.allocation_count() == 2);
  sim.deallocate(a, 1);
  CHECK(sim.footprint() == 512);
  CHECK(sim.peak_footprint() == 768);
  sim.deallocate(b, 300);
  CHECK(sim.footprint() == 0);
  CHECK(sim.total_allocations() == 2);
  CHECK(sim.kind() == memory_kind::none);
}

TEST_CASE("simulated: foreign, double and wrong-size frees are logic_errors naming the pointer") {
  simulated_memory_resource sim;
  void* a = sim.allocate(1000);
  CHECK_THROWS_WITH(sim.deallocate(a, 999), Catch::Contains("allocated with 1000 B"));
  int on_stack = 0;
  CHECK_THROWS_WITH(sim.deallocate(&on_stack, 4), Catch::Contains("did not hand out"));
  sim.deallocate(a, 1000);
  CHECK_THROWS_WITH(sim.deallocate(a, 1000), Catch::Contains("already freed"));
}

TEST_CASE("simulated: a free with another alignment is refused, naming both, and frees nothing") {
  simulated_memory_resource sim;
  void* p = sim.allocate(1000, {}, 256);
  CHECK_THROWS_WITH(sim.deallocate(p, 1000, {}, 4096),
                    Catch::Contains("deallocate of " + format_hex(p) + " with size 1000 B and alignment 4096") &&
                        Catch::Contains("allocated with 1000 B and alignment 256 (nothing was freed)"));
  CHECK(sim.owns(p));
  CHECK(sim.footprint() == 1024);
  void* q = sim.allocate(1000, {}, 65536);
  CHECK_THROWS_WITH(sim.deallocate(q, 1000), Catch::Contains("alignment 65536"));
  sim.deallocate(q, 1000, {}, 65536);
  sim.deallocate(p, 1000, {}, 16);  // alignments below 256 count as 256, as everywhere
  CHECK(sim.allocation_count() == 0);
}

TEST_CASE("simulated: capacity refuses like a full device") {
  simulated_memory_resource sim{1 << 20};
  void* a = sim.allocate(1 << 19);
  void* b = sim.allocate(1 << 19);
  try {
    (void)sim.allocate(1);
    FAIL("allocated past capacity");
  } catch (out_of_memory const& e) {
    CHECK(e.info().limit_bytes == std::size_t{1 << 20});
    CHECK(e.info().footprint_bytes == std::size_t{1 << 20});
    CHECK_THAT(e.what(), Catch::Contains("simulated could not allocate 1 B"));
  }
  sim.deallocate(a, 1 << 19);
  sim.deallocate(b, 1 << 19);
  CHECK_THROWS_AS(sim.allocate(std::size_t(-1)), out_of_memory);
}

TEST_CASE("simulated: a small range runs out, then reuses freed addresses") {
  simulated_memory_resource sim{std::numeric_limits<std::size_t>::max(), simulated_memory_resource::default_base, 4096};
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(sim.allocate(256)); }
  CHECK_THROWS_WITH(sim.allocate(256), Catch::Contains("address range exhausted"));
  sim.deallocate(blocks[5], 256);
  sim.deallocate(blocks[6], 256);
  void* again = sim.allocate(512);  // the two neighbours merged
  CHECK(again == blocks[5]);
}

TEST_CASE("simulated: randomized model — no overlap, alignment, exact footprint") {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    std::mt19937_64 rng{seed};
    simulated_memory_resource sim{std::numeric_limits<std::size_t>::max(), simulated_memory_resource::default_base,
                                  std::size_t{1} << 30};
    std::map<std::uintptr_t, std::pair<std::size_t, std::size_t>> live;  // address -> (bytes, alignment)
    std::size_t model_footprint = 0;
    for (int step = 0; step < 20000; ++step) {
      if (live.empty() || rng() % 100 < 60) {
        std::size_t const bytes = 1 + rng() % (1 << 16);
        std::size_t const align = std::size_t{1} << (rng() % 14);
        auto const p = reinterpret_cast<std::uintptr_t>(sim.allocate(bytes, {}, align));
        REQUIRE(p % std::max<std::size_t>(align, 256) == 0);
        std::size_t const span = detail::align_up(bytes, 256);
        auto next = live.lower_bound(p);
        if (next != live.end()) { REQUIRE(p + span <= next->first); }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          REQUIRE(prev->first + detail::align_up(prev->second.first, 256) <= p);
        }
        live.emplace(p, std::make_pair(bytes, align));
        model_footprint += span;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        sim.deallocate(reinterpret_cast<void*>(it->first), it->second.first, {}, it->second.second);
        model_footprint -= detail::align_up(it->second.first, 256);
        live.erase(it);
      }
      REQUIRE(sim.footprint() == model_footprint);
      REQUIRE(sim.allocation_count() == live.size());
    }
  }
}

TEST_CASE("simulated: a range past the top of the address space is refused at construction") {
  // It wrapped: the second 256-byte block was nullptr, a 512-byte one 0x100.
  CHECK_THROWS_WITH(simulated_memory_resource(SIZE_MAX, 0xffffffffffffff00, 1 << 20),
                    Catch::Contains("passes the top of the address space"));
  CHECK_THROWS(simulated_memory_resource(SIZE_MAX, 0xffffffffffffff00, 256));  // its end, 2^64, wraps to 0
  simulated_memory_resource last{SIZE_MAX, 0xfffffffffffffe00, 256};  // the highest range it can have
  CHECK(last.allocate(256) == reinterpret_cast<void*>(0xfffffffffffffe00));
}
