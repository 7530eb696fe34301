// Cases from a hostile review of the arena depot (each failed on its first version):
// the free-bytes bound, a failed event creation or wait, statistics of depot ranges;
// a threaded stress ([stress]) and a model fuzz of stream ordering ([fuzz]).
#include <catch2/catch.hpp>

#include <bump_upstream.hpp>
#include <fake_stream_sync.hpp>

#include <mrstack/detail/arena_core.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <set>
#include <stdexcept>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view on(std::uintptr_t s) { return stream_view{reinterpret_cast<cudaStream_t>(s)}; }
}  // namespace

TEST_CASE("depot review: free memory outside the stream arenas stays within max_free_bytes") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;     // 16 blocks a superblock
  o.empty_superblocks_kept = 0;    // stream arenas keep nothing
  o.max_free_bytes = 8 * MiB;
  o.minimum_growth = 16 * MiB;     // one chunk of 16 MiB
  arena_memory_resource mr{sim, 64 * MiB, o};
  std::vector<void*> blocks;
  for (int i = 0; i < 4 * 16; ++i) { blocks.push_back(mr.allocate(64 * KiB)); }  // 4 superblocks
  for (void* p : blocks) { mr.deallocate(p, 64 * KiB); }
  auto const st = mr.stats();
  CHECK(st.superblocks_in_arenas == 0);
  // Nothing is live and the arenas keep nothing: the wholly free chunk must go back.
  CHECK(st.global_free_bytes <= o.max_free_bytes);
  CHECK(mr.held_bytes() <= o.max_free_bytes);
  CHECK(mr.check_invariants() == "");
}

namespace {
using test::bump_upstream;

/// The fake, with waits that fail on demand (cudaStreamWaitEvent returning an error).
struct failing_sync final : detail::stream_sync {
  std::shared_ptr<test::fake_stream_sync> fake = std::make_shared<test::fake_stream_sync>();
  bool fail_waits = false;
  bool fail_creates = false;
  handle create_event() override {
    if (fail_creates) { throw std::runtime_error("cudaEventCreate failed"); }
    return fake->create_event();
  }
  void destroy_event(handle e) noexcept override { fake->destroy_event(e); }
  bool record(handle e, handle s) override { return fake->record(e, s); }
  void wait(handle s, handle e) override {
    if (fail_waits) { throw std::runtime_error("cudaStreamWaitEvent failed"); }
    fake->wait(s, e);
  }
  void synchronize(handle s) override { fake->synchronize(s); }
  void synchronize_all() override { fake->synchronize_all(); }
  bool idle(handle s) override { return fake->idle(s); }
  bool capturing(handle s) override { return fake->capturing(s); }
};

std::uintptr_t sim_thread = 1;
std::uintptr_t sim_thread_key() noexcept { return sim_thread; }

detail::arena_core::options core_options() {
  detail::arena_core::options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;  // four blocks a superblock
  o.empty_superblocks_kept = 1;
  o.max_size = 256 * MiB;
  o.max_free_bytes = 256 * MiB;
  o.minimum_growth = 4 * MiB;
  return o;
}
}  // namespace

namespace {
/// Two simulated threads on their per-thread (blocking) streams: thread 1 fills and frees
/// 40 superblocks alone, so its batches carry no event; then it is thread 2's turn, whose
/// allocations `run` makes. Every event is checked destroyed with the core.
template <typename Run>
void second_thread_after_an_alone_one(std::shared_ptr<failing_sync> const& sync, Run run) {
  detail::stream_ref const ptds1{1, 0x10, true};
  detail::stream_ref const ptds2{2, 0x20, true};
  sync->fake->set_blocking(0x10);
  sync->fake->set_blocking(0x20);
  bump_upstream up;
  {
    detail::arena_core core{up, core_options(), sync, &sim_thread_key};
    sim_thread = 1;
    std::vector<std::uintptr_t> first;
    for (int i = 0; i < 160; ++i) { first.push_back(core.allocate(256 * KiB, 256, ptds1)); }
    for (auto p : first) { REQUIRE(core.deallocate(p, 256 * KiB, 256, ptds1)); }  // event-less batches
    sim_thread = 2;
    run(core, ptds2);
    CHECK(core.check_invariants() == "");
  }
  CHECK(sync->fake->live_events() == 0);
}
}  // namespace

