// arena_memory_resource: size classes, random sequences on several streams against a
// model (contents checked over system memory), superblocks going back on exhaustion,
// cross-stream frees, refusals and bad frees. Longer sweeps: MRSTACK_LONG_TESTS=1.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/detail/arena_core.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;
using detail::arena_size_classes;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
bool long_tests() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr; }
stream_view fake_stream(int i) {
  return i == 0 ? stream_view{} : stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t(0x1000) * i)};
}
}  // namespace

TEST_CASE("arena: size classes cover every size with at most 25% rounding") {
  unsigned prev = 0;
  for (std::size_t size = 256; size <= 1 * MiB; size += 256) {
    unsigned const cls = arena_size_classes::class_of(size);
    std::size_t const cs = arena_size_classes::class_size(cls);
    REQUIRE(cs >= size);
    REQUIRE(cs * 4 <= size * 5 + 1024);  // within 25% (plus one unit for the smallest)
    REQUIRE(cls >= prev);                // monotonic
    REQUIRE(arena_size_classes::class_of(cs) == cls);
    if (cls > 0) { REQUIRE(arena_size_classes::class_size(cls - 1) < size); }  // the smallest class that fits
    prev = cls;
  }
  CHECK(arena_size_classes::class_of(1 * MiB) < arena_size_classes::max_classes);
}

TEST_CASE("arena: random sequences on several streams match the model") {
  for (bool real_memory : {true, false}) {
    CAPTURE(real_memory);
    resource_ptr up = real_memory ? resource_ptr{std::make_shared<system_memory_resource>()}
                                  : resource_ptr{std::make_shared<simulated_memory_resource>()};
    arena_options options;
    options.superblock_size = 1 * MiB;
    options.max_small_size = 256 * KiB;
    options.max_free_bytes = 16 * MiB;  // chunks go back often
    options.minimum_growth = 4 * MiB;
    arena_memory_resource mr{up, 256 * MiB, options};
    CHECK(mr.name() == "arena");
    std::mt19937_64 rng{real_memory ? 11U : 12U};
    struct block {
      std::size_t bytes;
      std::size_t alignment;
      int stream;
      unsigned char tag;
    };
    std::map<std::uintptr_t, block> live;
    std::size_t refusals = 0;
    int const steps = long_tests() ? 400000 : 60000;
    for (int step = 0; step < steps; ++step) {
      if (live.empty() || rng() % 100 < 55) {
        std::size_t const bytes = 1 + rng() % (rng() % 8 == 0 ? 8 * MiB : 64 * KiB);
        std::size_t const alignment = rng() % 10 == 0 ? std::size_t{512} << (rng() % 10) : 256;
        int const stream = static_cast<int>(rng() % 3);
        void* p = nullptr;
        try {
          p = mr.allocate(bytes, fake_stream(stream), alignment);
        } catch (out_of_memory const& e) {
          ++refusals;
          CHECK(e.info().resource == "arena");
          continue;
        }
        auto const a = reinterpret_cast<std::uintptr_t>(p);
        REQUIRE(a % alignment == 0);
        REQUIRE(mr.held_bytes() <= mr.arena_size());
        auto next = live.lower_bound(a);
        if (next != live.end()) { REQUIRE(a + bytes <= next->first); }
        if (next != live.begin()) { REQUIRE(std::prev(next)->first + std::prev(next)->second.bytes <= a); }
        auto const tag = static_cast<unsigned char>(rng());
        if (real_memory) {
          std::memset(p, tag, std::min<std::size_t>(bytes, 32));
          static_cast<unsigned char*>(p)[bytes - 1] = tag;
        }
        live.emplace(a, block{bytes, alignment, stream, tag});
      } else {
        auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
        auto* p = reinterpret_cast<unsigned char*>(it->first);
        if (real_memory) {
          REQUIRE(p[0] == it->second.tag);
          REQUIRE(p[it->second.bytes - 1] == it->second.tag);
        }
        int const stream = rng() % 5 == 0 ? static_cast<int>(rng() % 3) : it->second.stream;  // sometimes another stream
        mr.deallocate(p, it->second.bytes, fake_stream(stream), it->second.alignment);
        live.erase(it);
      }
      if (step % 500 == 0) { REQUIRE(mr.check_invariants() == ""); }
    }
    INFO("refusals: " << refusals);
    for (auto const& [a, b] : live) { mr.deallocate(reinterpret_cast<void*>(a), b.bytes, fake_stream(b.stream), b.alignment); }
    REQUIRE(mr.check_invariants() == "");
    CHECK(mr.stats().peak_held_bytes <= mr.arena_size());
    mr.release();  // wholly free superblocks go back, then every chunk
    auto const st = mr.stats();
    CHECK(st.superblocks_in_arenas == 0);
    CHECK(st.held_bytes == 0);
    CHECK(st.global_free_bytes == 0);
  }
}

