// The coalescing core (detail::block_pool) when host memory runs out: its class arrays
// grow by doubling, and a call that needs one to grow when operator new fails must
// throw std::bad_alloc with every block still indexed exactly once — a free refused
// whole (the block still live, nothing changed), a transfer block by block.
#include <catch2/catch.hpp>

#include <mrstack/detail/block_pool.hpp>

#include <host_allocation_failure.hpp>

#include <cstdlib>
#include <iterator>
#include <map>
#include <new>
#include <random>

using mrstack::detail::block_pool;
using mrstack::detail::owner_id;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// Runs `call` with operator new failing when `armed`; true when it threw std::bad_alloc.
template <typename Call>
bool refused_for_host_memory(bool armed, Call&& call) {
  mrstack::test::fail_host_allocations_from = armed ? 1 : 0;
  try {
    call();
  } catch (std::bad_alloc const&) {
    mrstack::test::fail_host_allocations_from = 0;
    return true;
  }
  mrstack::test::fail_host_allocations_from = 0;
  return false;
}

struct pool_totals {
  std::size_t live, free, live_blocks;
  bool operator==(pool_totals const&) const = default;
};
pool_totals totals(block_pool const& pool) {
  return {pool.live_bytes(), pool.free_bytes(), pool.live_blocks()};
}

}  // namespace

TEST_CASE("block_pool: when a class array cannot grow, a free is refused whole and transfers stay indexed") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  std::size_t refused_frees = 0;
  std::size_t refused_transfers = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{static_cast<std::uint64_t>(seed) * 104729};
    block_pool pool;
    for (int i = 0; i < 3; ++i) {
      pool.add_chunk(0x300000000000 + (std::uintptr_t(i) << 36), 64 * MiB, static_cast<owner_id>(i));
    }
    std::map<std::uintptr_t, std::size_t> live;
    for (int step = 0; step < 20000; ++step) {
      CAPTURE(step);
      auto const owner = static_cast<owner_id>(1 + rng() % 3);
      bool const armed = rng() % 4 == 0;
      unsigned const op = rng() % 100;
      if (live.empty() || op < 50) {
        std::size_t const size = (1 + rng() % 64) * 256 * (rng() % 8 == 0 ? 64 : 1);
        std::uintptr_t a = 0;
        pool_totals const before = totals(pool);
        if (refused_for_host_memory(armed, [&] { a = pool.allocate(size, 256, owner); })) {
          REQUIRE(totals(pool) == before);
        } else if (a != 0) {
          live.emplace(a, size);
        }
      } else if (op < 95) {
        auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
        pool_totals const before = totals(pool);
        std::size_t freed = 0;
        if (refused_for_host_memory(armed, [&] { freed = pool.deallocate(it->first, owner); })) {
          ++refused_frees;
          // It had left the block freed but in no class array, its bytes uncounted.
          REQUIRE(pool.check_invariants() == "");
          REQUIRE(totals(pool) == before);
          REQUIRE(pool.live_size(it->first) == it->second);
        } else {
          REQUIRE(freed == it->second);
          live.erase(it);
        }
      } else {
        auto const from = static_cast<owner_id>(rng() % 4);
        pool_totals const before = totals(pool);
        if (refused_for_host_memory(armed, [&] { pool.transfer(from, owner); })) { ++refused_transfers; }
        REQUIRE(totals(pool) == before);
      }
      if (armed || step % 97 == 0) { REQUIRE(pool.check_invariants() == ""); }
    }
    for (auto const& [address, size] : live) { REQUIRE(pool.deallocate(address, 1) == size); }
    pool.synchronize_all_owners();
    REQUIRE(pool.check_invariants() == "");
    REQUIRE(pool.free_bytes(block_pool::synchronized) == pool.total_bytes());
  }
  // The sequences do reach a full class array while operator new fails.
  CHECK(refused_frees > 0);
  CHECK(refused_transfers > 0);
}
