// fixed_size_memory_resource: one size, O(1); random sequences against a model over
// system (contents checked) and simulated memory; growth, refusals, errors, release,
// and stream-ordered reuse through the fake event seam.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
bool long_tests() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr; }
}  // namespace

TEST_CASE("fixed_size: random sequences match the model, over system and simulated memory") {
  for (bool real_memory : {true, false}) {
    for (std::size_t block : {std::size_t{256}, std::size_t{3000}, std::size_t{64} * KiB, std::size_t{1} * MiB}) {
      CAPTURE(real_memory, block);
      resource_ptr up = real_memory ? resource_ptr{std::make_shared<system_memory_resource>()}
                                    : resource_ptr{std::make_shared<simulated_memory_resource>()};
      fixed_size_memory_resource mr{up, block, 16};
      std::size_t const bs = mr.block_size();
      CHECK(bs == detail::align_up(block, 256));
      CHECK(detail::is_pow2(mr.block_alignment()));
      CHECK(bs % mr.block_alignment() == 0);
      std::mt19937_64 rng{block};
      std::map<std::uintptr_t, unsigned char> live;
      int const steps = long_tests() ? 200000 : (block >= MiB && real_memory ? 5000 : 30000);
      for (int step = 0; step < steps; ++step) {
        if (live.empty() || rng() % 100 < 55) {
          std::size_t const bytes = 1 + rng() % bs;
          void* p = mr.allocate(bytes);
          auto const a = reinterpret_cast<std::uintptr_t>(p);
          REQUIRE(a % mr.block_alignment() == 0);
          REQUIRE(live.count(a) == 0);
          auto next = live.lower_bound(a);
          if (next != live.end()) { REQUIRE(a + bs <= next->first); }
          bool inside = false;
          mr.for_each_chunk([&](std::uintptr_t base, std::size_t size) { inside = inside || (a >= base && a + bs <= base + size); });
          REQUIRE(inside);
          auto const tag = static_cast<unsigned char>(rng());
          if (real_memory) {
            std::memset(p, tag, 16);
            static_cast<unsigned char*>(p)[bs - 1] = tag;
          }
          live.emplace(a, tag);
        } else {
          auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
          auto* p = reinterpret_cast<unsigned char*>(it->first);
          if (real_memory) {
            for (int i = 0; i < 16; ++i) { REQUIRE(p[i] == it->second); }
            REQUIRE(p[bs - 1] == it->second);
          }
          mr.deallocate(p, 1 + rng() % bs);
          live.erase(it);
        }
        REQUIRE(mr.free_blocks() + live.size() == mr.total_blocks());
        REQUIRE(mr.free_bytes() == mr.free_blocks() * bs);
      }
      for (auto const& [a, tag] : live) { mr.deallocate(reinterpret_cast<void*>(a), bs); }
      CHECK(mr.free_blocks() == mr.total_blocks());
      // Chunks of 16 blocks, and past 64 chunks at least 1/8 of what is held.
      std::size_t held = 0;
      std::size_t chunks = 0;
      mr.for_each_chunk([&](std::uintptr_t, std::size_t size) {
        CHECK((size / bs == 16 || (chunks >= 64 && size / bs >= held / 8)));
        held += size / bs;
        ++chunks;
      });
      CHECK(mr.total_blocks() == held);
    }
  }
}

TEST_CASE("fixed_size: larger requests and alignments are errors that say so") {
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 4 * KiB, 8};
  CHECK(mr.name() == "fixed_size");
  CHECK(mr.block_alignment() == 4 * KiB);
  CHECK_THROWS_WITH(mr.allocate(4 * KiB + 1), Catch::Contains("exceeds its block size"));
  CHECK_THROWS_WITH(mr.allocate(100, {}, 8 * KiB), Catch::Contains("alignment 8192"));
  void* p = mr.allocate(100, {}, 4 * KiB);
  CHECK(detail::is_aligned(p, 4 * KiB));
  mr.deallocate(p, 100, {}, 4 * KiB);
  CHECK_THROWS_AS(fixed_size_memory_resource(nullptr), logic_error);
  CHECK_THROWS_AS(fixed_size_memory_resource(sim, 0), logic_error);
}

