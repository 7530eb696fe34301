// Stream slots at their limits: a resource whose free memory is spread over more streams
// than it has slots (65,535: short-lived threads' default streams do it on their own)
// synchronizes and recycles instead of refusing every later call; a stream handle of ~0
// (the stream maps' "no stream" key) is a stream like any other.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdint>
#include <memory>
#include <vector>

using namespace mrstack;

namespace {

stream_view fake_stream(std::size_t i) { return stream_view{reinterpret_cast<cudaStream_t>(0x10000 + 0x100 * i)}; }

constexpr std::size_t streams = 70'000;  // past the 65,535 slots

}  // namespace

TEST_CASE("stream slots: fixed_size serves a 70,000th stream after 65,535 hold free blocks") {
  // Each stream frees one block into a slot of its own and keeps it (later streams take
  // from the synchronized blocks first). At 65,535 every allocate and free on a new stream
  // threw length_error, with every block free.
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 256, streams};
  for (std::size_t i = 0; i < streams; ++i) {
    void* p = mr.allocate(100, fake_stream(i));
    mr.deallocate(p, 100, fake_stream(i));
  }
  CHECK(mr.free_blocks() == mr.total_blocks());
  CHECK(mr.chunk_count() == 1);
}

TEST_CASE("stream slots: a pool serves a 70,000th stream after 65,535 hold free blocks, and parks at the limit") {
  // Each stream keeps a live block beside the one it frees, so its free block stays its
  // own (merged with a neighbour, it went back to the pool's synchronized memory at the
  // next growth and the slots never filled). Streams that never report idle (the fake's
  // default), as real ones with work queued.
  auto const fake = std::make_shared<test::fake_stream_sync>();
  pool_options options;
  options.stream_sync = fake;
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_memory_resource mr{sim, 256 << 20, std::nullopt, options};
  std::vector<void*> kept;
  for (std::size_t i = 0; i < streams; ++i) {
    void* p = mr.allocate(256, fake_stream(i));
    kept.push_back(mr.allocate(256, fake_stream(i)));
    mr.deallocate(p, 256, fake_stream(i));
  }
  // A free that parks (more than the park minimum) while every slot is taken: it needs a
  // parked owner; it had freed the block, then thrown length_error. Nothing parks there,
  // so nothing is asked or recorded either (it had counted an idle park and a record).
  fake->report_idle = true;
  stream_view const s = fake_stream(streams - 1);
  void* big = mr.allocate(16 << 20, s);
  auto const before = mr.stats();
  CHECK_NOTHROW(mr.deallocate(big, 16 << 20, s));
  auto const after = mr.stats();
  CHECK(after.idle_parks == before.idle_parks);
  CHECK(after.events_recorded == before.events_recorded);
  for (std::size_t i = 0; i < streams; ++i) { mr.deallocate(kept[i], 256, fake_stream(i)); }
  CHECK(mr.fragmentation().live_bytes == 0);
}

TEST_CASE("stream slots: a stream handle of ~0 hands its blocks over like any stream's") {
  // Key ~0 marks "no stream" in the stream maps, and the owner cache started there with
  // owner 0 (synchronized): another stream took the block with no wait.
  auto fake = std::make_shared<test::fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const all_ones = ~std::uintptr_t{0};
  stream_view const x{reinterpret_cast<cudaStream_t>(all_ones)};
  stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};
  fixed_size_memory_resource mr{sim, 4096, 1, fake};
  mr.deallocate(mr.allocate(100, b), 100, b);
  void* q = mr.allocate(100, x);
  std::uint64_t const clock = fake->enqueue(all_ones);
  mr.deallocate(q, 100, x);
  void* r = mr.allocate(100, b);
  if (r == q) { CHECK(fake->ordered_after(0x200, all_ones, clock)); }
  mr.deallocate(r, 100, b);
}
