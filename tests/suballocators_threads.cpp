// Every suballocator hammered by several threads at once (run it under the tsan preset):
// each thread allocates and frees on its per-thread default stream, stamps its blocks and
// checks the stamps before freeing, and hands some blocks to other threads to free
// (cross-thread, cross-stream frees). Any overlap corrupts a stamp; any data race is
// ThreadSanitizer's to report.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct stamped {
  void* p;
  std::size_t bytes;
  std::uint64_t stamp;
};

void stamp(stamped const& b) {
  std::memcpy(b.p, &b.stamp, sizeof b.stamp);
  std::memcpy(static_cast<char*>(b.p) + b.bytes - sizeof b.stamp, &b.stamp, sizeof b.stamp);
}
bool intact(stamped const& b) {
  std::uint64_t head = 0;
  std::uint64_t tail = 0;
  std::memcpy(&head, b.p, sizeof head);
  std::memcpy(&tail, static_cast<char*>(b.p) + b.bytes - sizeof tail, sizeof tail);
  return head == b.stamp && tail == b.stamp;
}

/// Runs `threads` threads of `steps` random steps each over `mr`; returns the number of
/// corrupted blocks seen (must be 0).
int hammer(memory_resource& mr, int threads, int steps, std::size_t max_bytes) {
  std::atomic<int> corrupted{0};
  std::atomic<int> failures{0};
  std::mutex exchange_mutex;
  std::vector<stamped> exchange;  // blocks handed from one thread to another
  std::string first_refusal;
  std::vector<std::thread> pool;
  std::atomic<int> started{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // All start together: on a loaded machine a thread could otherwise finish before the
      // last one began (then fewer threads ever overlap, and fewer shards are made).
      started.fetch_add(1);
      while (started.load() < threads) { std::this_thread::yield(); }
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) * 7777 + 1};
      std::vector<stamped> mine;
      auto const stream = stream_view::per_thread();
      for (int step = 0; step < steps; ++step) {
        std::uint64_t const r = rng() % 100;
        if (mine.empty() || r < 48) {  // as many allocations as frees: usage stays bounded
          std::size_t const bytes = 16 + rng() % (max_bytes - 16);
          try {
            stamped b{mr.allocate(bytes, stream), bytes, (std::uint64_t(t) << 48) | std::uint64_t(step)};
            stamp(b);
            mine.push_back(b);
          } catch (out_of_memory const& e) {
            if (failures.fetch_add(1) == 0) {
              std::lock_guard lock{exchange_mutex};
              first_refusal = e.what();
            }
          }
        } else if (r < 52) {
          std::lock_guard lock{exchange_mutex};
          if (r < 50 || exchange.empty()) {  // give one away
            exchange.push_back(mine.back());
            mine.pop_back();
          } else {                            // take one to free here
            mine.push_back(exchange.back());
            exchange.pop_back();
          }
        } else {
          std::size_t const k = rng() % mine.size();
          if (!intact(mine[k])) { corrupted.fetch_add(1); }
          mr.deallocate(mine[k].p, mine[k].bytes, stream);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto const& b : mine) {
        if (!intact(b)) { corrupted.fetch_add(1); }
        mr.deallocate(b.p, b.bytes, stream);
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  for (auto const& b : exchange) {
    if (!intact(b)) { corrupted.fetch_add(1); }
    mr.deallocate(b.p, b.bytes, stream_view::per_thread());
  }
  INFO("first refusal: " << first_refusal);
  CHECK(failures.load() == 0);
  return corrupted.load();
}

int steps_per_thread() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr ? 200000 : 20000; }

}  // namespace

TEST_CASE("threads: pool") {
  auto sys = std::make_shared<system_memory_resource>();
  pool_memory_resource mr{sys, 16 * MiB};
  CHECK(hammer(mr, 4, steps_per_thread(), 64 * KiB) == 0);
  CHECK(mr.check_invariants() == "");
  CHECK(mr.used_bytes() == 0);
}

TEST_CASE("threads: pool, sharded from the second thread, more threads than shards") {
  auto sys = std::make_shared<system_memory_resource>();
  pool_options options;
  options.shard_after_contentions = 0;
  options.thread_shards = 3;
  options.shard_block_limit = 32 * KiB;  // blocks above it on the global blocks, the rest in shards
  pool_memory_resource mr{sys, 16 * MiB, std::nullopt, options};
  CHECK(hammer(mr, 6, steps_per_thread(), 64 * KiB) == 0);
  // Never more shards than asked for; as many only when three threads ran at once, which a
  // loaded machine does not promise (it may run them one after another).
  CHECK(mr.stats().thread_shards >= 1);
  CHECK(mr.stats().thread_shards <= 3);
  CHECK(mr.check_invariants() == "");
  CHECK(mr.used_bytes() == 0);
  mr.release();
  CHECK(mr.stats().slab_bytes == 0);
}

TEST_CASE("threads: fixed_size") {
  auto sys = std::make_shared<system_memory_resource>();
  fixed_size_memory_resource mr{sys, 4 * KiB, 64};
  CHECK(hammer(mr, 4, steps_per_thread(), 4 * KiB) == 0);
  CHECK(mr.free_blocks() == mr.total_blocks());
}

TEST_CASE("threads: binning") {
  auto sys = std::make_shared<system_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sys, 0);
  binning_memory_resource mr{sys, 256, 16 * KiB, pool};
  CHECK(hammer(mr, 4, steps_per_thread(), 64 * KiB) == 0);
  CHECK(pool->used_bytes() == 0);
}

TEST_CASE("threads: arena") {
  auto sys = std::make_shared<system_memory_resource>();
  arena_options options;
  options.superblock_size = 1 * MiB;
  options.max_small_size = 64 * KiB;
  arena_memory_resource mr{sys, 256 * MiB, options};
  CHECK(hammer(mr, 4, steps_per_thread(), 256 * KiB) == 0);
  CHECK(mr.check_invariants() == "");
  mr.release();
  CHECK(mr.held_bytes() == 0);  // every chunk went back to the upstream
}
