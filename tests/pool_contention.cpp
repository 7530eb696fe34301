// When frees park: with several streams, a free parks its stream before anyone asks once
// it has freed max(pool / park_divisor, park_minimum) since its last record, and — with a
// `contention_window` (0, always, by default) — only while memory is contended (a stream
// asked another for memory, or the pool grew, within that many frees). Streams that each
// reuse their own memory then make no CUDA call per free; once one asks, frees park
// again. Counted through the fake event seam.
#include <catch2/catch.hpp>

#include <faked_pool.hpp>

#include <mrstack/detail/stream_ordering.hpp>

#include <limits>

using namespace mrstack;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}

TEST_CASE("pool contention: with a window, streams reusing their own memory stop recording, and start again when one asks") {
  constexpr std::size_t window = 4096;
  pool_options options;
  options.contention_window = window;
  test::faked_pool f{options};
  auto& fake = f.fake;
  auto& pool = f.pool;
  auto const a = f.a;
  auto const b = f.b;
  // Warm up: each stream grows the pool for its own blocks (contention: frees park).
  void* pa = pool.allocate(64 * MiB, a);
  void* pb = pool.allocate(64 * MiB, b);
  pool.deallocate(pa, 64 * MiB, a);
  pool.deallocate(pb, 64 * MiB, b);
  std::size_t const warm_records = fake->records;
  CHECK(warm_records >= 1);  // the second stream's free parked: the pool had just grown
  std::size_t const grown = pool.pool_size();
  // Steady: each stream reuses its own memory; nobody asks, the pool does not grow.
  auto steady = [&](int rounds) {
    for (int i = 0; i < rounds; ++i) {
      pool.deallocate(pool.allocate(64 * MiB, a), 64 * MiB, a);
      pool.deallocate(pool.allocate(64 * MiB, b), 64 * MiB, b);
    }
  };
  int const window_pairs = static_cast<int>(window / 2);
  steady(window_pairs + 8);
  std::size_t const after_window = fake->records;
  steady(1000);
  CHECK(fake->records == after_window);  // no contention: no record per free
  CHECK(pool.pool_size() == grown);
  CHECK(after_window - warm_records <= static_cast<std::size_t>(window_pairs) * 2 + 16);
  // B now needs more than its own: it asks A (A's memory is not parked, so B grows), and
  // from then on frees park again, so the next such request finds A's memory parked.
  void* big = pool.allocate(100 * MiB, b);
  std::size_t const asked = fake->records;
  pool.deallocate(pool.allocate(64 * MiB, a), 64 * MiB, a);  // A's next call parks (asked)
  CHECK(fake->records > asked);
  std::size_t const resumed = fake->records;
  steady(10);
  CHECK(fake->records >= resumed + 10);  // contended again: frees park as they free
  pool.deallocate(big, 100 * MiB, b);
  CHECK(pool.check_invariants() == "");
  CHECK(fake->dead_named == 0);
}

TEST_CASE("pool contention: by default (window 0) frees park at every share freed, however long nobody asks") {
  test::faked_pool f;
  CHECK(f.pool.options().contention_window == 0);
  auto& fake = f.fake;
  auto& pool = f.pool;
  auto const a = f.a;
  auto const b = f.b;
  pool.deallocate(pool.allocate(64 * MiB, a), 64 * MiB, a);
  pool.deallocate(pool.allocate(64 * MiB, b), 64 * MiB, b);
  std::size_t const before = fake->records;
  for (int i = 0; i < 5000; ++i) {
    pool.deallocate(pool.allocate(64 * MiB, a), 64 * MiB, a);
    pool.deallocate(pool.allocate(64 * MiB, b), 64 * MiB, b);
  }
  CHECK(fake->records >= before + 10000);  // every 64 MiB free is more than 1/1024 of the pool
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool contention: a window near 2^64 keeps memory contended, not wrapped to never") {
  // Found by a hostile test: frees + window wrapped, so "as long as can be" meant "never".
  std::size_t const window = GENERATE(std::numeric_limits<std::size_t>::max(), std::size_t{1} << 63);
  INFO("window " << window);
  pool_options options;
  options.contention_window = window;
  test::faked_pool f{options};
  f.pool.deallocate(f.pool.allocate(64 * MiB, f.a), 64 * MiB, f.a);
  f.pool.deallocate(f.pool.allocate(64 * MiB, f.b), 64 * MiB, f.b);  // the pool just grew: contended
  std::size_t const before = f.fake->records;
  for (int i = 0; i < 100; ++i) {
    f.pool.deallocate(f.pool.allocate(64 * MiB, f.a), 64 * MiB, f.a);
    f.pool.deallocate(f.pool.allocate(64 * MiB, f.b), 64 * MiB, f.b);
  }
  CHECK(f.fake->records >= before + 200);  // every 64 MiB free is more than 1/1024 of the pool
}

TEST_CASE("pool contention: in a small pool a stream parks once per park_minimum freed, not at every free") {
  // A 0.25 GiB pool: 1/1024 is 256 KiB, so 1 MiB frees would each record; the minimum
  // (8 MiB by default) makes it one record per 8 frees. park_minimum 0 shows the
  // difference is the minimum's.
  auto records_per_free = [](std::size_t minimum) {
    pool_options options;
    options.contention_window = 0;  // always contended: parking is the only variable
    options.park_minimum = minimum;
    test::faked_pool f{options};
    void* fill = f.pool.allocate(240 * MiB, f.a);  // the pool grows to about 0.25 GiB
    f.pool.deallocate(fill, 240 * MiB, f.a);
    f.pool.deallocate(f.pool.allocate(MiB, f.b), MiB, f.b);  // a second stream: frees park
    REQUIRE(f.pool.pool_size() < 300 * MiB);
    std::size_t const before = f.fake->records;
    int const frees = 800;
    for (int i = 0; i < frees; ++i) { f.pool.deallocate(f.pool.allocate(MiB, f.a), MiB, f.a); }
    CHECK(f.pool.check_invariants() == "");
    return static_cast<double>(f.fake->records - before) / frees;
  };
  double const by_share = records_per_free(0);
  double const with_minimum = records_per_free(detail::park_policy::default_minimum);
  INFO("records a free: share alone " << by_share << ", with the 8 MiB minimum " << with_minimum);
  CHECK(by_share > 0.45);  // every 1 MiB free passes 256 KiB (at least every other one)
  CHECK(with_minimum > 0.1);
  CHECK(with_minimum < 0.15);  // 1/8: one record per 8 MiB freed
}
