// pool_memory_resource's thread shards, cases found by reading the code against its
// contract: statistics read while a shard is made and takes its first slab.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

TEST_CASE("pool shards review: statistics never count a new shard's first slab as used") {
  // A reader that looked at the shards before one existed, and took the global lock after
  // that shard's thread had carved its first slab out of the global blocks, counted the
  // whole slab as a used block (and none of it as free).
  constexpr int threads = 4;
  constexpr std::size_t block = 256;
  int wrong = 0;
  std::size_t worst = 0;
  for (int round = 0; round < 150 && wrong == 0; ++round) {
    pool_options o;
    o.shard_after_contentions = 0;
    pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, std::nullopt, o};
    mr.deallocate(mr.allocate(block), block);  // the first thread: the others shard
    std::atomic<bool> stop{false};
    std::atomic<int> seen{0};
    std::thread reader{[&] {
      while (!stop.load()) {
        auto const st = mr.stats();
        // Each worker holds at most one block at a time.
        if (st.used_bytes > threads * block || st.live_blocks > threads) {
          seen.fetch_add(1);
          worst = std::max(worst, st.used_bytes);
        }
      }
    }};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (int i = 0; i < 20; ++i) {
          mr.deallocate(mr.allocate(block, stream_view::per_thread()), block, stream_view::per_thread());
        }
      });
    }
    for (auto& w : workers) { w.join(); }
    stop = true;
    reader.join();
    wrong += seen.load();
    CHECK(mr.check_invariants() == "");
  }
  INFO("statistics read with a used slab: " << wrong << " (used bytes up to " << worst << ")");
  CHECK(wrong == 0);
}
