// Cases from a hostile review of the arena grown in place, the in-place planner, the
// pool's statistics locking, the arena's retirement of exited threads' arenas and capture
// questions (commits a2f9866..2d032de). Each case states what a correct allocator does;
// five failed before their fixes: superblocks going back past max_free kept every granule
// committed; a large free on a captured stream released (synchronizing, decommitting
// what the graph uses); a statistics reader defeated a shard thread's last drain (a false
// out-of-memory); an allocation after the thread-exit hook used a retired arena; arenas
// of exited threads whose blocks others freed were never retired; and a reclaim named a
// destroyed stream. The ordering and stress cases held up and stay as guards.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <small_vmm.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = test::vmm_granule;
constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
auto const make_vmm = [](std::size_t capacity = unlimited) { return test::make_small_vmm(capacity); };
using test::addr;
using handle = test::fake_stream_sync::handle;
stream_view sv(handle h) { return stream_view{reinterpret_cast<cudaStream_t>(h)}; }

/// Aborts the process when a test hangs (a deadlock).
struct watchdog {
  std::atomic<bool> done{false};
  std::thread t;
  explicit watchdog(int seconds, char const* what) {
    t = std::thread{[this, seconds, what] {
      for (int i = 0; i < seconds * 10 && !done.load(); ++i) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }
      if (!done.load()) {
        std::fprintf(stderr, "WATCHDOG: %s hung for %d s (deadlock?)\n", what, seconds);
        std::abort();
      }
    }};
  }
  ~watchdog() {
    done = true;
    t.join();
  }
};

/// Freed intervals with who freed them and when; allocations must be ordered after them.
struct order_checker {
  struct freed {
    std::uintptr_t end;
    handle freer;
    std::uint64_t clock;
  };
  std::map<std::uintptr_t, freed> intervals;
  int violations = 0;
  void on_free(std::uintptr_t a, std::size_t n, handle s, std::uint64_t clock) { intervals[a] = {a + n, s, clock}; }
  void on_alloc(test::fake_stream_sync const& f, std::uintptr_t a, std::size_t n, handle user) {
    auto it = intervals.upper_bound(a);
    if (it != intervals.begin()) { --it; }
    while (it != intervals.end() && it->first < a + n) {
      if (it->second.end <= a) {
        ++it;
        continue;
      }
      if (!f.ordered_after(user, it->second.freer, it->second.clock)) { ++violations; }
      it = intervals.erase(it);
    }
  }
};

}  // namespace

// ---- 1. the arena grown in place --------------------------------------------------------------------

TEST_CASE("review: arena > simulated_vmm: superblocks going back to the global arena past max_free give granules back") {
  auto vmm = make_vmm();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 1;
  o.max_free_bytes = 8 * MiB;
  arena_memory_resource arena{vmm, 1024 * MiB, o};
  std::vector<void*> blocks;
  for (int i = 0; i < 200 * 16; ++i) { blocks.push_back(arena.allocate(64 * KiB, stream_view::per_thread())); }
  std::size_t const peak = vmm->committed_bytes();
  for (void* p : blocks) { arena.deallocate(p, 64 * KiB, stream_view::per_thread()); }
  auto const st = arena.stats();
  INFO("committed after freeing everything: " << vmm->committed_bytes() << " of " << peak
                                             << ", global free " << st.global_free_bytes << ", in arenas "
                                             << st.free_bytes_in_arenas);
  // max_free 8 MiB, a few spare superblocks, a granule of slack: far below 200 MiB.
  CHECK(vmm->committed_bytes() <= 8 * MiB + 4 * MiB + 2 * G);
  CHECK(arena.check_invariants() == "");
}

TEST_CASE("review: arena over system (chunks): the same pattern returns chunks past max_free (baseline)") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 1;
  o.max_free_bytes = 8 * MiB;
  o.minimum_growth = 4 * MiB;
  o.growth_divisor = 1000;
  arena_memory_resource arena{std::make_shared<simulated_memory_resource>(), 1024 * MiB, o};
  std::vector<void*> blocks;
  for (int i = 0; i < 200 * 16; ++i) { blocks.push_back(arena.allocate(64 * KiB, stream_view::per_thread())); }
  for (void* p : blocks) { arena.deallocate(p, 64 * KiB, stream_view::per_thread()); }
  INFO("held after freeing everything: " << arena.held_bytes());
  CHECK(arena.held_bytes() <= 8 * MiB + 4 * MiB + 8 * MiB);
}

