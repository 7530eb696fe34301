// emm::adapter on the CPU: tokens, exactly-once finalizers, reset, deferred cleanup,
// memory info, the IPC refusal for host memory, thread safety, and a randomized model test
// against a reference map. The upstreams are `simulated` (checks every free) and `system`.
#include <catch2/catch.hpp>

#include <mrstack/emm/adapter.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/virtual_range.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <caching_resource.hpp>

#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace mrstack;
using emm::adapter;
using mrstack::test::caching_resource;

namespace {

std::uint32_t slot_of(std::uint64_t token) { return static_cast<std::uint32_t>(token & 0xffffffffU); }

}  // namespace

TEST_CASE("emm adapter: interface version, initialize is idempotent, bad construction is refused") {
  STATIC_REQUIRE(adapter::interface_version() == 1);
  adapter a{std::make_shared<system_memory_resource>()};
  CHECK_FALSE(a.initialized());
  a.initialize();
  a.initialize();
  CHECK(a.initialized());
  CHECK(a.outstanding_count() == 0);
  CHECK_THROWS_WITH(adapter{nullptr}, Catch::Contains("null"));
  adapter::options bad;
  bad.device = -2;
  CHECK_THROWS_WITH((adapter{std::make_shared<system_memory_resource>(), bad}), Catch::Contains("-2"));
}

TEST_CASE("emm adapter: memalloc hands out usable memory with a unique nonzero token; free returns it exactly once") {
  auto sim = std::make_shared<simulated_memory_resource>();
  adapter::options opts;
  opts.device = 3;
  adapter a{sim, opts};
  auto m = a.memalloc(1000, 7);
  CHECK(m.ptr != nullptr);
  CHECK(m.size == 1000);
  CHECK(m.device == 3);
  CHECK(m.tag == 7);
  CHECK(m.token != 0);
  CHECK(sim->owns(m.ptr));
  CHECK(a.outstanding_count() == 1);
  CHECK(a.outstanding_bytes() == 1000);

  auto freed = a.free(m.token);
  REQUIRE(freed.has_value());
  CHECK(freed->ptr == m.ptr);
  CHECK(freed->size == 1000);
  CHECK(freed->tag == 7);
  CHECK_FALSE(sim->owns(m.ptr));
  CHECK(sim->footprint() == 0);
  // The second call of the same finalizer is a no-op: the simulated upstream would throw
  // a logic_error on a double free, and the adapter does not even reach it.
  CHECK_FALSE(a.free(m.token).has_value());
  CHECK_FALSE(a.free(0).has_value());
  CHECK_FALSE(a.free(0xdeadbeef00000123ULL).has_value());
  CHECK(a.outstanding_count() == 0);
}

TEST_CASE("emm adapter: a zero-byte request gets a token and a null pointer") {
  auto sim = std::make_shared<simulated_memory_resource>();
  adapter a{sim};
  auto m = a.memalloc(0);
  CHECK(m.ptr == nullptr);
  CHECK(m.token != 0);
  CHECK(sim->total_allocations() == 0);
  CHECK(a.free(m.token).has_value());
  CHECK_FALSE(a.free(m.token).has_value());
}

TEST_CASE("emm adapter: tokens are never reused even when slots and addresses are") {
  auto sys = std::make_shared<system_memory_resource>();
  auto cache = std::make_shared<caching_resource>(sys);  // hands the same address back
  adapter a{cache};
  std::set<std::uint64_t> tokens;
  void* first_address = nullptr;
  for (int i = 0; i < 100; ++i) {
    auto m = a.memalloc(512);
    if (first_address == nullptr) { first_address = m.ptr; }
    CHECK(m.ptr == first_address);   // the address repeats ...
    CHECK(slot_of(m.token) == 0);    // ... and so does the slot ...
    CHECK(tokens.insert(m.token).second);  // ... but never the token
    REQUIRE(a.free(m.token).has_value());
  }
  // A token from before is stale for ever: it does not free the live allocation now in its slot.
  auto live = a.memalloc(512);
  for (auto t : tokens) { CHECK_FALSE(a.free(t).has_value()); }
  CHECK(a.outstanding_count() == 1);
  CHECK(a.free(live.token).has_value());
}

