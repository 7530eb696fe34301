// A thread shard's slab on its way back to the pool's global blocks when host memory runs
// out, at each host allocation of the call in turn: the slab's free into the global
// blocks may need host memory (its owner's index, a class-array entry of the block it
// merges into). Taken out of the shard before that free, a failed free left the slab a
// live global block that no shard held: its memory counted as used, and never went back
// to the upstream until the pool was destroyed. The same for a fresh slab the shard
// could not take (no host memory for its books): given back, and that free failed too.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const c{reinterpret_cast<cudaStream_t>(0x300)};

pool_options sharded_options() {
  pool_options o;
  o.shard_after_contentions = 0;  // sharded from the second thread on
  o.stream_sync = std::make_shared<test::thread_stream_seam>();
  return o;
}

/// Runs `call` with host allocations failing after the first `k`; true when it threw.
template <typename Call>
bool threw_with_allocations_left(long k, Call&& call) {
  bool threw = false;
  test::host_allocations_left = k;
  try {
    call();
  } catch (std::exception const&) {
    threw = true;
  }
  test::host_allocations_left = -1;
  return threw;
}

/// Everything freed: nothing may count as used, and a release gives every chunk back
/// (a slab no shard holds is a live global block: its chunk stays).
std::string what_is_lost(pool_memory_resource& mr, simulated_memory_resource const& upstream) {
  std::string lost;
  if (std::size_t const used = mr.stats().used_bytes; used != 0) { lost += "used " + std::to_string(used) + " B; "; }
  if (std::string const broken = mr.check_invariants(); !broken.empty()) { lost += broken + "; "; }
  mr.release();
  if (upstream.footprint() != 0) { lost += "after release, upstream holds " + std::to_string(upstream.footprint()) + " B"; }
  return lost;
}

/// Runs `scenario(k, mr, misreported)` on a fresh sharded pool whose first thread has
/// called, for k = 0..159 host allocations left; then no run may have lost memory (see
/// what_is_lost) and none may have misreported a call.
template <typename Scenario>
void check_each_allocation_failing(Scenario&& scenario) {
  int lost = 0;
  int misreported = 0;
  std::string first_loss;
  for (long k = 0; k < 160; ++k) {
    auto upstream = std::make_shared<simulated_memory_resource>();
    pool_memory_resource mr{upstream, 0, std::nullopt, sharded_options()};
    mr.deallocate(mr.allocate(256, a), 256, a);  // the first thread
    scenario(k, mr, misreported);
    if (std::string const why = what_is_lost(mr, *upstream); !why.empty()) {
      if (lost++ == 0) { first_loss = "with " + std::to_string(k) + " host allocations left: " + why; }
    }
  }
  INFO("first loss " << first_loss);
  CHECK(lost == 0);
  CHECK(misreported == 0);
}

}  // namespace

TEST_CASE("pool slabs: a give-back out of host memory loses no slab, at any of its allocations") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // As in tests/pool_shard_cases.cpp: the mover's shard holds two slabs of created stream
  // a's memory, the second with one live block; a drain on c may not hand them back, so
  // the shard awaits a call naming a. This thread's free of that last block, on a, is
  // such a call: the block is freed, then both slabs go back to the global blocks.
  check_each_allocation_failing([](long k, pool_memory_resource& mr, int& misreported) {
    void* last = nullptr;
    std::thread mover{[&] {
      std::vector<void*> blocks;  // more than the first 4 MiB slab holds: two slabs
      for (int i = 0; i < 100; ++i) { blocks.push_back(mr.allocate(64 * KiB, a)); }
      last = blocks.back();
      blocks.pop_back();
      for (void* p : blocks) { mr.deallocate(p, 64 * KiB, a); }
    }};
    mover.join();
    void* big = mr.allocate(512 * MiB, c);  // its growth's drain awaits a for the free slab
    if (threw_with_allocations_left(k, [&] { mr.deallocate(last, 64 * KiB, a); })) {
      try {  // refused with nothing changed: it is freed now
        mr.deallocate(last, 64 * KiB, a);
      } catch (std::exception const&) {
        ++misreported;  // it had gone through, and said it had failed
      }
    }
    mr.deallocate(big, 512 * MiB, c);
  });
}

