// The arena takes memory on demand: nothing at construction, chunks when first needed,
// never more than its maximum, wholly free chunks back to the upstream once it holds
// more than `max_free_bytes` free; eager keeps the old take-it-all behaviour. Also its
// fragmentation report, and many threads growing and shrinking it at once (run under the
// tsan preset).
#include <catch2/catch.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

arena_options small_options() {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 2;
  o.max_free_bytes = 8 * MiB;
  o.minimum_growth = 4 * MiB;
  return o;
}
}  // namespace

TEST_CASE("arena growth: nothing at construction, chunks on demand, never above the maximum") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr{sim, 64 * MiB, small_options()};
  CHECK(sim->footprint() == 0);
  CHECK(mr.held_bytes() == 0);
  void* small = mr.allocate(1000);
  CHECK(mr.held_bytes() >= 1 * MiB);
  CHECK(mr.held_bytes() <= 8 * MiB);
  CHECK(sim->footprint() == mr.held_bytes());
  std::vector<void*> big;
  for (int i = 0; i < 5; ++i) { big.push_back(mr.allocate(10 * MiB)); }
  CHECK(mr.held_bytes() <= 64 * MiB);
  CHECK(mr.check_invariants() == "");
  // 50 MiB live + a superblock: another 10 MiB may not fit under 64 MiB (chunks need room
  // to align), but whatever happens the maximum holds and a refusal names it.
  try {
    big.push_back(mr.allocate(30 * MiB));
    FAIL("expected out_of_memory");
  } catch (out_of_memory const& e) {
    CHECK(*e.info().limit_bytes == 64 * MiB);
    CHECK(*e.info().footprint_bytes <= 64 * MiB);
    CHECK(std::string{e.what()}.find("maximum") != std::string::npos);
  }
  CHECK(sim->peak_footprint() <= 64 * MiB);
  for (void* p : big) { mr.deallocate(p, 10 * MiB); }
  mr.deallocate(small, 1000);
  // 50 MiB came free: all but max_free_bytes (8 MiB) went back at once.
  CHECK(mr.stats().global_free_bytes <= 8 * MiB + 10 * MiB);
  CHECK(mr.check_invariants() == "");
  mr.release();
  CHECK(mr.held_bytes() == 0);
  CHECK(sim->footprint() == 0);
}

TEST_CASE("arena growth: the free bytes it keeps are bounded by max_free_bytes") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options = small_options();
  options.empty_superblocks_kept = 0;  // stream arenas keep nothing: every free superblock goes back
  arena_memory_resource mr{sim, 1024 * MiB, options};
  std::mt19937_64 rng{7};
  for (int cycle = 0; cycle < 6; ++cycle) {
    // Grow to ~200 MiB live with a random mix, then free everything in random order (a
    // training iteration, roughly).
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t live_bytes = 0;
    while (live_bytes < 200 * MiB) {
      std::size_t const bytes = rng() % 4 == 0 ? 1 * MiB + rng() % (8 * MiB) : 1 + rng() % (64 * KiB);
      live.emplace_back(mr.allocate(bytes), bytes);
      live_bytes += bytes;
      if (rng() % 3 == 0) {
        std::size_t const i = rng() % live.size();
        mr.deallocate(live[i].first, live[i].second);
        live_bytes -= live[i].second;
        live[i] = live.back();
        live.pop_back();
      }
    }
    CHECK(mr.held_bytes() >= live_bytes);
    CHECK(mr.held_bytes() <= 1024 * MiB);
    std::shuffle(live.begin(), live.end(), rng);
    for (auto const& [p, bytes] : live) { mr.deallocate(p, bytes); }
    // Every chunk is wholly free now: all but max_free_bytes went back on the frees.
    CHECK(mr.stats().global_free_bytes == mr.held_bytes());
    CHECK(mr.held_bytes() <= options.max_free_bytes);
    CHECK(sim->footprint() == mr.held_bytes());
    REQUIRE(mr.check_invariants() == "");
  }
  CHECK(mr.stats().upstream_deallocations > 0);
}

