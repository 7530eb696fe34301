// detail::pointer_map against std::unordered_map: random inserts, finds and erases over
// keys crowded into few slots (long probe runs, wrap-around, backward-shift deletion).
#include <catch2/catch.hpp>

#include <mrstack/detail/pointer_map.hpp>

#include <random>
#include <unordered_map>

using mrstack::detail::pointer_map;

TEST_CASE("pointer_map: agrees with a reference map over random operations") {
  std::uint64_t const seed = GENERATE(1, 2, 3, 4);
  std::size_t const key_space = GENERATE(std::size_t{50}, std::size_t{5000});
  INFO("seed " << seed << " key space " << key_space);
  std::mt19937_64 rng{seed};
  pointer_map<std::uint64_t> map;
  std::unordered_map<std::uintptr_t, std::uint64_t> model;
  auto key = [&] { return (1 + rng() % key_space) * 256; };
  for (int i = 0; i < 200000; ++i) {
    auto const k = key();
    switch (rng() % 4) {
      case 0:
      case 1: {
        std::uint64_t const v = rng();
        bool const fresh = model.emplace(k, v).second;
        REQUIRE(map.insert(k, v) == fresh);
        break;
      }
      case 2: {
        REQUIRE(map.erase(k) == (model.erase(k) == 1));
        break;
      }
      default: {
        auto const* got = map.find(k);
        auto it = model.find(k);
        REQUIRE((got != nullptr) == (it != model.end()));
        if (got != nullptr) { REQUIRE(*got == it->second); }
      }
    }
    REQUIRE(map.size() == model.size());
  }
  // Every entry is reachable, and for_each visits exactly the model.
  std::size_t visited = 0;
  map.for_each([&](std::uintptr_t k, std::uint64_t v) {
    ++visited;
    REQUIRE(model.at(k) == v);
  });
  CHECK(visited == model.size());
  for (auto const& [k, v] : model) {
    REQUIRE(map.find(k) != nullptr);
    REQUIRE(map.erase(k));
  }
  CHECK(map.empty());
  CHECK(map.find(256) == nullptr);
}

TEST_CASE("pointer_map: an empty map answers without allocating; values update in place") {
  pointer_map<int> map;
  CHECK(map.find(0x1000) == nullptr);
  CHECK_FALSE(map.erase(0x1000));
  CHECK(map.insert(0x1000, 7));
  CHECK_FALSE(map.insert(0x1000, 8));  // no overwrite
  CHECK(*map.find(0x1000) == 7);
  *map.find(0x1000) = 9;
  CHECK(*map.find(0x1000) == 9);
}

TEST_CASE("pointer_map: a room kept by erase_keeping_room is not used up by other inserts") {
  pointer_map<int> map;
  for (int i = 1; i <= 32; ++i) { REQUIRE(map.insert(std::uintptr_t(i) * 256, i)); }
  REQUIRE(map.capacity() == 64);  // 32 entries: as many as 64 slots hold at load 1/2
  REQUIRE(map.erase_keeping_room(256));
  CHECK(map.find(256) == nullptr);
  CHECK(map.size() == 31);
  CHECK(map.insert(100 * 256, 100));  // the kept room counts: this insert grows the table
  CHECK(map.capacity() == 128);
  CHECK(map.put_back(256, 1));  // into the kept room
  CHECK(map.capacity() == 128);
  CHECK(*map.find(256) == 1);
  CHECK(map.size() == 33);
  REQUIRE(map.erase_keeping_room(512));
  map.give_up_room();  // gone for good
  CHECK(map.find(512) == nullptr);
  CHECK(map.size() == 32);
  // Once given up, the room is free again: 64 entries fit 128 slots.
  for (int i = 200; i < 232; ++i) { REQUIRE(map.insert(std::uintptr_t(i) * 256, i)); }
  CHECK(map.size() == 64);
  CHECK(map.capacity() == 128);
  CHECK_FALSE(map.erase_keeping_room(512));  // not there: nothing kept
}