TEST_CASE("fixed_size: grows by chunks, asks fewer blocks when refused, then refuses with details") {
  auto sim = std::make_shared<simulated_memory_resource>(10 * MiB);
  fixed_size_memory_resource mr{sim, 1 * MiB, 4};
  CHECK(mr.chunk_count() == 1);
  CHECK(sim->footprint() == 4 * MiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) { blocks.push_back(mr.allocate(1 * MiB)); }
  CHECK(std::set<void*>(blocks.begin(), blocks.end()).size() == 10);
  CHECK(mr.total_blocks() == 10);  // 4 + 4 + 2 (the upstream had room for 2 more only)
  CHECK(sim->footprint() == 10 * MiB);
  try {
    (void)mr.allocate(1);
    FAIL("expected out_of_memory");
  } catch (out_of_memory const& e) {
    CHECK(e.info().resource == "fixed_size");
    // Its block size names the bin when binning has several fixed_size layers.
    CHECK_THAT(e.what(), Catch::Contains("; blocks of 1.00 MiB (1048576 B)"));
    CHECK(*e.info().footprint_bytes == 10 * MiB);
    CHECK(*e.info().free_bytes == 0);
  }
  for (void* p : blocks) { mr.deallocate(p, 1 * MiB); }
  mr.release();  // every block free: every chunk goes back
  CHECK(sim->footprint() == 0);
  CHECK(mr.chunk_count() == 0);
  void* again = mr.allocate(10);  // and it grows again on demand
  CHECK(mr.chunk_count() == 1);
  mr.release();  // in use: keeps its chunk
  CHECK(mr.chunk_count() == 1);
  mr.deallocate(again, 10);
}

TEST_CASE("fixed_size: destruction returns every chunk") {
  auto sim = std::make_shared<simulated_memory_resource>();
  {
    fixed_size_memory_resource mr{sim, 256, 1000};
    for (int i = 0; i < 5000; ++i) { (void)mr.allocate(200); }  // never freed
    CHECK(mr.chunk_count() == 5);
  }
  CHECK(sim->footprint() == 0);
}

TEST_CASE("fixed_size: stream-ordered reuse through the event seam") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const a = stream_view{reinterpret_cast<cudaStream_t>(0x100)};
  auto const b = stream_view{reinterpret_cast<cudaStream_t>(0x200)};
  fixed_size_memory_resource mr{sim, 64 * KiB, 4, fake};
  CHECK(fake->syncs == 1);  // the preallocated chunk: waited for once, then usable by any stream
  std::size_t const at_start = fake->calls();
  std::vector<void*> on_a;
  for (int i = 0; i < 4; ++i) { on_a.push_back(mr.allocate(1000, a)); }
  std::uint64_t const clock = fake->enqueue(0x100);
  for (void* p : on_a) { mr.deallocate(p, 1000, a); }
  for (int i = 0; i < 1000; ++i) { mr.deallocate(mr.allocate(10, a), 10, a); }
  CHECK(fake->calls() == at_start);  // one stream: no event calls
  // b takes over a's free blocks. a's frees predate the second stream, so no event covers
  // them, and a (a created stream) may be destroyed by now: one device synchronization.
  void* p = mr.allocate(1000, b);
  CHECK(fake->records == 0);
  CHECK(fake->sync_alls == 1);
  CHECK(fake->ordered_after(0x200, 0x100, clock));
  CHECK(std::find(on_a.begin(), on_a.end(), p) != on_a.end());
  CHECK(mr.chunk_count() == 1);  // no growth: the blocks moved
  // Two streams known: b's free records while b is named; a takes it with one wait.
  std::uint64_t const clock_b = fake->enqueue(0x200);
  mr.deallocate(p, 1000, b);
  CHECK(fake->records == 1);
  std::vector<void*> again;
  for (int i = 0; i < 4; ++i) { again.push_back(mr.allocate(1000, a)); }
  CHECK(std::find(again.begin(), again.end(), p) != again.end());
  CHECK(fake->waits == 1);
  CHECK(fake->sync_alls == 1);
  CHECK(fake->ordered_after(0x100, 0x200, clock_b));
  CHECK(fake->dead_named == 0);
  for (void* q : again) { mr.deallocate(q, 1000, a); }
}

TEST_CASE("fixed_size: one thread keeps no cache; a second thread turns the caches on") {
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 64 * KiB, 16};
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {  // the same thread again and again: one free list
    for (int i = 0; i < 8; ++i) { blocks.push_back(mr.allocate(1000)); }
    for (void* p : blocks) { mr.deallocate(p, 1000); }
    blocks.clear();
    CHECK(mr.cached_blocks() == 0);
  }
  std::thread{[&] { mr.deallocate(mr.allocate(1000), 1000); }}.join();
  for (int i = 0; i < 8; ++i) { blocks.push_back(mr.allocate(1000)); }
  for (void* p : blocks) { mr.deallocate(p, 1000); }
  CHECK(mr.cached_blocks() > 0);  // now through this thread's cache
  CHECK(mr.free_blocks() == 16);
}

