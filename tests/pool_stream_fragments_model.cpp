// A random model of a stream-ordered pool growing in place over a simulated virtual range,
// the way pool_memory_resource drives it: several created streams on several simulated
// threads, frees that park (prerecorded or found idle), a device that finishes work at
// random, releases that leave holes at the frontier. It checks what the runs of a
// stream's own and parked blocks (block_pool::allocate_across) and the claim of the
// parked block that growth extends (stream_ordered_pool::claim_parked_block_ending_at)
// must keep: every byte handed to a stream is ordered after the work of whoever freed it,
// and the block pool's invariants and accounting hold.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <stream_model.hpp>
#include <freed_ranges.hpp>
#include <simulated_threads.hpp>

#include <mrstack/detail/in_place_pool_growth.hpp>
#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <vector>

using namespace mrstack;
using detail::stream_ref;
using test::created;
using test::live_block;
using test::pending_free;
using test::current_thread;
using test::fake_stream_sync;
using test::freed_ranges;
using test::simulated_thread_key;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t granule = 64 * KiB;


void run_model(std::uint64_t seed, int steps) {
  CAPTURE(seed);
  std::mt19937_64 rng{seed};
  auto fake = std::make_shared<fake_stream_sync>();
  fake->report_idle = seed % 2 == 0;
  detail::park_policy parks;
  parks.divisor = seed % 3 == 0 ? 16U : 1024U;
  parks.minimum = 0;
  detail::stream_ordered_pool core{fake, &simulated_thread_key, true, parks};
  auto vmm = std::make_shared<simulated_vmm_memory_resource>(std::size_t{1} << 34, granule,
                                                             seed % 4 == 1 ? 96 * granule : ~std::size_t{0}, 1);
  detail::in_place_growth_options options;
  options.initial_bytes = 4 * granule;
  if (seed % 5 < 2) { options.release_threshold = (4 + seed % 5) * granule; }
  detail::in_place_pool_growth growth{*vmm, options};
  growth.start(core);
  std::uintptr_t const threads[] = {3, 5, 7};
  std::uintptr_t const streams[] = {0x100, 0x200, 0x300};
  freed_ranges freed;
  std::map<std::uintptr_t, live_block> live;
  std::map<std::uintptr_t, std::optional<pending_free>> pending;
  std::vector<detail::stream_sync::handle> spares;
  auto accounting = [&] {
    std::size_t live_bytes = 0;
    for (auto const& [a, b] : live) { live_bytes += b.size; }
    auto const& blocks = core.blocks();
    REQUIRE(blocks.live_bytes() == live_bytes);
    REQUIRE(blocks.free_bytes() + blocks.live_bytes() + blocks.withdrawn_bytes() == blocks.total_bytes());
    REQUIRE(blocks.total_bytes() == growth.policy().frontier_bytes());
    REQUIRE(vmm->committed_bytes() + growth.policy().hole_bytes() == growth.policy().frontier_bytes());
  };
  auto do_free = [&](std::uintptr_t address, std::uint64_t clock, detail::prepark* before) {
    live_block const b = live.at(address);
    REQUIRE(core.deallocate(address, created(b.stream), detail::block_pool::any_size, before) == b.size);
    if (before != nullptr && before->event != 0) { spares.push_back(before->event); }
    freed.add(address, b.size, b.stream, clock);
    live.erase(address);
    growth.after_deallocate(core, created(b.stream));
  };
  bool const captures = seed % 3 == 2;
  std::uintptr_t captured = 0;
  for (int step = 0; step < steps; ++step) {
    if (fake->report_idle && rng() % 8 == 0) { fake->complete(streams[rng() % 3]); }
    if (captures && rng() % 500 == 0) {
      if (captured != 0) {
        fake->end_capture(captured);
        captured = 0;
      } else {
        captured = streams[rng() % 3];
        fake->begin_capture(captured);
      }
    }
    current_thread = threads[rng() % 3];
    if (pending[current_thread]) {
      pending_free p = *pending[current_thread];
      pending[current_thread].reset();
      do_free(p.address, p.clock, &p.before);
      continue;
    }
    std::uintptr_t const s = streams[rng() % 3];
    if (live.size() < 4 || rng() % 100 < 50) {
      std::size_t const size = (1 + rng() % (rng() % 8 == 0 ? 1024 : 64)) * 256;
      std::size_t const alignment = rng() % 8 == 0 ? std::size_t{1} << (9 + rng() % 9) : 256;
      std::uintptr_t a = core.allocate(size, alignment, created(s));
      if (a == 0) {
        try {
          growth.grow(core, size, alignment, created(s));
          a = core.allocate(size, alignment, created(s));
        } catch (detail::growth_failure const&) {
        }
      }
      if (a == 0 && captured == 0 && core.synchronize_everything()) { a = core.allocate(size, alignment, created(s)); }
      if (a == 0) { continue; }  // out of memory: the device is full
      REQUIRE(a % alignment == 0);
      REQUIRE(freed.take(a, size, s, *fake) == "");
      auto next = live.lower_bound(a);
      if (next != live.end()) { REQUIRE(a + size <= next->first); }
      if (next != live.begin()) { REQUIRE(std::prev(next)->first + std::prev(next)->second.size <= a); }
      REQUIRE(vmm->is_committed(reinterpret_cast<void*>(a), size));
      live.emplace(a, live_block{size, s});
      fake->enqueue(s);
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      bool busy = false;
      for (auto const& [t, p] : pending) { busy = busy || (p && p->address == it->first); }
      if (busy) { continue; }
      std::uintptr_t const stream = it->second.stream;
      std::uint64_t const clock = fake->enqueue(stream);
      if (fake->report_idle && rng() % 2 == 0) { fake->complete(stream); }
      if (stream != captured && rng() % 3 == 0) {
        detail::prepark before;
        before.idle = fake->report_idle && fake->idle(stream);
        if (!before.idle) {
          if (spares.empty()) {
            before.event = fake->create_event();
          } else {
            before.event = spares.back();
            spares.pop_back();
          }
          REQUIRE(fake->record(before.event, stream));
        }
        pending[current_thread] = pending_free{it->first, clock, before};
        continue;
      }
      do_free(it->first, clock, nullptr);
    }
    if (captured == 0 && rng() % 2000 == 0) { (void)growth.release(core); }
    if (step % 64 == 0) {
      REQUIRE(core.blocks().check_invariants() == "");
      accounting();
    }
  }
  if (captured != 0) { fake->end_capture(captured); }
  INFO("records in captures " << fake->records_in_capture << ", waits into captures " << fake->waits_into_capture);
  CHECK(fake->records_in_capture == 0);
  CHECK(fake->waits_into_capture == 0);
  for (auto& [t, p] : pending) {
    if (p) {
      current_thread = t;
      pending_free q = *p;
      p.reset();
      do_free(q.address, q.clock, &q.before);
    }
  }
  while (!live.empty()) { do_free(live.begin()->first, fake->enqueue(live.begin()->second.stream), nullptr); }
  REQUIRE(core.blocks().check_invariants() == "");
  accounting();
  for (auto e : spares) { fake->destroy_event(e); }
  CHECK(fake->dead_named == 0);
}

}  // namespace

