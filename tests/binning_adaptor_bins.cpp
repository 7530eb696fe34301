// binning_memory_resource::fragmentation() when a bin or the large resource is an adaptor
// (statistics, tracking, ...) over a suballocator: an adaptor answers fragmentation() with
// its upstream's figures, so the suballocator behind it is what is added, once, and the
// upstream's figures stay out as when the upstream itself serves a bin.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

void check_same(fragmentation_info const& whole, fragmentation_info const& own) {
  CHECK(whole.held_bytes == own.held_bytes);
  CHECK(whole.live_bytes == own.live_bytes);
  CHECK(whole.free_bytes == own.free_bytes);
  CHECK(whole.free_blocks == own.free_blocks);
}
}  // namespace

TEST_CASE("binning: a pool behind an adaptor bin and as the large resource is added to fragmentation once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  auto counted = std::make_shared<statistics_resource_adaptor>(pool);
  binning_memory_resource mr{sim, pool};
  mr.add_bin(512, counted);
  void* a = mr.allocate(300);
  void* c = mr.allocate(64 * KiB);
  REQUIRE(pool->free_bytes() > 0);
  CHECK(mr.free_bytes_held() == pool->free_bytes());  // counted once here already
  check_same(mr.fragmentation(), pool->fragmentation());
  mr.deallocate(a, 300);
  mr.deallocate(c, 64 * KiB);
}

TEST_CASE("binning: a pool behind two adaptor bins is added to fragmentation once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  binning_memory_resource mr{sim};
  mr.add_bin(512, std::make_shared<statistics_resource_adaptor>(pool));
  mr.add_bin(1 * KiB, std::make_shared<tracking_resource_adaptor>(pool));
  void* a = mr.allocate(300);
  void* b = mr.allocate(1000);
  REQUIRE(pool->free_bytes() > 0);
  check_same(mr.fragmentation(), pool->fragmentation());
  mr.deallocate(a, 300);
  mr.deallocate(b, 1000);
}

TEST_CASE("binning: an adaptor over the upstream leaves the upstream's fragmentation out, as the upstream does") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto up = std::make_shared<pool_memory_resource>(sim, 4 * MiB);
  binning_memory_resource plain{up};
  plain.add_bin(512, up);
  binning_memory_resource wrapped{up, std::make_shared<statistics_resource_adaptor>(up)};
  wrapped.add_bin(512, std::make_shared<statistics_resource_adaptor>(up));
  void* a = wrapped.allocate(300);
  void* c = wrapped.allocate(64 * KiB);
  REQUIRE(up->free_bytes() > 0);
  check_same(wrapped.fragmentation(), plain.fragmentation());
  CHECK(wrapped.free_bytes_held() == plain.free_bytes_held());
  wrapped.deallocate(a, 300);
  wrapped.deallocate(c, 64 * KiB);
}
