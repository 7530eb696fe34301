// The arena's thread shards: threads that share one stream and contend for its arena get
// an arena each on that stream (here at once: `shard_after_contentions = 0` shards when a
// second thread calls). Blocks stay disjoint, any thread frees any block with no CUDA call
// (the same stream), one stream in use still makes no CUDA call at all, and a block a
// shard held back during a capture is settled by any thread's next call on the stream.
#include <catch2/catch.hpp>

#include <phase_gate.hpp>
#include <sharded_arena_options.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/error.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view const shared{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const other{reinterpret_cast<cudaStream_t>(0x200)};
using block = std::pair<void*, std::size_t>;

/// An arena sharded from a second thread on (support/sharded_arena_options.hpp); the fake seam counts CUDA calls.
struct sharded_arena {
  std::shared_ptr<test::thread_stream_seam> seam = std::make_shared<test::thread_stream_seam>();
  arena_memory_resource mr;

  explicit sharded_arena(bool thread_shards = true)
      : mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, test::sharded_arena_options(seam, thread_shards)} {}
  std::size_t cuda_calls() {
    return seam->ask([](test::fake_stream_sync& f) { return f.records + f.waits + f.syncs + f.sync_alls; });
  }
};

/// Runs f(0..n-1) on n threads that take their thread shard indices before any of them
/// starts: distinct ones (a thread done early would hand its index to one started late).
template <typename F>
void on_threads(int n, F const& f) {
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      (void)detail::this_thread_shard();
      started.fetch_add(1);
      while (started.load() < n) { std::this_thread::yield(); }
      f(i);
    });
  }
  for (auto& t : threads) { t.join(); }
}

/// Empty when no two blocks overlap.
std::string overlaps(std::vector<std::vector<block>> const& per_thread) {
  std::vector<block> all;
  for (auto const& v : per_thread) { all.insert(all.end(), v.begin(), v.end()); }
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    auto const end = static_cast<char*>(all[i - 1].first) + all[i - 1].second;
    if (end > static_cast<char*>(all[i].first)) { return "blocks overlap at block " + std::to_string(i); }
  }
  return "";
}

/// Rounds of: every thread allocates on `shared`, the blocks are checked, then each
/// thread frees its neighbour's blocks on `shared`.
void churn(sharded_arena& a, int threads, int rounds) {
  std::vector<std::vector<block>> held(threads);
  for (int round = 0; round < rounds; ++round) {
    on_threads(threads, [&](int t) {
      std::mt19937_64 rng(static_cast<unsigned>(round * 100 + t));
      for (int i = 0; i < 300; ++i) {
        std::size_t const size = 256 + rng() % (32 * KiB - 256);
        held[t].emplace_back(a.mr.allocate(size, shared), size);
      }
    });
    REQUIRE(overlaps(held) == "");
    REQUIRE(a.mr.check_invariants() == "");
    on_threads(threads, [&](int t) {
      auto& theirs = held[(t + 1) % threads];
      for (auto const& [p, size] : theirs) { a.mr.deallocate(p, size, shared); }
    });
    for (auto& v : held) { v.clear(); }
    REQUIRE(a.mr.check_invariants() == "");
  }
}

}  // namespace

TEST_CASE("arena thread shards: threads on one stream get an arena each, and free each other's blocks without a CUDA call") {
  sharded_arena a;
  churn(a, 4, 3);
  auto const st = a.mr.stats();
  CHECK(st.stream_arenas == 1);
  CHECK(st.thread_shard_arenas == 3);  // threads of later rounds took over the first round's shards
  REQUIRE(st.streams.size() == 1);     // the shards' free memory is the stream's
  CHECK(st.streams[0].free_bytes == st.free_bytes_in_arenas);
  // Every free was on the blocks' own stream, and the shards are one stream: no
  // synchronization, and no depot batch needed an event.
  CHECK(a.cuda_calls() == 0);
  a.mr.release();
  CHECK(a.mr.check_invariants() == "");
}