TEST_CASE("review: arena > simulated_vmm: a large free on a captured stream past max_free does not synchronize") {
  for (bool in_place : {false, true}) {
    auto fake = std::make_shared<test::fake_stream_sync>();
    arena_options o;
    o.superblock_size = 1 * MiB;
    o.max_small_size = 64 * KiB;
    o.max_free_bytes = 4 * MiB;
    o.grow_in_place = in_place;
    o.minimum_growth = 2 * MiB;
    o.stream_sync = fake;
    arena_memory_resource arena{make_vmm(), 256 * MiB, o};
    handle const a = 0x100;
    void* keep = arena.allocate(3 * MiB, sv(a));
    void* p = arena.allocate(16 * MiB, sv(a));
    std::size_t const committed = arena.held_bytes();
    fake->begin_capture(a);
    fake->enqueue(a);  // the graph's kernel uses p
    arena.deallocate(p, 16 * MiB, sv(a));
    INFO("grow_in_place=" << in_place << ": held " << committed << " -> " << arena.held_bytes());
    CHECK(fake->syncs_in_capture == 0);
    CHECK(arena.held_bytes() == committed);  // the graph still uses p's memory when launched
    fake->end_capture(a);
    arena.deallocate(keep, 3 * MiB, sv(a));
  }
}

TEST_CASE("review: arena > simulated_vmm: peak >= held, max respected, random traffic on 3 created streams is ordered") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    auto fake = std::make_shared<test::fake_stream_sync>();
    arena_options o;
    o.superblock_size = 1 * MiB;
    o.max_small_size = 64 * KiB;
    o.empty_superblocks_kept = 1;
    o.max_free_bytes = seed % 3 == 0 ? 0 : 6 * MiB;
    o.stream_sync = fake;
    std::size_t const max = 96 * MiB;
    auto vmm = make_vmm(seed % 2 == 0 ? 80 * MiB : unlimited);
    arena_memory_resource arena{vmm, max, o};
    order_checker order;
    std::mt19937_64 rng{seed};
    struct live_block {
      void* p;
      std::size_t n;
      handle s;
    };
    std::vector<live_block> live;
    handle const streams[] = {0x100, 0x200, 0x300};
    int ooms = 0;
    for (int step = 0; step < 4000; ++step) {
      unsigned const r = rng() % 100;
      if (r < 2) {
        arena.release();
      } else if (live.empty() || r < 55) {
        handle const s = streams[rng() % 3];
        std::size_t const n = rng() % 4 == 0 ? 64 * KiB + 256 * (rng() % (24 * 4096)) : 256 * (1 + rng() % 256);
        try {
          void* p = arena.allocate(n, sv(s));
          order.on_alloc(*fake, addr(p), detail::align_up(n, 256), s);
          fake->enqueue(s);  // work on p
          live.push_back({p, n, s});
        } catch (out_of_memory const&) {
          ++ooms;
        }
      } else {
        std::size_t const i = rng() % live.size();
        auto const b = live[i];
        // Freed on its stream, or (a third of the time) on another one.
        handle const f = rng() % 3 == 0 ? streams[rng() % 3] : b.s;
        // The block's last use was on b.s and, if f differs, the user ordered f after b.s
        // (modelled by an event of b.s that f waits for).
        if (f != b.s) {
          handle const e = fake->create_event();
          fake->record(e, b.s);
          fake->wait(f, e);
          fake->destroy_event(e);
        }
        std::uint64_t const clock = fake->enqueue(f);
        arena.deallocate(b.p, b.n, sv(f));
        order.on_free(addr(b.p), detail::align_up(b.n, 256), f, clock);
        live[i] = live.back();
        live.pop_back();
      }
      auto const st = arena.stats();
      if (st.peak_held_bytes < st.held_bytes || st.held_bytes > max || vmm->committed_bytes() != st.held_bytes) {
        FAIL_CHECK("seed " << seed << " step " << step << ": held " << st.held_bytes << " peak " << st.peak_held_bytes
                           << " committed " << vmm->committed_bytes());
        break;
      }
    }
    INFO("seed " << seed << " ooms " << ooms);
    CHECK(order.violations == 0);
    CHECK(arena.check_invariants() == "");
    for (auto const& b : live) { arena.deallocate(b.p, b.n, sv(b.s)); }
    CHECK(arena.check_invariants() == "");
  }
}

// ---- 2. the planner: pool over simulated_vmm, several streams ---------------------------------------

