// The limiting adaptor: refusals name the limit and the bytes in use, a refusal never
// reaches the upstream, upstream failures are rolled back, and the limit holds exactly
// under 8 threads (never passed, and nothing refused that a serial model would allow).
#include <catch2/catch.hpp>

#include <mrstack/adaptor/aligned_resource_adaptor.hpp>
#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

TEST_CASE("limiting: charges sizes rounded up to the granularity and refuses past the limit") {
  auto sim = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor lim{sim, 10 * 1024};
  CHECK(lim.name() == "limiting");
  CHECK(lim.upstream() == sim.get());
  CHECK(lim.limit() == 10240);
  CHECK(lim.charge_for(1) == 256);
  CHECK(lim.charge_for(256) == 256);
  CHECK(lim.charge_for(1000) == 1024);

  void* a = lim.allocate(1000);  // charged 1024
  CHECK(lim.used_bytes() == 1024);
  void* b = lim.allocate(9000);  // charged 9216: exactly at the limit
  CHECK(lim.used_bytes() == 10240);
  CHECK(lim.available_bytes() == 0);
  std::size_t const upstream_calls = sim->total_allocations();
  try {
    (void)lim.allocate(1);
    FAIL("allocated past the limit");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == 1);
    CHECK(e.info().resource == "limiting");
    REQUIRE(e.info().limit_bytes.has_value());
    CHECK(*e.info().limit_bytes == 10240);
    CHECK_THAT(e.what(), Catch::Contains("limit 10.00 KiB (10240 B)") && Catch::Contains("in use 10.00 KiB (10240 B)"));
  }
  CHECK(sim->total_allocations() == upstream_calls);  // the refusal never reached the upstream
  lim.deallocate(a, 1000);
  CHECK(lim.used_bytes() == 9216);
  void* c = lim.allocate(1024);
  lim.deallocate(c, 1024);
  lim.deallocate(b, 9000);
  CHECK(lim.used_bytes() == 0);
}

TEST_CASE("limiting: a custom granularity, and bad arguments") {
  auto sim = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor lim{sim, 1 << 20, 4096};
  void* p = lim.allocate(10);
  CHECK(lim.used_bytes() == 4096);
  lim.deallocate(p, 10);
  CHECK_THROWS_WITH(limiting_resource_adaptor(sim, 100, 300), Catch::Contains("granularity 300"));
  CHECK_THROWS_WITH(limiting_resource_adaptor(nullptr, 100), Catch::Contains("upstream"));
}

TEST_CASE("limiting: an upstream failure gives the reservation back") {
  auto sim = std::make_shared<simulated_memory_resource>(4096);  // the upstream is smaller than the limit
  limiting_resource_adaptor lim{sim, 1 << 20};
  CHECK_THROWS_AS(lim.allocate(8192), out_of_memory);
  CHECK(lim.used_bytes() == 0);
  void* p = lim.allocate(4096);
  CHECK(lim.used_bytes() == 4096);
  lim.deallocate(p, 4096);
}

namespace {

/// Frees by pointer alone, as cudaFree does: a layer above cannot learn a wrong size here.
class size_blind_resource final : public memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view) override {
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  void do_deallocate(void* p, std::size_t, std::size_t alignment, stream_view) override {
    ::operator delete(p, std::align_val_t{alignment});
  }
  std::string do_name() const override { return "size_blind"; }
};

}  // namespace

TEST_CASE("limiting: a free larger than its allocation over a size-blind upstream does not wrap the count") {
  // The excess comes back as credit (undetectable without tracking every block); used_bytes
  // had then read limit - (more than the limit), about 2^64.
  limiting_resource_adaptor lim{std::make_shared<size_blind_resource>(), 4096};
  void* p = lim.allocate(256);
  void* q = lim.allocate(256);
  lim.deallocate(p, 2048);  // the caller's mistake: 2048 for a block of 256
  CHECK(lim.used_bytes() == 0);
  lim.deallocate(q, 256);
  CHECK(lim.used_bytes() == 0);
}

TEST_CASE("limiting: a free with a size near SIZE_MAX over a size-blind upstream neither wraps nor shrinks the limit") {
  // The caller's -1 as a size: charged back as SIZE_MAX of credit. A wrapping add left the
  // shard with less credit than before, so used_bytes() read 257 B (never charged) and
  // the whole limit was refused to the next request.
  limiting_resource_adaptor lim{std::make_shared<size_blind_resource>(), 4096};
  void* p = lim.allocate(256);
  lim.deallocate(p, ~std::size_t{0});
  CHECK(lim.used_bytes() == 0);
  void* q = nullptr;
  CHECK_NOTHROW(q = lim.allocate(4096));
  lim.deallocate(q, 4096);
  // Two of them, from different threads' shards, summed by used_bytes and a refill's pass.
  void* r = lim.allocate(256);
  std::thread{[&] { lim.deallocate(r, ~std::size_t{0}); }}.join();
  CHECK(lim.used_bytes() == 0);
  void* big = nullptr;
  CHECK_NOTHROW(big = lim.allocate(4096));  // a refill takes the other shard's saturated credit
  lim.deallocate(big, 4096);
  CHECK(lim.used_bytes() == 0);
}

