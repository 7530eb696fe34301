// arena_memory_resource: small blocks a thread's per-thread default stream freed while it
// was being captured (held back until that stream's next call) when the thread exits
// before making one. Nobody names that stream again, so its exit is the last chance.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <utility>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view on(std::uintptr_t s) { return stream_view{reinterpret_cast<cudaStream_t>(s)}; }
auto const per_thread_handle = reinterpret_cast<std::uintptr_t>(cudaStreamPerThread);

arena_options faked_options(std::shared_ptr<detail::stream_sync> sync) {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 256 * KiB;
  o.max_free_bytes = 0;  // nothing free is kept outside the stream arenas
  o.minimum_growth = 1 * MiB;
  o.stream_sync = std::move(sync);
  return o;
}

/// Frees `p` (a block of `size` from another stream's arena) on a new thread's default
/// stream while that stream is captured; the capture ends and the thread exits.
void free_in_capture_then_exit(memory_resource& mr, test::fake_stream_sync& fake, void* p, std::size_t size) {
  std::thread worker{[&] {
    fake.begin_capture(per_thread_handle);
    mr.deallocate(p, size, stream_view::per_thread());  // held back: no synchronization in a capture
    fake.end_capture(per_thread_handle);
  }};
  worker.join();
}
}  // namespace

TEST_CASE("arena held back: an exited thread's held-back block is free again, and release() gives its chunk back") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, faked_options(fake)};
  void* const p = mr.allocate(4 * KiB, on(0x1000));
  free_in_capture_then_exit(mr, *fake, p, 4 * KiB);
  CHECK(mr.check_invariants() == "");
  CHECK(fake->syncs_in_capture == 0);
  // The block is free in 0x1000's arena: the stream reuses it, and no arena is left for
  // the exited thread.
  void* const again = mr.allocate(4 * KiB, on(0x1000));
  CHECK(again == p);
  mr.deallocate(again, 4 * KiB, on(0x1000));
  CHECK(mr.stats().stream_arenas == 1);
  mr.release();
  CHECK(mr.held_bytes() == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena held back: an exited thread's held-back block does not make a request that fits fail") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 4 * MiB, faked_options(fake)};
  void* const p = mr.allocate(4 * KiB, on(0x1000));
  free_in_capture_then_exit(mr, *fake, p, 4 * KiB);
  // Nothing is live: the whole arena fits one large block.
  void* big = nullptr;
  CHECK_NOTHROW(big = mr.allocate(4 * MiB, on(0x1000)));
  if (big != nullptr) { mr.deallocate(big, 4 * MiB, on(0x1000)); }
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena held back: a block of an exited thread's arena, held back and settled, retires that arena") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, faked_options(fake)};
  void* p = nullptr;
  std::thread worker{[&] { p = mr.allocate(4 * KiB, stream_view::per_thread()); }};
  worker.join();  // its arena still owes p: kept until p comes back
  fake->begin_capture(0x2000);
  mr.deallocate(p, 4 * KiB, on(0x2000));  // held back on 0x2000's arena
  fake->end_capture(0x2000);
  void* const q = mr.allocate(4 * KiB, on(0x2000));  // settles p: the exited thread's arena holds nothing
  mr.deallocate(q, 4 * KiB, on(0x2000));
  // As when a plain free empties it: retired, not left for some other thread's exit.
  CHECK(mr.stats().stream_arenas == 1);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena held back: threads that free in a capture and exit, beside threads that allocate", "[stress]") {
  auto const seam = std::make_shared<test::thread_stream_seam>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, faked_options(seam)};
  constexpr int threads = 8;
  constexpr int per_thread = 64;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::vector<void*>> given(threads);
    for (auto& g : given) {
      for (int i = 0; i < per_thread; ++i) { g.push_back(mr.allocate(4 * KiB, on(0x1000))); }
    }
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        // Half free in a capture of their own stream and exit; half allocate meanwhile.
        if (t % 2 == 0) {
          seam->begin_capture_here();
          for (void* p : given[t]) { mr.deallocate(p, 4 * KiB, stream_view::per_thread()); }
          seam->end_capture_here();
        } else {
          std::vector<void*> mine;
          for (int i = 0; i < per_thread; ++i) { mine.push_back(mr.allocate(4 * KiB, stream_view::per_thread())); }
          for (void* p : mine) { mr.deallocate(p, 4 * KiB, stream_view::per_thread()); }
          for (void* p : given[t]) { mr.deallocate(p, 4 * KiB, on(0x1000)); }
        }
      });
    }
    for (auto& w : workers) { w.join(); }
    CHECK(mr.stats().small_live_bytes == 0);
    CHECK(mr.check_invariants() == "");
  }
  mr.release();
  CHECK(mr.held_bytes() == 0);
}