TEST_CASE("arena: exhaustion takes superblocks back from stream arenas before refusing") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options;
  options.superblock_size = 1 * MiB;
  options.max_small_size = 64 * KiB;
  options.empty_superblocks_kept = 100;  // arenas keep their empty superblocks until pressed
  options.eager = true;                  // all 16 superblocks at once (room to align them included)
  arena_memory_resource mr{sim, 16 * MiB, options};
  std::vector<void*> small;
  for (int i = 0; i < 16 * 16; ++i) { small.push_back(mr.allocate(64 * KiB, fake_stream(1))); }  // all 16 superblocks
  CHECK(mr.stats().superblocks_in_arenas == 16);
  CHECK_THROWS_AS(mr.allocate(1 * MiB, fake_stream(2)), out_of_memory);
  for (void* p : small) { mr.deallocate(p, 64 * KiB, fake_stream(1)); }
  CHECK(mr.stats().superblocks_in_arenas == 16);  // kept, empty
  void* big = mr.allocate(8 * MiB, fake_stream(2));  // reclaims them, then succeeds
  CHECK(mr.stats().superblocks_in_arenas == 0);
  try {
    (void)mr.allocate(9 * MiB, fake_stream(2));
    FAIL("expected out_of_memory");
  } catch (out_of_memory const& e) {
    CHECK(*e.info().footprint_bytes == 17 * MiB - 256);
    CHECK(*e.info().largest_free_block == 9 * MiB - 256);  // the region has room to align its superblocks
    CHECK(std::string{e.what()}.find("arena") != std::string::npos);
  }
  mr.deallocate(big, 8 * MiB, fake_stream(2));
}

TEST_CASE("arena: a small block freed on another stream waits for that stream first") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options;
  options.stream_sync = fake;
  arena_memory_resource mr{sim, 64 * MiB, options};
  std::size_t const at_start = fake->calls();
  auto const a = fake_stream(1);
  auto const b = fake_stream(2);
  for (int i = 0; i < 1000; ++i) { mr.deallocate(mr.allocate(1000, a), 1000, a); }
  CHECK(fake->calls() == at_start);  // one stream: no CUDA calls
  void* p = mr.allocate(1000, a);
  std::uint64_t const clock = fake->enqueue(0x2000);  // b works on the block, then frees it
  mr.deallocate(p, 1000, b);
  CHECK(fake->syncs == 1);  // b, before its block goes back to a's arena
  CHECK(fake->ordered_after(0x1000, 0x2000, clock));
  CHECK(mr.allocate(1000, a) == p);
}

TEST_CASE("arena: bad frees are logic_errors; destruction returns the region") {
  auto sim = std::make_shared<simulated_memory_resource>();
  {
    arena_memory_resource mr{sim, 32 * MiB};
    void* p = mr.allocate(1000);
    void* big = mr.allocate(3 * MiB);
    CHECK_THROWS_AS(mr.deallocate(static_cast<char*>(p) + 256, 1000), logic_error);
    CHECK_THROWS_AS(mr.deallocate(p, 100000), logic_error);  // another size class
    mr.deallocate(p, 1000);
    CHECK_THROWS_WITH(mr.deallocate(p, 1000), Catch::Contains("already taken back"));
    int on_stack = 0;
    CHECK_THROWS_AS(mr.deallocate(&on_stack, 4), logic_error);
    // A large block (from the global arena) freed with another size: refused, unchanged.
    CHECK_THROWS_WITH(mr.deallocate(big, 2 * MiB), Catch::Contains("its block is 3145728 B; nothing was freed"));
    CHECK_THROWS_AS(mr.deallocate(big, 3 * MiB + 256), logic_error);
    mr.deallocate(big, 3 * MiB);  // the right size frees it
    CHECK_THROWS_AS(mr.deallocate(big, 3 * MiB), logic_error);  // a double free
    big = mr.allocate(3 * MiB);
    (void)big;  // leaked on purpose
    // A small block freed with another size of its own class (2304 and 2560 B share one):
    // refused, naming both sizes, and the block stays live.
    void* q = mr.allocate(2300);
    CHECK_THROWS_WITH(mr.deallocate(q, 2560), Catch::Contains("with size 2560 B (alignment 256), but its block is 2304 B"));
    CHECK_THROWS_WITH(mr.deallocate(q, 1000), Catch::Contains("its block is 2304 B"));  // another class
    mr.deallocate(q, 2300);
    CHECK_THROWS_WITH(mr.deallocate(q, 2300), Catch::Contains("already taken back"));
    CHECK(mr.check_invariants() == "");
  }
  CHECK(sim->footprint() == 0);
  CHECK_THROWS_AS(arena_memory_resource(sim, 0), logic_error);
  arena_options bad;
  bad.superblock_size = 3 * MiB;
  CHECK_THROWS_AS(arena_memory_resource(sim, 64 * MiB, bad), logic_error);
}

