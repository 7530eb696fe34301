// The adaptors that count per thread (statistics, limiting, tracking) stay exact while
// 8 threads call them and another reads: statistics' peaks never run ahead of or behind
// what was outstanding, limits hold at every read, tracking's books balance. Statistics'
// counters saturate instead of wrapping, and over-frees are clamped and reported.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <barrier>
#include <latch>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

/// Hands out one fake address for any size and takes everything back: for counting huge sizes.
class fake_upstream final : public memory_resource {
  void* do_allocate(std::size_t, std::size_t, stream_view) override { return reinterpret_cast<void*>(0x100000); }
  void do_deallocate(void*, std::size_t, std::size_t, stream_view) override {}
  std::string do_name() const override { return "fake"; }
};

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

}  // namespace

TEST_CASE("statistics: counters saturate instead of wrapping") {
  statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
  std::size_t const huge = std::size_t{1} << 62;
  for (int i = 0; i < 3; ++i) {
    void* p = stats.allocate(huge);
    stats.deallocate(p, huge);
  }
  auto const bytes = stats.bytes_counter();
  CHECK(bytes.value == 0);
  CHECK(bytes.peak == static_cast<std::int64_t>(huge));
  CHECK(bytes.total == int64_max);  // 3 x 2^62 does not fit: it stays at the top
  void* p = stats.allocate(std::numeric_limits<std::size_t>::max() - 1024);  // counted as 2^63 - 1
  CHECK(stats.bytes_counter().value == int64_max);
  CHECK(stats.bytes_counter().peak == int64_max);
  stats.deallocate(p, std::numeric_limits<std::size_t>::max() - 1024);
  CHECK(stats.bytes_counter().value == 0);
  CHECK(stats.allocations_counter() == statistics_resource_adaptor::counter{0, 1, 4});
}

TEST_CASE("statistics: a free larger than what is outstanding is clamped and reported, never wrapped") {
  statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
  void* a = stats.allocate(100);
  void* b = stats.allocate(1000);
  stats.deallocate(a, 1000);  // wrong size: 900 B too many
  stats.deallocate(b, 1000);
  CHECK(stats.bytes_counter().value == 0);  // clamped, not -900 (or 2^64 - 900 to an unsigned reader)
  CHECK(stats.overfreed_bytes() == 900);
  CHECK(stats.overfreed_allocations() == 0);
  CHECK(stats.bytes_counter().peak == 1100);
  // The counters go on from zero.
  void* c = stats.allocate(50);
  CHECK(stats.bytes_counter().value == 50);
  CHECK(stats.bytes_counter().peak == 1100);
  stats.deallocate(c, 50);
  // Inside a scope a negative current is legitimate (memory allocated before it): not clamped.
  void* d = stats.allocate(10);
  stats.push_counters();
  stats.deallocate(d, 10);
  CHECK(stats.bytes_counter().value == -10);
  auto const region = stats.pop_counters();
  CHECK(region.bytes.value == -10);
  CHECK(stats.bytes_counter().value == 0);
  CHECK(stats.overfreed_bytes() == 900);
}

TEST_CASE("statistics: frees of sizes near SIZE_MAX saturate current downwards without overflow") {
  // Two frees of -1 as a size over an upstream that takes anything: current saturates at
  // INT64_MIN. The lifetime's clamp computed 0 - INT64_MIN (overfreed_bytes() read it
  // negative), a pop's headroom peak - INT64_MIN: signed overflow both.
  constexpr std::size_t minus_one = ~std::size_t{0};
  SECTION("the lifetime's clamp") {
    statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
    void* p = stats.allocate(256);
    stats.deallocate(p, minus_one);
    stats.deallocate(p, minus_one);
    CHECK(stats.bytes_counter().value == 0);
    CHECK(stats.overfreed_bytes() == int64_max);
    CHECK(stats.bytes_counter().peak == 256);
  }
  SECTION("a scope's pop") {
    statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
    void* p = stats.allocate(256);
    stats.push_counters();
    stats.deallocate(p, minus_one);
    stats.deallocate(p, minus_one);
    auto const region = stats.pop_counters();
    CHECK(region.bytes.value == std::numeric_limits<std::int64_t>::min());
    CHECK(stats.bytes_counter().value == 0);
    CHECK(stats.overfreed_bytes() >= 0);
    CHECK(stats.bytes_counter().peak == 256);
    void* q = stats.allocate(512);  // the headroom the pop left is not negative: no false peak
    CHECK(stats.bytes_counter().peak == 512);
    stats.deallocate(q, 512);
  }
}