TEST_CASE("depot review: a failed wait after the legacy record leaks no event") {
  auto sync = std::make_shared<failing_sync>();
  second_thread_after_an_alone_one(sync, [&](detail::arena_core& core, detail::stream_ref const& ptds2) {
    sync->fail_waits = true;
    CHECK_THROWS(core.allocate(256 * KiB, 256, ptds2));  // legacy barrier recorded, the wait fails
    sync->fail_waits = false;
  });
}

TEST_CASE("depot review: no event for the legacy record: the batch stays, nothing leaks or breaks") {
  auto sync = std::make_shared<failing_sync>();
  second_thread_after_an_alone_one(sync, [&](detail::arena_core& core, detail::stream_ref const& ptds2) {
    sync->fail_creates = true;  // cudaEventCreate fails from here
    std::uintptr_t p = 0;
    try {
      p = core.allocate(256 * KiB, 256, ptds2);  // the global arena's own ordering may need an event too
    } catch (std::runtime_error const&) {
    }
    CHECK(core.check_invariants() == "");
    sync->fail_creates = false;
    if (p == 0) { p = core.allocate(256 * KiB, 256, ptds2); }  // served once events can be made
    REQUIRE(p != 0);
    REQUIRE(core.deallocate(p, 256 * KiB, 256, ptds2));
  });
}

TEST_CASE("depot review: statistics see contiguous depot superblocks as the free range they are") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  bump_upstream up;
  auto o = core_options();
  o.empty_superblocks_kept = 0;  // every wholly free superblock leaves the stream arena
  detail::arena_core core{up, o, fake, &sim_thread_key};
  detail::stream_ref const s{0x1000, 0x1000, false};
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(core.allocate(256 * KiB, 256, s)); }  // one 4 MiB chunk, 4 superblocks
  for (auto p : blocks) { REQUIRE(core.deallocate(p, 256 * KiB, 256, s)); }
  auto const st = core.stats();
  REQUIRE(st.global_free_bytes == st.held_bytes);  // all of it free
  // One chunk, wholly free: one free range of all of it...
  CHECK(st.global_free_blocks == 1);
  CHECK(st.largest_free_block == st.held_bytes);
  // ...which a request of that size indeed gets, with no growth.
  std::uintptr_t const big = core.allocate(st.held_bytes, 256, s);
  CHECK(big != 0);
  CHECK(core.stats().held_bytes == st.held_bytes);
  core.deallocate(big, st.held_bytes, 256, s);
}

TEST_CASE("depot review: a free that cannot get an event for the depot still frees, and throws nothing") {
  auto sync = std::make_shared<failing_sync>();
  bump_upstream up;
  detail::arena_core core{up, core_options(), sync, &sim_thread_key};
  detail::stream_ref const a{0x1000, 0x1000, false};
  detail::stream_ref const b{0x2000, 0x2000, false};
  core.deallocate(core.allocate(1024, 256, b), 1024, 256, b);  // two streams in use
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 40; ++i) { blocks.push_back(core.allocate(256 * KiB, 256, a)); }
  sync->fail_creates = true;
  std::size_t threw = 0;
  for (auto p : blocks) {
    try {
      if (!core.deallocate(p, 256 * KiB, 256, a)) { FAIL("refused"); }
    } catch (std::exception const& e) {
      ++threw;
      CHECK(core.live_size(p) == 0);  // the block was freed all the same
    }
  }
  sync->fail_creates = false;
  CHECK(threw == 0);
  CHECK(core.check_invariants() == "");
}

// Not a finding: a stress run for tsan and the invariants (hidden; run with "[stress]").
TEST_CASE("depot review: threads trading superblocks through the depot", "[stress]") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 1;
  o.max_free_bytes = 24 * MiB;
  o.minimum_growth = 4 * MiB;
  arena_memory_resource mr{sim, 512 * MiB, o};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::uintptr_t const mine = 0x1000 * (t + 1);
      for (int round = 0; round < 30; ++round) {
        stream_view const s = t % 2 == 0 ? stream_view{} : on(mine);  // default stream or a stream of its own
        std::vector<void*> blocks;
        for (int i = 0; i < 16 * (8 + round % 24); ++i) { blocks.push_back(mr.allocate(64 * KiB, s)); }
        for (void* p : blocks) { mr.deallocate(p, 64 * KiB, s); }
        if (round % 7 == t) { (void)mr.stats(); }
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      (void)mr.stats();
      std::this_thread::yield();
    }
  });
  for (int t = 0; t < 4; ++t) { threads[t].join(); }
  stop = true;
  threads.back().join();
  CHECK(mr.check_invariants() == "");
  mr.release();
  CHECK(mr.check_invariants() == "");
}

