// The coalescing core (detail::block_pool) and its address map, tested against simple
// reference models with random operation sequences: no overlap, alignment, blocks inside
// chunks, exact byte accounting, every structural invariant, full coalescing at the end,
// and the in-place growth operations (extend, withdraw, restore) the VMM upstream needs.
// Longer sweeps: MRSTACK_LONG_TESTS=1.
#include <catch2/catch.hpp>

#include <mrstack/detail/address_map.hpp>
#include <mrstack/detail/block_start_table.hpp>
#include <mrstack/detail/block_pool.hpp>

#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

using mrstack::detail::address_map;
using mrstack::detail::block_pool;
using mrstack::detail::owner_id;

namespace {

bool long_tests() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr; }

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// Live blocks of the model: address -> size, checked for overlap on every insert.
struct live_model {
  std::map<std::uintptr_t, std::size_t> blocks;
  std::size_t bytes = 0;

  void insert(std::uintptr_t a, std::size_t size) {
    auto next = blocks.lower_bound(a);
    if (next != blocks.end()) { REQUIRE(a + size <= next->first); }
    if (next != blocks.begin()) {
      auto prev = std::prev(next);
      REQUIRE(prev->first + prev->second <= a);
    }
    blocks.emplace(a, size);
    bytes += size;
  }
  std::pair<std::uintptr_t, std::size_t> erase_nth(std::size_t n) {
    auto it = std::next(blocks.begin(), static_cast<std::ptrdiff_t>(n));
    auto const result = *it;
    bytes -= it->second;
    blocks.erase(it);
    return result;
  }
};

/// Chunks of the model: base -> size.
struct chunk_model {
  std::map<std::uintptr_t, std::size_t> chunks;
  bool contains(std::uintptr_t a, std::size_t size) const {
    auto it = chunks.upper_bound(a);
    if (it == chunks.begin()) { return false; }
    --it;
    return a >= it->first && a + size <= it->first + it->second;
  }
};

std::size_t random_size(std::mt19937_64& rng, std::size_t max_large) {
  // Mostly small, some medium, a few large: the mix real programs make.
  std::uniform_int_distribution<int> kind{0, 9};
  int const k = kind(rng);
  std::size_t limit = k < 6 ? 16 * KiB : k < 9 ? 1 * MiB : max_large;
  std::uniform_int_distribution<std::size_t> d{1, limit / 256};
  return d(rng) * 256;
}

std::size_t random_alignment(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d{0, 15};
  int const k = d(rng);
  return k < 12 ? 256 : std::size_t{256} << (k - 11) * 2;  // 256, or 1 KiB .. 64 KiB
}

/// Largest size that a failed allocation may leave free: good fit only promises to
/// find a block when one exists in a size class above the request's.
std::size_t failure_bound(std::size_t size, std::size_t alignment) {
  std::size_t const need = size + alignment - 256;
  return need + need / 32 + 256;
}

void check_fully_coalesced(block_pool const& pool) {
  std::size_t free_blocks = 0;
  pool.for_each_free_block([&](std::uintptr_t, std::size_t, owner_id) { ++free_blocks; });
  CHECK(free_blocks == pool.chunk_count());
  pool.for_each_chunk([&](mrstack::detail::chunk_id, block_pool::chunk_info const& c) {
    CHECK(c.live_blocks == 0);
    bool whole = false;
    pool.for_each_free_block([&](std::uintptr_t a, std::size_t s, owner_id) { whole = whole || (a == c.base && s == c.size); });
    CHECK(whole);
  });
}

/// A key clustered like block addresses: one of a few regions, 256-byte granules.
std::uintptr_t block_like_address(std::mt19937_64& rng) {
  std::uniform_int_distribution<std::uintptr_t> granule{0, 1 << 14};
  std::uniform_int_distribution<int> region{0, 3};
  return std::uintptr_t{0x7f0000000000} + (std::uintptr_t(region(rng)) << 32) + granule(rng) * 256;
}
/// Insert (else erase) in the address-table model tests: the table grows to ~5,000 keys, then churns.
bool table_step_inserts(std::mt19937_64& rng, std::size_t live) {
  return live == 0 || (rng() % 100) < (live < 5000 ? 60U : 40U);
}

}  // namespace