TEST_CASE("statistics: 8 threads and a reader: every read is a state that existed, peaks exact") {
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 40);
  statistics_resource_adaptor stats{sim};
  constexpr int threads = 8;
  std::barrier sync{threads + 1};
  std::atomic<bool> done{false};
  std::vector<std::int64_t> held_at_barrier(threads);
  std::vector<std::int64_t> allocated(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t)};
      std::vector<std::pair<void*, std::size_t>> mine;
      // Churn with at most 64 KiB held per thread, then hold a final set across the barrier.
      std::int64_t held = 0;
      for (int i = 0; i < 20000; ++i) {
        if (mine.empty() || (rng() % 2 == 0 && held < 60000)) {
          std::size_t const n = 1 + rng() % 4096;
          mine.emplace_back(stats.allocate(n), n);
          held += static_cast<std::int64_t>(n);
          allocated[t] += static_cast<std::int64_t>(n);
        } else {
          stats.deallocate(mine.back().first, mine.back().second);
          held -= static_cast<std::int64_t>(mine.back().second);
          mine.pop_back();
        }
      }
      held_at_barrier[t] = held;
      sync.arrive_and_wait();  // everything held at once here
      sync.arrive_and_wait();  // the main thread has read
      for (auto const& [p, n] : mine) { stats.deallocate(p, n); }
    });
  }
  // Catch's assertions are not thread-safe: the reader counts what it saw wrong.
  std::atomic<int> bad_reads{0};
  std::atomic<int> reads{0};
  std::thread reader{[&] {
    std::int64_t last_peak = 0;
    std::int64_t last_total = 0;
    while (!done.load()) {
      auto const c = stats.bytes_counter();
      bool const good = c.value >= 0 && c.value <= c.peak && c.peak <= threads * 64000 &&  // none held > ~64 KiB
                        c.peak >= last_peak && c.total >= last_total;
      bad_reads.fetch_add(good ? 0 : 1);
      reads.fetch_add(1);
      last_peak = c.peak;
      last_total = c.total;
    }
  }};
  sync.arrive_and_wait();
  std::int64_t held_sum = 0;
  for (auto h : held_at_barrier) { held_sum += h; }
  auto const at_barrier = stats.bytes_counter();
  CHECK(at_barrier.value == held_sum);
  CHECK(at_barrier.peak >= held_sum);
  sync.arrive_and_wait();
  for (auto& w : workers) { w.join(); }
  done = true;
  reader.join();
  CHECK(reads.load() > 0);
  CHECK(bad_reads.load() == 0);
  std::int64_t total = 0;
  for (auto a : allocated) { total += a; }
  auto const end = stats.bytes_counter();
  CHECK(end.value == 0);
  CHECK(end.total == total);
  CHECK(end.peak >= held_sum);
  CHECK(stats.allocations_counter().value == 0);
  CHECK(stats.overfreed_bytes() == 0);
}

TEST_CASE("statistics: the peak is exactly the serial one when threads take turns") {
  // Threads alternate strictly (a token passed through an atomic): the calls have one
  // order, so the peak must be exactly the model's even though each thread counts in
  // its own shard.
  statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
  constexpr int threads = 4;
  std::atomic<int> turn{0};
  std::int64_t model_value = 0;
  std::int64_t model_peak = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 50};
      std::vector<std::size_t> mine;
      for (int round = 0; round < 500; ++round) {
        while (turn.load() % threads != t) { std::this_thread::yield(); }
        for (int k = 0; k < 5; ++k) {
          if (mine.empty() || rng() % 3 != 0) {
            std::size_t const n = 1 + rng() % 10000;
            (void)stats.allocate(n);
            mine.push_back(n);
            model_value += static_cast<std::int64_t>(n);
            model_peak = std::max(model_peak, model_value);
          } else {
            stats.deallocate(reinterpret_cast<void*>(0x100000), mine.back());
            model_value -= static_cast<std::int64_t>(mine.back());
            mine.pop_back();
          }
        }
        turn.fetch_add(1);
      }
      while (turn.load() < threads * 500) { std::this_thread::yield(); }
      for (std::size_t n : mine) { stats.deallocate(reinterpret_cast<void*>(0x100000), n); }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(stats.bytes_counter().peak == model_peak);
  CHECK(stats.bytes_counter().value == 0);
}

TEST_CASE("shards: threads that come and go never share a shard with a live thread") {
  // Each round: a few threads start and exit, then 16 run at once beside this one. With
  // ordinals from an ever-growing counter, some round's 16 came round to this thread's
  // index (or to each other's), and the two shared one shard's lock.
  std::size_t const mine = detail::this_thread_shard();
  for (int round = 0; round < 8; ++round) {
    for (int i = 0; i < 8; ++i) {
      std::thread{[] { (void)detail::this_thread_shard(); }}.join();
    }
    constexpr int live = 16;
    std::vector<std::size_t> got(live);
    std::barrier all_in{live};
    std::vector<std::thread> threads;
    for (int t = 0; t < live; ++t) {
      threads.emplace_back([&, t] {
        got[static_cast<std::size_t>(t)] = detail::this_thread_shard();
        all_in.arrive_and_wait();  // all alive at once: none has given its index back
      });
    }
    for (auto& t : threads) { t.join(); }
    std::set<std::size_t> distinct(got.begin(), got.end());
    INFO("round " << round);
    CHECK(distinct.size() == got.size());
    CHECK(distinct.count(mine) == 0);
  }
}