// Model fuzz (hidden, "[fuzz]"): random small/large traffic on created, legacy and
// per-thread streams against the recording fake; every reuse of a 64 KiB granule and
// every chunk handed back must be ordered after the last work that used it.
namespace {
struct granule_use {
  std::uintptr_t stream = 0;
  std::uint64_t clock = 0;
};
struct fuzz_state {
  std::shared_ptr<test::fake_stream_sync> fake;
  std::map<std::uintptr_t, granule_use> last;  // granule -> last work on it
  std::size_t violations = 0, chunk_violations = 0;
  std::string first;
  void use(std::uintptr_t p, std::size_t size, std::uintptr_t stream) {
    std::uint64_t const c = fake->enqueue(stream);
    for (std::uintptr_t g = p / (64 * KiB); g < (p + size + 64 * KiB - 1) / (64 * KiB); ++g) { last[g] = {stream, c}; }
  }
  void check(std::uintptr_t p, std::size_t size, std::uintptr_t user, char const* what, std::size_t& count) {
    for (std::uintptr_t g = p / (64 * KiB); g < (p + size + 64 * KiB - 1) / (64 * KiB); ++g) {
      auto const it = last.find(g);
      if (it == last.end()) { continue; }
      if (!fake->ordered_after(user, it->second.stream, it->second.clock)) {
        if (count++ == 0 && first.empty()) {
          first = std::string{what} + ": stream " + std::to_string(user) + " not after stream " +
                  std::to_string(it->second.stream) + " work " + std::to_string(it->second.clock);
        }
        return;
      }
    }
  }
};
fuzz_state* fuzz = nullptr;
/// The fake plus CUDA's rule for the legacy stream: while a blocking stream is captured,
/// it reads as captured, and touching it is a violation.
struct model_sync final : detail::stream_sync {
  std::shared_ptr<test::fake_stream_sync> fake;
  std::vector<handle> blocking;
  std::size_t legacy_touched_in_capture = 0;
  bool blocking_captured() {
    for (handle b : blocking) {
      if (fake->capturing(b)) { return true; }
    }
    return false;
  }
  handle create_event() override { return fake->create_event(); }
  void destroy_event(handle e) noexcept override { fake->destroy_event(e); }
  bool record(handle e, handle s) override {
    if (s == 0 && blocking_captured()) { ++legacy_touched_in_capture; }
    return fake->record(e, s);
  }
  void wait(handle s, handle e) override {
    if (s == 0 && blocking_captured()) { ++legacy_touched_in_capture; }
    fake->wait(s, e);
  }
  void synchronize(handle s) override { fake->synchronize(s); }
  void synchronize_all() override { fake->synchronize_all(); }
  bool idle(handle s) override { return fake->idle(s); }
  bool capturing(handle s) override { return fake->capturing(s) || (s == 0 && blocking_captured()); }
};
struct checking_upstream final : detail::arena_upstream {
  std::uintptr_t next = std::uintptr_t{1} << 40;
  std::uintptr_t allocate(std::size_t size, detail::stream_ref const&) override {
    std::uintptr_t const p = next;
    next += (size + 16 * MiB - 1) / (16 * MiB) * (16 * MiB);
    return p;
  }
  void deallocate(std::uintptr_t base, std::size_t size, detail::stream_ref const& s) noexcept override {
    if (fuzz != nullptr) { fuzz->check(base, size, s.handle, "chunk returned", fuzz->chunk_violations); }
  }
};
}  // namespace

