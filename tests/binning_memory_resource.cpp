// binning_memory_resource: routing by size and alignment, power-of-two and custom bins,
// the large fallback, random sequences over real memory (contents checked), and
// free_bytes_held()/fragmentation() over stacks that share layers.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

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
  mr.add_bin(3072);                        // a non-power-of-two bin
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

// free_bytes_held() against the ground truth: each layer's own free bytes, once per layer,
// however many bins (or the large resource) stand on it. simulated holds nothing free.
TEST_CASE("binning: a pool under two bins counts its free bytes once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto shared = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  auto small = std::make_shared<pool_memory_resource>(shared, 1 * MiB);
  auto medium = std::make_shared<pool_memory_resource>(shared, 1 * MiB);
  binning_memory_resource mr{sim};
  mr.add_bin(512, small);
  mr.add_bin(1 * KiB, medium);
  void* a = mr.allocate(300);
  void* b = mr.allocate(1000);
  REQUIRE(shared->free_bytes() > 0);
  std::size_t const truth = small->free_bytes() + medium->free_bytes() + shared->free_bytes();
  CHECK(mr.free_bytes_held() == truth);
  mr.deallocate(a, 300);
  mr.deallocate(b, 1000);
}

TEST_CASE("binning: fixed_size bins over a shared pool count the pool's free bytes once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto shared = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  auto f512 = std::make_shared<fixed_size_memory_resource>(shared, 512, 128);
  auto f1k = std::make_shared<fixed_size_memory_resource>(shared, 1 * KiB, 128);
  binning_memory_resource mr{sim};
  mr.add_bin(512, f512, f512->block_alignment());
  mr.add_bin(1 * KiB, f1k, f1k->block_alignment());
  void* a = mr.allocate(300);
  void* b = mr.allocate(1000);
  REQUIRE(shared->free_bytes() > 0);
  CHECK(mr.free_bytes_held() == f512->free_bytes() + f1k->free_bytes() + shared->free_bytes());
  // The same bins with the pool as binning's own upstream: the same figure.
  binning_memory_resource over_pool{shared};
  over_pool.add_bin(512, f512, f512->block_alignment());
  over_pool.add_bin(1 * KiB, f1k, f1k->block_alignment());
  CHECK(over_pool.free_bytes_held() == mr.free_bytes_held());
  mr.deallocate(a, 300);
  mr.deallocate(b, 1000);
}

TEST_CASE("binning: a pool under a bin and the large resource counts its free bytes once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto up = std::make_shared<pool_memory_resource>(sim, 16 * MiB);
  auto large = std::make_shared<pool_memory_resource>(up, 4 * MiB);
  auto custom = std::make_shared<pool_memory_resource>(large, 1 * MiB);
  binning_memory_resource mr{up, 256, 4 * KiB, large};  // default bins: fixed_size over up
  mr.add_bin(8 * KiB, custom);
  void* a = mr.allocate(300);
  void* b = mr.allocate(6 * KiB);
  void* c = mr.allocate(64 * KiB);
  std::size_t bins = 0;
  for (auto const& bin : mr.bins()) {
    if (auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(bin.resource.get())) {
      bins += fixed->free_bytes();
    }
  }
  REQUIRE(large->free_bytes() > 0);
  REQUIRE(up->free_bytes() > 0);
  CHECK(mr.free_bytes_held() == bins + custom->free_bytes() + large->free_bytes() + up->free_bytes());
  mr.deallocate(a, 300);
  mr.deallocate(b, 6 * KiB);
  mr.deallocate(c, 64 * KiB);
}

TEST_CASE("binning: one pool serving two bins and the large requests is counted once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  binning_memory_resource mr{sim, pool};
  mr.add_bin(512, pool);
  mr.add_bin(1 * KiB, pool);
  void* a = mr.allocate(300);
  void* b = mr.allocate(1000);
  void* c = mr.allocate(64 * KiB);
  REQUIRE(pool->free_bytes() > 0);
  CHECK(mr.free_bytes_held() == pool->free_bytes());
  auto const whole = mr.fragmentation();
  auto const own = pool->fragmentation();
  CHECK(whole.held_bytes == own.held_bytes);
  CHECK(whole.live_bytes == own.live_bytes);
  CHECK(whole.free_bytes == own.free_bytes);
  CHECK(whole.free_blocks == own.free_blocks);
  mr.deallocate(a, 300);
  mr.deallocate(b, 1000);
  mr.deallocate(c, 64 * KiB);
}