TEST_CASE("emm adapter: reset frees everything outstanding, stale finalizers are no-ops, it stays usable") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto cache = std::make_shared<caching_resource>(sim);
  adapter a{cache};
  std::vector<emm::memory_pointer> before;
  for (std::size_t i = 1; i <= 10; ++i) { before.push_back(a.memalloc(i * 256, static_cast<std::uint32_t>(i % 3))); }
  REQUIRE(a.free(before[4].token).has_value());  // one freed before the reset

  auto released = a.reset();
  CHECK(released.size() == 9);
  std::size_t released_bytes = 0;
  for (auto const& r : released) { released_bytes += r.size; }
  CHECK(released_bytes == 55 * 256 - 5 * 256);
  CHECK(a.outstanding_count() == 0);
  CHECK(a.outstanding_bytes() == 0);
  // reset asked the stack to give back what it holds free (Numba resets the context next).
  CHECK(cache->release_calls() == 1);
  CHECK(cache->cached_blocks() == 0);
  CHECK(sim->footprint() == 0);

  // Stale finalizers run later (Python's garbage collector decides when): no-ops.
  for (auto const& m : before) { CHECK_FALSE(a.free(m.token).has_value()); }
  CHECK(sim->footprint() == 0);

  // Still usable, and the addresses the simulated upstream reuses get fresh tokens.
  auto after = a.memalloc(256);
  for (auto const& m : before) { CHECK(after.token != m.token); }
  CHECK(a.outstanding_count() == 1);
  CHECK(a.free(after.token).has_value());
  CHECK(a.reset().empty());
}

TEST_CASE("emm adapter: defer_cleanup holds frees until the outermost guard ends") {
  auto sim = std::make_shared<simulated_memory_resource>();
  adapter a{sim};
  auto m1 = a.memalloc(256);
  auto m2 = a.memalloc(512);
  {
    auto outer = a.defer_cleanup();
    CHECK(a.deferral_depth() == 1);
    CHECK(a.free(m1.token).has_value());
    CHECK(sim->owns(m1.ptr));  // held back
    CHECK(a.deferred_count() == 1);
    CHECK_FALSE(a.free(m1.token).has_value());  // still exactly once
    {
      auto inner = a.defer_cleanup();
      CHECK(a.deferral_depth() == 2);
      CHECK(a.free(m2.token).has_value());
    }
    CHECK(a.deferral_depth() == 1);
    CHECK(sim->owns(m1.ptr));  // the inner guard's end frees nothing
    CHECK(sim->owns(m2.ptr));
    CHECK(a.deferred_count() == 2);
  }
  CHECK(a.deferral_depth() == 0);
  CHECK(a.deferred_count() == 0);
  CHECK(sim->footprint() == 0);
  CHECK_THROWS_WITH(a.end_deferral(), Catch::Contains("never begun"));
}

TEST_CASE("emm adapter: a reset inside a guard waits for the guard, as Numba's own manager does") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto cache = std::make_shared<caching_resource>(sim);
  adapter a{cache};
  auto m = a.memalloc(1024);
  a.begin_deferral();
  auto released = a.reset();
  CHECK(released.size() == 1);
  CHECK(a.outstanding_count() == 0);
  CHECK(sim->owns(m.ptr));              // not yet returned
  CHECK(cache->release_calls() == 0);   // and nothing released under the guard
  CHECK_FALSE(a.free(m.token).has_value());
  a.end_deferral();
  CHECK(cache->cached_blocks() == 1);   // returned to the stack once
  CHECK(sim->footprint() == 1024);      // the cache holds it
  cache->release();
  CHECK(sim->footprint() == 0);
}