TEST_CASE("review: pool > simulated_vmm: random traffic on 3 streams, release threshold and a full device, stays ordered") {
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    auto fake = std::make_shared<test::fake_stream_sync>();
    pool_options o;
    o.stream_sync = fake;
    o.release_threshold = seed % 3 == 0 ? 0 : 4 * MiB;
    o.thread_shards = 0;
    auto vmm = make_vmm(seed % 2 == 0 ? 48 * MiB : unlimited);
    pool_memory_resource pool{vmm, seed % 4 == 0 ? 4 * MiB : 0, 64 * MiB, o};
    order_checker order;
    std::mt19937_64 rng{seed * 77};
    struct live_block {
      void* p;
      std::size_t n;
      handle s;
    };
    std::vector<live_block> live;
    handle const streams[] = {0x100, 0x200, 0x300};
    for (int step = 0; step < 4000; ++step) {
      unsigned const r = rng() % 100;
      if (r < 2) {
        pool.release();
      } else if (live.empty() || r < 55) {
        handle const s = streams[rng() % 3];
        std::size_t const n = rng() % 4 == 0 ? 1 * MiB + 256 * (rng() % (8 * 4096)) : 256 * (1 + rng() % 4096);
        try {
          void* p = pool.allocate(n, sv(s));
          order.on_alloc(*fake, addr(p), detail::align_up(n, 256), s);
          fake->enqueue(s);
          live.push_back({p, n, s});
        } catch (out_of_memory const&) {
        }
      } else {
        std::size_t const i = rng() % live.size();
        auto const b = live[i];
        std::uint64_t const clock = fake->enqueue(b.s);
        pool.deallocate(b.p, b.n, sv(b.s));
        order.on_free(addr(b.p), detail::align_up(b.n, 256), b.s, clock);
        live[i] = live.back();
        live.pop_back();
      }
    }
    INFO("seed " << seed);
    CHECK(order.violations == 0);
    CHECK(pool.check_invariants() == "");
    for (auto const& b : live) { pool.deallocate(b.p, b.n, sv(b.s)); }
  }
}

// ---- 3. pool locking --------------------------------------------------------------------------------

TEST_CASE("review: pool: a shard thread's last drain is not defeated by a statistics reader waiting for its shard") {
  pool_options o;
  o.shard_after_contentions = 0;
  o.minimum_growth = 4 * MiB;
  o.growth_divisor = 1000;  // slabs of 4 MiB
  pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, 4 * MiB, o};
  mr.deallocate(mr.allocate(256), 256);  // the first thread: the others shard
  for (bool reader_on : {false, true}) {
    std::atomic<bool> stop{false};
    std::thread reader;
    if (reader_on) {
      reader = std::thread{[&] {
        while (!stop.load()) { (void)mr.stats(); }
      }};
    }
    int refusals = 0;
    int const rounds = 40;
    for (int i = 0; i < rounds; ++i) {
      // Three threads stay alive (distinct shards); the first leaves a wholly free slab in
      // its shard, then the others each need one, which only that slab can give.
      std::atomic<int> phase{0};
      std::atomic<int> oom{0};
      auto take_one = [&] {  // a block in this thread's shard, which needs a slab
        try {
          mr.deallocate(mr.allocate(256, stream_view::per_thread()), 256, stream_view::per_thread());
        } catch (out_of_memory const&) {
          oom.fetch_add(1);
        }
      };
      std::vector<std::thread> ts;
      for (int t = 0; t < 3; ++t) {
        ts.emplace_back([&, t] {
          for (int turn = 0; turn < 3; ++turn) {  // thread t takes its turn t; all stay alive
            while (phase.load() < turn) { std::this_thread::yield(); }
            if (turn == t) {
              take_one();
              phase = t + 1;
            }
          }
          while (phase.load() < 3) { std::this_thread::yield(); }
        });
      }
      for (auto& t : ts) { t.join(); }
      refusals += oom.load();
    }
    stop = true;
    if (reader.joinable()) { reader.join(); }
    INFO("reader " << reader_on << ": " << refusals << " refusals in " << 2 * rounds << " requests");
    CHECK(refusals == 0);
  }
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("review: pool: allocating threads near the maximum, with readers and releasers, never hang") {
  for (bool vmm : {false, true}) {
    watchdog dog{120, "pool locking stress"};
    pool_options o;
    o.shard_after_contentions = 0;
    o.minimum_growth = 2 * MiB;
    o.growth_divisor = 1000;
    o.release_threshold = vmm ? 2 * MiB : unlimited;
    resource_ptr up = vmm ? resource_ptr{make_vmm()} : resource_ptr{std::make_shared<simulated_memory_resource>()};
    pool_memory_resource mr{up, 0, 24 * MiB, o};
    mr.deallocate(mr.allocate(256), 256);
    std::atomic<bool> stop{false};
    std::atomic<long> ooms{0}, ops{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 6; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 31 + 5);
        std::vector<std::pair<void*, std::size_t>> mine;
        auto const s = stream_view::per_thread();
        while (!stop.load()) {
          if (mine.size() < 8 && rng() % 2 == 0) {
            std::size_t const n = rng() % 5 == 0 ? 2 * MiB + 256 * (rng() % 8192) : 256 * (1 + rng() % 4096);
            try {
              mine.emplace_back(mr.allocate(n, s), n);
            } catch (out_of_memory const&) {
              ooms.fetch_add(1);
            }
          } else if (!mine.empty()) {
            std::size_t const i = rng() % mine.size();
            mr.deallocate(mine[i].first, mine[i].second, s);
            mine[i] = mine.back();
            mine.pop_back();
          }
          ops.fetch_add(1);
        }
        for (auto [p, n] : mine) { mr.deallocate(p, n, s); }
      });
    }
    ts.emplace_back([&] {
      while (!stop.load()) {
        auto const st = mr.stats();
        auto const f = mr.fragmentation();
        (void)mr.free_bytes_held();
        if (st.used_bytes > st.pool_size || f.live_bytes > f.held_bytes) { FAIL_CHECK("stats inconsistent"); }
      }
    });
    ts.emplace_back([&] {
      while (!stop.load()) {
        mr.release();
        std::this_thread::yield();
      }
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    stop = true;
    for (auto& t : ts) { t.join(); }
    INFO("vmm " << vmm << " ops " << ops.load() << " ooms " << ooms.load());
    CHECK(mr.check_invariants() == "");
    CHECK(ops.load() > 1000);
  }
}

