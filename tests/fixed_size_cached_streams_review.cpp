// Review of 81e6149 (fixed_size caches streams the user created with several streams in
// use). A cache's frees make no CUDA call, so the resource cannot tell whether they were
// made during a graph capture, and a cache of a created stream that goes back while no
// call names its stream (64 bypasses, another thread's growth, a thread's exit) leaves
// its blocks "dirty": the next stream to want them synchronizes the device. Before the
// commit, with several streams, such frees recorded at once (and, in a capture, were
// marked freed in capture), so neither happened. The fake seam counts device
// synchronizations made while any capture lasts (CUDA refuses them and ends the capture).
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};
stream_view const c{reinterpret_cast<cudaStream_t>(0x300)};
stream_view const d{reinterpret_cast<cudaStream_t>(0x400)};
auto const handle_of = [](stream_view s) { return reinterpret_cast<test::fake_stream_sync::handle>(s.value()); };

/// Stream c allocates 300 blocks while a is captured: none may be one of `on_a` (freed
/// on a during the capture), and no device synchronization may happen; then the capture
/// ends and c frees them.
void c_takes_none_of(fixed_size_memory_resource& mr, test::fake_stream_sync& fake, std::vector<void*> const& on_a) {
  std::vector<void*> on_c;
  for (int i = 0; i < 300; ++i) { on_c.push_back(mr.allocate(1000, c)); }
  CHECK(fake.syncs_in_capture == 0);
  for (void* p : on_a) { CHECK(std::find(on_c.begin(), on_c.end(), p) == on_c.end()); }
  fake.end_capture(handle_of(a));
  for (void* p : on_c) { mr.deallocate(p, 1000, c); }
}
}  // namespace

TEST_CASE("fixed_size cached streams: blocks freed into a cache during a capture are not handed over by a device sync") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * KiB, 256, fake};
  REQUIRE(mr.thread_cache_blocks() == 64);
  // The first call from another thread, on the legacy stream (a created stream's frees
  // made before a second stream appeared have no event: taking them synchronizes the
  // device, a case older than the commit).
  std::thread{[&] { mr.deallocate(mr.allocate(1000), 1000); }}.join();
  // This thread is the second (caches on), a the second stream (the eager rule).
  std::vector<void*> on_a;
  for (int i = 0; i < 8; ++i) { on_a.push_back(mr.allocate(1000, a)); }
  fake->begin_capture(handle_of(a));
  fake->enqueue(handle_of(a));                             // the captured work that uses them
  for (void* p : on_a) { mr.deallocate(p, 1000, a); }     // into the cache: no CUDA call
  REQUIRE(mr.cached_blocks() > 8);
  // The thread moves to b: after 64 bypasses a's cache goes back unrecorded.
  for (int i = 0; i < 40; ++i) { mr.deallocate(mr.allocate(1000, b), 1000, b); }
  // Stream c wants memory while a is still being captured: a's blocks were freed in the
  // capture, so no event and no device synchronization orders c after their use.
  c_takes_none_of(mr, *fake, on_a);
  CHECK(fake->dead_named == 0);
}

TEST_CASE("fixed_size cached streams: an exiting thread's cache of a captured stream is not handed over by a device sync") {
  auto fake = std::make_shared<test::fake_stream_sync>();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * KiB, 256, fake};
  mr.deallocate(mr.allocate(1000), 1000);  // this thread first, on the legacy stream
  std::vector<void*> on_a;
  std::thread{[&] {
    for (int i = 0; i < 8; ++i) { on_a.push_back(mr.allocate(1000, a)); }  // caches on, a second stream
    fake->begin_capture(handle_of(a));
    fake->enqueue(handle_of(a));
    for (void* p : on_a) { mr.deallocate(p, 1000, a); }  // into its cache
  }}.join();  // its cache goes back unrecorded, a still captured
  c_takes_none_of(mr, *fake, on_a);
}

TEST_CASE("fixed_size cached streams: growth taking back a live thread's cache of a created stream does not synchronize the device") {
  // Thread A works on created stream a and keeps its cache; another thread's stream d is
  // being captured. This thread, on c, runs out and grows: the caches go back first, A's
  // unrecorded (this call names c, not a), and taking them then synchronized the device,
  // which CUDA refuses while d is captured. Before the commit A's frees on a recorded at
  // once (several streams): c waited on that event.
  auto fake = std::make_shared<test::fake_stream_sync>();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * KiB, 64, fake};
  mr.deallocate(mr.allocate(1000), 1000);  // this thread first, on the legacy stream
  std::mutex m;
  std::condition_variable cv;
  bool cached = false, done = false;
  std::thread owner{[&] {
    std::vector<void*> mine;
    for (int i = 0; i < 40; ++i) { mine.push_back(mr.allocate(1000, a)); }
    fake->enqueue(handle_of(a));
    for (void* p : mine) { mr.deallocate(p, 1000, a); }  // into A's cache
    std::unique_lock lock{m};
    cached = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  }};
  {
    std::unique_lock lock{m};
    cv.wait(lock, [&] { return cached; });
  }
  REQUIRE(mr.cached_blocks() >= 40);
  fake->begin_capture(handle_of(d));
  std::vector<void*> on_c;
  for (int i = 0; i < 64; ++i) { on_c.push_back(mr.allocate(1000, c)); }  // needs A's blocks
  CHECK(fake->syncs_in_capture == 0);
  CHECK(fake->sync_alls == 0);
  fake->end_capture(handle_of(d));
  {
    std::lock_guard lock{m};
    done = true;
  }
  cv.notify_all();
  owner.join();
  for (void* p : on_c) { mr.deallocate(p, 1000, c); }
  CHECK(fake->dead_named == 0);
}