TEST_CASE("fixed_size: created streams are cached with several streams, one record per spilled batch") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const a = stream_view{reinterpret_cast<cudaStream_t>(0x100)};
  auto const b = stream_view{reinterpret_cast<cudaStream_t>(0x200)};
  fixed_size_memory_resource mr{sim, 64 * KiB, 256, fake};
  REQUIRE(mr.thread_cache_blocks() == 64);
  std::thread{[&] { mr.deallocate(mr.allocate(1000, a), 1000, a); }}.join();
  // This thread is the second (caches on) and b the second stream (the eager rule: created
  // streams record their frees). 99 more allocations come from refills of 32 blocks: 29
  // are left in the cache.
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) { blocks.push_back(mr.allocate(1000, b)); }
  REQUIRE(mr.cached_blocks() == 29);
  std::size_t const before = fake->records;
  for (void* p : blocks) { mr.deallocate(p, 1000, b); }
  // Frees 36, 68 and 100 each find the cache full and spill 32 blocks with one record
  // (uncached, each of the 100 frees recorded).
  CHECK(fake->records - before == 3);
  CHECK(mr.cached_blocks() == 33);
  CHECK(mr.chunk_count() == 1);

  // Calls on a skip the cache, which keeps b's blocks for b (spilled now, they could not
  // be recorded on b: the call names a). A hit on b starts the count again.
  for (int i = 0; i < 31; ++i) { mr.deallocate(mr.allocate(1000, a), 1000, a); }  // 62 calls on a
  CHECK(mr.cached_blocks() == 33);
  mr.deallocate(mr.allocate(1000, b), 1000, b);  // hits the cache
  for (int i = 0; i < 32; ++i) { mr.deallocate(mr.allocate(1000, a), 1000, a); }  // 64 calls
  CHECK(mr.cached_blocks() == 33);
  CHECK(fake->sync_alls == 0);
  // The 65th call on a in a row: the thread has moved on, b's blocks go back unrecorded
  // and the cache holds a's.
  void* on_a = mr.allocate(1000, a);
  mr.deallocate(on_a, 1000, a);
  CHECK(mr.cached_blocks() < 33);
  // Another stream does not take b's unrecorded blocks (freed with no CUDA call, maybe
  // in a capture of b, which a device synchronization would not order): it grows.
  auto const c = stream_view{reinterpret_cast<cudaStream_t>(0x300)};
  std::vector<void*> on_c;
  for (int i = 0; i < 250; ++i) { on_c.push_back(mr.allocate(1000, c)); }
  CHECK(fake->sync_alls == 0);
  CHECK(mr.chunk_count() == 2);
  for (void* p : on_c) { mr.deallocate(p, 1000, c); }
  // Once b records again (a call naming it), its blocks go to other streams after a wait.
  std::size_t const waits = fake->waits;
  mr.deallocate(mr.allocate(1000, b), 1000, b);
  std::vector<void*> on_d;
  auto const d = stream_view{reinterpret_cast<cudaStream_t>(0x400)};
  for (int i = 0; i < 500; ++i) { on_d.push_back(mr.allocate(1000, d)); }
  CHECK(fake->sync_alls == 0);
  CHECK(fake->waits > waits);
  for (void* p : on_d) { mr.deallocate(p, 1000, d); }
  CHECK(fake->dead_named == 0);
}

TEST_CASE("fixed_size: chunks of one block grow geometrically past 64 chunks") {
  // Each growth rebuilds the chunk lookup: 20,000 chunks of one block took minutes and
  // gigabytes of heap. Past 64 chunks a chunk is 1/8 of the blocks held.
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 256, 1};
  std::vector<void*> blocks;
  for (int i = 0; i < 20'000; ++i) { blocks.push_back(mr.allocate(256)); }
  CHECK(mr.chunk_count() < 150);
  CHECK(mr.total_blocks() <= 20'000 + 20'000 / 8 + 1);  // under 1/8 held unused
  for (void* p : blocks) { mr.deallocate(p, 256); }
  CHECK(mr.free_blocks() == mr.total_blocks());
}

