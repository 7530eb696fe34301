// binning_memory_resource: routing by size and alignment, power-of-two and custom bins,
// the large fallback, and random sequences over real memory (contents checked).
#include <catch2/catch.hpp>

#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstring>
#include <map>
#include <random>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
}  // namespace

TEST_CASE("binning: power-of-two bins from min to max; bigger requests go to the upstream") {
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim, 1000, 64 * KiB};  // min rounds up to 1 KiB
  CHECK(mr.name() == "binning");
  REQUIRE(mr.bins().size() == 7);  // 1, 2, 4, ..., 64 KiB
  for (std::size_t i = 0; i < mr.bins().size(); ++i) {
    CHECK(mr.bins()[i].size == (KiB << i));
    CHECK(mr.bins()[i].alignment == (KiB << i));
  }
  CHECK(&mr.resource_for(1) == mr.bins()[0].resource.get());
  CHECK(&mr.resource_for(1 * KiB) == mr.bins()[0].resource.get());
  CHECK(&mr.resource_for(1 * KiB + 1) == mr.bins()[1].resource.get());
  CHECK(&mr.resource_for(64 * KiB) == mr.bins()[6].resource.get());
  CHECK(&mr.resource_for(64 * KiB + 1) == sim.get());
  CHECK(&mr.resource_for(100, 16 * KiB) == mr.bins()[4].resource.get());  // alignment picks a bigger bin
  CHECK(&mr.resource_for(100, 128 * KiB) == sim.get());

  void* big = mr.allocate(1 * MiB);
  CHECK(sim->owns(big));
  mr.deallocate(big, 1 * MiB);
  void* aligned = mr.allocate(300, {}, 32 * KiB);
  CHECK(detail::is_aligned(aligned, 32 * KiB));
  mr.deallocate(aligned, 300, {}, 32 * KiB);
  CHECK_THROWS_AS(binning_memory_resource(sim, 64 * KiB, 1 * KiB), logic_error);
}

TEST_CASE("binning: custom bins, custom bin resources and a large resource of choice") {
  auto sys = std::make_shared<system_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sys, 0);
  binning_memory_resource mr{sys, pool};  // no bins yet; large requests go to the pool
  mr.add_bin(3000);                        // a non-power-of-two bin (rounded to 3072)
  mr.add_bin(768);
  auto fixed = std::make_shared<fixed_size_memory_resource>(sys, 16 * KiB, 8);
  mr.add_bin(16 * KiB, fixed, fixed->block_alignment());
  REQUIRE(mr.bins().size() == 3);
  CHECK(mr.bins()[0].size == 768);
  CHECK(mr.bins()[1].size == 3072);
  CHECK(mr.bins()[2].resource == fixed);
  CHECK(&mr.resource_for(700) == mr.bins()[0].resource.get());
  CHECK(&mr.resource_for(769) == mr.bins()[1].resource.get());
  CHECK(&mr.resource_for(3072) == mr.bins()[1].resource.get());
  CHECK(&mr.resource_for(3073) == fixed.get());
  CHECK(&mr.resource_for(16 * KiB + 1) == pool.get());
  CHECK(&mr.resource_for(700, 1024) == mr.bins()[1].resource.get());  // 3072-byte blocks are 1 KiB-aligned
  CHECK(&mr.resource_for(700, 2048) == fixed.get());

  std::mt19937_64 rng{5};
  std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>> live;
  for (int step = 0; step < 40000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      std::size_t const bytes = 1 + rng() % (rng() % 4 == 0 ? 64 * KiB : 4 * KiB);
      auto* p = static_cast<unsigned char*>(mr.allocate(bytes));
      auto const a = reinterpret_cast<std::uintptr_t>(p);
      REQUIRE(a % 256 == 0);
      auto next = live.lower_bound(a);
      if (next != live.end()) { REQUIRE(a + bytes <= next->first); }
      if (next != live.begin()) { REQUIRE(std::prev(next)->first + std::prev(next)->second.first <= a); }
      auto const tag = static_cast<unsigned char>(rng());
      std::memset(p, tag, bytes);
      live.emplace(a, std::make_pair(bytes, tag));
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      auto* p = reinterpret_cast<unsigned char*>(it->first);
      REQUIRE(p[0] == it->second.second);
      REQUIRE(p[it->second.first - 1] == it->second.second);
      mr.deallocate(p, it->second.first);
      live.erase(it);
    }
  }
  for (auto const& [a, v] : live) { mr.deallocate(reinterpret_cast<void*>(a), v.first); }
  CHECK(pool->used_bytes() == 0);
  CHECK(fixed->free_blocks() == fixed->total_blocks());
  CHECK(mr.free_bytes_held() >= fixed->free_bytes() + pool->free_bytes());
  mr.release();
  CHECK(pool->pool_size() == 0);
  CHECK(fixed->chunk_count() == 0);
}
