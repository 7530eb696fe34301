// Events recorded before the pool's lock (detail/spare_events.hpp, stream_owners::park):
// a free that will park its stream records first and the pool adopts that event only when
// no other thread has named the stream — otherwise a free by another thread, made after
// the record but before the lock, would be parked under an event that does not cover it.
// Model-tested through the fake event seam with simulated threads, whose calls interleave
// between one thread's record and its free.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <stream_model.hpp>
#include <freed_ranges.hpp>
#include <simulated_threads.hpp>
#include <faked_pool.hpp>

#include <mrstack/detail/spare_events.hpp>
#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <vector>

using namespace mrstack;
using detail::stream_ref;
using test::created;
using test::live_block;
using test::pending_free;
using test::fake_stream_sync;
using test::freed_ranges;
using test::current_thread;
using test::simulated_thread_key;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;


/// What one model run saw: prerecorded events adopted, and parks that found their stream
/// idle (its memory made synchronized instead).
struct model_counts {
  std::size_t adopted = 0;
  std::size_t settled_idle = 0;
};

/// Which streams a simulated thread uses: only its own; its own for 1,000 steps, then the
/// next one's (threads of a pool taking turns on streams); or any of them.
enum class usage { own, rotating, shared };

/// Runs `steps` random steps of three simulated threads over three created streams. With
/// `idle_streams`, the device now and then finishes a stream's work, the seam answers
/// idle truly, and prerecording threads ask it first (as the pool does).
model_counts run_model(std::uint64_t seed, usage use, int steps, bool idle_streams = false) {
  std::mt19937_64 rng{seed};
  auto fake = std::make_shared<fake_stream_sync>();
  fake->report_idle = idle_streams;
  // Frees park when a stream has freed 1/park_divisor of the pool since its last park:
  // with 1024 nearly every free here parks, with 64 most do not (both must be safe).
  // (No minimum: the blocks here are small, and it is the parking that is under test.)
  detail::park_policy parks;
  parks.divisor = seed % 2 == 0 ? 64U : 1024U;
  parks.minimum = 0;
  detail::stream_ordered_pool core{fake, &simulated_thread_key, true, parks};
  std::uintptr_t const threads[] = {3, 5, 7};
  std::uintptr_t const streams[] = {0x100, 0x200, 0x300};
  freed_ranges freed;
  std::map<std::uintptr_t, live_block> live;
  std::map<std::uintptr_t, std::optional<pending_free>> pending;  // by thread
  std::vector<detail::stream_sync::handle> spares;
  model_counts counts;
  std::uintptr_t next_chunk = 0x500000000000;
  auto finish_free = [&](std::uintptr_t thread) {
    pending_free p = *pending[thread];
    pending[thread].reset();
    live_block const b = live.at(p.address);
    detail::stream_sync::handle const mine = p.before.event;
    REQUIRE(core.deallocate(p.address, created(b.stream), detail::block_pool::any_size, &p.before) == b.size);
    counts.adopted += p.before.event != mine ? 1 : 0;
    if (p.before.event != 0) { spares.push_back(p.before.event); }
    freed.add(p.address, b.size, b.stream, p.clock);
    live.erase(p.address);
  };
  for (int step = 0; step < steps; ++step) {
    if (idle_streams && rng() % 8 == 0) { fake->complete(streams[rng() % 3]); }  // the device catches up
    current_thread = threads[rng() % 3];
    if (pending[current_thread]) {  // a thread's next action is the free it prerecorded for
      finish_free(current_thread);
      continue;
    }
    std::size_t const own = (current_thread - 3) / 2 + (use == usage::rotating ? step / 1000 : 0);
    std::uintptr_t const s = use == usage::shared ? streams[rng() % 3] : streams[own % 3];
    if (live.size() < 4 || rng() % 100 < 50) {
      std::size_t const size = (1 + rng() % 64) * 64 * KiB;
      std::uintptr_t a = core.allocate(size, 256, created(s));
      if (a == 0 && core.blocks().total_bytes() > 512 * MiB && core.synchronize_everything()) {
        a = core.allocate(size, 256, created(s));
      }
      if (a == 0) {
        core.add_chunk(next_chunk, 32 * MiB, created(s));
        next_chunk += 64 * MiB;
        a = core.allocate(size, 256, created(s));
        REQUIRE(a != 0);
      }
      REQUIRE(freed.take(a, size, s, *fake) == "");
      live.emplace(a, live_block{size, s});
      fake->enqueue(s);
      continue;
    }
    // A free by this thread of a block on a stream it may use, not one another thread is freeing.
    auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
    bool busy = false;
    for (auto const& [t, p] : pending) { busy = busy || (p && p->address == it->first); }
    if (busy || (use != usage::shared && it->second.stream != s)) { continue; }
    std::uintptr_t const stream = it->second.stream;
    std::uint64_t const clock = fake->enqueue(stream);  // the block's last use
    if (idle_streams && rng() % 2 == 0) { fake->complete(stream); }  // and the device ran it at once
    if (rng() % 2 == 0) {
      // Prerecord on the block's stream now (or find it idle); other threads act before
      // the free lands.
      detail::prepark before;
      before.idle = idle_streams && fake->idle(stream);
      if (!before.idle) {
        if (spares.empty()) {
          before.event = fake->create_event();
        } else {
          before.event = spares.back();
          spares.pop_back();
        }
        REQUIRE(fake->record(before.event, stream));
      }
      pending[current_thread] = pending_free{it->first, clock, before};
      continue;
    }
    REQUIRE(core.deallocate(it->first, created(stream)) == it->second.size);
    freed.add(it->first, it->second.size, stream, clock);
    live.erase(it);
    if (step % 256 == 0) { REQUIRE(core.blocks().check_invariants() == ""); }
  }
  REQUIRE(core.blocks().check_invariants() == "");
  for (auto& s : spares) { fake->destroy_event(s); }
  counts.settled_idle = core.owners().idle_parks();
  return counts;
}