TEST_CASE("address_map: random inserts and erases match std::unordered_map") {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng{seed};
    address_map map;
    std::unordered_map<std::uintptr_t, std::uint32_t> model;
    std::vector<std::uintptr_t> keys;
    for (int step = 0; step < 200000; ++step) {
      if (table_step_inserts(rng, keys.size())) {
        std::uintptr_t const key = block_like_address(rng);
        auto const value = static_cast<std::uint32_t>(rng());
        if (model.count(key) != 0) {
          REQUIRE(map.find(key) == model[key]);
          continue;
        }
        map.insert(key, value);
        model.emplace(key, value);
        keys.push_back(key);
      } else {
        std::size_t const i = rng() % keys.size();
        std::uintptr_t const key = keys[i];
        keys[i] = keys.back();
        keys.pop_back();
        REQUIRE(map.erase(key) == model[key]);
        model.erase(key);
        REQUIRE(map.find(key) == address_map::npos);
      }
      REQUIRE(map.size() == model.size());
      if (step % 1000 == 0) {
        for (auto const& [k, v] : model) { REQUIRE(map.find(k) == v); }
      }
    }
    CHECK(map.erase(0x1234500) == address_map::npos);
  }
}

TEST_CASE("block_start_table: random inserts and erases match std::unordered_map") {
  using mrstack::detail::block_start_table;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng{seed};
    block_start_table table;
    // The table stores only a tag: node i's address lives here, as a block node's does.
    std::vector<std::uintptr_t> address_of;
    std::vector<std::uint32_t> free_nodes;
    std::unordered_map<std::uintptr_t, std::uint32_t> model;
    std::vector<std::uintptr_t> keys;
    for (int step = 0; step < 200000; ++step) {
      if (table_step_inserts(rng, keys.size())) {
        std::uintptr_t const key = block_like_address(rng);
        if (model.count(key) != 0) { continue; }
        std::uint32_t node = 0;
        if (!free_nodes.empty()) {
          node = free_nodes.back();
          free_nodes.pop_back();
        } else {
          node = static_cast<std::uint32_t>(address_of.size());
          address_of.push_back(0);
        }
        address_of[node] = key;
        table.insert(key, node);
        model.emplace(key, node);
        keys.push_back(key);
      } else {
        std::size_t const i = rng() % keys.size();
        std::uintptr_t const key = keys[i];
        keys[i] = keys.back();
        keys.pop_back();
        auto starts_at = [&](std::uint32_t n) { return address_of[n] == key; };
        REQUIRE(table.erase(key, starts_at) == model[key]);
        free_nodes.push_back(model[key]);
        model.erase(key);
        REQUIRE(table.find(key, starts_at) == block_start_table::npos);
      }
      REQUIRE(table.size() == model.size());
      if (step % 1000 == 0) {
        for (auto const& entry : model) {  // not a structured binding: clang 14 cannot capture one
          std::uintptr_t const k = entry.first;
          REQUIRE(table.find(k, [&](std::uint32_t n) { return address_of[n] == k; }) == entry.second);
        }
      }
    }
  }
}

TEST_CASE("block_start_table: two addresses with the same tag are told apart by their nodes") {
  using mrstack::detail::block_start_table;
  // a * K and (a + d) * K differ by d * K = x (mod 2^64); with d = x * K^-1 and x small,
  // the high halves (the tags) agree. K^-1 mod 2^64 by Newton's iteration.
  constexpr std::uint64_t k = 0x9E3779B97F4A7C15ULL;
  std::uint64_t inverse = k;
  for (int i = 0; i < 6; ++i) { inverse *= 2 - k * inverse; }
  REQUIRE(k * inverse == 1);
  std::uintptr_t const a = 0x7f0000100000;
  std::uint64_t const low = static_cast<std::uint32_t>(a * k);  // keep the sum below the next 2^32
  std::uint64_t const x = low < 0x80000000ULL ? 0x1000 : ~low & 0x7fffffff;
  std::uintptr_t const b = a + x * inverse;
  REQUIRE(b != a);
  REQUIRE(((a * k) >> 32) == ((b * k) >> 32));  // really the same tag
  std::uintptr_t const address_of[2] = {a, b};
  auto at = [&](std::uintptr_t key) { return [&, key](std::uint32_t n) { return address_of[n] == key; }; };
  block_start_table table;
  table.insert(a, 0);
  table.insert(b, 1);
  CHECK(table.find(a, at(a)) == 0);
  CHECK(table.find(b, at(b)) == 1);
  CHECK(table.erase(a, at(a)) == 0);
  CHECK(table.find(a, at(a)) == block_start_table::npos);
  CHECK(table.find(b, at(b)) == 1);
  CHECK(table.erase(b, at(b)) == 1);
  CHECK(table.size() == 0);
}

