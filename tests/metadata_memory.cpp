// Metadata memory (detail/metadata_memory.hpp): heap blocks below 1 MiB, 2 MiB-aligned
// mappings from 1 MiB up, and the two structures placed in it — a block pool big enough
// that its nodes come from huge-page regions, and an address table big enough to be mapped.
#include <catch2/catch.hpp>

#include <address_space.hpp>

#include <mrstack/detail/block_pool.hpp>
#include <mrstack/detail/block_start_table.hpp>
#include <mrstack/detail/metadata_memory.hpp>


#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace mrstack::detail;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

bool aligned_to(void const* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

/// Writes a pattern over [p, p + bytes) and reads it back.
bool round_trips(void* p, std::size_t bytes) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; i += 4093) { b[i] = static_cast<unsigned char>(i * 7); }
  b[bytes - 1] = 0xA5;
  for (std::size_t i = 0; i < bytes; i += 4093) {
    if (b[i] != static_cast<unsigned char>(i * 7) && i != bytes - 1) { return false; }
  }
  return b[bytes - 1] == 0xA5;
}
}  // namespace

TEST_CASE("metadata memory: small requests come from the heap, large ones are 2 MiB-aligned mappings") {
  for (std::size_t bytes : {std::size_t{64}, 32 * KiB, huge_page_threshold - 64, huge_page_threshold,
                            huge_page_size, huge_page_size + 4096, 5 * huge_page_size}) {
    CAPTURE(bytes);
    void* p = allocate_metadata(bytes);
    REQUIRE(p != nullptr);
    CHECK(aligned_to(p, 64));
    if (bytes >= huge_page_threshold) { CHECK(aligned_to(p, huge_page_size)); }
    CHECK(round_trips(p, bytes));
    deallocate_metadata(p, bytes);
  }
  deallocate_metadata(nullptr, 5 * huge_page_size);  // a no-op, like delete of null
}

TEST_CASE("metadata memory: an impossible size is std::bad_alloc, not a crash") {
  CHECK_THROWS_AS(allocate_metadata(~std::size_t{0} - 4096), std::bad_alloc);
  CHECK_THROWS_AS(allocate_metadata(std::size_t{1} << 62), std::bad_alloc);
}

TEST_CASE("metadata_array: moves hand over ownership exactly once") {
  metadata_array<std::uint64_t> a{huge_page_size / 8};
  std::uint64_t* const data = a.data();
  std::fill_n(data, a.size(), 7);
  metadata_array<std::uint64_t> b{std::move(a)};
  CHECK(a.data() == nullptr);
  CHECK(a.size() == 0);
  CHECK(b.data() == data);
  CHECK(b[b.size() - 1] == 7);
  metadata_array<std::uint64_t> c{16};
  c = std::move(b);  // c's own 16 entries are returned, b's move in
  CHECK(c.data() == data);
  CHECK(b.data() == nullptr);
}

