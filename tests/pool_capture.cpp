// A stream being captured into a CUDA graph: its work runs only when the graph is
// launched, and another stream cannot wait on an event recorded in the capture (on an H200
// such a wait failed with "invalid argument"). So while the capture lasts the pool parks
// none of that stream's frees and records nothing on it — the memory stays the stream's
// own, and another stream that wants it grows instead — and its first call after the
// capture parks as usual. Through the fake event seam (tests/support/fake_stream_sync.hpp).
#include <catch2/catch.hpp>

#include <faked_pool.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

/// a frees `size` bytes while captured; b then needs that much and more.
void free_while_captured_then_take(std::size_t size, bool report_idle, pool_options options = {}) {
  test::faked_pool f{options};
  f.fake->report_idle = report_idle;
  auto& pool = f.pool;
  auto const a = reinterpret_cast<test::fake_stream_sync::handle>(f.a.value());
  void* on_b = pool.allocate(size, f.b);
  pool.deallocate(on_b, size, f.b);   // a second stream: frees park from now on
  for (int i = 0; i < 3; ++i) {       // a parks once outside the capture (primes any pre-lock path)
    pool.deallocate(pool.allocate(size, f.a), size, f.a);
  }
  void* x = pool.allocate(size, f.a);
  void* w = pool.allocate(size, f.a);                 // freed after the capture
  f.fake->begin_capture(a);
  std::uint64_t const last_use = f.fake->enqueue(a);  // the graph's use of x
  pool.deallocate(x, size, f.a);
  void* small = pool.allocate(256, f.a);              // a's own reuse inside the capture is fine
  pool.deallocate(small, 256, f.a);
  CHECK(f.fake->records_in_capture == 0);
  std::size_t const grown = pool.stats().upstream_allocations;
  void* y1 = pool.allocate(size, f.b);                // b's own memory
  void* y2 = pool.allocate(size, f.b);                // not a's: it grows
  CHECK(y1 != x);
  CHECK(y2 != x);
  CHECK(pool.stats().upstream_allocations > grown);
  CHECK(f.fake->records_in_capture == 0);
  f.fake->end_capture(a);
  std::size_t const records = f.fake->records;
  pool.deallocate(w, size, f.a);                      // a's first call after the capture parks it
  CHECK(f.fake->records > records);
  std::vector<void*> taken{y1, y2};
  std::size_t const before_taking = pool.stats().upstream_allocations;
  while (taken.size() < 8 && taken.back() != x) { taken.push_back(pool.allocate(size, f.b)); }
  CHECK(taken.back() == x);                           // now b takes it, with no growth,
  CHECK(pool.stats().upstream_allocations == before_taking);
  CHECK(f.fake->ordered_after(0x200, a, last_use));   // ordered after a's work
  for (void* p : taken) { pool.deallocate(p, size, f.b); }
  CHECK(f.fake->dead_named == 0);
  CHECK(pool.check_invariants() == "");
}

}  // namespace

TEST_CASE("pool capture: a stream being captured parks nothing and records nothing until the capture ends") {
  SECTION("a large free (parks for certain: the event would be made before the lock)") {
    free_while_captured_then_take(64 * MiB, false);
  }
  SECTION("the same with idle streams reported (a captured stream is never idle)") {
    free_while_captured_then_take(64 * MiB, true);
  }
  SECTION("RMM's rule: an event at every free") {
    pool_options eager;
    eager.record_on_demand = false;
    free_while_captured_then_take(64 * MiB, false, eager);
  }
}