TEST_CASE("block_pool: exact reuse, coalescing on both sides, alignment padding") {
  block_pool pool;
  std::uintptr_t const base = 0x100000000;
  pool.add_chunk(base, 1 * MiB, 1);
  std::uintptr_t const a = pool.allocate(4 * KiB, 256, 1);
  std::uintptr_t const b = pool.allocate(8 * KiB, 256, 1);
  std::uintptr_t const c = pool.allocate(4 * KiB, 256, 1);
  CHECK(a == base);
  CHECK(b == base + 4 * KiB);
  CHECK(c == base + 12 * KiB);
  CHECK(pool.deallocate(b, 1) == 8 * KiB);
  CHECK(pool.allocate(8 * KiB, 256, 1) == b);  // the freed block of exactly that size comes back
  CHECK(pool.deallocate(a, 1) == 4 * KiB);
  CHECK(pool.deallocate(c, 1) == 4 * KiB);
  CHECK(pool.deallocate(b, 1) == 8 * KiB);     // merges with a (before) and c + the tail (after)
  CHECK(pool.check_invariants() == "");
  check_fully_coalesced(pool);
  CHECK(pool.deallocate(b, 1) == 0);           // double free: not a live block
  CHECK(pool.deallocate(base + 256, 1) == 0);  // foreign pointer

  std::uintptr_t const small = pool.allocate(256, 256, 1);
  std::uintptr_t const aligned = pool.allocate(1 * KiB, 64 * KiB, 1);
  CHECK(aligned % (64 * KiB) == 0);
  CHECK(pool.free_bytes() == 1 * MiB - 256 - 1 * KiB);  // the padding went back to the free lists
  CHECK(pool.check_invariants() == "");
  pool.deallocate(small, 1);
  pool.deallocate(aligned, 1);
  check_fully_coalesced(pool);
}