TEST_CASE("emm adapter: get_memory_info counts what the stack holds free as free") {
  auto sys = std::make_shared<system_memory_resource>();
  auto cache = std::make_shared<caching_resource>(sys);
  adapter::options opts;
  opts.query_memory = [](int, memory_kind kind) {
    CHECK(kind == memory_kind::host);
    return emm::memory_info{1000000, 4000000};
  };
  adapter a{cache, opts};
  CHECK(a.get_memory_info().free == 1000000);
  CHECK(a.get_memory_info().total == 4000000);
  auto m = a.memalloc(300000);
  REQUIRE(a.free(m.token).has_value());  // the cache now holds 300000 bytes free
  CHECK(a.get_memory_info().free == 1300000);
  CHECK(a.get_memory_info().total == 4000000);
  cache->release();
  CHECK(a.get_memory_info().free == 1000000);

  // Never more free than total.
  opts.query_memory = [](int, memory_kind) { return emm::memory_info{3900000, 4000000}; };
  adapter b{cache, opts};
  auto n = b.memalloc(300000);
  REQUIRE(b.free(n.token).has_value());
  CHECK(b.get_memory_info().free == 4000000);
}

TEST_CASE("emm adapter: default memory info of a host stack is the host's physical memory") {
  adapter a{std::make_shared<system_memory_resource>()};
  auto info = a.get_memory_info();
  CHECK(info.total > 0);
  CHECK(info.free > 0);
  CHECK(info.free <= info.total);
}

TEST_CASE("emm adapter: memory info over a simulated bottom is the simulated device's, not the host's") {
  constexpr std::size_t capacity = std::size_t{64} << 20;
  auto sim = std::make_shared<simulated_memory_resource>(capacity);
  auto pool = std::make_shared<pool_memory_resource>(sim, std::size_t{4} << 20);
  adapter a{pool};
  // As cudaMemGetInfo for a real device: total the capacity, free what it has not handed
  // out, plus what the stack holds free (the pool's initial chunk).
  CHECK(a.get_memory_info().total == capacity);
  CHECK(a.get_memory_info().free == capacity);
  auto m = a.memalloc(std::size_t{1} << 20);
  CHECK(a.get_memory_info().free == capacity - (std::size_t{1} << 20));
  REQUIRE(a.free(m.token).has_value());
  pool->release();
  CHECK(sim->footprint() == 0);
  CHECK(a.get_memory_info().free == capacity);

  auto vmm = std::make_shared<simulated_vmm_memory_resource>(std::size_t{1} << 30, std::size_t{2} << 20, capacity);
  adapter v{vmm};
  auto n = v.memalloc(std::size_t{3} << 20);
  REQUIRE(vmm->mapped_bytes() >= (std::size_t{3} << 20));
  CHECK(v.get_memory_info().total == capacity);
  CHECK(v.get_memory_info().free == capacity - vmm->mapped_bytes() + vmm->free_bytes_held());
  REQUIRE(v.free(n.token).has_value());

  adapter unlimited{std::make_shared<simulated_memory_resource>()};
  auto u = unlimited.memalloc(4096);
  CHECK(unlimited.get_memory_info().total == std::numeric_limits<std::size_t>::max());
  CHECK(unlimited.get_memory_info().free == std::numeric_limits<std::size_t>::max() - 4096);
  REQUIRE(unlimited.free(u.token).has_value());
}

