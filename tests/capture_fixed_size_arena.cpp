// fixed_size (and so binning's bins) and the arena while a stream is being captured into a
// CUDA graph. CUDA refuses an event recorded in a capture to a stream outside it, a wait
// from a captured stream on an event recorded outside, and a synchronization of a stream
// being captured; each ends the capture (seen on an H200 with the pool,
// tests/gpu/pool_idle_parks.cpp). So none of those may happen, and memory freed inside a
// capture goes to another stream only after the capture. The pool's own cases are in
// tests/pool_capture.cpp; the fake seam is tests/support/fake_stream_sync.hpp.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <memory>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};
auto const handle_of = [](stream_view s) { return reinterpret_cast<test::fake_stream_sync::handle>(s.value()); };

struct faked_fixed_size {
  std::shared_ptr<test::fake_stream_sync> fake = std::make_shared<test::fake_stream_sync>();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), MiB, 4, fake};

  /// Allocates on `s` until every block of the first chunk is taken (none left to share).
  std::vector<void*> take_all(stream_view s) {
    std::vector<void*> taken;
    for (std::size_t i = 0; i < mr.blocks_per_chunk(); ++i) { taken.push_back(mr.allocate(MiB, s)); }
    return taken;
  }
};

}  // namespace

TEST_CASE("fixed_size capture: a free inside a capture records nothing and stays its stream's until the capture ends") {
  faked_fixed_size f;
  auto& mr = f.mr;
  std::vector<void*> held = f.take_all(b);  // b holds the first chunk: a second stream
  void* x = mr.allocate(MiB, a);            // a grows
  void* w = mr.allocate(MiB, a);            // freed after the capture
  f.fake->begin_capture(handle_of(a));
  std::uint64_t const last_use = f.fake->enqueue(handle_of(a));
  mr.deallocate(x, MiB, a);                 // the eager rule would record here
  CHECK(f.fake->records_in_capture == 0);
  std::vector<void*> on_b;
  for (std::size_t i = 0; i < 2 * mr.blocks_per_chunk(); ++i) { on_b.push_back(mr.allocate(MiB, b)); }
  CHECK(std::find(on_b.begin(), on_b.end(), x) == on_b.end());  // b grew instead of taking x
  CHECK(f.fake->records_in_capture == 0);
  CHECK(f.fake->waits_into_capture == 0);
  CHECK(f.fake->syncs_in_capture == 0);
  f.fake->end_capture(handle_of(a));
  std::size_t const records = f.fake->records;
  mr.deallocate(w, MiB, a);  // a's first free after the capture records what it holds
  CHECK(f.fake->records > records);
  void* y = nullptr;
  for (std::size_t i = 0; i < 2 * mr.blocks_per_chunk() && y != x; ++i) {
    y = mr.allocate(MiB, b);
    on_b.push_back(y);
  }
  CHECK(y == x);  // now b takes it, ordered after a's work
  CHECK(f.fake->ordered_after(handle_of(b), handle_of(a), last_use));
  for (void* p : on_b) { mr.deallocate(p, MiB, b); }
  for (void* p : held) { mr.deallocate(p, MiB, b); }
  CHECK(f.fake->dead_named == 0);
}

TEST_CASE("fixed_size capture: a captured stream takes no memory that needs a wait; it grows") {
  faked_fixed_size f;
  auto& mr = f.mr;
  std::vector<void*> held = f.take_all(b);
  void* x = mr.allocate(MiB, a);
  f.fake->enqueue(handle_of(a));
  mr.deallocate(x, MiB, a);  // recorded: taking it needs a wait on that event
  mr.deallocate(held.back(), MiB, b);
  held.pop_back();
  f.fake->begin_capture(handle_of(b));
  std::vector<void*> on_b;
  for (std::size_t i = 0; i < 2 * mr.blocks_per_chunk(); ++i) { on_b.push_back(mr.allocate(MiB, b)); }
  CHECK(std::find(on_b.begin(), on_b.end(), x) == on_b.end());
  CHECK(f.fake->waits_into_capture == 0);
  CHECK(f.fake->syncs_in_capture == 0);
  f.fake->end_capture(handle_of(b));
  for (void* p : on_b) { mr.deallocate(p, MiB, b); }
  for (void* p : held) { mr.deallocate(p, MiB, b); }
}

TEST_CASE("arena capture: a small block freed on a stream being captured waits for the capture's end") {
  // Freed on another stream than its arena's, a small block is normally made safe by
  // synchronizing the freeing stream; on a stream being captured that ends the capture,
  // and the graph's work on the block has not even run. So it is held back, and goes back
  // to its arena at the freeing stream's first call after the capture, which synchronizes.
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_options options;
  options.stream_sync = fake;
  arena_memory_resource arena{std::make_shared<simulated_memory_resource>(), 256 * MiB, options};
  void* x = arena.allocate(1024, a);
  void* on_b = arena.allocate(256, b);  // freed after the capture: b's first call then
  fake->begin_capture(handle_of(b));
  std::uint64_t const last_use = fake->enqueue(handle_of(b));
  arena.deallocate(x, 1024, b);
  CHECK(fake->syncs_in_capture == 0);
  CHECK(arena.check_invariants() == "");
  CHECK_THROWS_AS(arena.deallocate(x, 1024, b), logic_error);  // held back, not live: a second free is refused
  void* during = arena.allocate(1024, a);
  CHECK(during != x);  // not reused while the capture lasts
  fake->end_capture(handle_of(b));
  arena.deallocate(on_b, 256, b);  // b's first call after the capture gives x back
  CHECK(fake->syncs_in_capture == 0);
  void* after = arena.allocate(1024, a);
  CHECK(after == x);
  // b was synchronized first (the fake counts the capture's work as b's own; a real
  // graph's work runs at its launches, which ordering is the caller's).
  CHECK(fake->ordered_after(handle_of(a), handle_of(b), last_use));
  arena.deallocate(after, 1024, a);
  arena.deallocate(during, 1024, a);
  CHECK(arena.check_invariants() == "");
  SECTION("outside a capture the freeing stream is synchronized at once") {
    void* y = arena.allocate(1024, a);
    std::size_t const syncs = fake->syncs;
    arena.deallocate(y, 1024, b);
    CHECK(fake->syncs == syncs + 1);
  }
}
