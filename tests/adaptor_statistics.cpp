// The statistics adaptor: counters against a reference model, scopes that nest (a popped
// scope's peak is its region's; outer scopes stay right), and exact counters — peaks
// included — after concurrent churn from 8 threads.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <algorithm>
#include <functional>
#include <barrier>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;
using counter = statistics_resource_adaptor::counter;

namespace {
counter make(std::int64_t value, std::int64_t peak, std::int64_t total) { return counter{value, peak, total}; }
}  // namespace

namespace Catch {
template <>
struct StringMaker<counter> {
  static std::string convert(counter const& c) {
    return "{value " + std::to_string(c.value) + ", peak " + std::to_string(c.peak) + ", total " +
           std::to_string(c.total) + "}";
  }
};
}  // namespace Catch

TEST_CASE("statistics: counters follow a reference model over random calls") {
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 30);
  statistics_resource_adaptor stats{sim};
  CHECK(stats.name() == "statistics");
  CHECK(stats.upstream() == sim.get());
  std::mt19937_64 rng{7};
  std::vector<std::pair<void*, std::size_t>> held;
  counter bytes{};
  counter count{};
  for (int i = 0; i < 20000; ++i) {
    if (held.empty() || rng() % 5 < 3) {
      std::size_t const n = 1 + rng() % 100000;
      held.emplace_back(stats.allocate(n), n);
      bytes.value += static_cast<std::int64_t>(n);
      bytes.total += static_cast<std::int64_t>(n);
      count.value += 1;
      count.total += 1;
    } else {
      std::size_t const k = rng() % held.size();
      stats.deallocate(held[k].first, held[k].second);
      bytes.value -= static_cast<std::int64_t>(held[k].second);
      count.value -= 1;
      held[k] = held.back();
      held.pop_back();
    }
    bytes.peak = std::max(bytes.peak, bytes.value);
    count.peak = std::max(count.peak, count.value);
    if (i % 997 == 0) {
      REQUIRE(stats.bytes_counter() == bytes);
      REQUIRE(stats.allocations_counter() == count);
    }
  }
  CHECK(stats.bytes_counter() == bytes);
  CHECK(stats.allocations_counter() == count);
  // A refused request counts nothing.
  CHECK_THROWS_AS(stats.allocate(std::size_t{1} << 40), out_of_memory);
  CHECK(stats.bytes_counter() == bytes);
  for (auto [p, n] : held) { stats.deallocate(p, n); }
  CHECK(stats.bytes_counter().value == 0);
  CHECK(stats.allocations_counter().value == 0);
}

TEST_CASE("statistics: scopes nest; a popped scope reports its region and folds into the outer one") {
  auto sim = std::make_shared<simulated_memory_resource>();
  statistics_resource_adaptor stats{sim};
  void* a = stats.allocate(100);
  CHECK(stats.scope_depth() == 0);

  auto const at_push = stats.push_counters();  // middle region
  CHECK(at_push.bytes == make(100, 100, 100));
  CHECK(stats.bytes_counter() == make(0, 0, 0));
  void* b = stats.allocate(50);
  void* c = stats.allocate(70);
  stats.deallocate(b, 50);
  CHECK(stats.bytes_counter() == make(70, 120, 120));

  stats.push_counters();  // inner region
  CHECK(stats.scope_depth() == 2);
  void* d = stats.allocate(200);
  stats.deallocate(d, 200);
  auto const inner = stats.pop_counters();
  CHECK(inner.bytes == make(0, 200, 200));
  CHECK(inner.allocations == make(0, 1, 1));
  // The middle region saw 70 + 200 at once.
  CHECK(stats.bytes_counter() == make(70, 270, 320));
  CHECK(stats.allocations_counter() == make(1, 2, 3));

  // Freeing memory allocated before the region makes the region's current negative.
  stats.push_counters();
  stats.deallocate(a, 100);
  auto const freeing = stats.pop_counters();
  CHECK(freeing.bytes == make(-100, 0, 0));
  CHECK(freeing.allocations == make(-1, 0, 0));
  CHECK(stats.bytes_counter() == make(-30, 270, 320));

  auto const middle = stats.pop_counters();
  CHECK(middle.bytes == make(-30, 270, 320));
  CHECK(stats.scope_depth() == 0);
  // The lifetime: 100 + 70 + 200 were out together at the peak; 70 remain.
  CHECK(stats.bytes_counter() == make(70, 370, 420));
  CHECK(stats.allocations_counter() == make(1, 3, 4));
  stats.deallocate(c, 70);
  CHECK(stats.bytes_counter() == make(0, 370, 420));

  CHECK_THROWS_WITH(stats.pop_counters(), Catch::Contains("without a matching push"));
}