TEST_CASE("block_pool: blocks of different owners never merge; synchronized blocks merge into either") {
  block_pool pool;
  std::uintptr_t const base = 0x200000000;
  pool.add_chunk(base, 64 * KiB, 1);
  std::uintptr_t const a = pool.allocate(16 * KiB, 256, 1);
  std::uintptr_t const b = pool.allocate(16 * KiB, 256, 1);
  std::uintptr_t const c = pool.allocate(32 * KiB, 256, 1);
  pool.deallocate(a, 1);
  pool.deallocate(b, 2);  // another stream: stays apart from a
  CHECK(pool.free_blocks(1) == 1);
  CHECK(pool.free_blocks(2) == 1);
  CHECK(pool.allocate(32 * KiB, 256, 1) == 0);  // neither owner alone has 32 KiB
  CHECK(pool.largest_free_block() == 16 * KiB);
  CHECK(pool.check_invariants() == "");
  pool.deallocate(c, block_pool::synchronized);  // merges into b's block, which keeps owner 2
  CHECK(pool.free_blocks(2) == 1);
  CHECK(pool.free_bytes(2) == 48 * KiB);
  pool.transfer(2, 1);  // owner 1 waited for owner 2: everything merges
  CHECK(pool.free_blocks(1) == 1);
  CHECK(pool.free_bytes(1) == 64 * KiB);
  CHECK(pool.check_invariants() == "");
  check_fully_coalesced(pool);

  // An exclusive owner (another thread's default stream) never absorbs synchronized memory.
  pool.transfer(1, block_pool::synchronized);
  pool.set_exclusive(5, true);
  std::uintptr_t const x = pool.allocate(16 * KiB, 256, block_pool::synchronized);
  pool.deallocate(x, 5);
  CHECK(pool.free_blocks(5) == 1);
  CHECK(pool.free_bytes(block_pool::synchronized) == 48 * KiB);
  CHECK(pool.check_invariants() == "");
  std::uintptr_t const y = pool.allocate(48 * KiB, 256, block_pool::synchronized);
  pool.deallocate(y, 5);  // both neighbours are its own: merges with them
  CHECK(pool.free_blocks(5) == 1);
  CHECK(pool.free_bytes(5) == 64 * KiB);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("block_pool: random allocate/free over several chunks matches the model") {
  int const seeds = long_tests() ? 64 : 6;
  int const steps = long_tests() ? 400000 : 100000;
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{static_cast<std::uint64_t>(seed)};
    block_pool pool;
    chunk_model chunks;
    for (int i = 0; i < 3; ++i) {
      std::size_t const size = (std::uniform_int_distribution<std::size_t>{1, 64 * MiB / 256}(rng)) * 256 + 8 * MiB;
      std::uintptr_t const base = 0x100000000000 + (std::uintptr_t(i) << 36) + 256 * (rng() % 1000);
      pool.add_chunk(base, size, 1);
      chunks.chunks.emplace(base, size);
    }
    live_model live;
    std::size_t failures = 0;
    for (int step = 0; step < steps; ++step) {
      bool const allocate = live.blocks.empty() || rng() % 100 < 55;
      if (allocate) {
        std::size_t const size = random_size(rng, 8 * MiB);
        std::size_t const alignment = random_alignment(rng);
        std::uintptr_t const a = pool.allocate(size, alignment, 1);
        if (a == 0) {
          ++failures;
          REQUIRE(pool.largest_free_block() < failure_bound(size, alignment));
          REQUIRE_FALSE(pool.can_allocate(size, alignment, 1));
        } else {
          REQUIRE(a % alignment == 0);
          REQUIRE(chunks.contains(a, size));
          REQUIRE(pool.live_size(a) == size);
          live.insert(a, size);
        }
      } else {
        auto const [a, size] = live.erase_nth(rng() % live.blocks.size());
        REQUIRE(pool.deallocate(a, 1) == size);
      }
      REQUIRE(pool.live_bytes() == live.bytes);
      REQUIRE(pool.live_blocks() == live.blocks.size());
      REQUIRE(pool.free_bytes() + pool.live_bytes() == pool.total_bytes());
      if (step % 97 == 0) { REQUIRE(pool.check_invariants() == ""); }
    }
    INFO("allocation failures: " << failures);
    while (!live.blocks.empty()) {
      auto const [a, size] = live.erase_nth(rng() % live.blocks.size());
      REQUIRE(pool.deallocate(a, 1) == size);
    }
    REQUIRE(pool.check_invariants() == "");
    check_fully_coalesced(pool);
  }
}

TEST_CASE("block_pool: random owners and transfers keep owners apart and account exactly") {
  int const seeds = long_tests() ? 32 : 4;
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{static_cast<std::uint64_t>(seed) * 7919};
    block_pool pool;
    chunk_model chunks;
    for (int i = 0; i < 2; ++i) {
      std::uintptr_t const base = 0x300000000000 + (std::uintptr_t(i) << 36);
      pool.add_chunk(base, 32 * MiB, static_cast<owner_id>(i));  // one synchronized chunk, one owned by 1
      chunks.chunks.emplace(base, 32 * MiB);
    }
    live_model live;
    for (int step = 0; step < 100000; ++step) {
      auto const owner = static_cast<owner_id>(1 + rng() % 3);
      if (live.blocks.empty() || rng() % 100 < 55) {
        std::size_t const size = random_size(rng, 4 * MiB);
        std::size_t const alignment = random_alignment(rng);
        std::uintptr_t a = pool.allocate(size, alignment, owner);
        if (a == 0) { a = pool.allocate(size, alignment, block_pool::synchronized); }
        if (a == 0) {
          // Take over another owner's memory (the pool resource would wait on an event first).
          for (owner_id other = 1; other <= 3 && a == 0; ++other) {
            if (other != owner && pool.can_allocate(size, alignment, other)) {
              pool.transfer(other, owner);
              a = pool.allocate(size, alignment, owner);
              // Good fit may still miss a block of the request's own class that the
              // transfer placed beyond the few it looks at; never a larger one.
              if (a == 0) { REQUIRE(pool.largest_free_block(owner) < failure_bound(size, alignment)); }
            }
          }
        }
        if (a != 0) {
          REQUIRE(a % alignment == 0);
          REQUIRE(chunks.contains(a, size));
          live.insert(a, size);
        }
      } else {
        auto const [a, size] = live.erase_nth(rng() % live.blocks.size());
        REQUIRE(pool.deallocate(a, owner) == size);
      }
      std::size_t per_owner = 0;
      for (owner_id o = 0; o <= 3; ++o) { per_owner += pool.free_bytes(o); }
      REQUIRE(per_owner == pool.free_bytes());
      REQUIRE(pool.live_bytes() == live.bytes);
      if (step % 101 == 0) {
        REQUIRE(pool.check_invariants() == "");
      }
    }
    while (!live.blocks.empty()) {
      auto const [a, size] = live.erase_nth(0);
      REQUIRE(pool.deallocate(a, static_cast<owner_id>(1 + rng() % 3)) == size);
      REQUIRE(pool.check_invariants() == "");
    }
    REQUIRE(pool.check_invariants() == "");
    pool.synchronize_all_owners();
    REQUIRE(pool.check_invariants() == "");
    check_fully_coalesced(pool);
    CHECK(pool.free_bytes(block_pool::synchronized) == pool.total_bytes());
  }
}