TEST_CASE("pool slabs: a refill out of host memory loses no slab, at any of its allocations") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // A shard's thread fills its first 4 MiB slab, then asks for a block that needs a
  // second slab: taking it from the global blocks and making it the shard's chunk both
  // need host memory.
  check_each_allocation_failing([](long k, pool_memory_resource& mr, int& misreported) {
    std::thread mover{[&] {
      std::vector<void*> blocks;
      for (int i = 0; i < 4; ++i) { blocks.push_back(mr.allocate(MiB, a)); }
      std::size_t const used = mr.stats().used_bytes;
      void* p = nullptr;
      bool const threw = threw_with_allocations_left(k, [&] { p = mr.allocate(MiB, a); });
      if (threw != (mr.stats().used_bytes == used)) { ++misreported; }
      if (!threw) { blocks.push_back(p); }
      for (void* b : blocks) { mr.deallocate(b, MiB, a); }
    }};
    mover.join();
  });
}

TEST_CASE("pool slabs: a slab the page map cannot be written for goes back, at any host allocation") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  MRSTACK_TEST_NEEDS_CALLOC_FAILURES();
  // A shard's second slab lies past a 200 GiB block, in 2 MiB pages no level of the page
  // map covered yet: mapping it to the shard calloc'ed a level. Out of host memory there,
  // the slab went back to the global blocks, and that free wanted host memory too (the
  // slab came from the initial chunk's synchronized memory and went back as stream a's,
  // which had no free memory there): failing, it left the slab a live global block that
  // no shard held.
  constexpr std::size_t GiB = 1024 * MiB;
  int lost = 0;
  int misreported = 0;
  std::string first_loss;
  for (long k = 0; k < 40; ++k) {
    auto upstream = std::make_shared<simulated_memory_resource>();
    pool_memory_resource mr{upstream, 201 * GiB, std::nullopt, sharded_options()};
    void* first = mr.allocate(256, c);  // the first thread, on another stream than a
    void* big = nullptr;
    std::thread mover{[&] {
      std::vector<void*> blocks;
      for (int i = 0; i < 4; ++i) { blocks.push_back(mr.allocate(MiB, a)); }  // the first slab, full
      std::thread other{[&] { big = mr.allocate(200 * GiB, a); }};
      other.join();
      std::size_t const used = mr.stats().used_bytes;
      void* p = nullptr;
      test::callocs_can_fail = true;
      bool const threw = threw_with_allocations_left(k, [&] { p = mr.allocate(MiB, a); });
      test::callocs_can_fail = false;
      if (threw != (mr.stats().used_bytes == used)) { ++misreported; }
      if (!threw) { blocks.push_back(p); }
      for (void* b : blocks) { mr.deallocate(b, MiB, a); }
    }};
    mover.join();
    mr.deallocate(big, 200 * GiB, a);
    mr.deallocate(first, 256, c);
    if (std::string const why = what_is_lost(mr, *upstream); !why.empty()) {
      if (lost++ == 0) { first_loss = "with " + std::to_string(k) + " host allocations left: " + why; }
    }
  }
  INFO("first loss " << first_loss);
  CHECK(lost == 0);
  CHECK(misreported == 0);
}

TEST_CASE("pool slabs: a sharded pool's chunk whose page-map levels cannot be made goes back") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  MRSTACK_TEST_NEEDS_CALLOC_FAILURES();
  // Sharded, a chunk the pool grows gets its page-map levels before it joins the global
  // blocks (a slab taken from it is then mapped without host memory): out of host memory
  // for them, the chunk goes back to the upstream and the request fails whole.
  constexpr std::size_t GiB = 1024 * MiB;
  int leaked = 0;
  int failed = 0;
  for (long k = 0; k < 24; ++k) {
    auto upstream = std::make_shared<simulated_memory_resource>();
    pool_memory_resource mr{upstream, 0, std::nullopt, sharded_options()};
    mr.deallocate(mr.allocate(256, a), 256, a);  // the first thread
    std::thread second{[&] {
      mr.deallocate(mr.allocate(256, a), 256, a);  // sharded from here
      std::size_t const footprint = upstream->footprint();
      void* p = nullptr;
      test::callocs_can_fail = true;
      bool const threw = threw_with_allocations_left(k, [&] { p = mr.allocate(300 * GiB, a); });
      test::callocs_can_fail = false;
      if (threw) {
        ++failed;
        // (Growth may give free chunks back first: the footprint may drop.)
        if (upstream->footprint() > footprint || !mr.check_invariants().empty()) { ++leaked; }
      } else {
        mr.deallocate(p, 300 * GiB, a);
      }
    }};
    second.join();
    mr.release();
    if (upstream->footprint() != 0) { ++leaked; }
  }
  CHECK(failed > 0);
  CHECK(leaked == 0);
}
