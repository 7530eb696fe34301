// The arena's depot (src/detail/arena_depot.cpp): wholly free superblocks a stream arena
// hands back wait there, carved, for the next stream arena that needs one. Model-tested
// against the recording fake of CUDA events: another stream takes them only after waiting
// for the frees made on them, the freeing stream takes them back with no wait, one stream
// in use makes no CUDA call, a stream being captured or one the call may not name is left
// alone, and the depot gives its superblocks to the global arena before it grows.
#include <catch2/catch.hpp>

#include <bump_upstream.hpp>
#include <fake_stream_sync.hpp>

#include <mrstack/detail/arena_core.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <map>
#include <random>
#include <set>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::uintptr_t stream_a = 0x1000;
constexpr std::uintptr_t stream_b = 0x2000;
constexpr std::uintptr_t stream_c = 0x3000;
stream_view on(std::uintptr_t s) { return stream_view{reinterpret_cast<cudaStream_t>(s)}; }

arena_options depot_options(std::shared_ptr<test::fake_stream_sync> fake) {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;  // four blocks a superblock
  o.empty_superblocks_kept = 1;  // spares past 2 go back in one trip
  o.max_free_bytes = 256 * MiB;
  o.minimum_growth = 4 * MiB;
  o.stream_sync = std::move(fake);
  return o;
}

/// An arena over simulated memory with the recording fake (`size` at most).
struct depot_setup {
  std::shared_ptr<test::fake_stream_sync> fake = std::make_shared<test::fake_stream_sync>();
  std::shared_ptr<simulated_memory_resource> sim = std::make_shared<simulated_memory_resource>();
  arena_memory_resource mr;
  explicit depot_setup(std::size_t size = 256 * MiB) : mr{sim, size, depot_options(fake)} {}
  /// Stream b makes a call: two streams are in use from here.
  void use_b() { mr.deallocate(mr.allocate(1000, on(stream_b)), 1000, on(stream_b)); }
};

/// `n` blocks of 256 KiB on `s`.
std::vector<void*> fill(arena_memory_resource& mr, std::uintptr_t s, int n) {
  std::vector<void*> blocks;
  for (int i = 0; i < n; ++i) { blocks.push_back(mr.allocate(256 * KiB, on(s))); }
  return blocks;
}

void free_all(arena_memory_resource& mr, std::vector<void*> const& blocks, std::uintptr_t s) {
  for (void* p : blocks) { mr.deallocate(p, 256 * KiB, on(s)); }
}

std::set<std::uintptr_t> superblocks_of(std::vector<void*> const& blocks) {
  std::set<std::uintptr_t> bases;
  for (void* p : blocks) { bases.insert(reinterpret_cast<std::uintptr_t>(p) / MiB); }
  return bases;
}

/// Simulated threads for the core (per-thread default streams are told apart by thread).
std::uintptr_t current_thread = 1;
std::uintptr_t simulated_thread_key() noexcept { return current_thread; }

using test::bump_upstream;

/// The core's options for the simulated-thread cases: four 256 KiB blocks a superblock,
/// spares past 2 go back in one trip, at most `size` held and kept free.
detail::arena_core::options core_options(std::size_t size) {
  detail::arena_core::options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.empty_superblocks_kept = 1;
  o.max_size = size;
  o.max_free_bytes = size;
  o.minimum_growth = 4 * MiB;
  return o;
}

bool share_a_superblock(std::vector<void*> const& x, std::vector<void*> const& y) {
  auto const a = superblocks_of(x);
  for (auto b : superblocks_of(y)) {
    if (a.count(b) != 0) { return true; }
  }
  return false;
}
}  // namespace