TEST_CASE("arena: a thread that exits hands its arena's free superblocks back") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options;
  options.superblock_size = 1 * MiB;
  options.max_small_size = 64 * KiB;
  arena_memory_resource mr{sim, 64 * MiB, options};
  std::thread worker{[&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 200; ++i) { blocks.push_back(mr.allocate(16 * KiB, stream_view::per_thread())); }
    for (void* p : blocks) { mr.deallocate(p, 16 * KiB, stream_view::per_thread()); }
  }};
  worker.join();
  CHECK(mr.stats().superblocks_in_arenas == 0);
  CHECK(mr.stats().global_free_bytes == mr.held_bytes());
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena: superblocks move between a stream arena and the global arena in batches") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options options;
  options.superblock_size = 1 * MiB;
  options.max_small_size = 256 * KiB;
  options.empty_superblocks_kept = 3;
  arena_memory_resource mr{sim, 256 * MiB, options};
  stream_view const s = fake_stream(0);
  // The first small block brings 2 x 3 superblocks in one trip: one in use, five spares.
  void* first = mr.allocate(256 * KiB, s);
  CHECK(mr.stats().superblocks_in_arenas == 6);
  // 40 superblocks' worth of 256 KiB blocks (4 to a superblock).
  std::vector<void*> blocks{first};
  for (int i = 1; i < 160; ++i) { blocks.push_back(mr.allocate(256 * KiB, s)); }
  CHECK(mr.stats().superblocks_in_arenas >= 40);
  CHECK(mr.stats().superblocks_in_arenas <= 40 + 5);
  CHECK(mr.check_invariants() == "");
  // Freeing them all: spares pile up to 6, then all but 3 go back at once; the arena ends
  // holding at most 6 spares plus the 3 empty superblocks its class list may keep.
  std::size_t most_held = 0;
  for (void* p : blocks) {
    mr.deallocate(p, 256 * KiB, s);
    most_held = std::max(most_held, mr.stats().superblocks_in_arenas);
  }
  CHECK(most_held <= 45);
  CHECK(mr.stats().superblocks_in_arenas <= 3 + 6);
  CHECK(mr.stats().superblocks_in_arenas >= 3);
  CHECK(mr.check_invariants() == "");
  // release() takes every free superblock back.
  mr.release();
  CHECK(mr.stats().superblocks_in_arenas == 0);
  CHECK(mr.held_bytes() == 0);
  CHECK(sim->footprint() == 0);
}

TEST_CASE("arena: a free whose size exceeds the arena is refused, naming the block, directly and through binning") {
  // Rounded up to 256, a size within 255 of SIZE_MAX saturated to the block pool's "any
  // size", which freed whatever large block started there.
  auto sim = std::make_shared<simulated_memory_resource>();
  auto mr = std::make_shared<arena_memory_resource>(sim, 64 * MiB);
  binning_memory_resource bins{mr, 256, 64 * KiB};  // larger requests go to the arena
  for (memory_resource* r : {static_cast<memory_resource*>(mr.get()), static_cast<memory_resource*>(&bins)}) {
    void* big = r->allocate(3 * MiB);
    for (std::size_t const bad : {SIZE_MAX - 300, SIZE_MAX - 255, SIZE_MAX - 100, SIZE_MAX, 64 * MiB + 1}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH(r->deallocate(big, bad), Catch::Contains("its block is 3145728 B; nothing was freed"));
    }
    CHECK(mr->check_invariants() == "");
    r->deallocate(big, 3 * MiB);  // still live: the right size frees it, once
    CHECK_THROWS_WITH(r->deallocate(big, 3 * MiB), Catch::Contains("already taken back"));
  }
}

