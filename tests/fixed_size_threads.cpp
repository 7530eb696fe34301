// fixed_size (and binning through it) under threads, with the per-thread caches: caches
// are taken back before the resource grows or refuses, an exiting thread hands its cache
// back, a destroyed resource is never called back, frees into a cache are checked like
// any other, and a cached block reaches another stream only through the ordered path.
// Run it under the tsan preset too.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <barrier>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
}  // namespace

TEST_CASE("fixed_size threads: caches are taken back before growing, so the footprint does not grow") {
  constexpr int threads = 4;
  constexpr std::size_t blocks = 64;
  // Room for exactly one chunk: growing would be refused.
  auto sim = std::make_shared<simulated_memory_resource>(blocks * 64 * KiB);
  fixed_size_memory_resource mr{sim, 64 * KiB, blocks};
  REQUIRE(mr.thread_cache_blocks() >= 4);
  std::barrier sync{threads + 1};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<void*> mine;
      for (int i = 0; i < 8; ++i) { mine.push_back(mr.allocate(1000, stream_view::per_thread())); }
      for (void* p : mine) { mr.deallocate(p, 1000, stream_view::per_thread()); }  // into this thread's cache
      sync.arrive_and_wait();  // caches full
      sync.arrive_and_wait();  // main took everything
    });
  }
  sync.arrive_and_wait();
  CHECK(mr.free_blocks() == blocks);  // cached blocks count as free
  std::set<void*> all;
  for (std::size_t i = 0; i < blocks; ++i) { all.insert(mr.allocate(1000)); }  // needs the cached ones
  CHECK(all.size() == blocks);
  CHECK(sim->footprint() == blocks * 64 * KiB);
  CHECK_THROWS_AS(mr.allocate(1000), out_of_memory);
  sync.arrive_and_wait();
  for (auto& th : pool) { th.join(); }
  for (void* p : all) { mr.deallocate(p, 1000); }
  CHECK(mr.free_blocks() == blocks);
}

TEST_CASE("fixed_size threads: an exiting thread hands its cache back; release returns everything") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto mr = std::make_shared<fixed_size_memory_resource>(sim, 4 * KiB, 32);
  for (int round = 0; round < 3; ++round) {
    std::thread([&] {
      std::vector<void*> mine;
      for (int i = 0; i < 20; ++i) { mine.push_back(mr->allocate(4 * KiB, stream_view::per_thread())); }
      for (void* p : mine) { mr->deallocate(p, 4 * KiB, stream_view::per_thread()); }
    }).join();
    CHECK(mr->free_blocks() == mr->total_blocks());
    auto const f = mr->fragmentation();
    CHECK(f.live_bytes == 0);
    CHECK(f.free_bytes == f.held_bytes);
  }
  mr->release();
  CHECK(sim->footprint() == 0);
  CHECK(mr->chunk_count() == 0);
}

TEST_CASE("fixed_size threads: a resource destroyed before a thread exits is never called back") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::atomic<int> stage{0};
  auto first = std::make_shared<fixed_size_memory_resource>(sim, 4 * KiB, 8);
  std::thread worker([&] {
    void* p = first->allocate(100);
    first->deallocate(p, 100);  // this thread now has a cache of `first`
    stage = 1;
    while (stage.load() != 2) { std::this_thread::yield(); }
    // `first` is gone; a new resource may reuse its ticket index: the stale entry must not be used.
    auto second = std::make_shared<fixed_size_memory_resource>(sim, 4 * KiB, 8);
    void* q = second->allocate(100);
    CHECK(second->holds_live_block(q));
    second->deallocate(q, 100);
    CHECK(second->free_blocks() == second->total_blocks());
  });
  while (stage.load() != 1) { std::this_thread::yield(); }
  first.reset();
  CHECK(sim->footprint() == 0);
  stage = 2;
  worker.join();
  CHECK(sim->footprint() == 0);
}

