// arena_memory_resource under misuse and thread exit: a refused free changes nothing (no
// arena made for the stream it named, no synchronization of it), and the free superblocks
// of an exited thread's arena go back once other threads free its last blocks.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view on(std::uintptr_t s) { return stream_view{reinterpret_cast<cudaStream_t>(s)}; }

/// Small blocks up to 256 KiB in 1 MiB superblocks, stream sync through `fake`.
arena_options faked_options(std::shared_ptr<test::fake_stream_sync> const& fake) {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.stream_sync = fake;
  return o;
}
}  // namespace

TEST_CASE("arena misuse: a double free named on another stream is refused and changes nothing") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, faked_options(fake)};
  void* p = mr.allocate(4 * KiB, on(0x1000));
  void* q = mr.allocate(4 * KiB, on(0x1000));
  mr.deallocate(p, 4 * KiB, on(0x1000));
  std::size_t const calls = fake->calls();
  auto const before = mr.stats();
  CHECK_THROWS_AS(mr.deallocate(p, 4 * KiB, on(0x2000)), logic_error);        // double free
  CHECK_THROWS_AS(mr.deallocate(q, 8 * KiB, on(0x2000)), logic_error);        // wrong size
  CHECK_THROWS_AS(mr.deallocate(static_cast<char*>(q) + 256, 4 * KiB, on(0x2000)), logic_error);  // interior
  auto const after = mr.stats();
  CHECK(after.stream_arenas == before.stream_arenas);  // no arena for a stream that only misfreed
  CHECK(fake->calls() == calls);                       // nor a synchronization of it
  CHECK(mr.check_invariants() == "");
  mr.deallocate(q, 4 * KiB, on(0x1000));
}

TEST_CASE("arena misuse: an exited thread's superblocks go back when another thread frees its blocks") {
  auto sim = std::make_shared<simulated_memory_resource>();
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.max_free_bytes = 0;  // nothing free is kept outside the stream arenas
  o.minimum_growth = 1 * MiB;
  arena_memory_resource mr{sim, 64 * MiB, o};
  std::vector<void*> blocks;
  std::thread worker{[&] {
    for (int i = 0; i < 40; ++i) { blocks.push_back(mr.allocate(256 * KiB, stream_view::per_thread())); }
  }};
  worker.join();
  CHECK(mr.stats().superblocks_in_arenas == 10);
  for (void* p : blocks) { mr.deallocate(p, 256 * KiB, stream_view{}); }
  // Nobody allocates from the exited thread's arena again: it keeps nothing, and is
  // retired by the free that emptied it (not at some other thread's exit).
  auto const st = mr.stats();
  CHECK(st.superblocks_in_arenas == 0);
  CHECK(st.stream_arenas == 0);
  CHECK(st.global_free_bytes == st.held_bytes);
  CHECK(mr.check_invariants() == "");
  // Its chunk is owned by the exited thread's stream: it goes back once synchronized.
  mr.release();
  CHECK(mr.held_bytes() == 0);
}

TEST_CASE("arena misuse: while a stream holds blocks back, a large call on a new stream makes it no arena") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, faked_options(fake)};
  void* p = mr.allocate(4 * KiB, on(0x1000));
  fake->begin_capture(0x2000);
  mr.deallocate(p, 4 * KiB, on(0x2000));  // held back until 0x2000's capture ends
  CHECK(mr.stats().stream_arenas == 2);
  void* big = mr.allocate(2 * MiB, on(0x3000));  // a large block: no stream arena needed
  mr.deallocate(big, 2 * MiB, on(0x3000));
  CHECK(mr.stats().stream_arenas == 2);
  fake->end_capture(0x2000);
  void* q = mr.allocate(4 * KiB, on(0x2000));  // settles the held-back block
  mr.deallocate(q, 4 * KiB, on(0x2000));
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena misuse: threads free exited threads' blocks while others exit", "[stress]") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 1;
  o.max_free_bytes = 2 * MiB;
  o.minimum_growth = 2 * MiB;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, o};
  std::size_t const sizes[] = {256, 4 * KiB, 20 * KiB, 64 * KiB};
  for (int round = 0; round < 20; ++round) {
    std::vector<std::vector<std::pair<void*, std::size_t>>> left(4);
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        for (int i = 0; i < 60; ++i) {
          std::size_t const size = sizes[(i + w) % 4];
          left[w].emplace_back(mr.allocate(size, stream_view::per_thread()), size);
        }
      });
    }
    for (auto& t : workers) { t.join(); }
    std::vector<std::thread> freers;
    for (int w = 0; w < 4; ++w) {
      freers.emplace_back([&, w] {
        for (auto const& [p, size] : left[w]) { mr.deallocate(p, size, stream_view::per_thread()); }
        void* mine = mr.allocate(4 * KiB, stream_view::per_thread());  // and exits, as the workers did
        mr.deallocate(mine, 4 * KiB, stream_view::per_thread());
      });
    }
    for (auto& t : freers) { t.join(); }
  }
  auto const st = mr.stats();
  CHECK(st.small_live_bytes == 0);
  CHECK(st.superblocks_in_arenas == 0);
  CHECK(st.stream_arenas == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena misuse: threads that only free, on streams with no arena, beside threads that allocate", "[stress]") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  o.empty_superblocks_kept = 1;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, o};
  constexpr int rounds = 200;
  std::vector<std::vector<void*>> handed(rounds);
  std::vector<std::atomic<bool>> ready(rounds);
  std::atomic<int> refused{0};
  std::thread producer{[&] {
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < 16; ++i) { handed[r].push_back(mr.allocate(4 * KiB, stream_view::per_thread())); }
      ready[r].store(true, std::memory_order_release);
    }
  }};
  std::vector<std::thread> freers;
  for (int f = 0; f < 2; ++f) {
    freers.emplace_back([&, f] {
      for (int r = f; r < rounds; r += 2) {
        while (!ready[r].load(std::memory_order_acquire)) { std::this_thread::yield(); }
        for (void* p : handed[r]) { mr.deallocate(p, 4 * KiB, stream_view::per_thread()); }
      }
    });
  }
  producer.join();
  for (auto& t : freers) { t.join(); }
  // Second frees, once nothing can hand those addresses out again meanwhile.
  for (auto const& round : handed) {
    for (void* p : round) {
      try {
        mr.deallocate(p, 4 * KiB, stream_view{});
      } catch (logic_error const&) {
        refused.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  CHECK(refused.load() == rounds * 16);
  CHECK(mr.stats().stream_arenas == 0);  // the free-only threads made none; the producer's retired
  CHECK(mr.stats().small_live_bytes == 0);
  CHECK(mr.check_invariants() == "");
}