TEST_CASE("shards: past 64 live threads, a new thread takes a free index, not an overflow thread's") {
  detail::shard_indices reg;
  std::vector<std::size_t> held;
  for (std::size_t i = 0; i < detail::counter_shards; ++i) { held.push_back(reg.acquire()); }
  std::size_t const overflow = reg.acquire();  // the 65th live thread shares some index
  std::size_t const other = (overflow + 5) % detail::counter_shards;
  reg.release(held[overflow]);  // the thread it shares with exits, and another one
  reg.release(held[other]);
  CHECK(reg.acquire() == other);  // 63 live threads: nobody holds `other`, so no sharing
}

namespace {
std::latch* index_given_back = nullptr;
std::latch* index_taken_again = nullptr;
std::atomic<std::size_t> late_shard{0};
struct uses_shard_at_exit {
  ~uses_shard_at_exit() {  // runs after the thread's index went back (built before it was taken)
    index_given_back->count_down();
    index_taken_again->wait();
    late_shard = detail::this_thread_shard();
  }
};
}  // namespace

TEST_CASE("shards: a thread-exit destructor after the index went back does not share a new thread's") {
  (void)detail::this_thread_shard();
  std::latch given_back{1}, taken{1}, done{1};
  index_given_back = &given_back;
  index_taken_again = &taken;
  std::thread a{[] {
    thread_local uses_shard_at_exit late;
    (void)&late;
    (void)detail::this_thread_shard();
  }};
  given_back.wait();
  std::size_t b_index = 0;
  std::thread b{[&] {
    b_index = detail::this_thread_shard();  // a's index, given back
    taken.count_down();
    done.wait();
  }};
  a.join();
  CHECK(late_shard.load() != b_index);
  done.count_down();
  b.join();
}

TEST_CASE("statistics: refills() counts the allocations that had to refill their thread's credit") {
  // A thread's first allocation finds its shard without credit (a refill); after its own
  // free, the same size is served from its own credit (no refill).
  statistics_resource_adaptor stats{std::make_shared<fake_upstream>()};
  void* const p = reinterpret_cast<void*>(0x100000);
  CHECK(stats.refills() == 0);
  (void)stats.allocate(4096);
  CHECK(stats.refills() == 1);
  stats.deallocate(p, 4096);
  (void)stats.allocate(4096);
  stats.deallocate(p, 4096);
  CHECK(stats.refills() == 1);
  std::thread other{[&] { (void)stats.allocate(1024); }};  // a new thread: its shard is empty
  other.join();
  CHECK(stats.refills() == 2);
  CHECK(stats.bytes_counter().peak == 4096);  // the other thread took this one's credit
}

TEST_CASE("limiting: 8 threads and a reader: the upstream's usage never passes the limit, books balance") {
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 40);
  std::size_t const limit = 1 << 20;
  limiting_resource_adaptor lim{sim, limit};
  constexpr int threads = 8;
  std::atomic<bool> done{false};
  std::atomic<std::size_t> refusals{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 9};
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 20000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          std::size_t const n = 1 + rng() % 65536;
          try {
            mine.emplace_back(lim.allocate(n), n);
          } catch (out_of_memory const&) {
            refusals.fetch_add(1);
          }
        } else {
          lim.deallocate(mine.back().first, mine.back().second);
          mine.pop_back();
        }
      }
      for (auto const& [p, n] : mine) { lim.deallocate(p, n); }
    });
  }
  // used_bytes() is limit - unused, never above the limit by construction: what must stay
  // within it is the upstream's usage (the simulated upstream rounds to 256 B, as the
  // charges do), read here while the threads run and as its peak.
  std::atomic<int> over{0};
  std::thread reader{[&] {
    while (!done.load()) { over.fetch_add(sim->footprint() <= limit ? 0 : 1); }
  }};
  for (auto& w : workers) { w.join(); }
  done = true;
  reader.join();
  CHECK(over.load() == 0);
  CHECK(sim->peak_footprint() <= limit);
  CHECK(refusals.load() > 0);  // the limit was reached
  CHECK(lim.used_bytes() == 0);
  CHECK(sim->footprint() == 0);
  // Everything the threads left as credit is usable by one thread: the whole limit.
  void* all = lim.allocate(limit);
  CHECK(lim.used_bytes() == limit);
  CHECK_THROWS_AS(lim.allocate(1), out_of_memory);
  lim.deallocate(all, limit);
}

TEST_CASE("tracking: frees from other threads find their records; counts exact") {
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 40);
  tracking_resource_adaptor tracking{sim};
  constexpr int threads = 8;
  std::vector<std::vector<std::pair<void*, std::size_t>>> made(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        std::size_t const n = 256 * (1 + (i + t) % 16);
        made[t].emplace_back(tracking.allocate(n), n);
      }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(tracking.outstanding_count() == threads * 1000);
  workers.clear();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (auto const& [p, n] : made[(t + 1) % threads]) { tracking.deallocate(p, n); }  // another thread's blocks
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(tracking.outstanding_count() == 0);
  CHECK(tracking.outstanding_bytes() == 0);
  CHECK_THROWS_AS(tracking.deallocate(made[0][0].first, made[0][0].second), logic_error);
}