TEST_CASE("depot review: model fuzz of stream ordering", "[fuzz]") {
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    fuzz_state st;
    st.fake = std::make_shared<test::fake_stream_sync>();
    fuzz = &st;
    auto fake = st.fake;
    fake->set_blocking(0x10);
    fake->set_blocking(0x30);
    std::vector<std::pair<detail::stream_ref, std::uintptr_t>> streams = {
        {{0x1000, 0x1000, false}, 0}, {{0x2000, 0x2000, false}, 0}, {{0, 0, false}, 0},
        {{1, 0x10, true}, 1}, {{3, 0x30, true}, 3}};
    std::mt19937_64 rng{seed};
    std::size_t legacy_touched = 0;
    {
      checking_upstream up;
      auto o = core_options();
      o.max_size = 64 * MiB;
      o.max_free_bytes = (rng() % 3) * 8 * MiB;
      o.empty_superblocks_kept = rng() % 3;
      auto model = std::make_shared<model_sync>();
      model->fake = fake;
      model->blocking = {0x10, 0x30};
      detail::arena_core core{up, o, model, &sim_thread_key};
      std::uintptr_t captured = ~std::uintptr_t{0};
      bool killed = false;
      struct live_block {
        std::uintptr_t p;
        std::size_t size;
        std::size_t stream;
      };
      std::vector<live_block> live;
      for (int step = 0; step < 3000; ++step) {
        if (captured == ~std::uintptr_t{0} && rng() % 200 == 0) {
          captured = streams[rng() % streams.size()].first.handle;
          if (captured == 0) {
            captured = ~std::uintptr_t{0};
          } else {
            fake->begin_capture(captured);
          }
        } else if (captured != ~std::uintptr_t{0} && rng() % 50 == 0) {
          fake->end_capture(captured);
          captured = ~std::uintptr_t{0};
        }
        if (!killed && step > 1500 && rng() % 100 == 0 && captured != 0x2000) {
          // Stream 0x2000 frees what it holds and is destroyed.
          for (std::size_t i = 0; i < live.size();) {
            if (live[i].stream != 1) {
              ++i;
              continue;
            }
            st.use(live[i].p, live[i].size, 0x2000);
            REQUIRE(core.deallocate(live[i].p, live[i].size, 256, streams[1].first));
            live[i] = live.back();
            live.pop_back();
          }
          fake->kill(0x2000);
          killed = true;
        }
        std::size_t si = rng() % streams.size();
        if (killed && si == 1) { si = 0; }
        bool const in_capture = captured != ~std::uintptr_t{0};
        if (in_capture && (captured == 0x10 || captured == 0x30) && si == 2) { continue; }  // legacy: illegal then
        auto const& [s, thread] = streams[si];
        sim_thread = thread != 0 ? thread : 5 + rng() % 2;
        int const op = static_cast<int>(rng() % 100);
        if (op < 50) {
          std::size_t const size = rng() % 8 == 0 ? (1 + rng() % 4) * MiB : (1 + rng() % 4) * 64 * KiB;
          std::uintptr_t p = 0;
          try {
            p = core.allocate(size, 256, s);
          } catch (std::exception const&) {
            p = 0;
          }
          if (p == 0) { continue; }
          st.check(p, size, s.handle, "reuse", st.violations);
          st.use(p, size, s.handle);
          live.push_back({p, size, si});
        } else if (op < 95 && !live.empty()) {
          std::size_t const i = rng() % live.size();
          if (killed && live[i].stream == 1) { continue; }
          if (in_capture && (captured == 0x10 || captured == 0x30) && live[i].stream == 2) { continue; }
          auto const b = live[i];
          auto const& [bs, bt] = streams[b.stream];
          sim_thread = bt != 0 ? bt : 5 + rng() % 2;
          st.use(b.p, b.size, bs.handle);  // last work, then the free on the same stream
          REQUIRE(core.deallocate(b.p, b.size, 256, bs));
          live[i] = live.back();
          live.pop_back();
        } else if (op < 97) {
          (void)core.reclaim(s);
        } else if (op < 98) {
          if (!in_capture) { (void)core.release_free_chunks(); }
        } else {
          (void)core.stats();
        }
      }
      REQUIRE(core.check_invariants() == "");
      if (captured != ~std::uintptr_t{0}) { fake->end_capture(captured); }
      for (auto const& b : live) {
        auto const& [bs, bt] = streams[b.stream];
        sim_thread = bt != 0 ? bt : 5;
        REQUIRE(core.deallocate(b.p, b.size, 256, bs));
      }
      REQUIRE(core.check_invariants() == "");
      sim_thread = 5;
      legacy_touched = model->legacy_touched_in_capture;
    }
    fuzz = nullptr;
    (void)legacy_touched;  // the old code touches it too (exhaustion's device synchronization): not checked
    INFO("seed " << seed << ": " << st.first);
    CHECK(st.violations == 0);
    CHECK(st.chunk_violations == 0);
    CHECK(fake->live_events() == 0);
    CHECK(fake->dead_named == 0);
    CHECK(fake->waits_into_capture == 0);
    CHECK(fake->records_in_capture == 0);
    if (st.violations + st.chunk_violations != 0) { break; }
  }
}
