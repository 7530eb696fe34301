// A thread's per-thread-stream arenas are retired by its exit hook (a thread_local). A
// thread_local built before the thread's first arena call is destroyed after that hook,
// and its destructor may still free or allocate on the thread's default stream: it must
// neither strand an arena (and its superblocks) per thread, nor keep using an arena that
// was retired meanwhile and taken by a new thread for its own stream.
#include <catch2/catch.hpp>

#include <phase_gate.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// Runs `at_exit` when the thread exits, after the arena's exit hook when it was set
/// (built) before the thread's first arena call.
struct late_destructor {
  std::function<void()> at_exit;
  ~late_destructor() {
    if (at_exit) { at_exit(); }
  }
};
thread_local late_destructor late;

arena_options small_arenas() {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.minimum_growth = 4 * MiB;
  o.empty_superblocks_kept = 1;
  return o;
}

}  // namespace

TEST_CASE("arena thread exit: late destructors that allocate leave no arena behind, however many threads run them") {
  arena_memory_resource mr1{std::make_shared<simulated_memory_resource>(), 256 * MiB, small_arenas()};
  arena_memory_resource mr2{std::make_shared<simulated_memory_resource>(), 256 * MiB, small_arenas()};
  constexpr int threads = 8;
  for (int i = 0; i < threads; ++i) {
    std::thread t{[&] {
      late.at_exit = [&] {  // built now: destroyed after the hook
        for (auto* mr : {&mr1, &mr2}) {  // several arena resources, each twice
          void* p = mr->allocate(4 * KiB, stream_view::per_thread());
          void* q = mr->allocate(8 * KiB, stream_view::per_thread());
          mr->deallocate(p, 4 * KiB, stream_view::per_thread());
          mr->deallocate(q, 8 * KiB, stream_view::per_thread());
        }
      };
      for (auto* mr : {&mr1, &mr2}) {
        mr->deallocate(mr->allocate(256, stream_view::per_thread()), 256, stream_view::per_thread());
      }
    }};
    t.join();
  }
  for (auto* mr : {&mr1, &mr2}) {
    auto const st = mr->stats();
    INFO("stream arenas " << st.stream_arenas << ", superblocks in arenas " << st.superblocks_in_arenas);
    CHECK(st.stream_arenas == 0);  // every thread has exited: no arena of theirs is in use
    CHECK(st.superblocks_in_arenas == 0);
    CHECK(mr->check_invariants() == "");
  }
}

TEST_CASE("arena thread exit: a late destructor's free and allocations never use an arena a new thread took") {
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, small_arenas()};
  test::phase_gate gate;
  void* late_block = nullptr;
  void* p0 = nullptr;  // not on t's stack: the late destructor runs after t's function returned
  std::thread t{[&] {
    late.at_exit = [&] {
      // The hook found p0 live: its arena is an exited thread's, kept until it empties.
      mr.deallocate(p0, 4 * KiB, stream_view::per_thread());
      gate.advance(1);
      gate.wait_for(2);  // meanwhile that arena is retired and a new thread takes it
      late_block = mr.allocate(4 * KiB, stream_view::per_thread());
      void* again = mr.allocate(4 * KiB, stream_view::per_thread());
      mr.deallocate(again, 4 * KiB, stream_view::per_thread());
      mr.deallocate(late_block, 4 * KiB, stream_view::per_thread());
    };
    p0 = mr.allocate(4 * KiB, stream_view::per_thread());
  }};
  gate.wait_for(1);
  // Another thread's exit retires the arenas of exited threads that have emptied.
  std::thread{[&] { mr.deallocate(mr.allocate(256, stream_view::per_thread()), 256, stream_view::per_thread()); }}.join();
  void* taken = nullptr;
  test::phase_gate newcomer_done;
  std::thread newcomer{[&] {
    // A new thread takes a retired arena for its own default stream, and frees a block on
    // it: the block may be reused on this stream at once, on no other without ordering.
    void* q = mr.allocate(4 * KiB, stream_view::per_thread());
    mr.deallocate(q, 4 * KiB, stream_view::per_thread());
    taken = q;
    newcomer_done.advance(1);
    gate.wait_for(3);
  }};
  newcomer_done.wait_for(1);
  gate.advance(2);
  t.join();
  CHECK(late_block != taken);  // the late destructor did not allocate from the newcomer's arena
  gate.advance(3);
  newcomer.join();
  auto const st = mr.stats();
  CHECK(st.stream_arenas == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena thread exit: an arena over an arena hands its chunk back at a thread's exit, no deadlock") {
  // x's chunks are small blocks of y. A thread that made x grow leaves y's arena on its
  // stream; another thread that only used x exits holding x's last free superblock, and
  // its exit hook hands x's chunk back to y on that thread's stream. The hook had held the
  // registry lock of live arenas while doing so, and y's first call on the thread took it
  // again: the thread never finished exiting.
  auto sim = std::make_shared<simulated_memory_resource>();
  auto y = std::make_shared<arena_memory_resource>(sim, 64 * MiB);  // small blocks up to 1 MiB
  arena_options o;
  o.superblock_size = 64 * KiB;
  o.max_small_size = 32 * KiB;
  o.max_free_bytes = 0;  // a wholly free chunk goes back at once
  auto x = std::make_shared<arena_memory_resource>(y, 1 * MiB, o);
  void* grown = nullptr;
  std::thread{[&] { grown = x->allocate(100 * KiB, stream_view::per_thread()); }}.join();
  REQUIRE(y->stats().small_live_bytes == 1 * MiB);
  // The exit runs on a thread a watcher joins, and the test waits for the watcher with a
  // deadline: a deadlock fails the test instead of hanging it.
  auto exited = std::make_shared<std::promise<void>>();
  std::future<void> done = exited->get_future();
  std::thread watcher{[x, y, grown, exited] {
    std::thread{[&] {
      void* s = x->allocate(1 * KiB, stream_view::per_thread());
      x->deallocate(s, 1 * KiB, stream_view::per_thread());
      x->deallocate(grown, 100 * KiB, stream_view::per_thread());
    }}.join();
    exited->set_value();
  }};
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    // The hung thread holds locks the process's own exit takes (the main thread's hook):
    // end the process rather than hang at exit.
    std::fprintf(stderr, "FAILED: a thread exiting with an arena over an arena did not finish within 30 s (deadlock)\n");
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  watcher.join();
  CHECK(x->held_bytes() == 0);  // the exiting thread's hook handed x's chunk back
  CHECK(y->stats().small_live_bytes == 0);
  CHECK(x->check_invariants() == "");
  CHECK(y->check_invariants() == "");
}