// ---- 4. arena retirement at thread exit --------------------------------------------------------------

namespace {
arena_memory_resource* g_exit_arena = nullptr;
struct allocates_at_exit {
  bool armed = false;
  ~allocates_at_exit() {
    if (!armed || g_exit_arena == nullptr) { return; }
    // A thread_local destructor that runs after the arena's exit hook (it was constructed
    // first) and needs a little temporary device memory.
    void* p = g_exit_arena->allocate(4 * KiB, stream_view::per_thread());
    g_exit_arena->deallocate(p, 4 * KiB, stream_view::per_thread());
  }
};
thread_local allocates_at_exit at_exit;
}  // namespace

TEST_CASE("review: arena: a thread_local destructor allocating after the exit hook does not use a retired arena") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.minimum_growth = 4 * MiB;
  o.empty_superblocks_kept = 1;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, o};
  g_exit_arena = &mr;
  std::thread t{[&] {
    at_exit.armed = true;  // constructed before the arena's hook
    mr.deallocate(mr.allocate(256, stream_view::per_thread()), 256, stream_view::per_thread());
  }};
  t.join();
  g_exit_arena = nullptr;
  auto const st = mr.stats();
  INFO("stream arenas " << st.stream_arenas << ", superblocks in arenas " << st.superblocks_in_arenas
                        << ", large live bytes " << st.large_live_bytes);
  CHECK(st.large_live_bytes == 0);  // no large block is live
  CHECK(mr.check_invariants() == "");
  // A new thread takes the retired arena, which was to hold nothing.
  std::thread u{[&] {
    void* p = mr.allocate(4 * KiB, stream_view::per_thread());
    mr.deallocate(p, 4 * KiB, stream_view::per_thread());
  }};
  u.join();
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("review: arena: short-lived threads retire arenas while others free their blocks, read stats and reclaim") {
  for (bool vmm : {false, true}) {
    watchdog dog{120, "arena retirement stress"};
    arena_options o;
    o.superblock_size = 64 * KiB;
    o.max_small_size = 32 * KiB;
    o.minimum_growth = 1 * MiB;
    o.empty_superblocks_kept = 1;
    o.max_free_bytes = 1 * MiB;
    resource_ptr up = vmm ? resource_ptr{make_vmm()} : resource_ptr{std::make_shared<system_memory_resource>()};
    arena_memory_resource mr{up, 256 * MiB, o};
    std::mutex m;
    std::vector<std::pair<void*, std::size_t>> handed;  // blocks of exited threads
    std::atomic<bool> stop{false};
    std::thread freer{[&] {
      while (!stop.load() || !handed.empty()) {
        std::vector<std::pair<void*, std::size_t>> got;
        {
          std::lock_guard lock{m};
          got.swap(handed);
        }
        for (auto [p, n] : got) { mr.deallocate(p, n, stream_view::per_thread()); }
        std::this_thread::yield();
      }
    }};
    std::thread reader{[&] {
      while (!stop.load()) {
        auto const st = mr.stats();
        (void)st;
        (void)mr.free_bytes_held();
        if (auto const e = mr.check_invariants(); !e.empty()) { FAIL_CHECK(e); }
      }
    }};
    std::thread reclaimer{[&] {
      while (!stop.load()) {
        mr.release();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }};
    for (int round = 0; round < 40; ++round) {
      std::vector<std::thread> ts;
      for (int t = 0; t < 3; ++t) {
        ts.emplace_back([&, t, round] {
          std::mt19937_64 rng(static_cast<std::uint64_t>(round * 7 + t));
          std::vector<std::pair<void*, std::size_t>> mine;
          for (int k = 0; k < 40; ++k) {
            std::size_t const n = 256 * (1 + rng() % 100);
            mine.emplace_back(mr.allocate(n, stream_view::per_thread()), n);
          }
          // Half go to the freer thread (freed after this thread exits), half freed here.
          std::lock_guard lock{m};
          for (std::size_t i = 0; i < mine.size(); ++i) {
            if (i % 2 == 0 || rng() % 4 == 0) {
              handed.push_back(mine[i]);
            } else {
              mr.deallocate(mine[i].first, mine[i].second, stream_view::per_thread());
            }
          }
        });
      }
      for (auto& t : ts) { t.join(); }
    }
    stop = true;
    freer.join();
    reader.join();
    reclaimer.join();
    CHECK(mr.check_invariants() == "");
    auto const st = mr.stats();
    INFO("vmm " << vmm << " arenas " << st.stream_arenas);
    CHECK(st.stream_arenas <= 8);
    mr.release();
    if (vmm) { CHECK(dynamic_cast<simulated_vmm_memory_resource&>(*up).committed_bytes() == 0); }
  }
}

// ---- 5. capture questions about streams the call may not name ----------------------------------------

TEST_CASE("review: arena: reclaim from another call names no destroyed stream") {
  for (bool vmm : {false, true}) {
    for (int how = 0; how < 2; ++how) {
      auto fake = std::make_shared<test::fake_stream_sync>();
      arena_options o;
      o.superblock_size = 64 * KiB;
      o.max_small_size = 32 * KiB;
      o.minimum_growth = 1 * MiB;
      o.empty_superblocks_kept = 1;
      o.max_free_bytes = 0;
      o.stream_sync = fake;
      resource_ptr up = vmm ? resource_ptr{make_vmm()} : resource_ptr{std::make_shared<simulated_memory_resource>()};
      arena_memory_resource arena{up, 4 * MiB, o};
      handle const x = 0x500;
      handle const y = 0x600;
      // y first, so a second stream is seen (created streams record eagerly from then on).
      arena.deallocate(arena.allocate(256, sv(y)), 256, sv(y));
      std::vector<void*> on_x;
      for (int i = 0; i < 8; ++i) { on_x.push_back(arena.allocate(16 * KiB, sv(x))); }
      for (void* p : on_x) { arena.deallocate(p, 16 * KiB, sv(x)); }  // x's arena keeps its superblocks
      fake->kill(x);  // the user destroys x; nothing may name it again
      int records_on_x = 0;
      fake->on_record = [&](handle h) { records_on_x += h == x ? 1 : 0; };
      if (how == 0) {
        arena.release();
      } else {
        // y runs out: the arena reclaims every stream arena's free superblocks.
        std::vector<void*> on_y;
        try {
          for (;;) { on_y.push_back(arena.allocate(32 * KiB, sv(y))); }
        } catch (out_of_memory const&) {
        }
        for (void* p : on_y) { arena.deallocate(p, 32 * KiB, sv(y)); }
      }
      INFO("vmm " << vmm << (how == 0 ? " release()" : " exhaustion") << ": dead_named " << fake->dead_named
                  << ", records " << fake->records << ", records on x " << records_on_x
                  << ", syncs " << fake->syncs << ", queries " << fake->queries);
      CHECK(fake->dead_named == 0);
      CHECK(arena.check_invariants() == "");
    }
  }
}