TEST_CASE("arena depot: one stream in use makes no CUDA call, and takes its superblocks back") {
  depot_setup d;
  auto& fake = d.fake;
  auto& mr = d.mr;
  std::size_t const at_start = fake->calls();
  auto first = fill(mr, stream_a, 160);  // 40 superblocks
  free_all(mr, first, stream_a);
  std::size_t const held = mr.held_bytes();
  auto again = fill(mr, stream_a, 160);
  CHECK(fake->calls() == at_start);
  CHECK(mr.held_bytes() == held);  // the same superblocks, not new memory
  CHECK(share_a_superblock(first, again));
  free_all(mr, again, stream_a);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: another stream takes a stream's superblocks only after waiting for its frees") {
  depot_setup d;
  d.use_b();
  auto& fake = d.fake;
  auto& mr = d.mr;
  auto const a_blocks = fill(mr, stream_a, 160);
  std::uint64_t const work = fake->enqueue(stream_a);  // a's kernels use its blocks, then it frees them
  std::size_t const records = fake->records;
  free_all(mr, a_blocks, stream_a);
  CHECK(fake->records > records);  // an event per batch handed to the depot
  CHECK_FALSE(fake->ordered_after(stream_b, stream_a, work));
  std::size_t const held = mr.held_bytes();
  fake->kill(stream_a);  // destroyed after its frees: its batches' events still order b
  auto const b_blocks = fill(mr, stream_b, 120);
  CHECK(share_a_superblock(a_blocks, b_blocks));  // reused from the depot...
  CHECK(mr.held_bytes() == held);                 // ...not grown
  CHECK(fake->ordered_after(stream_b, stream_a, work));  // ...after a wait for a's work
  CHECK(fake->dead_named == 0);
  std::size_t const waits = fake->waits;
  free_all(mr, b_blocks, stream_b);
  auto const b_again = fill(mr, stream_b, 120);  // its own batches back: no wait
  CHECK(fake->waits == waits);
  free_all(mr, b_again, stream_b);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: a stream that comes later takes the first one's unrecorded batches only in order") {
  depot_setup d;
  auto& fake = d.fake;
  auto& mr = d.mr;
  auto const a_blocks = fill(mr, stream_a, 160);
  std::uint64_t const work = fake->enqueue(stream_a);
  free_all(mr, a_blocks, stream_a);  // one stream in use: batches without events
  auto const b_blocks = fill(mr, stream_b, 160);
  // Where b got a's memory at all, it is ordered after a's work.
  if (share_a_superblock(a_blocks, b_blocks)) { CHECK(fake->ordered_after(stream_b, stream_a, work)); }
  CHECK(fake->dead_named == 0);
  free_all(mr, b_blocks, stream_b);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: a stream being captured takes no other stream's batch") {
  depot_setup d;
  d.use_b();
  auto& fake = d.fake;
  auto& mr = d.mr;
  auto const a_blocks = fill(mr, stream_a, 160);
  free_all(mr, a_blocks, stream_a);
  fake->begin_capture(stream_b);
  auto const b_blocks = fill(mr, stream_b, 40);  // served all the same: by growing
  fake->end_capture(stream_b);
  CHECK(fake->waits_into_capture == 0);
  CHECK(fake->records_in_capture == 0);
  CHECK_FALSE(share_a_superblock(a_blocks, b_blocks));
  free_all(mr, b_blocks, stream_b);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: a free on another stream hands nothing to the depot for a stream it may not name") {
  depot_setup d;
  d.use_b();
  auto& fake = d.fake;
  auto& mr = d.mr;
  auto const a_blocks = fill(mr, stream_a, 160);
  std::size_t records_on_a = 0;
  fake->on_record = [&](std::uintptr_t s) { records_on_a += s == stream_a ? 1 : 0; };
  free_all(mr, a_blocks, stream_c);  // a's blocks, freed by a call naming c only
  CHECK(records_on_a == 0);
  CHECK(fake->dead_named == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: its superblocks go to the global arena before it grows, and on release") {
  depot_setup d{32 * MiB};
  d.use_b();
  auto& fake = d.fake;
  auto& mr = d.mr;
  auto const a_blocks = fill(mr, stream_a, 96);  // 24 superblocks of the 32 MiB allowed
  std::uint64_t const work = fake->enqueue(stream_a);
  free_all(mr, a_blocks, stream_a);
  // 20 MiB fits under the maximum only where a's superblocks were.
  void* large = mr.allocate(20 * MiB, on(stream_b));
  CHECK(mr.held_bytes() <= 32 * MiB);
  CHECK(fake->ordered_after(stream_b, stream_a, work));
  CHECK(mr.check_invariants() == "");
  mr.deallocate(large, 20 * MiB, on(stream_b));
  auto const again = fill(mr, stream_a, 40);
  free_all(mr, again, stream_a);
  mr.release();
  CHECK(mr.held_bytes() == 0);
  CHECK(d.sim->footprint() == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena depot: every event it made is destroyed with the arena") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  {
    arena_memory_resource mr{sim, 256 * MiB, depot_options(fake)};
    mr.deallocate(mr.allocate(1000, on(stream_b)), 1000, on(stream_b));
    for (int round = 0; round < 4; ++round) {
      auto const a_blocks = fill(mr, stream_a, 80);
      free_all(mr, a_blocks, stream_a);
      auto const b_blocks = fill(mr, stream_b, 80);
      free_all(mr, b_blocks, stream_b);
    }
    CHECK(fake->creates > 0);
  }
  CHECK(fake->live_events() == 0);
}

TEST_CASE("arena depot: a per-thread stream's batch made while it was alone reaches another thread after a legacy record") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  detail::stream_ref const ptds1{1, 0x10, true};  // key, handle, per-thread
  detail::stream_ref const ptds2{2, 0x20, true};
  fake->set_blocking(0x10);
  fake->set_blocking(0x20);
  bump_upstream up;
  detail::arena_core core{up, core_options(256 * MiB), fake, &simulated_thread_key};
  current_thread = 1;
  std::vector<std::uintptr_t> first;
  for (int i = 0; i < 160; ++i) { first.push_back(core.allocate(256 * KiB, 256, ptds1)); }
  std::uint64_t const work = fake->enqueue(0x10);
  for (auto p : first) { REQUIRE(core.deallocate(p, 256 * KiB, 256, ptds1)); }
  CHECK(fake->records + fake->waits == 0);  // one stream in use: its batches carry no event
  current_thread = 2;  // thread 1 has exited, or just stopped allocating
  std::vector<std::uintptr_t> second;
  for (int i = 0; i < 160; ++i) { second.push_back(core.allocate(256 * KiB, 256, ptds2)); }
  std::set<std::uintptr_t> firsts;
  for (auto p : first) { firsts.insert(p / MiB); }
  std::size_t shared = 0;
  for (auto p : second) { shared += firsts.count(p / MiB); }
  CHECK(shared > 0);
  CHECK(fake->ordered_after(0x20, 0x10, work));
  for (auto p : second) { REQUIRE(core.deallocate(p, 256 * KiB, 256, ptds2)); }
  CHECK(core.check_invariants() == "");
}