/// The scene of the two explicit tests below: thread A (3) holds blocks `a` (16 MiB) and
/// `b` (4 KiB) on created stream s and has just parked s, so it alone has named s since;
/// thread B (5) uses a second stream t, so frees park.
struct two_threads_one_stream {
  struct scene {
    stream_ref s, t;
    std::uintptr_t a, b;
  };
  explicit two_threads_one_stream(bool idle_streams)
      : fake{make_fake(idle_streams)}, core{fake, &simulated_thread_key, true, no_minimum()} {
    scene& x = blocks;
    x.s = created(0x100);
    x.t = created(0x200);
    current_thread = 3;
    core.add_chunk(0x500000000000, 64 * MiB, x.s);
    x.a = core.allocate(16 * MiB, 256, x.s);
    x.b = core.allocate(4 * KiB, 256, x.s);
    current_thread = 5;
    core.add_chunk(0x600000000000, 8 * MiB, x.t);  // a second stream: frees park from now on
    REQUIRE(core.allocate(4 * KiB, 256, x.t) != 0);
    current_thread = 3;
    std::uintptr_t const c = core.allocate(8 * MiB, 256, x.s);
    REQUIRE(core.deallocate(c, x.s) == 8 * MiB);  // A parks s: the one thread since that park
  }
  static std::shared_ptr<fake_stream_sync> make_fake(bool idle_streams) {
    auto f = std::make_shared<fake_stream_sync>();
    f->report_idle = idle_streams;
    return f;
  }
  static detail::park_policy no_minimum() {
    detail::park_policy parks;
    parks.minimum = 0;
    return parks;
  }
  std::shared_ptr<fake_stream_sync> fake;
  detail::stream_ordered_pool core;
  scene blocks{};
};

}  // namespace

TEST_CASE("pool prerecord: streams each used by one thread adopt the events recorded before the lock, safely") {
  for (usage const use : {usage::own, usage::rotating}) {
    std::size_t adopted = 0;
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      CAPTURE(seed);
      adopted += run_model(seed, use, 60000).adopted;
    }
    INFO("rotating " << (use == usage::rotating) << ", adopted " << adopted);
    CHECK(adopted > 1000);  // the test exercised the adoption it is about, also as threads take turns
  }
  current_thread = 3;
}

TEST_CASE("pool prerecord: streams several threads use never park under an event recorded before another's free") {
  std::size_t adopted = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    adopted += run_model(seed, usage::shared, 60000).adopted;
  }
  INFO("adopted " << adopted);
  CHECK(adopted > 0);  // between one thread's two parks with no other thread in between
  current_thread = 3;
}