TEST_CASE("arena: a free with another alignment than the block's, or one not a power of two, is refused") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr{sim, 64 * MiB};
  void* large = mr.allocate(2 * MiB, {}, 4096);
  CHECK_THROWS_WITH(mr.deallocate(large, 2 * MiB, {}, 1 * MiB),
                    Catch::Contains("but its block was handed out with alignment 4096; nothing was freed"));
  CHECK_THROWS_WITH(mr.deallocate(large, 2 * MiB, {}, 8192), Catch::Contains("alignment 4096"));
  CHECK_THROWS_AS(mr.deallocate(large, 2 * MiB), logic_error);  // 256: the block was aligned to 4096
  void* plain = mr.allocate(3 * MiB);  // alignment 256
  CHECK_THROWS_WITH(mr.deallocate(plain, 3 * MiB, {}, 4096), Catch::Contains("handed out with alignment 256"));
  // A small size with a large alignment comes from the global arena too.
  void* small_aligned = mr.allocate(100 * KiB, {}, 8192);
  CHECK_THROWS_AS(mr.deallocate(small_aligned, 100 * KiB, {}, 16384), logic_error);
  CHECK_THROWS_AS(mr.deallocate(small_aligned, 100 * KiB), logic_error);
  void* small = mr.allocate(1000);
  for (std::size_t const bad : {std::size_t{0}, std::size_t{3}, std::size_t{768}, std::size_t{3} << 20}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(mr.deallocate(small, 1000, {}, bad), Catch::Contains("an alignment must be a power of two"));
    CHECK_THROWS_WITH(mr.deallocate(large, 2 * MiB, {}, bad), Catch::Contains("an alignment must be a power of two"));
  }
  CHECK(mr.check_invariants() == "");
  // Every refusal left its block live: the right shape frees each, once.
  mr.deallocate(large, 2 * MiB, {}, 4096);
  mr.deallocate(plain, 3 * MiB);
  mr.deallocate(small_aligned, 100 * KiB, {}, 8192);
  mr.deallocate(small, 1000, {}, 128);  // every alignment up to 256 is the default one
  CHECK_THROWS_AS(mr.deallocate(large, 2 * MiB, {}, 4096), logic_error);
  auto const st = mr.stats();
  CHECK(st.large_live_bytes + st.small_live_bytes == 0);
}

namespace {
/// Refuses its first `refusals` allocations, then serves from `up`.
class refusing_upstream final : public memory_resource {
 public:
  explicit refusing_upstream(resource_ptr up) : up_{std::move(up)} {}
  std::atomic<int> refusals{0};

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view s) override {
    if (refusals.load() > 0) {
      --refusals;
      allocation_failure info;
      info.requested_bytes = bytes;
      info.resource = "refusing";
      info.detail = "a transient refusal";
      throw out_of_memory(std::move(info));
    }
    return up_->allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_view s) override {
    up_->deallocate(p, bytes, s, alignment);
  }
  std::string do_name() const override { return "refusing"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
  resource_ptr up_;
};
}  // namespace

TEST_CASE("arena: out_of_memory names an upstream refusal only when this call's growth was refused") {
  auto up = std::make_shared<refusing_upstream>(std::make_shared<simulated_memory_resource>());
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.minimum_growth = 1 * MiB;
  arena_memory_resource mr{up, 16 * MiB, o};
  up->refusals = 1;  // the first growth is refused once, then served smaller
  std::vector<void*> live{mr.allocate(4 * MiB)};
  // Later, at the maximum: the upstream was not asked, so it refused nothing this time.
  try {
    for (;;) { live.push_back(mr.allocate(4 * MiB)); }
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), Catch::Contains("(the maximum size is reached)"));
    CHECK_THAT(e.what(), !Catch::Contains("transient"));
  }
  for (void* p : live) { mr.deallocate(p, 4 * MiB); }
  mr.release();
  REQUIRE(mr.held_bytes() == 0);
  // A call whose every growth is refused names the upstream's reason.
  up->refusals = 1000;
  CHECK_THROWS_WITH(mr.allocate(4 * MiB), Catch::Contains("upstream refused") && Catch::Contains("a transient refusal"));
  up->refusals = 0;
  mr.deallocate(mr.allocate(4 * MiB), 4 * MiB);  // served again; nothing stale is named later
}
