// detail::flat_combiner (include/mrstack/detail/flat_combiner.hpp): every section runs
// exactly once, under the mutex, and a section another thread runs sees its requester as
// the acting thread; a thread whose section waits too long runs it itself. Also what
// acting for another thread changes in the stream-ordering rules: the requester's
// per-thread default stream is never recorded on by the thread running its call.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/detail/flat_combiner.hpp>
#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/stream_ordering.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <thread>
#include <vector>

using namespace mrstack;
using namespace mrstack::detail;

namespace {

struct section_record {
  std::uintptr_t requester = 0;  // this_thread_key() of the thread that asked
  std::uintptr_t acting = 0;     // acting_thread_key() while it ran
  std::uintptr_t runner = 0;     // this_thread_key() of the thread that ran it
  int runs = 0;
  lean_mutex* mutex = nullptr;
  bool mutex_held = false;
};

void record_section(void* context) noexcept {
  auto& r = *static_cast<section_record*>(context);
  r.acting = acting_thread_key();
  r.runner = this_thread_key();
  r.mutex_held = !r.mutex->try_lock();
  if (!r.mutex_held) { r.mutex->unlock(); }
  ++r.runs;
}

void wait_until(std::function<bool()> const& done) {
  auto const give_up = std::chrono::steady_clock::now() + std::chrono::seconds{20};
  while (!done() && std::chrono::steady_clock::now() < give_up) { std::this_thread::yield(); }
  REQUIRE(done());
}

}  // namespace

TEST_CASE("flat_combiner: sections published while the lock is held run once each, under it, as their requesters") {
  flat_combiner combiner;
  lean_mutex mutex;
  std::vector<section_record> records(3);
  mutex.lock();  // nobody can run a section yet: all three publish
  std::vector<std::thread> threads;
  for (auto& r : records) {
    r.mutex = &mutex;
    threads.emplace_back([&combiner, &mutex, &r] {
      r.requester = this_thread_key();
      combiner.run(mutex, &record_section, &r);
    });
  }
  wait_until([&] { return combiner.waiting() == records.size(); });
  mutex.unlock();
  for (auto& t : threads) { t.join(); }
  int run_for_another = 0;
  for (auto const& r : records) {
    CHECK(r.runs == 1);
    CHECK(r.mutex_held);
    CHECK(r.acting == r.requester);  // the requester, whichever thread ran it
    run_for_another += r.runner != r.requester ? 1 : 0;
  }
  // The first thread to take the lock ran every published section, its own included.
  CHECK(run_for_another == 2);
  CHECK(combiner.combined() == 2);
  CHECK_FALSE(acting_for_another_thread());
}

TEST_CASE("flat_combiner: a section kept waiting past its patience is taken back and run by its own thread") {
  flat_combiner combiner;
  lean_mutex mutex;
  section_record r;
  r.mutex = &mutex;
  mutex.lock();
  std::thread waiter{[&] {
    r.requester = this_thread_key();
    combiner.run(mutex, &record_section, &r);
  }};
  // Published, then taken back after `patience` rounds (the thread now sleeps in lock()).
  wait_until([&] { return combiner.waiting() == 1; });
  wait_until([&] { return combiner.waiting() == 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds{20});
  CHECK(r.runs == 0);  // not run while the lock was held
  mutex.unlock();
  waiter.join();
  CHECK(r.runs == 1);
  CHECK(r.runner == r.requester);
  CHECK(combiner.combined() == 0);
}

TEST_CASE("flat_combiner: 8 threads, 20,000 sections each, a plain counter stays exact") {
  flat_combiner combiner;
  lean_mutex mutex;
  std::size_t counter = 0;  // written only by sections, under the mutex
  auto bump = [](void* c) noexcept { ++*static_cast<std::size_t*>(c); };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) { combiner.run(mutex, bump, &counter); }
    });
  }
  for (auto& t : threads) { t.join(); }
  CHECK(counter == 8u * 20000u);
}

TEST_CASE("acting for another thread: its per-thread default stream is ordered through the legacy stream") {
  // Thread R freed a block on its per-thread default stream; another thread, running a
  // call of R's on a created stream, needs that memory. Only R may record on R's default
  // stream (cudaStreamPerThread on any other thread names that thread's own), so the
  // handover must go through the legacy stream, as for any other thread's default stream.
  auto fake = std::make_shared<test::fake_stream_sync>();
  stream_ordered_pool pool{fake, &acting_thread_key};
  constexpr std::uintptr_t per_thread_handle = 0x2;  // cudaStreamPerThread
  std::uintptr_t const r_key = this_thread_key();
  stream_ref const r_default{r_key, per_thread_handle, true};
  stream_ref const created{0x300, 0x300, false};
  pool.blocks().add_chunk(0x1000000, 1 << 20, block_pool::synchronized);
  std::uintptr_t const a = pool.allocate(1 << 20, 256, r_default);
  REQUIRE(a != 0);
  REQUIRE(pool.deallocate(a, r_default) != 0);
  std::vector<std::uintptr_t> recorded_on;
  fake->on_record = [&](test::fake_stream_sync::handle s) { recorded_on.push_back(s); };
  std::uintptr_t b = 0;
  std::thread runner{[&] {
    acting_for as{r_key};
    b = pool.allocate(1 << 20, 256, created);
  }};
  runner.join();
  CHECK(b == a);
  CHECK(std::find(recorded_on.begin(), recorded_on.end(), per_thread_handle) == recorded_on.end());
  CHECK(std::find(recorded_on.begin(), recorded_on.end(), 0u) != recorded_on.end());
}