TEST_CASE("pool stream fragments model: in-place growth over parked and own blocks never reuses memory early") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) { run_model(seed, 40000); }
}

namespace {

/// The free blocks of a block_pool as a map: address -> (end, owner).
struct free_view {
  std::uintptr_t end;
  detail::owner_id owner;
};
std::map<std::uintptr_t, free_view> free_map(detail::block_pool const& pool) {
  std::map<std::uintptr_t, free_view> m;
  pool.for_each_free_block([&](std::uintptr_t a, std::size_t n, detail::owner_id o) { m[a] = free_view{a + n, o}; });
  return m;
}
/// The owner of free byte `a` (or -1 when not free).
int owner_at(std::map<std::uintptr_t, free_view> const& m, std::uintptr_t a) {
  auto it = m.upper_bound(a);
  if (it == m.begin()) { return -1; }
  --it;
  return a < it->second.end ? it->second.owner : -1;
}

}  // namespace

TEST_CASE("block_pool model: allocate_across takes only the two owners' memory, and finds any run that fits") {
  using detail::block_pool;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{seed};
    block_pool pool;
    std::vector<std::pair<std::uintptr_t, std::size_t>> chunks;
    std::uintptr_t next = 0x500000000000;
    for (int c = 0; c < 3; ++c) {
      std::size_t const n = (64 + rng() % 256) * 256;
      pool.add_chunk(next, n, static_cast<detail::owner_id>(1 + rng() % 4));
      chunks.emplace_back(next, n);
      next += n;  // chunks back to back: a run must still not cross them
    }
    std::map<std::uintptr_t, std::size_t> live;
    for (int step = 0; step < 20000; ++step) {
      auto const o = static_cast<detail::owner_id>(1 + rng() % 4);
      auto const p = static_cast<detail::owner_id>(1 + rng() % 4);
      std::size_t const size = (1 + rng() % 48) * 256;
      std::size_t const alignment = rng() % 4 == 0 ? std::size_t{256} << (rng() % 6) : 256;
      int const action = static_cast<int>(rng() % 10);
      if (action < 4 || live.empty()) {
        std::uintptr_t const a = pool.allocate(size, alignment, o);
        if (a != 0) { live[a] = size; }
      } else if (action < 8) {
        auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
        REQUIRE(pool.deallocate(it->first, static_cast<detail::owner_id>(rng() % 5)) == it->second);
        live.erase(it);
      } else if (action == 8 && o != p) {
        auto const before = free_map(pool);
        std::size_t const other_bytes = pool.free_bytes() - pool.free_bytes(o) - pool.free_bytes(p) -
                                        pool.free_bytes(block_pool::synchronized);
        // Is there a run of o's and p's neighbours with one of each, room to align anywhere?
        bool run_exists = false;
        for (auto it = before.begin(); it != before.end() && !run_exists;) {
          if (it->second.owner != o && it->second.owner != p) {
            ++it;
            continue;
          }
          std::uintptr_t const start = it->first;
          std::uintptr_t end = it->second.end;
          bool has_o = it->second.owner == o, has_p = it->second.owner == p;
          auto chunk_end = [&](std::uintptr_t a) {
            for (auto const& [b, n] : chunks) {
              if (a >= b && a < b + n) { return b + n; }
            }
            return std::uintptr_t{0};
          };
          for (++it; it != before.end() && it->first == end && end != chunk_end(start) &&
                     (it->second.owner == o || it->second.owner == p);
               ++it) {
            has_o = has_o || it->second.owner == o;
            has_p = has_p || it->second.owner == p;
            end = it->second.end;
          }
          run_exists = has_o && has_p && end - start >= size + alignment - 256;
        }
        std::uintptr_t const a = pool.allocate_across(size, alignment, o, p);
        if (run_exists && a == 0) {
          for (auto const& [x, v] : before) { UNSCOPED_INFO(std::hex << x << "-" << v.end << std::dec << " (" << (v.end - x) / 256 << " granules) owner " << v.owner); }
          for (auto const& [b, n] : chunks) { UNSCOPED_INFO("chunk " << std::hex << b << "-" << b + n); }
          UNSCOPED_INFO("o " << o << " p " << p << " size " << size / 256 << " granules, alignment " << alignment);
        }
        if (run_exists) { REQUIRE(a != 0); }
        if (a != 0) {
          REQUIRE(a % alignment == 0);
          for (std::uintptr_t x = a; x < a + size; x += 256) {
            int const w = owner_at(before, x);
            INFO("byte at +" << (x - a) << " was owner " << w);
            REQUIRE((w == o || w == p || w == block_pool::synchronized));
          }
          live[a] = size;
        }
        std::size_t const other_after = pool.free_bytes() - pool.free_bytes(o) - pool.free_bytes(p) -
                                        pool.free_bytes(block_pool::synchronized);
        REQUIRE(other_after == other_bytes);
      } else if (action == 9) {
        // The helpers growth uses: the free block ending at a random block end.
        auto const m = free_map(pool);
        if (!m.empty()) {
          auto it = std::next(m.begin(), static_cast<std::ptrdiff_t>(rng() % m.size()));
          auto const t = pool.owner_of_free_block_ending_at(it->second.end);
          REQUIRE(t.has_value());
          REQUIRE(*t == it->second.owner);
          std::size_t const total_free = pool.free_bytes();
          pool.transfer_free_block_ending_at(it->second.end, o);
          REQUIRE(pool.free_bytes() == total_free);
          auto const after = free_map(pool);
          REQUIRE(owner_at(after, it->second.end - 256) == o);
        }
      }
      if (step % 16 == 0) { REQUIRE(pool.check_invariants() == ""); }
      std::size_t lb = 0;
      for (auto const& [a, n] : live) { lb += n; }
      REQUIRE(pool.live_bytes() == lb);
      REQUIRE(pool.free_bytes() + lb == pool.total_bytes());
    }
  }
}