TEST_CASE("block_start_table: grown past 1 MiB of slots (a mapped table), every entry is still found") {
  block_start_table table;
  std::vector<std::uintptr_t> addresses;
  std::mt19937_64 rng{42};
  for (std::uint32_t i = 0; i < 200000; ++i) {  // 2^19 slots of 8 bytes: 4 MiB
    std::uintptr_t const a = (rng() & 0x0000'7fff'ffff'ff00ULL) | 0x100;
    addresses.push_back(a);
    table.insert(a, i);
  }
  std::vector<std::uintptr_t> const& addr = addresses;
  for (std::uint32_t i = 0; i < addresses.size(); i += 7) {
    CHECK(table.find(addresses[i], [&](std::uint32_t n) { return addr[n] == addresses[i]; }) == i);
  }
  for (std::uint32_t i = 0; i < addresses.size(); i += 2) {
    REQUIRE(table.erase(addresses[i], [&](std::uint32_t n) { return addr[n] == addresses[i]; }) == i);
  }
  CHECK(table.size() == addresses.size() / 2);
  for (std::uint32_t i = 1; i < addresses.size(); i += 2) {
    CHECK(table.find(addresses[i], [&](std::uint32_t n) { return addr[n] == addresses[i]; }) == i);
  }
}

TEST_CASE("block_pool: 150,000 blocks (nodes from huge-page regions) split, free and coalesce exactly") {
  block_pool pool;
  std::uintptr_t const base = 0x7000'0000'0000ULL;
  std::size_t const blocks = 150000;  // > 16 heap pages + 2 regions of 65,536 nodes
  pool.add_chunk(base, blocks * 2 * block_pool::granularity, block_pool::synchronized);
  std::vector<std::uintptr_t> live;
  for (std::size_t i = 0; i < blocks; ++i) {
    std::uintptr_t const a = pool.allocate(block_pool::granularity, block_pool::granularity, block_pool::synchronized);
    REQUIRE(a == base + i * block_pool::granularity);  // the front of the one free block, in order
    live.push_back(a);
  }
  CHECK(pool.live_blocks() == blocks);
  // Free every other block: 75,000 free holes that must not merge with live neighbours.
  for (std::size_t i = 0; i < blocks; i += 2) { REQUIRE(pool.deallocate(live[i], block_pool::synchronized) != 0); }
  CHECK(pool.free_block_count() == blocks / 2 + 1);
  CHECK(pool.check_invariants() == "");
  std::mt19937_64 rng{7};
  std::vector<std::uintptr_t> rest;
  for (std::size_t i = 1; i < blocks; i += 2) { rest.push_back(live[i]); }
  std::shuffle(rest.begin(), rest.end(), rng);
  for (std::uintptr_t a : rest) { REQUIRE(pool.deallocate(a, block_pool::synchronized) == block_pool::granularity); }
  CHECK(pool.live_blocks() == 0);
  CHECK(pool.free_block_count() == 1);  // everything merged back into the one chunk
  CHECK(pool.largest_free_block() == blocks * 2 * block_pool::granularity);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("metadata_reservation: commits grow from the start, zeroed, without moving what is there") {
  metadata_reservation space{64 * MiB, 4 * MiB};
  REQUIRE(space.data() != nullptr);
  CHECK(aligned_to(space.data(), huge_page_size));
  CHECK(space.reserved_bytes() == 64 * MiB);
  CHECK(space.committed_bytes() == 0);
  auto* const bytes = static_cast<unsigned char*>(space.data());
  space.commit(100);
  CHECK(space.committed_bytes() == 64 * KiB);  // the first step
  bytes[100] = 42;
  std::size_t last = space.committed_bytes();
  for (std::size_t want : {65 * KiB, 300 * KiB, 2 * MiB, 2 * MiB + 1, 9 * MiB, 64 * MiB}) {
    space.commit(want);
    CAPTURE(want);
    CHECK(space.committed_bytes() >= want);
    CHECK(space.committed_bytes() >= last);
    if (want > huge_page_size) { CHECK(space.committed_bytes() % huge_page_size == 0); }
    CHECK(bytes[space.committed_bytes() - 1] == 0);  // fresh memory is zeroed
    bytes[space.committed_bytes() - 1] = 1;
    last = space.committed_bytes();
  }
  CHECK(space.data() == bytes);
  CHECK(bytes[100] == 42);  // nothing moved
  space.commit(10);         // already committed: no change
  CHECK(space.committed_bytes() == 64 * MiB);
  CHECK_THROWS_AS(space.commit(64 * MiB + 1), std::bad_alloc);
}

TEST_CASE("metadata_reservation: under an address-space limit it reserves less, in whole huge pages") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("skipped: sanitizers reserve terabytes of shadow memory, so no address-space limit can be set");
  return;
#else
  // 7 MiB of room. A 1.5 TiB request halves through 3 x 2^k sizes: 6 MiB (8 MiB with the
  // alignment slack) does not fit, 3 MiB would, but is not a whole number of huge pages,
  // which commit() rounds up to; so the reservation must be 2 MiB, and all of it commit.
  int const status = mrstack::test::exit_status_under_address_limit(7 * MiB, [] { return 0; }, [](int) {
    metadata_reservation space{std::size_t{3} << 39, 2 * MiB};
    std::size_t const got = space.reserved_bytes();
    if (got < 2 * MiB || got > 6 * MiB) { return 11; }
    if (got % huge_page_size != 0) { return 12; }
    space.commit(got);
    if (space.committed_bytes() != got) { return 13; }
    static_cast<unsigned char*>(space.data())[got - 1] = 1;
    try {
      metadata_reservation too_big{std::size_t{1} << 40, 64 * MiB};  // cannot get 64 MiB
      return 14;
    } catch (std::bad_alloc const&) {
    }
    return 0;
  });
  CHECK(status == 0);
#endif
}

TEST_CASE("block_pool: past the blocks its node space holds, a call is refused with the count and changes nothing") {
  block_pool pool{65536};  // 2 MiB of nodes: exactly 65,536
  std::uintptr_t const base = 0x7000'0000'0000ULL;
  pool.add_chunk(base, 70000 * block_pool::granularity, block_pool::synchronized);  // node 1
  for (std::size_t i = 0; i < 65535; ++i) {  // each split takes a node: 65,536 in all
    REQUIRE(pool.allocate(block_pool::granularity, block_pool::granularity, block_pool::synchronized) != 0);
  }
  try {
    (void)pool.allocate(block_pool::granularity, block_pool::granularity, block_pool::synchronized);
    FAIL("the 65,537th block was not refused");
  } catch (std::length_error const& e) {
    CHECK_THAT(e.what(), Catch::Contains("more than 65536 blocks"));
  }
  CHECK(pool.live_blocks() == 65535);
  CHECK(pool.check_invariants() == "");
  // The whole rest still comes out as one block: no new node needed.
  CHECK(pool.allocate((70000 - 65535) * block_pool::granularity, block_pool::granularity, block_pool::synchronized) != 0);
  CHECK(pool.free_block_count() == 0);
  // A freed block of that size is taken whole (no split, so no new node): served again.
  REQUIRE(pool.deallocate(base, block_pool::synchronized) == block_pool::granularity);
  CHECK(pool.allocate(block_pool::granularity, block_pool::granularity, block_pool::synchronized) == base);
  CHECK(pool.check_invariants() == "");
}

namespace {
/// A pool of 65,536 nodes with one 1 GiB chunk cut into 256 B blocks until the nodes run
/// out: its rest is one free block, and a call that must split it is refused.
std::uintptr_t fill_to_node_limit(block_pool& pool, std::uintptr_t base) {
  pool.add_chunk(base, std::size_t{1} << 30, 1);
  std::uintptr_t end = base;
  try {
    for (;;) { end = pool.allocate(block_pool::granularity, block_pool::granularity, 1) + block_pool::granularity; }
  } catch (std::length_error const&) {
  }
  return end;  // where the free rest starts
}
}  // namespace

TEST_CASE("block_pool: at the node limit an aligned block that needs splits off both sides is refused whole") {
  block_pool pool{65536};
  std::uintptr_t const base = std::uintptr_t{1} << 40;
  std::uintptr_t const rest = fill_to_node_limit(pool, base);
  std::size_t const free = pool.free_bytes();
  REQUIRE(pool.free_block_count() == 1);
  // An alignment the rest's start misses: the block needs a lead and a tail (two nodes).
  std::size_t const alignment = rest % 512 != 0 ? 512 : 1024;
  CHECK_THROWS_AS(pool.allocate(block_pool::granularity, alignment, 1), std::length_error);
  // The free block had left its index before the split threw: lost, 1 GiB of it.
  CHECK(pool.check_invariants() == "");
  CHECK(pool.free_bytes() == free);
  CHECK(pool.free_block_count() == 1);
  CHECK(pool.largest_free_block(1) == free);
  // Taken whole (no node needed), it is served.
  CHECK(pool.allocate(free, block_pool::granularity, 1) == rest);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("block_pool: at the node limit a hole that needs splits is refused whole") {
  block_pool pool{65536};
  std::uintptr_t const rest = fill_to_node_limit(pool, std::uintptr_t{1} << 40);
  std::size_t const free = pool.free_bytes();
  auto carve_middle = [&](std::uintptr_t, std::size_t size, owner_id) {
    return block_pool::range{block_pool::granularity, size - 2 * block_pool::granularity};
  };
  CHECK_THROWS_AS(pool.withdraw_free_ranges(carve_middle), std::length_error);
  CHECK(pool.check_invariants() == "");
  CHECK(pool.free_bytes() == free);
  CHECK(pool.withdrawn_bytes() == 0);
  CHECK(pool.allocate(free, block_pool::granularity, 1) == rest);
}

TEST_CASE("block_pool: when the address table cannot grow, the allocation is refused and changes nothing") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("skipped: sanitizers reserve terabytes of shadow memory, so no address-space limit can be set");
  return;
#else
  // The nodes are reserved up front (inside the limit); the address table doubles in new
  // mappings, and one of them is refused. Every block is the front of the one free block,
  // so no class array grows: the table is what fails.
  auto setup = [] {
    auto pool = std::make_unique<block_pool>(std::size_t{1} << 20);
    pool->add_chunk(std::uintptr_t{1} << 40, std::size_t{1} << 30, 1);
    return pool;
  };
  int const status = mrstack::test::exit_status_under_address_limit(8 * MiB, setup, [](std::unique_ptr<block_pool>& pool) {
    std::size_t live = 0;
    try {
      for (;; ++live) { (void)pool->allocate(block_pool::granularity, block_pool::granularity, 1); }
    } catch (std::bad_alloc const&) {
    }
    // A block had been linked as live with no address-table entry.
    if (live == 0 || !pool->check_invariants().empty()) { return 12; }
    if (pool->live_blocks() != live || pool->live_bytes() != live * block_pool::granularity) { return 13; }
    if (pool->free_bytes() + pool->live_bytes() != pool->total_bytes()) { return 14; }
    return 0;
  });
  CHECK(status == 0);
#endif
}