TEST_CASE("statistics: nested scopes against a model of every region, random calls") {
  auto sim = std::make_shared<simulated_memory_resource>();
  statistics_resource_adaptor stats{sim};
  std::mt19937_64 rng{2024};
  // Model: every open region's counters updated on every call (the naive, obviously right way).
  std::vector<counter> model(1);
  std::vector<std::pair<void*, std::size_t>> held;
  for (int i = 0; i < 20000; ++i) {
    auto const dice = rng() % 100;
    if (dice < 3 && model.size() < 6) {
      stats.push_counters();
      model.emplace_back();
    } else if (dice < 6 && model.size() > 1) {
      auto const got = stats.pop_counters();
      REQUIRE(got.bytes == model.back());
      model.pop_back();
    } else if (held.empty() || dice < 55) {
      std::size_t const n = 1 + rng() % 5000;
      held.emplace_back(stats.allocate(n), n);
      for (auto& c : model) {
        c.value += static_cast<std::int64_t>(n);
        c.total += static_cast<std::int64_t>(n);
        c.peak = std::max(c.peak, c.value);
      }
    } else {
      std::size_t const k = rng() % held.size();
      stats.deallocate(held[k].first, held[k].second);
      for (auto& c : model) { c.value -= static_cast<std::int64_t>(held[k].second); }
      held[k] = held.back();
      held.pop_back();
    }
    REQUIRE(stats.bytes_counter() == model.back());
  }
  while (model.size() > 1) {
    REQUIRE(stats.pop_counters().bytes == model.back());
    model.pop_back();
  }
  CHECK(stats.bytes_counter() == model.front());
  for (auto [p, n] : held) { stats.deallocate(p, n); }
}