TEST_CASE("arena growth: a stream arena's superblock batches grow with it, and what it holds idle stays bounded") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options = small_options();  // 1 MiB superblocks, 16 blocks of 64 KiB each, 2 kept
  options.max_free_bytes = 1024 * MiB;
  arena_memory_resource mr{sim, 1024 * MiB, options};
  std::size_t const kept = options.empty_superblocks_kept;
  // Free bytes inside the arena's superblocks: spares, class-list superblocks kept, and at
  // most one partly used superblock (blocks are handed out densely here).
  auto idle_bound = [&](std::size_t superblocks) { return (superblocks / 8 + 3 * kept + 1) * MiB; };
  // Twice: growing to 256 superblocks (from the global arena the first time, from the
  // depot the second), then handing them all back.
  std::size_t most_idle[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    std::vector<void*> blocks;
    for (int i = 0; i < 16 * 256; ++i) {
      blocks.push_back(mr.allocate(64 * KiB));
      auto const st = mr.stats();
      most_idle[round] = std::max(most_idle[round], st.free_bytes_in_arenas);
      REQUIRE(st.free_bytes_in_arenas <= idle_bound(st.superblocks_in_arenas));
    }
    CHECK(mr.check_invariants() == "");
    for (void* p : blocks) {
      mr.deallocate(p, 64 * KiB);
      auto const st = mr.stats();
      REQUIRE(st.free_bytes_in_arenas <= idle_bound(st.superblocks_in_arenas));
    }
    // Wound down, it keeps no more than a small arena would.
    CHECK(mr.stats().superblocks_in_arenas <= 3 * kept);
    CHECK(mr.check_invariants() == "");
  }
  // From the global arena it takes 2 x kept a trip (each superblock is block-pool work
  // under the shared lock); from the depot, more as it grows: it held more spares at once.
  CHECK(most_idle[0] <= (2 * kept + 1) * MiB);
  CHECK(most_idle[1] > (2 * kept + 1) * MiB);
  CHECK(mr.held_bytes() <= 300 * MiB);  // the second round reused the first one's memory
}

TEST_CASE("arena growth: eager takes its whole size at once and keeps it") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options = small_options();
  options.eager = true;
  arena_memory_resource mr{sim, 64 * MiB, options};
  std::size_t const region = 64 * MiB + 1 * MiB - 256;
  CHECK(sim->footprint() == region);
  std::vector<void*> big;
  for (int i = 0; i < 6; ++i) { big.push_back(mr.allocate(10 * MiB)); }
  for (void* p : big) { mr.deallocate(p, 10 * MiB); }
  mr.release();
  CHECK(sim->footprint() == region);  // kept until destruction
  CHECK(mr.stats().upstream_allocations == 1);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena growth: fragmentation reports held, live and free bytes per stream arena") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr{sim, 256 * MiB, small_options()};
  auto const s1 = stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000})};
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) { blocks.push_back(mr.allocate(16 * KiB, s1)); }
  void* big = mr.allocate(3 * MiB, s1);
  auto f = mr.fragmentation();
  CHECK(f.resource == "arena");
  CHECK(f.held_bytes == mr.held_bytes());
  CHECK(f.live_bytes == 10 * 16 * KiB + 3 * MiB);
  CHECK(f.held_bytes == f.live_bytes + f.free_bytes);
  REQUIRE(f.streams.size() == 1);
  CHECK(f.streams[0].stream == 0x1000);
  CHECK(f.streams[0].largest_free_block == 64 * KiB);  // spares ready for any class
  CHECK(f.streams[0].free_blocks > 0);
  CHECK(f.largest_free_block >= 64 * KiB);
  CHECK(f.free_blocks >= f.streams[0].free_blocks);
  for (void* p : blocks) { mr.deallocate(p, 16 * KiB, s1); }
  mr.deallocate(big, 3 * MiB, s1);
  f = mr.fragmentation();
  CHECK(f.live_bytes == 0);
  CHECK(f.free_bytes == f.held_bytes);
}

