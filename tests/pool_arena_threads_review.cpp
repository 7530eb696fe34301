// The pool's thread shards and the arena under threads, from a hostile review (each case
// failed before its fix; run them under the tsan preset too):
// - the pool's fragmentation() while a slab goes back to the global blocks: its free
//   bytes were summed shard by shard before the global blocks were read, so the slab was
//   counted free twice (free + live exceeded what the pool held);
// - the arena's thread exit found the thread's own arena through its cache of 8 arenas:
//   a thread that had used more streams than that left its arena unretired, holding its
//   spare superblocks.
#include <catch2/catch.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

pool_options shard_from_second_thread() {
  pool_options o;
  o.shard_after_contentions = 0;
  return o;
}

}  // namespace

TEST_CASE("pool review: fragmentation() counts a slab going back to the global blocks once") {
  pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, std::nullopt, shard_from_second_thread()};
  mr.deallocate(mr.allocate(256), 256);  // the first thread: the others shard
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::atomic<int> reads{0};
  std::thread worker{[&] {
    while (!stop.load()) { mr.deallocate(mr.allocate(256, stream_view::per_thread()), 256, stream_view::per_thread()); }
  }};
  std::thread releaser{[&] {
    while (!stop.load()) { mr.release(); }
  }};
  std::thread reader{[&] {
    while (!stop.load()) {
      auto const f = mr.fragmentation();
      std::size_t streams = 0;
      for (auto const& share : f.streams) { streams += share.free_bytes; }
      if (f.free_bytes + f.live_bytes > f.held_bytes || streams > f.free_bytes) { wrong.fetch_add(1); }
      reads.fetch_add(1);
    }
  }};
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  worker.join();
  releaser.join();
  reader.join();
  INFO(reads.load() << " reads");
  CHECK(wrong.load() == 0);
}

TEST_CASE("arena review: a thread that used more streams than its arena cache holds still retires its own arena") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, o};
  auto const created = [](int k) { return stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000} * (k + 1))}; };
  int const threads = 40;
  for (int t = 0; t < threads; ++t) {
    std::thread{[&] {
      // Its own default stream's arena first, then more created streams than the thread
      // remembers arenas (8): its own arena's entry is the one pushed out.
      mr.deallocate(mr.allocate(4 * KiB, stream_view::per_thread()), 4 * KiB, stream_view::per_thread());
      for (int k = 0; k < 9; ++k) { mr.deallocate(mr.allocate(4 * KiB, created(k)), 4 * KiB, created(k)); }
    }}.join();
  }
  // The 9 created streams' arenas stay; every exited thread's own arena was retired, its
  // superblocks back, rather than one arena and its spares left per thread (before the
  // fix: 49 arenas, holding the whole 256 MiB maximum against 224 MiB once retired).
  auto const st = mr.fragmentation();
  INFO(st.streams.size() << " stream arenas, " << st.held_bytes << " B held");
  CHECK(st.streams.size() <= 10);
}
