// A hostile review of the per-thread caches (fixed_size, binning) and the sharded adaptors
// (statistics, limiting, tracking) under threads: each case is a bug found and fixed.
// Run it under the tsan and asan presets too.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t KiB = 1024;
}  // namespace

TEST_CASE("review: cached_blocks() while threads come and go reads no cache list being changed") {
  // cached_blocks() walked the list of caches with no lock while threads that started
  // added their cache to it and threads that exited erased theirs: a data race, and a
  // read of a cache already freed.
  auto sim = std::make_shared<simulated_memory_resource>();
  fixed_size_memory_resource mr{sim, 4 * KiB, 64};
  std::atomic<bool> stop{false};
  std::atomic<bool> sane{true};
  std::thread reader{[&] {  // no CHECK here: Catch2's assertions are not thread-safe
    while (!stop.load()) {
      if (mr.cached_blocks() > mr.total_blocks()) { sane = false; }
    }
  }};
  for (int round = 0; round < 200; ++round) {
    std::vector<std::thread> workers;
    for (int t = 0; t < 3; ++t) {
      workers.emplace_back([&] {
        void* p = mr.allocate(4 * KiB, stream_view::per_thread());
        mr.deallocate(p, 4 * KiB, stream_view::per_thread());
      });
    }
    for (auto& w : workers) { w.join(); }
  }
  stop = true;
  reader.join();
  CHECK(sane.load());
  CHECK(mr.cached_blocks() == 0);  // every worker exited: every cache went back
  CHECK(mr.free_blocks() == mr.total_blocks());
}