TEST_CASE("block_pool: chunks grow in place, free granules are withdrawn and restored") {
  int const seeds = long_tests() ? 32 : 4;
  constexpr std::size_t granule = 64 * KiB;
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{static_cast<std::uint64_t>(seed) * 104729};
    block_pool pool;
    // Reserve a large virtual range per chunk and grow into it, as a VMM upstream does.
    struct reserved {
      std::uintptr_t base;
      std::size_t mapped;
      mrstack::detail::chunk_id id;
    };
    std::vector<reserved> ranges;
    for (int i = 0; i < 2; ++i) {
      std::uintptr_t const base = 0x400000000000 + (std::uintptr_t(i) << 36);
      ranges.push_back({base, 4 * MiB, pool.add_chunk(base, 4 * MiB, 1)});
    }
    live_model live;   // live blocks and holes both occupy address space
    std::map<std::uintptr_t, std::size_t> holes;
    auto inside = [&](std::uintptr_t a, std::size_t size) {
      for (auto const& r : ranges) {
        if (a >= r.base && a + size <= r.base + r.mapped) { return true; }
      }
      return false;
    };
    for (int step = 0; step < 30000; ++step) {
      int const op = static_cast<int>(rng() % 100);
      if (op < 50 || live.blocks.empty()) {
        std::size_t const size = random_size(rng, 2 * MiB);
        std::uintptr_t const a = pool.allocate(size, 256, 1);
        if (a == 0) {
          auto& r = ranges[rng() % ranges.size()];
          std::size_t const grow = ((size + granule - 1) / granule + rng() % 8) * granule;
          pool.extend_chunk(r.id, grow, 1);
          r.mapped += grow;
        } else {
          REQUIRE(inside(a, size));
          for (auto const& [h, hs] : holes) { REQUIRE((a + size <= h || h + hs <= a)); }
          live.insert(a, size);
        }
      } else if (op < 90) {
        auto const [a, size] = live.erase_nth(rng() % live.blocks.size());
        REQUIRE(pool.deallocate(a, 1) == size);
      } else if (op < 95) {
        // Withdraw the whole granules inside free blocks (what unmapping them would do).
        std::size_t expected = 0;
        std::size_t const got = pool.withdraw_free_ranges([&](std::uintptr_t a, std::size_t size, owner_id) {
          std::uintptr_t const first = (a + granule - 1) / granule * granule;
          std::uintptr_t const last = (a + size) / granule * granule;
          if (last <= first || rng() % 2 == 0) { return block_pool::range{}; }
          holes.emplace(first, last - first);
          expected += last - first;
          return block_pool::range{first - a, last - first};
        });
        REQUIRE(got == expected);
      } else if (!holes.empty()) {
        auto it = std::next(holes.begin(), static_cast<std::ptrdiff_t>(rng() % holes.size()));
        if (it->second > granule && rng() % 2 == 0) {
          // Cut it in two (what a grow needing part of it does): both stay holes.
          std::size_t const at = (1 + rng() % (it->second / granule - 1)) * granule;
          REQUIRE(pool.split_hole(it->first, at) == at);
          holes.emplace(it->first + at, it->second - at);
          it->second = at;
        } else {
          REQUIRE(pool.restore(it->first, 1) == it->second);
          REQUIRE(pool.restore(it->first, 1) == 0);
          holes.erase(it);
        }
      }
      std::size_t hole_bytes = 0;
      for (auto const& h : holes) { hole_bytes += h.second; }
      REQUIRE(pool.withdrawn_bytes() == hole_bytes);
      REQUIRE(pool.live_bytes() == live.bytes);
      REQUIRE(pool.free_bytes() + pool.live_bytes() + pool.withdrawn_bytes() == pool.total_bytes());
      if (step % 53 == 0) { REQUIRE(pool.check_invariants() == ""); }
    }
    // A chunk with live blocks cannot be removed.
    if (!live.blocks.empty()) {
      auto const some = live.blocks.begin()->first;
      for (auto const& r : ranges) {
        if (some >= r.base && some < r.base + r.mapped) { CHECK_FALSE(pool.remove_chunk(r.id)); }
      }
    }
    while (!live.blocks.empty()) {
      auto const [a, size] = live.erase_nth(0);
      REQUIRE(pool.deallocate(a, 1) == size);
    }
    for (auto const& [h, size] : holes) { REQUIRE(pool.restore(h, 1) == size); }
    REQUIRE(pool.check_invariants() == "");
    check_fully_coalesced(pool);
    for (auto const& r : ranges) {
      auto const info = pool.chunk(r.id);
      CHECK(info.base == r.base);
      CHECK(info.size == r.mapped);
      CHECK(pool.remove_chunk(r.id));
    }
    CHECK(pool.total_bytes() == 0);
    CHECK(pool.chunk_count() == 0);
    CHECK(pool.check_invariants() == "");
  }
}