TEST_CASE("statistics: exact after concurrent churn from 8 threads, peaks included") {
  constexpr int threads = 8;
  auto sim = std::make_shared<simulated_memory_resource>();
  statistics_resource_adaptor stats{sim};
  std::barrier sync{threads};
  std::vector<std::int64_t> held_bytes(threads);       // phase A: what each thread holds at the barrier
  std::vector<std::int64_t> total_bytes(threads);      // everything each thread allocated
  std::vector<std::int64_t> total_count(threads);
  std::vector<std::int64_t> scoped_bytes(threads);     // allocated inside the scope (phase B)
  std::vector<std::int64_t> scoped_count(threads);
  statistics_resource_adaptor::counters phase_a_region{};
  statistics_resource_adaptor::counters phase_b_region{};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto const i = static_cast<std::size_t>(t);
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 1000};
      std::vector<std::pair<void*, std::size_t>> mine;
      if (t == 0) { stats.push_counters(); }
      sync.arrive_and_wait();
      // Phase A: churn holding at most 64 blocks under 8 KiB, then free them all and hold
      // 64 blocks of 8 KiB or more. At every moment a thread holds no more than its final
      // set, and at the barrier all final sets are held at once: the lifetime peak must be
      // exactly their sum (and phase B below stays far under it).
      for (int k = 0; k < 3000; ++k) {
        if (mine.empty() || (mine.size() < 64 && rng() % 2 == 0)) {
          std::size_t const n = 4096 + rng() % 4096;
          mine.emplace_back(stats.allocate(n), n);
          total_bytes[i] += static_cast<std::int64_t>(n);
          total_count[i] += 1;
        } else {
          std::size_t const j = rng() % mine.size();
          stats.deallocate(mine[j].first, mine[j].second);
          mine[j] = mine.back();
          mine.pop_back();
        }
      }
      for (auto const& [p, n] : mine) { stats.deallocate(p, n); }
      mine.clear();
      while (mine.size() < 64) {
        std::size_t const n = 8192 + rng() % 8192;
        mine.emplace_back(stats.allocate(n), n);
        total_bytes[i] += static_cast<std::int64_t>(n);
        total_count[i] += 1;
      }
      for (auto const& [p, n] : mine) { held_bytes[i] += static_cast<std::int64_t>(n); }
      sync.arrive_and_wait();
      if (t == 0) {
        phase_a_region = stats.pop_counters();
        stats.push_counters();
      }
      sync.arrive_and_wait();
      for (auto const& [p, n] : mine) { stats.deallocate(p, n); }
      mine.clear();
      // Phase B: churn of small blocks, at most 16 held per thread (< 16 * 1024 bytes each).
      for (int k = 0; k < 20000; ++k) {
        if (mine.empty() || (mine.size() < 16 && rng() % 2 == 0)) {
          std::size_t const n = 1 + rng() % 1024;
          mine.emplace_back(stats.allocate(n), n);
          total_bytes[i] += static_cast<std::int64_t>(n);
          total_count[i] += 1;
          scoped_bytes[i] += static_cast<std::int64_t>(n);
          scoped_count[i] += 1;
        } else {
          std::size_t const j = rng() % mine.size();
          stats.deallocate(mine[j].first, mine[j].second);
          mine[j] = mine.back();
          mine.pop_back();
        }
      }
      for (auto const& [p, n] : mine) { stats.deallocate(p, n); }
      sync.arrive_and_wait();
      if (t == 0) { phase_b_region = stats.pop_counters(); }
    });
  }
  for (auto& th : pool) { th.join(); }
  std::int64_t held_sum = 0;
  std::int64_t bytes_sum = 0;
  std::int64_t count_sum = 0;
  std::int64_t scoped_bytes_sum = 0;
  std::int64_t scoped_count_sum = 0;
  for (std::size_t i = 0; i < threads; ++i) {
    held_sum += held_bytes[i];
    bytes_sum += total_bytes[i];
    count_sum += total_count[i];
    scoped_bytes_sum += scoped_bytes[i];
    scoped_count_sum += scoped_count[i];
  }
  CHECK(stats.scope_depth() == 0);
  auto const life = stats.current_counters();
  CHECK(life.bytes == make(0, held_sum, bytes_sum));
  CHECK(life.allocations == make(0, threads * 64, count_sum));
  // Phase A's region ended while everything was held: current = peak = the held sum.
  CHECK(phase_a_region.bytes.value == held_sum);
  CHECK(phase_a_region.bytes.peak == held_sum);
  CHECK(phase_a_region.allocations.value == threads * 64);
  // Phase B's region: it freed phase A's blocks and allocated/freed its own.
  CHECK(phase_b_region.bytes.value == -held_sum);
  CHECK(phase_b_region.bytes.total == scoped_bytes_sum);
  CHECK(phase_b_region.allocations.total == scoped_count_sum);
  CHECK(phase_b_region.bytes.peak <= threads * 16 * 1024);
  CHECK(sim->allocation_count() == 0);
}

namespace {

/// Allocates from the system heap; once `refuse` is set, its deallocate runs `during_free`
/// (a read of the adaptor above, standing for another thread's) and refuses the free.
class refusing_upstream final : public memory_resource {
 public:
  bool refuse = false;
  std::function<void()> during_free;