namespace {

/// b, being captured, asks for memory only a holds (parked under an event, or parked
/// complete when a was idle).
void take_while_captured(bool a_idle, pool_options options = {}) {
  constexpr std::size_t size = 64 * MiB;
  test::faked_pool f{options};
  f.fake->report_idle = a_idle;
  auto& pool = f.pool;
  auto const b = reinterpret_cast<test::fake_stream_sync::handle>(f.b.value());
  pool.deallocate(pool.allocate(256, f.b), 256, f.b);  // a second stream
  void* x = pool.allocate(size, f.a);
  f.fake->enqueue(0x100);
  if (a_idle) { f.fake->complete(0x100); }
  pool.deallocate(x, size, f.a);                        // a parks: recorded, or idle
  f.fake->begin_capture(b);
  std::size_t const grown = pool.stats().upstream_allocations;
  void* y = pool.allocate(size, f.b);
  CHECK(f.fake->waits_into_capture == 0);
  CHECK(f.fake->syncs_in_capture == 0);
  if (a_idle) {
    CHECK(y == x);  // complete: no wait needed, so a captured stream may take it
    CHECK(pool.stats().upstream_allocations == grown);
  } else {
    CHECK(y != x);  // it would need a wait: grown instead
    CHECK(pool.stats().upstream_allocations > grown);
  }
  f.fake->end_capture(b);
  void* z = pool.allocate(size, f.b);                   // after the capture: a's memory, with a wait
  if (!a_idle) { CHECK(z == x); }
  pool.deallocate(y, size, f.b);
  pool.deallocate(z, size, f.b);
  CHECK(pool.check_invariants() == "");
}

}  // namespace

TEST_CASE("pool capture: a stream being captured takes other streams' memory only when it needs no wait") {
  SECTION("a parked under an event: b grows") { take_while_captured(false); }
  SECTION("a parked idle: b takes it") { take_while_captured(true); }
  SECTION("RMM's rule") {
    pool_options eager;
    eager.record_on_demand = false;
    take_while_captured(false, eager);
  }
}


TEST_CASE("pool capture: while the legacy stream answers 'capturing', another thread's default-stream memory is not taken") {
  // CUDA: while any blocking stream is being captured, a record on the legacy default
  // stream ends that capture in every mode, and asking about the legacy stream reports
  // an error, which the seam answers as "capturing". The fake marks the legacy stream.
  test::faked_pool f;
  auto& pool = f.pool;
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;
  void* x = nullptr;
  std::thread owner{[&] {
    x = pool.allocate(4 * MiB, stream_view::per_thread());
    pool.deallocate(x, 4 * MiB, stream_view::per_thread());
    std::unique_lock lock{m};
    phase = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 2; });  // alive: its default stream is another thread's
  }};
  {
    std::unique_lock lock{m};
    cv.wait(lock, [&] { return phase == 1; });
  }
  f.fake->begin_capture(test::fake_stream_sync::handle{0});
  std::size_t const grown = pool.stats().upstream_allocations;
  void* y = pool.allocate(4 * MiB, f.b);
  CHECK(f.fake->records_in_capture == 0);  // nothing recorded on the legacy stream
  CHECK(f.fake->sync_alls == 0);
  CHECK(y != x);                           // it grew instead
  CHECK(pool.stats().upstream_allocations > grown);
  f.fake->end_capture(test::fake_stream_sync::handle{0});
  void* z = pool.allocate(4 * MiB, f.b);   // after the capture it may be taken
  CHECK(z == x);
  {
    std::lock_guard lock{m};
    phase = 2;
  }
  cv.notify_all();
  owner.join();
  pool.deallocate(y, 4 * MiB, f.b);
  pool.deallocate(z, 4 * MiB, f.b);
  CHECK(f.fake->dead_named == 0);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool capture: a chunk of a destroyed stream is not asked about when chunks go back") {
  // Whether a chunk's memory is held by a capture is asked only for a stream the call may
  // name: asking CUDA about a destroyed stream crashed on an H200 (growth looked for
  // wholly free chunks to return, and one was a destroyed stream's).
  auto fake = std::make_shared<test::fake_stream_sync>();
  detail::stream_ordered_pool core{fake};
  detail::stream_ref const a{0x100, 0x100, false};
  detail::stream_ref const b{0x200, 0x200, false};
  detail::chunk_id const of_a = core.add_chunk(0x10000000, 64 * MiB, a);
  detail::chunk_id const of_b = core.add_chunk(0x20000000, 64 * MiB, b);
  fake->kill(0x100);  // the user destroys a
  detail::stream_ref out{};
  CHECK_FALSE(core.return_stream_without_sync(of_a, out, b));  // a cannot be named by b's call
  CHECK(fake->dead_named == 0);
  CHECK(core.return_stream_without_sync(of_b, out, b));  // b's own: asked, and not captured
  CHECK(out.key == b.key);
  fake->begin_capture(0x200);
  CHECK_FALSE(core.return_stream_without_sync(of_b, out, b));  // held by b's capture
  fake->end_capture(0x200);
}