TEST_CASE("fixed_size: a refused free on a new stream does not make it a stream in use") {
  // The free made the stream's slot before it was checked: a double or foreign free on a
  // second stream turned on the eager rule, and every later free on the one real stream
  // recorded an event. With or without thread caches (the spill path did the same).
  for (bool caching : {false, true}) {
    INFO("thread caches " << caching);
    auto fake = std::make_shared<test::fake_stream_sync>();
    fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 4096, 64, fake};
    if (caching) { std::thread{[&] { mr.deallocate(mr.allocate(1), 1); }}.join(); }
    auto const a = stream_view{reinterpret_cast<cudaStream_t>(0x100)};
    auto const b = stream_view{reinterpret_cast<cudaStream_t>(0x200)};
    void* p = mr.allocate(1, a);
    mr.deallocate(p, 1, a);
    std::size_t const calls = fake->calls();
    CHECK_THROWS_WITH(mr.deallocate(p, 1, b), Catch::Contains("double free"));
    int foreign = 0;
    CHECK_THROWS_AS(mr.deallocate(&foreign, 1, b), logic_error);
    for (int i = 0; i < 200; ++i) { mr.deallocate(mr.allocate(1, a), 1, a); }
    CHECK(fake->calls() == calls);  // still one stream: no records
  }
}

TEST_CASE("fixed_size: a refused free leaves the thread's cache as it was") {
  // A double free on another stream than the cache's went through the spill path, which
  // emptied the cache into the shared stacks before the free was refused ("nothing was
  // changed", said the message).
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 4096, 64};
  mr.deallocate(mr.allocate(1), 1);  // this thread first; the next one turns caching on
  std::size_t cached_before = 0;
  std::size_t cached_after = 0;
  bool refused = false;
  std::thread([&] {
    void* p[4];
    for (auto& x : p) { x = mr.allocate(1, stream_view::per_thread()); }
    for (auto& x : p) { mr.deallocate(x, 1, stream_view::per_thread()); }
    cached_before = mr.cached_blocks();
    try {
      mr.deallocate(p[0], 1, stream_view{});
    } catch (logic_error const& e) {
      refused = std::string{e.what()}.find("double free") != std::string::npos;
    }
    cached_after = mr.cached_blocks();
  }).join();
  CHECK(refused);
  CHECK(cached_before > 0);
  CHECK(cached_after == cached_before);
}

TEST_CASE("fixed_size: over a fixed_size, growth past 64 chunks stays within the upstream's blocks") {
  // Past 64 chunks a growth asked for 1/8 of the blocks held in one chunk: a fixed_size
  // upstream refuses a request above its block size with a logic_error, so the 257th
  // allocation failed although the upstream had room for many more chunks.
  auto sim = std::make_shared<simulated_memory_resource>();
  auto inner = std::make_shared<fixed_size_memory_resource>(sim, 4 * KiB, 16);
  fixed_size_memory_resource outer{inner, 1 * KiB, 4};
  std::vector<void*> blocks;
  for (int i = 0; i < 2000; ++i) { blocks.push_back(outer.allocate(1 * KiB)); }
  CHECK(outer.total_blocks() == 2000);
  CHECK(std::set<void*>(blocks.begin(), blocks.end()).size() == 2000);
  for (void* p : blocks) { outer.deallocate(p, 1 * KiB); }
  CHECK(outer.free_blocks() == outer.total_blocks());
  // A chunk of construction the upstream refuses is still the caller's error.
  CHECK_THROWS_AS(fixed_size_memory_resource(inner, 1 * KiB, 8), logic_error);
}

namespace {
/// The fake seam, but synchronizing a stream fails (a CUDA error at construction).
class failing_synchronize_sync final : public detail::stream_sync {
 public:
  test::fake_stream_sync inner;
  handle create_event() override { return inner.create_event(); }
  void destroy_event(handle e) noexcept override { inner.destroy_event(e); }
  bool record(handle e, handle s) override { return inner.record(e, s); }
  void wait(handle s, handle e) override { inner.wait(s, e); }
  void synchronize(handle) override { throw std::runtime_error("synchronize failed"); }
  void synchronize_all() override { inner.synchronize_all(); }
};
}  // namespace