TEST_CASE("pool prerecord: without the one-thread rule the model sees memory reused early (the model can fail)") {
  // A stream named by two threads: B frees after A's record, then A's free parks both
  // under A's event. The pool must record anew; a pool that adopted A's event would hand
  // B's block to another stream before B's work.
  two_threads_one_stream m{false};
  auto& fake = m.fake;
  auto& core = m.core;
  auto const& [s, t, a, b] = m.blocks;
  fake->enqueue(0x100);
  detail::stream_sync::handle event = fake->create_event();
  REQUIRE(fake->record(event, 0x100));  // A's prerecord
  current_thread = 5;                   // B, on the same stream, frees after it
  std::uint64_t const b_clock = fake->enqueue(0x100);
  std::size_t const records = fake->records;
  REQUIRE(core.deallocate(b, s) == 4 * KiB);
  CHECK(fake->records == records);  // too small to park: B's free waits for a record
  current_thread = 3;
  detail::stream_sync::handle const mine = event;
  detail::prepark before{event, false};
  REQUIRE(core.deallocate(a, s, detail::block_pool::any_size, &before) == 16 * MiB);
  CHECK(before.event == mine);  // not adopted: the stream has had two threads
  event = before.event;
  current_thread = 5;
  std::uintptr_t const reused = core.allocate(48 * MiB, 256, t);  // takes parked memory, B's block too
  REQUIRE(reused != 0);
  CHECK(fake->ordered_after(0x200, 0x100, b_clock));
  // And the model would have caught the adoption: A's event does not cover B's free.
  fake->wait(0x300, mine);
  CHECK_FALSE(fake->ordered_after(0x300, 0x100, b_clock));
  fake->destroy_event(event);
  current_thread = 3;
}

TEST_CASE("pool prerecord: the pool records large frees on created streams before its lock, and counts them") {
  test::faked_pool f;
  auto& fake = f.fake;
  auto& pool = f.pool;
  auto const a = f.a;
  auto const b = f.b;
  void* pa = pool.allocate(64 * MiB, a);
  void* pb = pool.allocate(64 * MiB, b);
  pool.deallocate(pb, 64 * MiB, b);  // the second stream is seen: the next free learns the bound
  for (int i = 0; i < 100; ++i) {
    pool.deallocate(pa, 64 * MiB, a);  // parks A, with the event it recorded first
    pa = pool.allocate(64 * MiB, a);
  }
  std::size_t const created_events = fake->creates;
  CHECK(created_events <= 3);  // two streams' events, reused; not one per free
  CHECK(pool.stats().events_recorded == fake->records);
  void* on_b = pool.allocate(64 * MiB, b);  // A's parked memory or B's own: never early
  pool.deallocate(on_b, 64 * MiB, b);
  pool.deallocate(pa, 64 * MiB, a);
  CHECK(pool.check_invariants() == "");
  CHECK(fake->dead_named == 0);
}

TEST_CASE("pool idle streams: parks that find their stream idle record nothing, and nothing is reused early") {
  for (usage const use : {usage::own, usage::rotating, usage::shared}) {
    model_counts total;
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      CAPTURE(seed);
      model_counts const c = run_model(seed, use, 60000, true);
      total.adopted += c.adopted;
      total.settled_idle += c.settled_idle;
    }
    INFO("usage " << static_cast<int>(use) << ", adopted " << total.adopted << ", idle parks " << total.settled_idle);
    CHECK(total.settled_idle > 1000);  // the idle path was exercised, beside events
    CHECK(total.adopted > 0);
  }
  current_thread = 3;
}

TEST_CASE("pool idle streams: an idle answer from before the lock counts only while one thread names the stream (the model can fail)") {
  // A finds s idle before its lock; B then uses a block on s and frees it; A's free parks
  // s. Taking A's answer would hand B's block to another stream before B's work ran.
  two_threads_one_stream m{true};  // A's park of s found it idle: no record
  auto& fake = m.fake;
  auto& core = m.core;
  auto const& [s, t, a, b] = m.blocks;
  CHECK(core.owners().idle_parks() == 1);
  detail::prepark before;
  before.idle = fake->idle(0x100);  // A, before its lock
  REQUIRE(before.idle);
  current_thread = 5;  // B, on the same stream, uses b and frees it
  std::uint64_t const b_clock = fake->enqueue(0x100);
  REQUIRE(core.deallocate(b, s) == 4 * KiB);
  current_thread = 3;
  REQUIRE(core.deallocate(a, s, detail::block_pool::any_size, &before) == 16 * MiB);
  CHECK(core.owners().idle_parks() == 1);  // asked again under the lock: busy, so it recorded
  current_thread = 5;
  std::uintptr_t const reused = core.allocate(48 * MiB, 256, t);  // parked memory, B's block too
  REQUIRE(reused != 0);
  CHECK(fake->ordered_after(0x200, 0x100, b_clock));
  CHECK_FALSE(fake->ordered_after(0x300, 0x100, b_clock));  // what a stream taking it unordered would see
  current_thread = 3;
}