TEST_CASE("arena growth: a superblock's tail that its class cannot use is not counted live") {
  // 3 KiB and 96 KiB classes leave a tail in every superblock; it was reported as live
  // bytes (held - free) with nothing allocated.
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr{sim, 1024 * MiB};
  for (std::size_t n : {3000, 6000, 100000}) { mr.deallocate(mr.allocate(n), n); }
  auto f = mr.fragmentation();
  CHECK(f.live_bytes == 0);
  CHECK(f.held_bytes >= f.free_bytes);
  void* p = mr.allocate(100000);
  f = mr.fragmentation();
  CHECK(f.live_bytes >= 100000);
  CHECK(f.live_bytes < 100000 + 32 * KiB);  // its size class's block, not a superblock's tail
  CHECK(f.held_bytes >= f.live_bytes + f.free_bytes);
  mr.deallocate(p, 100000);
  CHECK(mr.fragmentation().live_bytes == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena growth: 8 threads grow and shrink it at once; blocks never overlap") {
  auto sys = std::make_shared<system_memory_resource>();
  arena_options options = small_options();
  options.max_free_bytes = 2 * MiB;  // chunks go back all the time
  options.minimum_growth = 2 * MiB;
  arena_memory_resource mr{sys, 1024 * MiB, options};
  constexpr int threads = 8;
  std::vector<std::thread> workers;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 100};
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      auto const stream = t % 2 == 0 ? stream_view::per_thread() : stream_view{};
      for (int step = 0; step < 4000; ++step) {
        if (mine.empty() || rng() % 100 < 52) {
          std::size_t const bytes = rng() % 8 == 0 ? 1 * MiB + rng() % (3 * MiB) : 1 + rng() % (64 * KiB);
          auto* p = static_cast<unsigned char*>(mr.allocate(bytes, stream));
          std::memset(p, t + 1, std::min<std::size_t>(bytes, 64));
          p[bytes - 1] = static_cast<unsigned char>(t + 1);
          mine.emplace_back(p, bytes);
        } else {
          std::size_t const i = rng() % mine.size();
          auto [p, bytes] = mine[i];
          if (p[0] != t + 1 || p[bytes - 1] != t + 1) { corrupted.fetch_add(1); }
          mr.deallocate(p, bytes, stream);
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (auto [p, bytes] : mine) { mr.deallocate(p, bytes, stream); }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(corrupted.load() == 0);
  CHECK(mr.check_invariants() == "");
  CHECK(mr.stats().upstream_deallocations > 0);
  mr.release();
  CHECK(mr.held_bytes() == 0);
}

TEST_CASE("arena growth: an arena of one superblock serves its small blocks when the upstream's chunk is aligned") {
  // Superblocks are carved aligned to their size; growth asks room for that alignment
  // first, and, when the maximum leaves none, for the superblock alone (which the
  // simulated upstream's aligned chunks can hold).
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr{sim, 4 * MiB};  // the default superblock: 4 MiB
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) { blocks.push_back(mr.allocate(1 * MiB)); }
  CHECK(mr.held_bytes() == 4 * MiB);
  CHECK_THROWS_AS(mr.allocate(1 * MiB), out_of_memory);  // the maximum, exactly
  for (void* p : blocks) { mr.deallocate(p, 1 * MiB); }
  CHECK(mr.check_invariants() == "");
}

namespace {

enum class take_outcome { grew, waited, inconclusive };

/// B asks for memory only A holds, unparked (A freed less than the park minimum since its
/// last park), while another thread keeps calling on A. Inconclusive when the driver made
/// so many calls before B asked that A had freed past the minimum and parked by itself, or
/// none while B asked.
take_outcome b_takes_from_a_driven_stream() {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options o;
  o.minimum_growth = 2 * MiB;  // chunks of exactly what is asked
  o.max_free_bytes = 64 * MiB;
  arena_memory_resource mr{sim, 64 * MiB, o};
  stream_view const a{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x100})};
  stream_view const b{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x200})};
  void* held_by_b = mr.allocate(2 * MiB, b);  // a second stream
  // A's chunk (4 MiB), all free and A's own: the chunk and the 3 MiB freed count 7 MiB
  // against the 8 MiB after which A parks.
  mr.deallocate(mr.allocate(3 * MiB, a), 3 * MiB, a);
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::thread driver{[&] {  // another thread keeps calling on A, in the global arena
    while (!stop) {
      // Aligned past 256 B, so a large request: 256 B a free.
      mr.deallocate(mr.allocate(256, a, 512), 256, a, 512);
      ++calls;
    }
  }};
  while (calls < 100) { std::this_thread::yield(); }
  std::size_t const before = mr.stats().upstream_allocations;
  int const calls_before = calls;
  void* p = mr.allocate(3 * MiB, b);  // only A's unparked memory can serve it without growth
  // The driver made no call while B asked: descheduled for B's whole bounded wait, which
  // then grows by design (seen on a loaded 2-core VM, 40 tries in a row).
  bool const driver_stalled = calls == calls_before;
  stop = true;
  driver.join();
  // Chunks taken, not bytes held: a growth that finds A parked by the time the upstream
  // answered gives its chunk back, but the chunk was taken (and counts in the peak).
  bool const grew = mr.stats().upstream_allocations != before;
  mr.deallocate(p, 3 * MiB, b);
  mr.deallocate(held_by_b, 2 * MiB, b);
  CHECK(mr.check_invariants() == "");
  constexpr int self_park_calls = (1 << 20) / 256;  // the 1 MiB left below the minimum
  if (calls_before >= self_park_calls || driver_stalled) { return take_outcome::inconclusive; }
  return grew ? take_outcome::grew : take_outcome::waited;
}

}  // namespace

TEST_CASE("arena growth: memory of a stream another thread drives is waited for, not grown past") {
  // As the pool (tests/pool_threads.cpp): the wait is bounded (50 us), so a descheduled
  // driver lets B grow, as designed. Up to 40 tries, until one conclusive try did not
  // grow; an arena that never waits grew in every conclusive one on this machine. A
  // machine so loaded that no try is conclusive (B's thread descheduled for the driver's
  // 4,096 calls every time) proves nothing either way, and says so.
  int conclusive = 0;
  bool waited = false;
  for (int attempt = 0; attempt < 40 && !waited; ++attempt) {
    take_outcome const r = b_takes_from_a_driven_stream();
    conclusive += r != take_outcome::inconclusive ? 1 : 0;
    waited = r == take_outcome::waited;
  }
  if (conclusive == 0) {
    WARN("no conclusive try: B's thread was descheduled past A's own park every time");
    return;
  }
  CHECK(waited);
}