TEST_CASE("binning: a bin size that is not a multiple of 256 is refused, and no bin changes") {
  // Rounded up, 300 B named the 512 B bin, which it replaced unseen.
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim, 256, 1024};
  std::vector<binning_memory_resource::bin> const before = mr.bins();
  for (std::size_t const bad : {std::size_t{1}, std::size_t{255}, std::size_t{300}, std::size_t{3000}}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(mr.add_bin(bad), Catch::Contains("a bin of " + std::to_string(bad) + " B") &&
                                           Catch::Contains("multiples of 256 B"));
    auto fixed = std::make_shared<fixed_size_memory_resource>(sim, 512, 8);
    CHECK_THROWS_AS(mr.add_bin(bad, fixed), logic_error);
  }
  REQUIRE(mr.bins().size() == before.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    CHECK(mr.bins()[i].size == before[i].size);
    CHECK(mr.bins()[i].resource == before[i].resource);
  }
}

TEST_CASE("binning: a request goes to the smallest bin whose blocks are aligned enough, and its free follows") {
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim};
  auto aligned = std::make_shared<fixed_size_memory_resource>(sim, 4096, 16);  // 4 KiB blocks, 4 KiB-aligned
  mr.add_bin(256, aligned, 4096);  // served as a 256 B bin whose blocks are 4 KiB-aligned
  mr.add_bin(1024);
  mr.add_bin(8192);
  // Indexed by max(size, alignment), the lookup began past the 256 B bin.
  CHECK(&mr.resource_for(100, 4096) == aligned.get());
  CHECK(&mr.resource_for(256, 1024) == aligned.get());
  CHECK(&mr.resource_for(257, 1024) == mr.bins()[1].resource.get());
  CHECK(&mr.resource_for(1000, 4096) == mr.bins()[2].resource.get());  // 1 KiB bin: aligned to 1 KiB only
  CHECK(&mr.resource_for(100, 16384) == &mr.large_resource());
  CHECK(&mr.resource_for(8193) == &mr.large_resource());
  void* p = mr.allocate(100, {}, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  CHECK(aligned->free_blocks() + 1 == aligned->total_blocks());
  mr.deallocate(p, 100, {}, 4096);  // routed the same way: the bin that holds it
  CHECK(aligned->free_blocks() == aligned->total_blocks());
}

TEST_CASE("binning: a bin added after the first allocation is refused, and nothing changes") {
  // A replaced bin's fixed_size was destroyed with a block out (its memory went back to
  // the upstream while in use), and a new bin took the frees of blocks the large resource
  // had served.
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim, 256, 1024};
  void* p = mr.allocate(256);
  void* q = mr.allocate(3000);  // the large resource's
  std::size_t const footprint = sim->footprint();
  std::vector<binning_memory_resource::bin> const before = mr.bins();
  CHECK_THROWS_WITH(mr.add_bin(256), Catch::Contains("a bin of 256 B added after the first allocation") &&
                                         Catch::Contains("nothing was added"));
  CHECK_THROWS_AS(mr.add_bin(4096), logic_error);
  CHECK(sim->footprint() == footprint);
  REQUIRE(mr.bins().size() == before.size());
  for (std::size_t i = 0; i < before.size(); ++i) { CHECK(mr.bins()[i].resource == before[i].resource); }
  mr.deallocate(p, 256);
  mr.deallocate(q, 3000);
}

TEST_CASE("binning: a fixed_size bin that cannot serve its requests is refused when added") {
  // It was accepted, and every request it was given failed in the fixed_size with an
  // error naming only the fixed_size's block size; an alignment asked of a bin made here
  // was dropped without a word.
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim};
  auto small = std::make_shared<fixed_size_memory_resource>(sim, 512, 4);
  CHECK_THROWS_WITH(mr.add_bin(1024, small), Catch::Contains("a bin of 1024 B served by a fixed_size of 512 B blocks"));
  CHECK_THROWS_WITH(mr.add_bin(512, small, 4096),
                    Catch::Contains("aligned to 4096 B, but its fixed_size blocks are aligned to 512 B"));
  CHECK_THROWS_WITH(mr.add_bin(768, nullptr, 1024), Catch::Contains("aligned to 256 B only"));
  CHECK(mr.bins().empty());
  mr.add_bin(512, small, 512);  // what it can serve
  mr.add_bin(1024, nullptr, 1024);
  REQUIRE(mr.bins().size() == 2);
  CHECK(mr.bins()[1].alignment == 1024);
}

TEST_CASE("binning: with 255 bins, a bin of a size present is replaced") {
  // "at most 255 bins" was thrown for a replacement too, which adds none.
  auto sim = std::make_shared<simulated_memory_resource>();
  binning_memory_resource mr{sim};
  for (std::size_t i = 1; i <= 255; ++i) { mr.add_bin(256 * i, sim); }
  auto fixed = std::make_shared<fixed_size_memory_resource>(sim, 512, 4);
  mr.add_bin(512, fixed, 512);
  CHECK(mr.bins().size() == 255);
  CHECK(mr.bins()[1].resource == fixed);
  CHECK_THROWS_WITH(mr.add_bin(256 * 256, sim), "binning: at most 255 bins");
}