TEST_CASE("emm adapter: get_ipc_handle refuses host memory with a clear message") {
  adapter a{std::make_shared<system_memory_resource>()};
  auto m = a.memalloc(256);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr), Catch::Contains("host memory") && Catch::Contains("system") &&
                                                 Catch::Contains("CUDA IPC"));
  adapter s{std::make_shared<simulated_memory_resource>()};
  CHECK_THROWS_WITH(s.get_ipc_handle(reinterpret_cast<void*>(0x1000)),
                    Catch::Contains("serves addresses with no memory behind them"));
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter: get_ipc_handle of a virtual-memory layer needs the block's size, and a real vmm") {
  auto vmm = std::make_shared<simulated_vmm_memory_resource>();
  adapter a{std::make_shared<pool_memory_resource>(vmm)};
  auto m = a.memalloc(4096);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr), Catch::Contains("virtual-memory (vmm)") &&
                                                 Catch::Contains("size is needed"));
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr, 4096), Catch::Contains("simulated_vmm memory cannot be shared"));
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter: memalloc is refused while the stack's vmm layer is asleep; frees work") {
  auto vmm = std::make_shared<simulated_vmm_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(vmm);
  adapter a{pool};
  auto m = a.memalloc(4096);
  sleep_stack(*pool, true);
  CHECK_THROWS_WITH(a.memalloc(4096), Catch::Contains("asleep") && Catch::Contains("wake()"));
  CHECK(a.free(m.token).has_value());
  wake_stack(*pool);
  auto again = a.memalloc(4096);
  CHECK(a.free(again.token).has_value());
}

TEST_CASE("emm adapter: the destructor frees what is still outstanding or deferred") {
  auto sim = std::make_shared<simulated_memory_resource>();
  {
    adapter a{sim};
    (void)a.memalloc(256);
    auto m = a.memalloc(256);
    a.begin_deferral();
    CHECK(a.free(m.token).has_value());
    CHECK(sim->footprint() == 512);
  }
  CHECK(sim->footprint() == 0);
}

TEST_CASE("emm adapter: memory is really usable (system upstream)") {
  adapter a{std::make_shared<system_memory_resource>()};
  auto m = a.memalloc(4096);
  std::memset(m.ptr, 0x5a, 4096);
  CHECK(static_cast<unsigned char*>(m.ptr)[4095] == 0x5a);
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter: randomized model test against a reference map") {
  auto sim = std::make_shared<simulated_memory_resource>();
  adapter a{sim};
  std::mt19937_64 rng{20240611};
  std::map<std::uint64_t, emm::memory_pointer> live;  // the reference
  std::vector<std::uint64_t> dead;                     // tokens freed or reset: must stay no-ops
  std::size_t live_bytes = 0;
  int deferral = 0;
  std::size_t held_back = 0;  // bytes freed under a guard, still with the upstream
  for (int step = 0; step < 20000; ++step) {
    auto const op = rng() % 100;
    if (op < 45 || live.empty()) {
      std::size_t const size = (rng() % 8 == 0) ? 0 : 1 + rng() % 100000;
      auto m = a.memalloc(size, static_cast<std::uint32_t>(rng() % 4));
      REQUIRE(live.count(m.token) == 0);
      live[m.token] = m;
      live_bytes += size;
    } else if (op < 85) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      auto freed = a.free(it->first);
      REQUIRE(freed.has_value());
      CHECK(freed->ptr == it->second.ptr);
      CHECK(freed->size == it->second.size);
      CHECK(freed->tag == it->second.tag);
      if (deferral > 0) { held_back += it->second.size == 0 ? 0 : detail::align_up(it->second.size, 256); }
      live_bytes -= it->second.size;
      dead.push_back(it->first);
      live.erase(it);
    } else if (op < 90 && !dead.empty()) {
      CHECK_FALSE(a.free(dead[rng() % dead.size()]).has_value());
    } else if (op < 93) {
      if (deferral < 3) {
        a.begin_deferral();
        ++deferral;
      }
    } else if (op < 97) {
      if (deferral > 0) {
        a.end_deferral();
        if (--deferral == 0) { held_back = 0; }
      }
    } else if (op < 98) {
      auto released = a.reset();
      CHECK(released.size() == live.size());
      for (auto const& [token, m] : live) {
        dead.push_back(token);
        if (deferral > 0) { held_back += m.size == 0 ? 0 : detail::align_up(m.size, 256); }
      }
      live.clear();
      live_bytes = 0;
    }
    REQUIRE(a.outstanding_count() == live.size());
    REQUIRE(a.outstanding_bytes() == live_bytes);
    std::size_t live_footprint = 0;
    for (auto const& [token, m] : live) { live_footprint += m.size == 0 ? 0 : detail::align_up(m.size, 256); }
    REQUIRE(sim->footprint() == live_footprint + held_back);
  }
  while (deferral-- > 0) { a.end_deferral(); }
  (void)a.reset();
  CHECK(sim->footprint() == 0);
}