TEST_CASE("limiting: a request too large to round up is refused, not wrapped") {
  auto sim = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor lim{sim, std::size_t{1} << 40};
  CHECK_THROWS_AS(lim.allocate(~std::size_t{0} - 10), out_of_memory);
  CHECK(lim.used_bytes() == 0);
}

TEST_CASE("limiting: 8 threads filling to the limit end exactly where a serial model would") {
  constexpr int threads = 8;
  std::size_t const limit = (std::size_t{3} << 20) + 777;  // not a multiple of anything handy
  auto sim = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor lim{sim, limit};
  std::mutex m;
  std::vector<std::pair<void*, std::size_t>> held;
  std::vector<std::size_t> refused;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 99};
      std::vector<std::pair<void*, std::size_t>> mine;
      std::vector<std::size_t> my_refusals;
      // Nobody frees, so usage only grows: keep asking until 3 refusals in a row.
      for (int misses = 0; misses < 3;) {
        std::size_t const bytes = 1 + rng() % 40000;
        try {
          mine.emplace_back(lim.allocate(bytes), bytes);
          misses = 0;
        } catch (out_of_memory const&) {
          my_refusals.push_back(bytes);
          ++misses;
        }
      }
      std::lock_guard lock{m};
      held.insert(held.end(), mine.begin(), mine.end());
      refused.insert(refused.end(), my_refusals.begin(), my_refusals.end());
    });
  }
  for (auto& th : pool) { th.join(); }
  std::size_t charged = 0;
  for (auto const& [p, bytes] : held) { charged += lim.charge_for(bytes); }
  CHECK(charged == lim.used_bytes());
  CHECK(charged <= limit);
  // The upstream held exactly the charges (the simulated upstream rounds spans to 256 too)
  // and never more than the limit at any moment.
  CHECK(sim->footprint() == charged);
  CHECK(sim->peak_footprint() <= limit);
  // Usage never shrank, so every refusal must still be a refusal at the end state: nothing
  // was refused that would have fit.
  REQUIRE(!refused.empty());
  for (std::size_t bytes : refused) {
    INFO("refused " << bytes << " with " << charged << " in use");
    CHECK(charged + lim.charge_for(bytes) > limit);
  }
  for (auto const& [p, bytes] : held) { lim.deallocate(p, bytes); }
  CHECK(lim.used_bytes() == 0);
  CHECK(sim->footprint() == 0);
}

TEST_CASE("limiting: 8 threads churning never pass the limit, and the books balance") {
  constexpr int threads = 8;
  constexpr int ops = 20000;
  std::size_t const limit = std::size_t{1} << 20;
  auto sim = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor lim{sim, limit};
  std::atomic<std::size_t> refusals{0};
  std::atomic<bool> over{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) * 31 + 5};
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < ops; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          std::size_t const bytes = 1 + rng() % 60000;
          try {
            mine.emplace_back(lim.allocate(bytes), bytes);
          } catch (out_of_memory const&) {
            refusals.fetch_add(1);
          }
        } else {
          std::size_t const k = rng() % mine.size();
          lim.deallocate(mine[k].first, mine[k].second);
          mine[k] = mine.back();
          mine.pop_back();
        }
        if (lim.used_bytes() > limit) { over.store(true); }
      }
      for (auto const& [p, bytes] : mine) { lim.deallocate(p, bytes); }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK_FALSE(over.load());
  CHECK(refusals.load() > 0);  // the limit did bind
  CHECK(sim->peak_footprint() <= limit);
  CHECK(lim.used_bytes() == 0);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("limiting: over real memory, the bytes are usable") {
  auto sys = std::make_shared<system_memory_resource>();
  limiting_resource_adaptor lim{sys, 1 << 16};
  auto* p = static_cast<unsigned char*>(lim.allocate(5000, {}, 1024));
  REQUIRE(detail::is_aligned(p, 1024));
  std::memset(p, 0x3c, 5000);
  CHECK(p[4999] == 0x3c);
  lim.deallocate(p, 5000, {}, 1024);
  CHECK(lim.kind() == memory_kind::host);
}

TEST_CASE("limiting: the padding of over-aligned requests counts only with aligned above it") {
  // aligned > limiting: aligned asks for the request plus its padding, and that is charged.
  auto sim = std::make_shared<simulated_memory_resource>();
  auto lim = std::make_shared<limiting_resource_adaptor>(sim, 4096);
  aligned_resource_adaptor over{lim, 4096};
  void* p = over.allocate(256);
  CHECK(lim->used_bytes() == 4096);
  CHECK_THROWS_AS(over.allocate(256), out_of_memory);
  over.deallocate(p, 256);
  CHECK(lim->used_bytes() == 0);

  // limiting > aligned: the limit sees 256 B a request while the memory below spends 4 KiB.
  auto sim2 = std::make_shared<simulated_memory_resource>();
  limiting_resource_adaptor under{std::make_shared<aligned_resource_adaptor>(sim2, 4096), 4096};
  void* a = under.allocate(256);
  void* b = under.allocate(256);
  CHECK(under.used_bytes() == 512);
  CHECK(sim2->footprint() == 8192);
  under.deallocate(a, 256);
  under.deallocate(b, 256);
}
