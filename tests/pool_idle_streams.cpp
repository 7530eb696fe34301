// Streams that have finished their work (cudaStreamQuery says idle) park their frees with
// no event, and other streams take that memory with no wait (stream_owners::park_if_idle);
// streams that stay busy are asked rarely. Through the fake event seam.
#include <catch2/catch.hpp>

#include <faked_pool.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>

using namespace mrstack;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}

TEST_CASE("pool idle streams: an idle stream's frees park with no record, and another stream takes them with no wait") {
  test::faked_pool f;
  f.fake->report_idle = true;
  auto& pool = f.pool;
  void* pa = pool.allocate(64 * MiB, f.a);
  void* pb = pool.allocate(64 * MiB, f.b);
  pool.deallocate(pb, 64 * MiB, f.b);  // a second stream
  std::size_t const records = f.fake->records;
  pool.deallocate(pa, 64 * MiB, f.a);  // parks a: idle, so no event
  CHECK(f.fake->records == records);
  CHECK(pool.stats().idle_parks >= 1);
  std::size_t const waits = f.fake->waits;
  void* first = pool.allocate(64 * MiB, f.b);   // b's own
  void* second = pool.allocate(64 * MiB, f.b);  // a's, parked while idle
  CHECK(f.fake->waits == waits);
  CHECK(pool.stats().upstream_allocations == 2);  // not grown for it
  pool.deallocate(first, 64 * MiB, f.b);
  pool.deallocate(second, 64 * MiB, f.b);
  CHECK(pool.check_invariants() == "");
  CHECK(f.fake->dead_named == 0);
}

TEST_CASE("pool idle streams: once a busy stream parks with a record, its parked memory is waited for again") {
  test::faked_pool f;
  f.fake->report_idle = true;
  auto& pool = f.pool;
  void* pa = pool.allocate(64 * MiB, f.a);
  void* pa2 = pool.allocate(64 * MiB, f.a);
  void* pb = pool.allocate(64 * MiB, f.b);
  pool.deallocate(pb, 64 * MiB, f.b);
  pool.deallocate(pa, 64 * MiB, f.a);  // idle: parked complete
  std::uint64_t const last_use = f.fake->enqueue(0x100);  // a is busy with pa2 now
  pool.deallocate(pa2, 64 * MiB, f.a);  // busy: recorded, and everything parked waits for it
  CHECK(f.fake->records >= 1);
  void* on_b1 = pool.allocate(64 * MiB, f.b);
  void* on_b2 = pool.allocate(64 * MiB, f.b);
  void* on_b3 = pool.allocate(64 * MiB, f.b);  // some of a's parked memory, ordered after a's work
  CHECK(f.fake->ordered_after(0x200, 0x100, last_use));
  for (void* p : {on_b1, on_b2, on_b3}) { pool.deallocate(p, 64 * MiB, f.b); }
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool idle streams: a stream that stays busy is asked about once per 64 parks") {
  test::faked_pool f;
  f.fake->report_idle = true;
  auto& pool = f.pool;
  void* pb = pool.allocate(64 * MiB, f.b);
  pool.deallocate(pb, 64 * MiB, f.b);  // a second stream
  void* pa = pool.allocate(64 * MiB, f.a);
  std::size_t const queries = f.fake->queries;
  for (int i = 0; i < 640; ++i) {
    f.fake->enqueue(0x100);  // work on a that never finishes
    pool.deallocate(pa, 64 * MiB, f.a);
    pa = pool.allocate(64 * MiB, f.a);
  }
  std::size_t const asked = f.fake->queries - queries;
  INFO(asked << " queries over 640 parks");
  CHECK(asked >= 10);
  CHECK(asked <= 20);  // 1 + 2 + 4 + ... up to 64 between asks: ~10 + 640 / 64
  CHECK(pool.stats().idle_parks == 0);
  f.fake->complete(0x100);
  std::size_t parks_seen = 0;
  for (int i = 0; i < 128 && parks_seen == 0; ++i) {  // finished: found idle within a round of skips
    pool.deallocate(pa, 64 * MiB, f.a);
    pa = pool.allocate(64 * MiB, f.a);
    parks_seen = pool.stats().idle_parks;
  }
  CHECK(parks_seen == 1);
  pool.deallocate(pa, 64 * MiB, f.a);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool idle streams: one thread alternating between two busy streams is asked rarely on both") {
  test::faked_pool f;
  f.fake->report_idle = true;
  auto& pool = f.pool;
  void* pa = pool.allocate(64 * MiB, f.a);
  void* pb = pool.allocate(64 * MiB, f.b);
  std::size_t const queries = f.fake->queries;
  for (int i = 0; i < 640; ++i) {
    f.fake->enqueue(0x100);
    f.fake->enqueue(0x200);
    pool.deallocate(pa, 64 * MiB, f.a);
    pool.deallocate(pb, 64 * MiB, f.b);
    pa = pool.allocate(64 * MiB, f.a);
    pb = pool.allocate(64 * MiB, f.b);
  }
  std::size_t const asked = f.fake->queries - queries;
  INFO(asked << " queries over 1280 parks");
  CHECK(asked <= 40);  // each stream's busy streak is kept apart (not reset at every switch)
  pool.deallocate(pa, 64 * MiB, f.a);
  pool.deallocate(pb, 64 * MiB, f.b);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool idle streams: a stream found busy in one pool is still asked at once by another") {
  test::faked_pool busy;
  busy.fake->report_idle = true;
  void* pb = busy.pool.allocate(64 * MiB, busy.b);
  busy.pool.deallocate(pb, 64 * MiB, busy.b);
  void* pa = busy.pool.allocate(64 * MiB, busy.a);
  for (int i = 0; i < 20; ++i) {  // a long busy streak for handle a in this pool
    busy.fake->enqueue(0x100);
    busy.pool.deallocate(pa, 64 * MiB, busy.a);
    pa = busy.pool.allocate(64 * MiB, busy.a);
  }
  busy.pool.deallocate(pa, 64 * MiB, busy.a);
  test::faked_pool fresh;  // same stream handles, a pool of its own, nothing queued
  fresh.fake->report_idle = true;
  void* qb = fresh.pool.allocate(64 * MiB, fresh.b);
  fresh.pool.deallocate(qb, 64 * MiB, fresh.b);
  void* qa = fresh.pool.allocate(64 * MiB, fresh.a);
  fresh.pool.deallocate(qa, 64 * MiB, fresh.a);
  CHECK(fresh.pool.stats().idle_parks == 1);
  CHECK(fresh.fake->records == 0);
}
