// in_place_growth over a virtual range whose driver refuses on demand: a decommit that
// gives back any subset of its granules and then fails, and the re-commit of what it gave
// back failing too, over random traffic, releases and grows. After every step the books
// must match the range: the granules committed are exactly those the core's free and live
// blocks touch (plus, only after a failed re-commit, granules inside holes, which the next
// release with the driver well gives back), holes are what the core holds withdrawn, the
// maximum is never passed, and a request is refused only when committing it would pass
// the maximum. A second case adds a core whose books refuse (out of host memory) in the
// middle of a grow or a release: no granule is left committed in no block, and none free
// without memory behind it.
#include <catch2/catch.hpp>

#include <mrstack/detail/in_place_growth.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <reference_core.hpp>

#include <cstddef>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace mrstack;
using mrstack::test::reference_core;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = 2 * MiB;

// Decommit, when refusing, gives back a random subset of the granules asked for (one by
// one, so any position) and then throws; commit, when refusing, commits nothing (the
// contract's all-or-nothing) and throws out_of_memory. Any commit may be refused (a
// grow's first plan or its plan after the release), or only the re-commit right after a
// refused decommit.
class flaky_range final : public virtual_range {
 public:
  double decommit_refusal = 0;  // chance that one decommit is refused
  double commit_refusal = 0;    // chance that a commit right after a refused decommit is refused
  double any_commit_refusal = 0;  // chance that any other commit is refused
  std::size_t refused_decommits = 0;
  std::size_t refused_recommits = 0;
  std::size_t refused_commits = 0;
  long refuse_commits_from = -1;  // n >= 0: the n-th commit from now and every later one are refused

  flaky_range(virtual_range& inner, unsigned seed) : inner_{inner}, rng_{seed} {}
  [[nodiscard]] std::byte* range_base() const noexcept override { return inner_.range_base(); }
  [[nodiscard]] std::size_t range_bytes() const noexcept override { return inner_.range_bytes(); }
  [[nodiscard]] std::size_t granularity() const noexcept override { return inner_.granularity(); }
  void claim(std::string_view claimant) override { inner_.claim(claimant); }
  void unclaim() noexcept override { inner_.unclaim(); }
  std::size_t commit(void* ptr, std::size_t bytes) override {
    bool const after_refusal = just_refused_;
    just_refused_ = false;
    if (refuse_commits_from >= 0 && refuse_commits_from-- == 0) {
      refuse_commits_from = 0;
      ++refused_commits;
      throw std::bad_alloc();
    }
    if (after_refusal && chance(commit_refusal)) {
      ++refused_recommits;
      throw std::bad_alloc();
    }
    if (!after_refusal && chance(any_commit_refusal)) {  // a grow's, its retry's too
      ++refused_commits;
      throw std::bad_alloc();
    }
    return inner_.commit(ptr, bytes);
  }
  std::size_t decommit(void* ptr, std::size_t bytes) override {
    just_refused_ = false;
    if (!chance(decommit_refusal)) { return inner_.decommit(ptr, bytes); }
    auto* const p = static_cast<std::byte*>(ptr);
    for (std::size_t at = 0; at + G <= bytes; at += G) {
      if (chance(0.5)) { (void)inner_.decommit(p + at, G); }
    }
    ++refused_decommits;
    just_refused_ = true;
    throw std::runtime_error("injected: the driver refused the decommit");
  }
  [[nodiscard]] std::size_t committed_bytes() const noexcept override { return inner_.committed_bytes(); }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept override { return inner_.mapped_bytes(); }
  [[nodiscard]] bool owns(void const* ptr) const noexcept override { return inner_.owns(ptr); }

 private:
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>{0, 1}(rng_) < p; }

  virtual_range& inner_;
  std::mt19937_64 rng_;
  bool just_refused_ = false;
};

struct flaky_pool {
  simulated_vmm_memory_resource vmm;
  flaky_range range;
  reference_core core;
  detail::in_place_growth<reference_core> growth;
  std::map<std::uintptr_t, std::size_t> live;

  // Odd seeds map four granules per physical allocation (granule_map.hpp).
  flaky_pool(unsigned seed, detail::in_place_growth_options const& options)
      : vmm{256 * G, G, std::numeric_limits<std::size_t>::max(), seed % 2 == 0 ? 1u : 4u},
        range{vmm, seed},
        growth{range, "flaky_pool", options} {
    growth.start(core, 0);
  }
  ~flaky_pool() {
    for (auto const& [p, n] : live) { core.deallocate(p, 0); }
  }

  [[nodiscard]] std::size_t granule(std::uintptr_t address) const {
    return (address - reinterpret_cast<std::uintptr_t>(vmm.range_base())) / G;
  }