TEST_CASE("block_pool: a hole split in two stays two holes; a part of it is restored alone") {
  block_pool pool;
  std::uintptr_t const base = 0x400000000000;
  mrstack::detail::chunk_id const c = pool.add_chunk(base, 16 * KiB, 1);
  std::uintptr_t const a = pool.allocate(4 * KiB, 256, 1);
  REQUIRE(a == base);
  REQUIRE(pool.withdraw_free_ranges([](std::uintptr_t, std::size_t size, owner_id) {
    return size == 12 * KiB ? block_pool::range{0, 8 * KiB} : block_pool::range{};
  }) == 8 * KiB);  // the hole [4, 12) KiB, free [12, 16) KiB
  CHECK(pool.split_hole(base + 5 * KiB, 256) == 0);  // no hole starts there
  CHECK(pool.split_hole(a, 256) == 0);               // a live block is no hole
  CHECK_THROWS_AS(pool.split_hole(base + 4 * KiB, 8 * KiB), std::invalid_argument);  // not inside it
  CHECK_THROWS_AS(pool.split_hole(base + 4 * KiB, 100), std::invalid_argument);      // not granular
  REQUIRE(pool.split_hole(base + 4 * KiB, 3 * KiB) == 3 * KiB);
  CHECK(pool.withdrawn_blocks() == 2);
  CHECK(pool.withdrawn_bytes() == 8 * KiB);
  CHECK(pool.chunk(c).withdrawn_blocks == 2);
  CHECK(pool.check_invariants() == "");
  REQUIRE(pool.restore(base + 4 * KiB, 1) == 3 * KiB);  // the first part alone
  CHECK(pool.free_bytes() == 3 * KiB + 4 * KiB);        // the rest is no free memory
  CHECK(pool.withdrawn_bytes() == 5 * KiB);
  CHECK(pool.check_invariants() == "");
  REQUIRE(pool.restore(base + 7 * KiB, 1) == 5 * KiB);
  CHECK(pool.deallocate(a, 1) == 4 * KiB);
  CHECK(pool.free_block_count() == 1);  // all merged again
  CHECK(pool.remove_chunk(c));
}