TEST_CASE("arena depot: per-thread streams' batches pass between threads through one legacy barrier, ordered") {
  // Per-thread default streams hand superblocks to each other through the depot. Each
  // batch had one event recorded on its stream and each taker one wait, under the depot's
  // lock; sixteen threads on an H200 host ran at half the rate they did with none. Now a
  // taker waits on a barrier recorded on the legacy stream after the batch came in, and a
  // stream that already waited on a barrier covering a batch takes it with no call. Random
  // model: every block another stream freed is reused only after that free's work.
  auto fake = std::make_shared<test::fake_stream_sync>();
  constexpr int threads = 4;
  std::vector<detail::stream_ref> ptds;
  for (int t = 0; t < threads; ++t) {
    auto const handle = static_cast<std::uintptr_t>(0x10 * (t + 1));
    ptds.push_back(detail::stream_ref{static_cast<std::uintptr_t>(t + 1), handle, true});
    fake->set_blocking(handle);
  }
  bump_upstream up;
  detail::arena_core core{up, core_options(1024 * MiB), fake, &simulated_thread_key};
  struct last_free {
    std::uintptr_t stream = 0;
    std::uint64_t clock = 0;
  };
  std::map<std::uintptr_t, last_free> freed;  // by block address
  std::vector<std::vector<std::uintptr_t>> live(threads);
  std::mt19937 rng{12};
  std::size_t cross_stream_reuses = 0;
  for (int step = 0; step < 40000; ++step) {
    int const t = static_cast<int>(rng() % threads);
    current_thread = static_cast<std::uintptr_t>(t + 1);
    auto& mine = live[static_cast<std::size_t>(t)];
    // Each thread grows to about 40 blocks and shrinks back, in turns, so superblocks move.
    bool const grow = (step / 2000 + t) % 2 == 0;
    if ((grow && mine.size() < 60) || mine.empty()) {
      std::uintptr_t const p = core.allocate(256 * KiB, 256, ptds[static_cast<std::size_t>(t)]);
      REQUIRE(p != 0);
      if (auto const f = freed.find(p); f != freed.end() && f->second.stream != ptds[static_cast<std::size_t>(t)].handle) {
        ++cross_stream_reuses;
        INFO("step " << step);
        REQUIRE(fake->ordered_after(ptds[static_cast<std::size_t>(t)].handle, f->second.stream, f->second.clock));
      }
      freed.erase(p);
      mine.push_back(p);
    } else {
      std::size_t const i = rng() % mine.size();
      std::uintptr_t const p = mine[i];
      mine[i] = mine.back();
      mine.pop_back();
      auto const handle = ptds[static_cast<std::size_t>(t)].handle;
      freed[p] = last_free{handle, fake->enqueue(handle)};  // work on the block, then its free
      REQUIRE(core.deallocate(p, 256 * KiB, 256, ptds[static_cast<std::size_t>(t)]));
    }
    if (rng() % 64 == 0) { fake->complete(ptds[rng() % threads].handle); }
  }
  INFO(cross_stream_reuses << " blocks reused by another stream; " << fake->records << " records, " << fake->waits
                           << " waits");
  CHECK(cross_stream_reuses > 300);
  // A record per batch handed in and a wait per batch taken would be several per
  // superblock moved; the barrier covers many batches, and a stream waits once for all
  // it covers.
  CHECK(fake->records < cross_stream_reuses / 8);
  CHECK(core.check_invariants() == "");
}