TEST_CASE("arena thread shards: off, threads on one stream share its arena") {
  sharded_arena a{false};
  churn(a, 4, 2);
  CHECK(a.mr.stats().stream_arenas == 1);
  CHECK(a.mr.stats().thread_shard_arenas == 0);
  CHECK(a.cuda_calls() == 0);
}

TEST_CASE("arena thread shards: a thread alone on a stream, or on its per-thread stream, is not sharded") {
  sharded_arena a;
  std::vector<block> mine;
  for (int i = 0; i < 100; ++i) { mine.emplace_back(a.mr.allocate(1024, shared), 1024); }
  for (auto const& [p, size] : mine) { a.mr.deallocate(p, size, shared); }
  on_threads(4, [&](int) {
    void* p = a.mr.allocate(1024, stream_view::per_thread());
    a.mr.deallocate(p, 1024, stream_view::per_thread());
  });
  CHECK(a.mr.stats().thread_shard_arenas == 0);
}

TEST_CASE("arena thread shards: a block one thread's shard held back in a capture is settled by another thread's call") {
  // x comes from `other`'s arena. The settler makes `shared`'s arena; the holder, a
  // second thread on `shared`, gets a shard of it and frees x on `shared` while `shared`
  // is being captured, so its shard holds x back. After the capture the settler's call on
  // `shared` must give x back (the holder, still alive, may never call on `shared` again).
  sharded_arena a;
  void* x = a.mr.allocate(4096, other);
  test::phase_gate gate;
  auto const capture = [&](bool begin) {
    a.seam->ask([begin](test::fake_stream_sync& f) {
      begin ? f.begin_capture(0x100) : f.end_capture(0x100);
      return 0;
    });
  };
  std::thread settler{[&] {
    void* p = a.mr.allocate(1024, shared);  // makes `shared`'s arena
    gate.advance(1);
    gate.wait_for(2);
    void* q = a.mr.allocate(1024, shared);  // after the capture: settles the holder's shard
    a.mr.deallocate(q, 1024, shared);
    a.mr.deallocate(p, 1024, shared);
  }};
  std::thread holder{[&] {
    gate.wait_for(1);
    void* mine = a.mr.allocate(1024, shared);  // a second thread: its own shard of `shared`
    capture(true);
    a.mr.deallocate(x, 4096, shared);  // held back: `shared` cannot be synchronized now
    capture(false);
    gate.advance(2);
    gate.wait_for(3);
    a.mr.deallocate(mine, 1024, shared);
  }};
  settler.join();
  CHECK(a.mr.stats().thread_shard_arenas == 1);
  CHECK(a.seam->ask([](test::fake_stream_sync& f) { return f.syncs_in_capture; }) == 0);
  void* again = a.mr.allocate(4096, other);
  CHECK(again == x);  // back in `other`'s arena, free
  a.mr.deallocate(again, 4096, other);
  gate.advance(3);
  holder.join();
  CHECK(a.mr.check_invariants() == "");
}

TEST_CASE("arena thread shards: the spec sets them") {
  auto const on = make_stack("arena(size=64MiB, shard_after_contentions=0) > simulated");
  auto const off = make_stack("arena(size=64MiB, thread_shards=off) > simulated");
  auto* sharded = dynamic_cast<arena_memory_resource*>(on.get());
  auto* unsharded = dynamic_cast<arena_memory_resource*>(off.get());
  REQUIRE(sharded != nullptr);
  REQUIRE(unsharded != nullptr);
  on_threads(2, [&](int) {
    for (auto* mr : {sharded, unsharded}) {
      void* p = mr->allocate(1024, shared);
      mr->deallocate(p, 1024, shared);
    }
  });
  CHECK(sharded->stats().thread_shard_arenas == 1);
  CHECK(unsharded->stats().thread_shard_arenas == 0);
  CHECK_THROWS_AS(make_stack("arena(size=64MiB, shard_after_contentions=-1) > simulated"), spec_error);
}