  // The model: every granule a free or live block touches must be committed (the core may
  // hand it out); a granule wholly inside a hole is committed only after a failed re-commit.
  void check(bool recommit_failed) const {
    INFO(core.check());
    REQUIRE(core.check().empty());
    REQUIRE(core.withdrawn_bytes() == growth.hole_bytes());
    REQUIRE(core.total_bytes() == growth.frontier_bytes());
    REQUIRE(vmm.committed_bytes() <= growth.maximum_bytes());
    std::set<std::size_t> needed;
    std::size_t withdrawn_blocks = 0;
    for (auto const& [a, b] : core.blocks()) {
      if (b.st == reference_core::state::withdrawn) {
        ++withdrawn_blocks;
        continue;
      }
      for (std::size_t g = granule(a); g <= granule(a + b.size - 1); ++g) { needed.insert(g); }
    }
    REQUIRE(withdrawn_blocks == growth.hole_count());  // one hole per withdrawn block, none free
    for (std::size_t g : needed) { REQUIRE(vmm.is_committed(vmm.range_base() + g * G, G)); }
    if (!recommit_failed) { REQUIRE(vmm.committed_bytes() == needed.size() * G); }
    vmm.check_invariants();
  }
};

}  // namespace

TEST_CASE("in_place_growth: random refused decommits and re-commits keep the books exact") {
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 rng{seed};
    detail::in_place_growth_options options;
    options.maximum_bytes = (8 + seed % 24) * G;
    flaky_pool pool{seed, options};
    pool.range.decommit_refusal = 0.4;
    pool.range.commit_refusal = seed % 3 == 0 ? 0.5 : 0.0;
    pool.range.any_commit_refusal = seed % 4 == 1 ? 0.2 : 0.0;
    std::vector<std::uintptr_t> order;
    for (int step = 0; step < 400; ++step) {
      int const op = static_cast<int>(rng() % 10);
      if (op < 5) {
        std::size_t const size = (1 + rng() % (3 * G / 256)) * 256;
        std::size_t const alignment = rng() % 8 == 0 ? G : 256;
        std::uintptr_t p = pool.core.allocate(size, alignment, 0);
        if (p == 0) {
          std::size_t const refused_before = pool.range.refused_decommits + pool.range.refused_commits;
          try {
            pool.growth.grow(pool.core, size, alignment, 0);
            p = pool.core.allocate(size, alignment, 0);
            REQUIRE(p != 0);
          } catch (detail::growth_failure const&) {
            // Refused: committing a fresh stretch for it would pass the maximum. (Granules
            // a failed re-commit left in holes refuse early only while the driver still
            // refuses: the release in grow decommits them.)
            if (pool.range.refused_decommits + pool.range.refused_commits == refused_before) {
              std::size_t const slack = alignment > 256 ? alignment : 0;
              CHECK(pool.vmm.committed_bytes() + detail::align_up(size + slack, G) > options.maximum_bytes);
            }
          } catch (std::runtime_error const& e) {
            REQUIRE(std::string_view{e.what()}.find("injected") != std::string_view::npos);  // its release
          }
        }
        if (p != 0) {
          REQUIRE(pool.vmm.is_accessible(reinterpret_cast<void*>(p), size));
          pool.live.emplace(p, size);
          order.push_back(p);
        }
      } else if (op < 9 && !order.empty()) {
        std::size_t const i = rng() % order.size();
        std::uintptr_t const p = order[i];
        order[i] = order.back();
        order.pop_back();
        REQUIRE(pool.core.deallocate(p, 0) == pool.live.at(p));
        pool.live.erase(p);
      } else {
        try {
          (void)pool.growth.release(pool.core);
        } catch (std::runtime_error const& e) {
          REQUIRE(std::string_view{e.what()}.find("injected") != std::string_view::npos);
        }
      }
      pool.check(pool.range.refused_recommits != 0);
    }
    // With the driver well again, one release gives back every granule no live block
    // touches, those left committed in holes by a failed re-commit too.
    pool.range.decommit_refusal = 0;
    pool.range.commit_refusal = 0;
    pool.range.any_commit_refusal = 0;
    (void)pool.growth.release(pool.core);
    pool.check(false);
    CHECK(pool.range.refused_decommits > 0);
  }
}

namespace {

// reference_core whose books refuse on demand (std::bad_alloc, as block_pool out of host
// memory): extend_chunk, restore and split_hole refuse before changing anything, a withdraw
// refuses one block's range after the ranges before it went (block_pool withdraws block by
// block).
class refusing_core : public reference_core {
 public:
  double refusal = 0;  // chance that one call (one block of a withdraw) is refused
  long refuse_from = -1;  // n >= 0: the n-th call from now (one block of a withdraw) and all
                          // later ones are refused
  std::size_t refused = 0;

