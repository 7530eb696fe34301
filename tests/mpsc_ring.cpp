// detail::mpsc_ring: from 8 producers through a tiny ring (constant back-pressure), every
// record arrives exactly once, each producer's records in its order.
#include <catch2/catch.hpp>

#include <mrstack/detail/mpsc_ring.hpp>

#include <atomic>
#include <thread>
#include <vector>

using mrstack::detail::mpsc_ring;

namespace {
struct item {
  std::uint32_t producer;
  std::uint32_t index;
};
}  // namespace

TEST_CASE("mpsc_ring: every record once, per-producer order kept, under back-pressure") {
  std::size_t const capacity = GENERATE(std::size_t{2}, std::size_t{8}, std::size_t{1024});
  INFO("capacity " << capacity);
  constexpr std::uint32_t producers = 8;
  constexpr std::uint32_t per_producer = 20000;
  mpsc_ring<item> ring{capacity};
  CHECK(ring.capacity() == capacity);
  std::atomic<int> stalls{0};
  std::vector<std::thread> pool;
  for (std::uint32_t p = 0; p < producers; ++p) {
    pool.emplace_back([&, p] {
      for (std::uint32_t i = 0; i < per_producer; ++i) { ring.push(item{p, i}, [&] { stalls.fetch_add(1); }); }
    });
  }
  std::vector<std::uint32_t> next(producers, 0);
  std::size_t received = 0;
  while (received < std::size_t{producers} * per_producer) {
    item it{};
    if (!ring.try_pop(it)) {
      std::this_thread::yield();
      continue;
    }
    REQUIRE(it.producer < producers);
    REQUIRE(it.index == next[it.producer]);
    ++next[it.producer];
    ++received;
  }
  for (auto& th : pool) { th.join(); }
  item extra{};
  CHECK_FALSE(ring.try_pop(extra));
  CHECK_FALSE(ring.has_next());
  CHECK(ring.claimed() == ring.popped());
  for (auto n : next) { CHECK(n == per_producer); }
}

TEST_CASE("mpsc_ring: a capacity that is not a power of two is refused") {
  CHECK_THROWS_AS(mpsc_ring<int>(3), std::invalid_argument);
  CHECK_THROWS_AS(mpsc_ring<int>(1), std::invalid_argument);
  CHECK_THROWS_AS(mpsc_ring<int>(0), std::invalid_argument);
}