 private:
  void* do_allocate(std::size_t bytes, std::size_t, stream_view) override { return ::operator new(bytes); }
  void do_deallocate(void* p, std::size_t, std::size_t, stream_view) override {
    if (!refuse) {
      ::operator delete(p);
      return;
    }
    if (during_free) { during_free(); }
    throw logic_error("refusing_upstream: a double free, refused on purpose");
  }
  std::string do_name() const override { return "refusing"; }
};

}  // namespace

TEST_CASE("statistics: a read while the upstream holds a free it then refuses clamps nothing") {
  // A double free is counted down before it is forwarded; a read in that window took it
  // for an over-free and clamped it, and the refusal's count back then raised the peak:
  // with nothing out, the adaptor read 1 allocation current and twice the real peak.
  auto upstream = std::make_shared<refusing_upstream>();
  statistics_resource_adaptor stats{upstream};
  void* p = stats.allocate(1000);
  stats.deallocate(p, 1000);
  upstream->refuse = true;
  counter seen{};
  upstream->during_free = [&] { seen = stats.bytes_counter(); };
  CHECK_THROWS_WITH(stats.deallocate(p, 1000), Catch::Contains("refused on purpose"));
  CHECK(seen.value == 0);  // the free in flight reads as 0, and is not clamped away
  CHECK(stats.bytes_counter() == counter{0, 1000, 1000});
  CHECK(stats.allocations_counter() == counter{0, 1, 1});
  CHECK(stats.overfreed_bytes() == 0);
  CHECK(stats.overfreed_allocations() == 0);
}

TEST_CASE("statistics: a region opened while a free is in flight never counts that free's refusal") {
  // The free began before the region: its refusal counts the memory back where its count
  // went (the enclosing region). It had gone into the new region: 1 allocation of 1000 B,
  // current and peak, in a region that made none.
  auto upstream = std::make_shared<refusing_upstream>();
  statistics_resource_adaptor stats{upstream};
  void* live = stats.allocate(1000);
  void* gone = stats.allocate(1000);
  stats.deallocate(gone, 1000);
  upstream->refuse = true;
  upstream->during_free = [&] { (void)stats.push_counters(); };
  CHECK_THROWS_WITH(stats.deallocate(gone, 1000), Catch::Contains("refused on purpose"));
  upstream->refuse = false;
  auto const region = stats.pop_counters();
  CHECK(region.bytes == counter{0, 0, 0});
  CHECK(region.allocations == counter{0, 0, 0});
  CHECK(stats.bytes_counter() == counter{1000, 2000, 2000});  // the refused free left it as it was
  // Opened and closed inside the free's window, a region leaves the count to the lifetime.
  upstream->refuse = true;
  upstream->during_free = [&] {
    (void)stats.push_counters();
    (void)stats.pop_counters();
    (void)stats.push_counters();
  };
  CHECK_THROWS(stats.deallocate(gone, 1000));
  upstream->refuse = false;
  CHECK(stats.pop_counters().bytes == counter{0, 0, 0});
  CHECK(stats.bytes_counter() == counter{1000, 2000, 2000});
  stats.deallocate(live, 1000);
  CHECK(stats.bytes_counter() == counter{0, 2000, 2000});
}

TEST_CASE("statistics: a refused free of a size no block has leaves every counter as it was") {
  // Counted down first, 2^64 - 1 B saturated the shard's headroom credit; the refusal's
  // count back then left it short, and the next allocation raised the peak with no more
  // memory out (1500 where 1000 was ever out).
  auto upstream = std::make_shared<refusing_upstream>();
  statistics_resource_adaptor stats{upstream};
  void* a = stats.allocate(1000);
  stats.deallocate(a, 1000);
  void* b = stats.allocate(500);
  upstream->refuse = true;
  CHECK_THROWS(stats.deallocate(b, SIZE_MAX));
  upstream->refuse = false;
  void* c = stats.allocate(500);
  CHECK(stats.bytes_counter() == counter{1000, 1000, 2000});
  stats.deallocate(b, 500);
  stats.deallocate(c, 500);
  CHECK(stats.bytes_counter() == counter{0, 1000, 2000});
  CHECK(stats.overfreed_bytes() == 0);
}