TEST_CASE("emm adapter: concurrent memalloc and free from many threads") {
  auto sim = std::make_shared<simulated_memory_resource>();
  adapter a{sim};
  constexpr int threads = 8;
  constexpr int rounds = 5000;
  std::vector<std::thread> workers;
  std::mutex tokens_mutex;
  std::set<std::uint64_t> all_tokens;
  std::size_t issued = 0;
  std::atomic<int> wrong_frees{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<emm::memory_pointer> mine;
      std::vector<std::uint64_t> seen;
      for (int i = 0; i < rounds; ++i) {
        if (mine.empty() || rng() % 3 != 0) {
          mine.push_back(a.memalloc(256 + rng() % 4096, static_cast<std::uint32_t>(t)));
          seen.push_back(mine.back().token);
        } else {
          auto m = mine.back();
          mine.pop_back();
          auto freed = a.free(m.token);
          if (!freed || freed->ptr != m.ptr || freed->tag != static_cast<std::uint32_t>(t)) { ++wrong_frees; }
        }
        if (i % 997 == 0) {
          auto guard = a.defer_cleanup();
          if (!mine.empty()) {
            (void)a.free(mine.back().token);
            mine.pop_back();
          }
        }
      }
      for (auto const& m : mine) { (void)a.free(m.token); }
      std::lock_guard lock{tokens_mutex};
      issued += seen.size();
      for (auto tok : seen) { all_tokens.insert(tok); }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(wrong_frees.load() == 0);
  CHECK(a.outstanding_count() == 0);
  CHECK(sim->footprint() == 0);
  CHECK(a.deferral_depth() == 0);
  // Every token issued was distinct across all threads.
  CHECK(issued > static_cast<std::size_t>(threads) * rounds / 2);
  CHECK(all_tokens.size() == issued);
}

TEST_CASE("emm adapter over a real pool: held-free bytes count as free, reset gives the chunks back") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto pool = std::make_shared<pool_memory_resource>(sim, std::size_t{4} << 20);
  adapter::options opts;
  opts.query_memory = [](int, memory_kind) { return emm::memory_info{std::size_t{100} << 20, std::size_t{1} << 30}; };
  adapter a{pool, opts};
  auto const free_at_start = a.get_memory_info().free;
  CHECK(free_at_start == (std::size_t{100} << 20) + pool->free_bytes());  // the initial chunk is free
  std::vector<emm::memory_pointer> ms;
  for (int i = 0; i < 16; ++i) { ms.push_back(a.memalloc(std::size_t{64} << 10)); }
  CHECK(a.get_memory_info().free == free_at_start - std::size_t{16} * (64 << 10));
  for (int i = 0; i < 8; ++i) { REQUIRE(a.free(ms[static_cast<std::size_t>(i)].token).has_value()); }
  CHECK(a.get_memory_info().free == free_at_start - std::size_t{8} * (64 << 10));
  CHECK(sim->footprint() > 0);
  CHECK(a.reset().size() == 8);
  // Everything was freed, so every chunk is wholly free and goes back to the upstream.
  CHECK(pool->pool_size() == 0);
  CHECK(sim->footprint() == 0);
  auto again = a.memalloc(1000);  // still usable: the pool grows again
  CHECK(sim->footprint() > 0);
  CHECK(a.free(again.token).has_value());
}