TEST_CASE("fixed_size threads: double and foreign frees are caught in the caches too, under threads") {
  auto sys = std::make_shared<system_memory_resource>();
  auto large = std::make_shared<system_memory_resource>();
  binning_memory_resource mr{sys, 256, 64 * KiB, large};
  constexpr int threads = 4;
  // Enough blocks in every bin that no thread grows one while the others run: growing
  // takes every cache back, and a block another thread had just freed (and is about to
  // free again, on purpose) could then be handed out, making its second free a correct
  // free of someone else's live block.
  for (std::size_t bytes = 256; bytes <= 64 * KiB; bytes *= 2) {
    std::vector<void*> warm(threads * 96);
    for (auto& w : warm) { w = mr.allocate(bytes); }
    for (auto* w : warm) { mr.deallocate(w, bytes); }
  }
  std::atomic<int> caught{0};
  std::atomic<int> duplicates{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto const s = t % 2 == 0 ? stream_view::per_thread() : stream_view{};
      for (int round = 0; round < 200; ++round) {
        std::size_t const bytes = 256u << (round % 8);
        void* p = mr.allocate(bytes, s);
        std::memset(p, t, bytes);
        mr.deallocate(p, bytes, s);  // now in this thread's cache
        try {
          mr.deallocate(p, bytes, s);
        } catch (logic_error const&) {
          caught.fetch_add(1);
        }
        try {  // inside p's block (p + 256 would start the next 256 B block: a valid free)
          mr.deallocate(static_cast<char*>(p) + 128, bytes, s);
        } catch (logic_error const&) {
          caught.fetch_add(1);
        }
        void* a = mr.allocate(bytes, s);
        void* b = mr.allocate(bytes, s);
        if (a == b) { duplicates.fetch_add(1); }
        mr.deallocate(a, bytes, s);
        mr.deallocate(b, bytes, s);
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(caught.load() == threads * 200 * 2);
  CHECK(duplicates.load() == 0);
  CHECK(mr.fragmentation().live_bytes == 0);
}

TEST_CASE("fixed_size threads: a cached block reaches another stream only after ordering") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>(64 * KiB);  // one chunk, no growth
  fixed_size_memory_resource mr{sim, 64 * KiB, 1, fake};
  void* p = mr.allocate(100);                         // legacy stream: through this thread's cache
  std::uint64_t const clock = fake->enqueue(0);       // work on the legacy stream uses p
  mr.deallocate(p, 100);                              // cached for the legacy stream
  auto const other = stream_view{reinterpret_cast<cudaStream_t>(0x100)};
  void* q = mr.allocate(100, other);                  // the only block: taken back from the cache
  CHECK(q == p);
  CHECK(fake->ordered_after(0x100, 0, clock));
  CHECK(fake->dead_named == 0);
  mr.deallocate(q, 100, other);
}

TEST_CASE("fixed_size threads: many threads, random sizes through binning, contents intact") {
  auto sys = std::make_shared<system_memory_resource>();
  binning_memory_resource mr{sys, 256, 32 * KiB};
  constexpr int threads = 8;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::pair<unsigned char*, std::size_t>> live;
      std::uint64_t x = 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(t + 1);
      for (int step = 0; step < 20000; ++step) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (live.empty() || x % 100 < 55) {
          std::size_t const bytes = 1 + x % (32 * KiB);
          auto* p = static_cast<unsigned char*>(mr.allocate(bytes, stream_view::per_thread()));
          p[0] = static_cast<unsigned char>(t);
          p[bytes - 1] = static_cast<unsigned char>(t);
          live.emplace_back(p, bytes);
        } else {
          std::size_t const k = x % live.size();
          auto [p, bytes] = live[k];
          if (p[0] != t || p[bytes - 1] != t) { corrupted.fetch_add(1); }
          mr.deallocate(p, bytes, stream_view::per_thread());
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto [p, bytes] : live) { mr.deallocate(p, bytes, stream_view::per_thread()); }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(corrupted.load() == 0);
  CHECK(mr.fragmentation().live_bytes == 0);
  (void)MiB;
}

TEST_CASE("fixed_size threads: a refill takes a live thread's blocks after one wait, not one wait a block") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 64 * KiB, 256, fake};
  std::size_t const half = mr.thread_cache_blocks() / 2;
  std::atomic<int> phase{0};
  std::thread a{[&] {
    std::vector<void*> blocks;
    for (std::size_t i = 0; i < 4 * mr.thread_cache_blocks(); ++i) {
      blocks.push_back(mr.allocate(1000, stream_view::per_thread()));
    }
    for (void* p : blocks) { mr.deallocate(p, 1000, stream_view::per_thread()); }  // most spill to the shared stacks
    phase = 1;
    while (phase != 2) { std::this_thread::yield(); }  // alive while b takes them
  }};
  while (phase != 1) { std::this_thread::yield(); }
  std::size_t const waits_before = fake->waits;
  std::vector<void*> on_b;
  std::thread b{[&] {
    for (std::size_t i = 0; i < half; ++i) { on_b.push_back(mr.allocate(1000, stream_view::per_thread())); }
    for (void* p : on_b) { mr.deallocate(p, 1000, stream_view::per_thread()); }
  }};
  b.join();
  phase = 2;
  a.join();
  INFO("waits " << fake->waits - waits_before << " for " << half << " blocks");
  CHECK(fake->waits - waits_before <= 2);
  CHECK(mr.chunk_count() == 1);  // no growth: b's blocks came from a's
}