  explicit refusing_core(unsigned seed) : rng_{seed} {}
  void extend_chunk(int chunk, std::size_t bytes, int owner) {
    refuse_maybe();
    reference_core::extend_chunk(chunk, bytes, owner);
  }
  std::size_t restore(std::uintptr_t address, int owner) {
    refuse_maybe();
    return reference_core::restore(address, owner);
  }
  std::size_t split_hole(std::uintptr_t address, std::size_t offset) {
    refuse_maybe();
    return reference_core::split_hole(address, offset);
  }
  template <typename Choose>
  std::size_t withdraw_free_ranges(Choose&& choose) {
    return reference_core::withdraw_free_ranges([&](std::uintptr_t address, std::size_t size, int owner) {
      range const r = choose(address, size, owner);
      if (r.length != 0) { refuse_maybe(); }  // as block_pool: right after its range was chosen
      return r;
    });
  }

 private:
  void refuse_maybe() {
    if (refuse_from >= 0 && refuse_from-- == 0) {
      refuse_from = 0;
      ++refused;
      throw std::bad_alloc();
    }
    if (refusal > 0 && std::uniform_real_distribution<double>{0, 1}(rng_) < refusal) {
      ++refused;
      throw std::bad_alloc();
    }
  }
  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("in_place_growth: a core out of host memory during a grow or release leaves no granule lost or unbacked") {
  // A grow commits first and then gives the granules to the core; a core that refused then
  // left them committed in no block, or free in the core without memory behind them.
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 rng{seed};
    simulated_vmm_memory_resource vmm{256 * G, G};
    flaky_range range{vmm, seed};
    refusing_core core{seed};
    detail::in_place_growth_options options;
    options.maximum_bytes = (8 + seed % 24) * G;
    options.growth_step = seed % 5 == 2 ? 3 * G : 0;
    detail::in_place_growth<refusing_core> growth{range, "refusing_core", options};
    growth.start(core, 0);
    range.decommit_refusal = seed % 2 == 0 ? 0.3 : 0.0;
    core.refusal = 0.15;
    std::map<std::uintptr_t, std::size_t> live;
    std::vector<std::uintptr_t> order;
    auto const granule = [&](std::uintptr_t a) { return (a - reinterpret_cast<std::uintptr_t>(vmm.range_base())) / G; };
    for (int step = 0; step < 300; ++step) {
      int const op = static_cast<int>(rng() % 10);
      if (op < 5) {
        std::size_t const size = (1 + rng() % (3 * G / 256)) * 256;
        std::size_t const alignment = rng() % 8 == 0 ? G : 256;
        std::uintptr_t p = core.allocate(size, alignment, 0);
        if (p == 0) {
          try {
            growth.grow(core, size, alignment, 0);
            p = core.allocate(size, alignment, 0);
          } catch (std::bad_alloc const&) {
          }
        }
        if (p != 0) {
          REQUIRE(vmm.is_accessible(reinterpret_cast<void*>(p), size));
          live.emplace(p, size);
          order.push_back(p);
        }
      } else if (op < 9 && !order.empty()) {
        std::size_t const i = rng() % order.size();
        REQUIRE(core.deallocate(order[i], 0) == live.at(order[i]));
        live.erase(order[i]);
        order[i] = order.back();
        order.pop_back();
      } else {
        try {
          (void)growth.release(core);
        } catch (std::exception const&) {
          // refused: the checks below hold all the same
        }
      }
      INFO("step " << step);
      INFO(core.check());
      REQUIRE(core.check().empty());
      REQUIRE(core.withdrawn_bytes() == growth.hole_bytes());
      REQUIRE(core.total_bytes() == growth.frontier_bytes());
      // A reused hole's rest stays a hole whatever the core refuses: nothing is committed
      // for it, so the maximum holds (a rest the core refused to withdraw again was
      // committed past it).
      REQUIRE(vmm.committed_bytes() <= growth.maximum_bytes());
      // Every granule a free or live block touches is committed (the core may hand it out).
      std::set<std::size_t> needed;
      for (auto const& [a, b] : core.blocks()) {
        if (b.st == reference_core::state::withdrawn) { continue; }
        for (std::size_t g = granule(a); g <= granule(a + b.size - 1); ++g) { needed.insert(g); }
      }
      for (std::size_t g : needed) { REQUIRE(vmm.is_committed(vmm.range_base() + g * G, G)); }
    }
    // With the driver and the host well again, one release leaves committed exactly the
    // granules live blocks touch: none was lost past the frontier or in a hole.
    range.decommit_refusal = 0;
    core.refusal = 0;
    (void)growth.release(core);
    std::set<std::size_t> touched;
    for (auto const& [p, n] : live) {
      for (std::size_t g = granule(p); g <= granule(p + n - 1); ++g) { touched.insert(g); }
    }
    CHECK(vmm.committed_bytes() == touched.size() * G);
    CHECK(core.refused > 0);
    for (auto const& [p, n] : live) { core.deallocate(p, 0); }
  }
}

TEST_CASE("in_place_growth: a grow whose core has no host memory says so") {
  // It said "no physical memory for ... B even after releasing every free granule (...):
  // std::bad_alloc", blaming the device for the host.
  simulated_vmm_memory_resource vmm{64 * G, G};
  refusing_core core{1};
  detail::in_place_growth<refusing_core> growth{vmm, "refusing_core", {}};
  growth.start(core, 0);
  REQUIRE(core.allocate(G, 256, 0) == 0);
  growth.grow(core, G, 256, 0);  // adds the chunk: nothing the core refuses
  std::uintptr_t const p = core.allocate(G, 256, 0);
  REQUIRE(p != 0);
  core.refusal = 1;
  try {
    growth.grow(core, 3 * G, 256, 0);
    FAIL("grew with no host memory");
  } catch (detail::growth_failure const& e) {
    core.refusal = 0;
    CHECK_THAT(e.what(), Catch::Contains("no host memory for the 6291456 B a grow committed") &&
                             !Catch::Contains("physical"));
  }
  core.refusal = 0;
  CHECK(vmm.committed_bytes() == G);  // the extension went back
  CHECK(core.total_bytes() == G);
  core.deallocate(p, 0);
}

TEST_CASE("in_place_growth: a reused hole's rest is never free without memory behind it, whatever refuses") {
  // A grow needing part of a hole restored the whole hole and withdrew its rest again. The
  // core refusing that withdraw (out of host memory) left the rest free there, so it was
  // committed, past the maximum; the device refusing that commit too left it free with no
  // memory behind it (a later block there faulted), and a bare std::bad_alloc escaped.
  // Every pair of refusals that last (host memory and the device stay short): the core's
  // calls from the n-th on, the range's commits from the m-th on (-1: none). A single
  // refusal of each the release in grow made good: it withdrew the unbacked rest again.
  for (long n = -1; n < 6; ++n) {
    for (long m = -1; m < 6; ++m) {
      INFO("core calls from " << n << " and commits from " << m << " refused");
      simulated_vmm_memory_resource vmm{64 * G, G};
      flaky_range range{vmm, 1};
      refusing_core core{1};
      detail::in_place_growth_options options;
      options.maximum_bytes = 7 * G;
      detail::in_place_growth<refusing_core> growth{range, "refusing_core", options};
      growth.start(core, 0);
      growth.grow(core, 5 * G, 256, 0);
      std::uintptr_t const w = core.allocate(G, 256, 0);
      std::uintptr_t const x = core.allocate(3 * G, 256, 0);
      std::uintptr_t const s = core.allocate(G, 256, 0);
      core.deallocate(x, 0);
      (void)growth.release(core);        // a 3-granule hole between w and s
      growth.grow(core, 4 * G, 256, 0);  // too large for the hole: the frontier
      std::uintptr_t const y = core.allocate(4 * G, 256, 0);
      REQUIRE((w != 0 && s != 0 && y != 0));
      REQUIRE(vmm.committed_bytes() == 6 * G);
      core.refuse_from = n;
      range.refuse_commits_from = m;
      std::uintptr_t p = 0;
      std::string error;
      try {
        growth.grow(core, G / 2, 256, 0);  // the hole's first granule
        p = core.allocate(G / 2, 256, 0);
      } catch (std::exception const& e) {
        error = e.what();
      }
      core.refuse_from = -1;
      range.refuse_commits_from = -1;
      if (p == 0) { CHECK_THAT(error, Catch::StartsWith("in-place growth: ")); }  // says who refused
      if (n == 0) {  // the split, before anything is committed
        CHECK_THAT(error, Catch::Contains("the pool's books had no host memory to split the 6291456 B hole"));
        CHECK(vmm.committed_bytes() == 6 * G);
      }
      INFO(core.check());
      REQUIRE(core.check().empty());
      CHECK(core.withdrawn_bytes() == growth.hole_bytes());
      CHECK(core.total_bytes() == growth.frontier_bytes());
      CHECK(vmm.committed_bytes() <= growth.maximum_bytes());
      std::size_t withdrawn_blocks = 0;
      for (auto const& [a, b] : core.blocks()) {  // the core may hand out every free byte
        if (b.st == reference_core::state::withdrawn) {
          ++withdrawn_blocks;
        } else {
          CHECK(vmm.is_committed(reinterpret_cast<std::byte*>(a), b.size));
        }
      }
      CHECK(withdrawn_blocks == growth.hole_count());
      for (std::uintptr_t q : {w, s, y, p}) {
        if (q != 0) { core.deallocate(q, 0); }
      }
      (void)growth.release(core);
      CHECK(vmm.committed_bytes() == 0);  // nothing lost
    }
  }
}