TEST_CASE("fixed_size: a constructor that fails after taking its first chunk gives it back") {
  // The first chunk is synchronized after the upstream gave it; when that failed, the
  // constructor threw with the chunk recorded nowhere a destructor would return it.
  auto sim = std::make_shared<simulated_memory_resource>();
  CHECK_THROWS_WITH(fixed_size_memory_resource(sim, 1 * KiB, 8, std::make_shared<failing_synchronize_sync>()),
                    "synchronize failed");
  CHECK(sim->allocation_count() == 0);
  CHECK(sim->footprint() == 0);
}

namespace {
/// simulated, but the deallocate numbered `fail_at` (from 0) throws, as a CUDA error would.
struct refusing_free_upstream final : memory_resource {
  std::shared_ptr<simulated_memory_resource> sim = std::make_shared<simulated_memory_resource>();
  int fail_at = -1;
  int frees = 0;
  void* do_allocate(std::size_t b, std::size_t a, stream_view s) override { return sim->allocate(b, s, a); }
  void do_deallocate(void* p, std::size_t b, std::size_t a, stream_view s) override {
    if (frees++ == fail_at) { throw std::runtime_error("deallocate failed"); }
    sim->deallocate(p, b, s, a);
  }
  std::string do_name() const override { return "refusing_free"; }
};
}  // namespace

TEST_CASE("fixed_size: a release the upstream refuses half way hands out no returned memory") {
  // The chunks went back in a loop and were forgotten only after it: when the second
  // was refused, the first (returned) still served blocks, and was returned again at
  // the next release or destruction.
  auto up = std::make_shared<refusing_free_upstream>();
  {
    fixed_size_memory_resource mr{up, 256, 1, std::make_shared<test::fake_stream_sync>()};
    std::vector<void*> blocks;
    for (int i = 0; i < 3; ++i) { blocks.push_back(mr.allocate(256)); }
    for (void* p : blocks) { mr.deallocate(p, 256); }
    up->fail_at = up->frees + 1;
    CHECK_THROWS_WITH(mr.release(), "deallocate failed");
    CHECK(mr.chunk_count() == up->sim->allocation_count());
    CHECK(mr.pool_size() == up->sim->footprint());
    for (int i = 0; i < 3; ++i) { CHECK(up->sim->owns(mr.allocate(256))); }
  }
  CHECK(up->sim->allocation_count() == 0);  // what was left went back once, at destruction
}

TEST_CASE("fixed_size: the free check's page hash stays small when chunks grow far above the standard one") {
  // Pages were a standard chunk (one block here) whatever the chunks: a chunk of 200,000
  // blocks took a slot of 64 bytes per block, and fixed_size(256 B, 1 block a chunk) held
  // twice the memory it served in host memory for 1e6 blocks, growing 14x slower.
  std::size_t const block = 256;
  detail::fixed_size_chunks chunks{block, 1};
  std::uintptr_t const base = std::uintptr_t{1} << 40;
  std::vector<std::uintptr_t> small;
  for (std::size_t i = 0; i < 64; ++i) {
    small.push_back(base + i * 4096);
    (void)chunks.add(small.back(), 1);
  }
  std::uintptr_t const big = base + (std::uintptr_t{1} << 30);
  std::size_t const big_blocks = 200'000;
  detail::block_state* const states = chunks.add(big, big_blocks);
  CHECK(chunks.current().slot_count() <= 2048);  // 391 pages of 512 blocks, and the small ones
  for (std::uintptr_t a : small) {
    CHECK(chunks.find(a) != nullptr);
    CHECK(chunks.find(a + block) == nullptr);
  }
  for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{77'777}, big_blocks - 1}) {
    CHECK(chunks.find(big + k * block) == states + k);
    CHECK(chunks.find(big + k * block + 16) == nullptr);
  }
  CHECK(chunks.find(big + big_blocks * block) == nullptr);
  CHECK(chunks.find(big - block) == nullptr);
}

TEST_CASE("fixed_size: a chunk far above the standard one spans at most 257 pages of the free check") {
  // 8,128 blocks of 256 B over 4 KiB standard pages: pages of 4 KiB (1/256 rounded down)
  // made it 508 pages, 1,024 slots; 8 KiB pages make it 254, 512 slots at half load.
  static detail::block_state states[8128];
  std::uintptr_t const first = std::uintptr_t{1} << 32;
  detail::chunk_snapshot const snapshot{{{first, first + 8128 * 256, states}}, 256, 12};
  CHECK(snapshot.slot_count() <= 512);
  CHECK(snapshot.find(first + 8127 * 256) == states + 8127);
  CHECK(snapshot.find(first + 8128 * 256) == nullptr);
}
