// detail::live_block_table against a std::set of (address, device): random inserts, erases
// and look-ups over addresses that share a hash (the low 8 bits are not hashed), that are
// live on two devices at once, whose probe runs wrap around the table's end, and over
// enough blocks to grow the table many times; and a block a refused free took out goes
// back without host memory, however full other threads made the table meanwhile; and a
// block handed out again at a freed block's address is told from it by its generation.
#include <catch2/catch.hpp>

#include <mrstack/detail/live_block_table.hpp>

#include "host_allocation_failure.hpp"

#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <utility>
#include <vector>

using mrstack::detail::live_block;
using mrstack::detail::live_block_table;

namespace {

using key = std::pair<std::uintptr_t, int>;

void* as_ptr(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

/// Every slot holds a block of the model, found where it is, and every block of the model
/// is found; the table is a power of two at most half full.
void check_whole(live_block_table const& table, std::set<key> const& model) {
  REQUIRE(table.size() == model.size());
  REQUIRE(2 * table.size() <= table.capacity());
  REQUIRE((table.capacity() & (table.capacity() - 1)) == 0);
  std::size_t occupied = 0;
  for (std::size_t i = 0; i < table.capacity(); ++i) {
    live_block const& b = table[i];
    if (b.ptr == nullptr) { continue; }
    ++occupied;
    REQUIRE(model.count(key{reinterpret_cast<std::uintptr_t>(b.ptr), b.device}) == 1);
    REQUIRE(table.find(b.ptr, b.device) == i);
  }
  REQUIRE(occupied == model.size());
  for (auto const& [address, device] : model) { REQUIRE(table.find(as_ptr(address), device) != live_block_table::npos); }
}

std::size_t model_count(std::set<key> const& model, std::uintptr_t address) {
  auto const first = model.lower_bound(key{address, -1});
  auto const last = model.lower_bound(key{address + 1, -1});
  return static_cast<std::size_t>(std::distance(first, last));
}

}  // namespace

TEST_CASE("live_block_table: agrees with a set of (address, device) over random operations") {
  std::uint64_t const seed = GENERATE(1, 2, 3, 4, 5);
  std::size_t const blocks = GENERATE(std::size_t{40}, std::size_t{3000});
  INFO("seed " << seed << ", up to " << blocks << " blocks");
  std::mt19937_64 rng{seed};
  live_block_table table;
  std::set<key> model;
  std::uintptr_t const base = std::uintptr_t{0x7f00'0000'0000};
  auto address = [&]() -> std::uintptr_t {
    switch (rng() % 4) {
      case 0: return base + (rng() % 16) * 256 + rng() % 256;  // one hash for 256 addresses: one home
      case 1:  // a probe run from the table's last slots wraps around to its first
        if (table.capacity() != 0) {
          for (int tries = 0; tries < 4096; ++tries) {
            std::uintptr_t const a = base + (1 + rng() % (1u << 24)) * 256;
            if (table.home(as_ptr(a)) + 2 >= table.capacity()) { return a; }
          }
        }
        [[fallthrough]];
      default: return base + (1 + rng() % (blocks * 4)) * 256;
    }
  };
  for (int step = 0; step < 60000; ++step) {
    std::uintptr_t const a = address();
    int const device = static_cast<int>(rng() % 2);  // simulated stacks of two devices share addresses
    bool const live = model.count(key{a, device}) == 1;
    switch (rng() % 5) {
      case 0:
      case 1:
        if (!live && model.size() < blocks) {
          table.insert(live_block{as_ptr(a), device});
          model.insert(key{a, device});
        }
        break;
      case 2: {  // erase a block of the model (a random one: the look-up address is mostly not live)
        if (model.empty()) { break; }
        auto it = model.lower_bound(key{a, device});
        if (it == model.end()) { it = model.begin(); }
        std::size_t const slot = table.find(as_ptr(it->first), it->second);
        REQUIRE(slot != live_block_table::npos);
        table.erase(slot);
        model.erase(it);
        REQUIRE(table.find(as_ptr(a), device) == (model.count(key{a, device}) ? table.find(as_ptr(a), device)
                                                                               : live_block_table::npos));
        break;
      }
      default: {
        std::size_t const slot = table.find(as_ptr(a), device);
        REQUIRE((slot != live_block_table::npos) == live);
        if (live) { REQUIRE((table[slot].ptr == as_ptr(a) && table[slot].device == device)); }
        REQUIRE(table.count(as_ptr(a)) == model_count(model, a));
        REQUIRE((table.find(as_ptr(a), -1) != live_block_table::npos) == (model_count(model, a) != 0));
      }
    }
    REQUIRE(table.size() == model.size());
    if (step % 997 == 0) { check_whole(table, model); }
  }
  check_whole(table, model);
  while (!model.empty()) {  // emptied again, every erase finding what is left
    auto it = model.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % model.size()));
    table.erase(table.find(as_ptr(it->first), it->second));
    model.erase(it);
    if (model.size() % 64 == 0) { check_whole(table, model); }
  }
  REQUIRE(table.size() == 0);
}

