// Stream slots at their limits: a resource whose free memory is spread over more streams
// than it has slots (65,535: short-lived threads' default streams do it on their own)
// synchronizes and recycles instead of refusing every later call; a stream handle of ~0
// (the stream maps' "no stream" key) is a stream like any other.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <simulated_threads.hpp>

#include <mrstack/detail/stream_ordering.hpp>

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

TEST_CASE("stream slots: the last slot's stream takes over another stream's blocks without growing") {
  // fixed_size reads owner id 0xffff as "no owner": while the last slot had that id, its
  // stream's takeover read as "found nothing" and the resource grew a chunk instead.
  auto fake = std::make_shared<test::fake_stream_sync>();
  constexpr std::size_t per_chunk = 65536 + 8;
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256, per_chunk, fake};
  stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
  stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};
  void* kept_a = mr.allocate(100, a);  // slots 1 and 2; from the second on, frees record
  void* kept_b = mr.allocate(100, b);
  mr.deallocate(mr.allocate(100, a), 100, a);
  mr.deallocate(mr.allocate(100, b), 100, b);
  std::size_t const others = detail::stream_owners::max_slot - 2;  // slots 3 .. max_slot, one free block each
  for (std::size_t i = 0; i < others; ++i) { mr.deallocate(mr.allocate(100, fake_stream(i)), 100, fake_stream(i)); }
  stream_view const last = fake_stream(others - 1);
  REQUIRE(mr.chunk_count() == 1);
  std::vector<void*> mine;
  for (int k = 0; k < 40; ++k) { mine.push_back(mr.allocate(100, last)); }  // past its own: takeovers
  CHECK(mr.chunk_count() == 1);
  for (void* p : mine) { mr.deallocate(p, 100, last); }
  mr.deallocate(kept_a, 100, a);
  mr.deallocate(kept_b, 100, b);
}

TEST_CASE("stream slots: a recycled slot starts with nothing freed: its new stream parks no earlier than any") {
  // The slot kept its last stream's count of bytes freed since that stream's last record,
  // so the new stream's first small free made it record and park.
  auto fake = std::make_shared<test::fake_stream_sync>();
  detail::stream_ordered_pool core{fake, &test::simulated_thread_key, true};
  core.add_chunk(0x100000000000, std::size_t{1} << 30, test::shared_stream(0));
  core.synchronize_everything();
  auto const x = test::shared_stream(0x1000);
  core.add_chunk(0x200000000000, 7 << 20, x);  // x's own chunk, used whole: no neighbour to merge with
  std::uintptr_t kept = core.allocate(7 << 20, 256, x);
  core.deallocate(kept, x);  // 7 MiB freed since x's last record, below the 8 MiB a park needs
  kept = core.allocate(7 << 20, 256, x);  // taken back: x's slot holds no free memory
  detail::owner_id const slot_of_x = core.owner_of(x);
  (void)core.owner_of(test::shared_stream(0x2000));  // the owner cache now names another stream
  detail::stream_ref z{};
  for (std::size_t i = 0; i < 1100 && z.key == 0; ++i) {  // past soft_slot_limit: empty slots are recycled
    auto const s = test::shared_stream(0x100000 + 0x100 * i);
    if (core.owner_of(s) == slot_of_x) {
      z = s;
    } else {
      (void)core.allocate(4096, 256, s);  // kept: this stream's slot is not the one recycled
      core.deallocate(core.allocate(4096, 256, s), s);
    }
  }
  REQUIRE(z.key != 0);
  core.add_chunk(0x300000000000, 2 << 20, z);
  std::uintptr_t const block = core.allocate(2 << 20, 256, z);
  REQUIRE(block != 0);
  std::size_t const records = fake->records;
  core.deallocate(block, z);  // 2 MiB freed on z: no park due
  CHECK(fake->records == records);
  (void)kept;
}