TEST_CASE("live_block_table: an empty table finds nothing and counts nothing") {
  live_block_table table;
  REQUIRE(table.find(as_ptr(0x1000), 0) == live_block_table::npos);
  REQUIRE(table.find(as_ptr(0x1000), -1) == live_block_table::npos);
  REQUIRE(table.count(as_ptr(0x1000)) == 0);
  REQUIRE(table.capacity() == 0);
}

TEST_CASE("live_block_table: a block taken out goes back without host memory, the table refilled meanwhile") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  std::size_t const taken = GENERATE(std::size_t{1}, std::size_t{8}, std::size_t{31});
  INFO(taken << " frees refused at once");
  live_block_table table;
  std::set<key> model;
  std::uintptr_t next = 0x7f00'0000'0000;
  auto add = [&] {
    next += 256;
    table.insert(live_block{as_ptr(next), 0});
    model.insert(key{next, 0});
  };
  while (2 * (table.size() + 1) <= 64) { add(); }  // half full: the next insert would grow
  REQUIRE(table.capacity() == 64);
  // `taken` frees take their blocks out; other threads' allocations fill the room again.
  std::vector<live_block> out;
  for (std::size_t i = 0; i < taken; ++i) {
    auto it = model.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(i * 3 % model.size()));
    std::size_t const slot = table.find(as_ptr(it->first), 0);
    out.push_back(table[slot]);
    table.erase(slot);
    model.erase(it);
  }
  for (std::size_t i = 0; i < taken; ++i) { add(); }
  REQUIRE(table.capacity() == 64);
  // The frees are refused: their blocks go back, with no host memory to be had.
  mrstack::test::fail_host_allocations_from = 1;
  bool threw = false;
  try {
    for (live_block const& b : out) { table.put_back(b); }
  } catch (std::bad_alloc const&) {
    threw = true;
  }
  mrstack::test::fail_host_allocations_from = 0;
  REQUIRE_FALSE(threw);
  for (live_block const& b : out) { model.insert(key{reinterpret_cast<std::uintptr_t>(b.ptr), b.device}); }
  REQUIRE(table.size() == model.size());
  for (auto const& [address, device] : model) { REQUIRE(table.find(as_ptr(address), device) != live_block_table::npos); }
  // Over half full until the next insert, which grows it back under half.
  add();
  check_whole(table, model);
  REQUIRE(table.capacity() == 128);
}

TEST_CASE("live_block_table: a pool's addresses probe as short as random ones") {
  // A pool hands out blocks one after another; here sizes of 512 B to 16 KiB in turn. The
  // books split them over 64 shards by the hash's top bits and probe from the next ones:
  // with one multiply for a hash, addresses a Fibonacci number of 256-byte steps apart
  // landed a few slots apart in one shard, and blocks sat 2.3 slots from home on average.
  std::vector<live_block_table> shards(std::size_t{1} << live_block_table::shard_bits);
  auto shard_of = [&](void* p) -> live_block_table& {
    return shards[live_block_table::hash(p) >> (64 - live_block_table::shard_bits)];
  };
  std::vector<void*> blocks;
  std::uintptr_t next = 0x7e00'0000'0000;
  for (int i = 0; i < 10000; ++i) {
    blocks.push_back(as_ptr(next));
    next += std::uintptr_t{512} << (i % 6);
  }
  for (void* p : blocks) { shard_of(p).insert(live_block{p, 0}); }
  double displacement = 0;
  for (void* p : blocks) {
    live_block_table& table = shard_of(p);
    displacement += static_cast<double>((table.find(p, 0) - table.home(p)) & (table.capacity() - 1));
  }
  displacement /= static_cast<double>(blocks.size());
  INFO("average slots from home: " << displacement);
  CHECK(displacement < 0.5);  // random addresses: about 0.2 at these loads
}

TEST_CASE("live_block_table: a block at a freed block's address has another generation") {
  live_block_table table;
  void* const p = as_ptr(0x7d00'0000'0000);
  std::uint32_t const first = table.insert(live_block{p, 0, 12345});  // the caller's generation is ignored
  REQUIRE(first != 12345);
  REQUIRE(table[table.find(p, 0)].generation == first);
  std::uint32_t const other_device = table.insert(live_block{p, 1});
  CHECK(other_device != first);
  // Freed, and another block handed out at the same address on the same device.
  table.erase(table.find(p, 0));
  std::uint32_t const second = table.insert(live_block{p, 0});
  CHECK(second != first);
  CHECK(table[table.find(p, 0)].generation == second);
  // A refused free puts its block back as it was: the same block, the same generation.
  std::size_t const slot = table.find(p, 0);
  live_block const taken = table[slot];
  table.erase(slot);
  table.put_back(taken);
  CHECK(table[table.find(p, 0)].generation == second);
  // Growing the table moves the entries whole.
  std::uintptr_t next = 0x7c00'0000'0000;
  for (int i = 0; i < 200; ++i) { table.insert(live_block{as_ptr(next += 256), 0}); }
  REQUIRE(table.capacity() > 64);
  CHECK(table[table.find(p, 0)].generation == second);
  CHECK(table[table.find(p, 1)].generation == other_device);
}
