// The tracking adaptor: it reports exactly the allocations left outstanding (also from 8
// threads), rejects foreign, double and wrong-size frees without forwarding them, groups
// leaks by symbolized call site, and writes a leak report at destruction.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/detail/stack_trace.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

std::string hex(void const* p) {
  std::ostringstream os;
  os << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return os.str();
}

// Two distinct call sites for the stack tests. noipa keeps each a frame of its own (no
// inlining, and no identical-code folding of the two).
[[gnu::noipa]] void* leak_from_site_alpha(memory_resource& mr, std::size_t bytes) {
  void* p = mr.allocate(bytes);
  asm volatile("" ::: "memory");  // no tail call: this frame stays on the stack
  return p;
}
[[gnu::noipa]] void* leak_from_site_beta(memory_resource& mr, std::size_t bytes) {
  void* p = mr.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}

bool mentions(std::vector<std::string> const& stack, std::string const& what) {
  return std::any_of(stack.begin(), stack.end(), [&](std::string const& f) { return f.find(what) != std::string::npos; });
}

}  // namespace

TEST_CASE("tracking: outstanding() lists exactly what was not freed") {
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  CHECK(track.name() == "tracking");
  CHECK(track.upstream() == sim.get());
  CHECK_FALSE(track.captures_stacks());
  std::mt19937_64 rng{5};
  std::map<void*, std::size_t> live;
  std::map<void*, std::size_t> alignment_of;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      std::size_t const n = 1 + rng() % 10000;
      std::size_t const align = std::size_t{256} << (rng() % 3);
      void* p = track.allocate(n, reinterpret_cast<cudaStream_t>(std::uintptr_t{0x40}), align);
      live.emplace(p, n);
      alignment_of[p] = align;
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      track.deallocate(it->first, it->second, {}, alignment_of[it->first]);
      live.erase(it);
    }
    if (i % 500 == 0) {
      REQUIRE(track.outstanding_count() == live.size());
    }
  }
  auto const all = track.outstanding();
  REQUIRE(all.size() == live.size());
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < all.size(); ++k) {
    auto it = live.find(all[k].pointer);
    REQUIRE(it != live.end());
    CHECK(all[k].bytes == it->second);
    CHECK(all[k].alignment == alignment_of[all[k].pointer]);
    CHECK(all[k].stream == 0x40);
    CHECK(all[k].stack.empty());
    if (k > 0) { CHECK(all[k - 1].sequence < all[k].sequence); }  // oldest first
    bytes += it->second;
  }
  CHECK(track.outstanding_bytes() == bytes);
  CHECK(sim->allocation_count() == live.size());
  for (auto const& a : all) { track.deallocate(a.pointer, a.bytes, {}, a.alignment); }
  CHECK(track.outstanding_count() == 0);
  CHECK(track.outstanding_bytes() == 0);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("tracking: foreign, double and wrong-size frees are logic errors and never reach the upstream") {
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  void* mine = track.allocate(1000);
  void* theirs = sim->allocate(512);  // live in the upstream, but not handed out by the tracker

  SECTION("a pointer it never handed out") {
    try {
      track.deallocate(theirs, 512);
      FAIL("foreign free accepted");
    } catch (logic_error const& e) {
      CHECK_THAT(e.what(), Catch::StartsWith("tracking:") && Catch::Contains(hex(theirs)) && Catch::Contains("512 B") &&
                               Catch::Contains("never handed out"));
    }
    CHECK(sim->owns(theirs));  // not forwarded: the upstream still has it live
  }
  SECTION("a wrong size") {
    try {
      track.deallocate(mine, 999);
      FAIL("wrong-size free accepted");
    } catch (logic_error const& e) {
      CHECK_THAT(e.what(), Catch::Contains(hex(mine)) && Catch::Contains("size 999 B") &&
                               Catch::Contains("allocated with size 1000 B"));
    }
    CHECK(sim->owns(mine));
    CHECK(track.outstanding_count() == 1);  // still tracked, and still freeable correctly
  }
  SECTION("a wrong alignment") {
    CHECK_THROWS_WITH(track.deallocate(mine, 1000, {}, 4096), Catch::Contains("alignment 4096"));
    CHECK(sim->owns(mine));
  }
  SECTION("a double free") {
    track.deallocate(mine, 1000);
    CHECK_THROWS_WITH(track.deallocate(mine, 1000), Catch::Contains(hex(mine)) && Catch::Contains("taken back"));
    mine = track.allocate(1000);
  }
  track.deallocate(mine, 1000);
  sim->deallocate(theirs, 512);
  CHECK(track.outstanding_count() == 0);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("tracking: 8 threads — exactly the leaked allocations remain") {
  constexpr int threads = 8;
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  std::mutex m;
  std::map<void*, std::size_t> leaked;
  std::atomic<int> rejected{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 17};
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 5000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          std::size_t const n = 1 + rng() % 5000;
          mine.emplace_back(track.allocate(n), n);
        } else {
          std::size_t const k = rng() % mine.size();
          if (rng() % 50 == 0) {  // now and then, a wrong size first: rejected, nothing changes
            try {
              track.deallocate(mine[k].first, mine[k].second + 1);
            } catch (logic_error const&) {
              rejected.fetch_add(1);
            }
          }
          track.deallocate(mine[k].first, mine[k].second);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      std::lock_guard lock{m};
      for (auto const& [p, n] : mine) { leaked.emplace(p, n); }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(rejected.load() > 0);
  auto const all = track.outstanding();
  REQUIRE(all.size() == leaked.size());
  std::set<std::uint64_t> sequences;
  for (auto const& a : all) {
    auto it = leaked.find(a.pointer);
    REQUIRE(it != leaked.end());
    CHECK(a.bytes == it->second);
    sequences.insert(a.sequence);
  }
  CHECK(sequences.size() == all.size());
  CHECK(sim->allocation_count() == leaked.size());
  for (auto const& [p, n] : leaked) { track.deallocate(p, n); }
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("tracking: call sites are grouped by stack, named, and ranked by bytes") {
  auto sys = std::make_shared<system_memory_resource>();
  tracking_resource_adaptor track{sys, /*capture_stacks=*/true};
  CHECK(track.captures_stacks());
  std::vector<std::pair<void*, std::size_t>> held;
  // Counts the compiler cannot see, so each loop keeps one call instruction (one stack).
  int volatile alphas = 3;
  int volatile betas = 2;
  for (int i = 0; i < alphas; ++i) { held.emplace_back(leak_from_site_alpha(track, 1000), 1000); }
  for (int i = 0; i < betas; ++i) { held.emplace_back(leak_from_site_beta(track, 5000), 5000); }
  auto const sites = track.call_sites();
  REQUIRE(sites.size() == 2);
  CHECK(sites[0].count == 2);
  CHECK(sites[0].bytes == 10000);
  CHECK(mentions(sites[0].stack, "leak_from_site_beta"));
  CHECK_FALSE(mentions(sites[0].stack, "leak_from_site_alpha"));
  CHECK(sites[1].count == 3);
  CHECK(sites[1].bytes == 3000);
  CHECK(mentions(sites[1].stack, "leak_from_site_alpha"));
  // Innermost frame first: the adaptor's own frames are skipped, the caller is near the top.
  REQUIRE(!sites[1].stack.empty());
  auto const pos = std::find_if(sites[1].stack.begin(), sites[1].stack.end(),
                                [](std::string const& f) { return f.find("leak_from_site_alpha") != std::string::npos; });
  CHECK(pos - sites[1].stack.begin() <= 2);
  // Each frame names its module and offset for addr2line.
  CHECK_THAT(sites[1].stack.front(), Catch::Contains("(") && Catch::Contains("+0x"));

  auto const text = track.report();
  CHECK_THAT(text, Catch::Contains("5 allocations outstanding") && Catch::Contains("13000 B") &&
                       Catch::Contains("top 2 of 2 call sites") && Catch::Contains("leak_from_site_beta"));
  CHECK(text.find("leak_from_site_beta") < text.find("leak_from_site_alpha"));  // most bytes first
  for (auto const& [p, n] : held) { track.deallocate(p, n); }
  CHECK(track.call_sites().empty());
  CHECK_THAT(track.report(), Catch::Contains("0 allocations outstanding"));
}

TEST_CASE("tracking: a leak report at destruction — count, bytes, top call sites") {
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  void* a = nullptr;
  void* b = nullptr;
  {
    tracking_resource_adaptor track{sim, true, /*report_leaks=*/true, &out};
    a = leak_from_site_alpha(track, 4096);
    b = leak_from_site_beta(track, 100);
    void* c = track.allocate(64);
    track.deallocate(c, 64);
  }
  std::string const text = out.str();
  CHECK_THAT(text, Catch::Contains("leak report (tracking > simulated)") && Catch::Contains("2 allocations outstanding") &&
                       Catch::Contains("4196 B") && Catch::Contains("leak_from_site_alpha") &&
                       Catch::Contains(hex(a)) && Catch::Contains(hex(b)));
  sim->deallocate(a, 4096);
  sim->deallocate(b, 100);

  // Nothing outstanding: no report at all.
  std::ostringstream quiet;
  { tracking_resource_adaptor track{sim, false, true, &quiet}; }
  CHECK(quiet.str().empty());
}

TEST_CASE("tracking: without stacks the report says how to get them") {
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  void* p = track.allocate(300);
  auto const sites = track.call_sites();
  REQUIRE(sites.size() == 1);
  CHECK(sites[0].stack.empty());
  CHECK_THAT(track.report(), Catch::Contains("capture_stacks = true") && Catch::Contains("300 B"));
  track.deallocate(p, 300);
  CHECK_THROWS_WITH(tracking_resource_adaptor(nullptr), Catch::Contains("upstream"));
}

TEST_CASE("stack_trace: frames resolve to function names in this executable") {
  void* frames[8];
  std::size_t const n = detail::capture_stack(frames, 8, 0);
  REQUIRE(n > 0);
  // The innermost frame is this test case's function (Catch names it ____C_A_T_C_H...).
  std::string const first = detail::describe_frame(frames[0]);
  CHECK_THAT(first, Catch::Contains("C_A_T_C_H") && Catch::Contains("test_adaptor_tracking+0x"));
  CHECK(detail::capture_stack(frames, 8, 1000) == 0);
  CHECK_THAT(detail::describe_frame(reinterpret_cast<void*>(std::uintptr_t{0x10})), Catch::Contains("0x10"));
}

namespace {

/// Any size succeeds at a made-up address that is never touched (a size-blind stand-in).
class made_up_addresses final : public memory_resource {
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  void* do_allocate(std::size_t, std::size_t, stream_view) override {
    next_ += 4096;
    return reinterpret_cast<void*>(next_);
  }
  void do_deallocate(void*, std::size_t, std::size_t, stream_view) override {}
  std::string do_name() const override { return "made_up_addresses"; }
};

}  // namespace

TEST_CASE("tracking: outstanding bytes past SIZE_MAX read SIZE_MAX, never a wrapped sum") {
  // Two allocations of 2^63 in one shard summed to 0 bytes outstanding.
  tracking_resource_adaptor track{std::make_shared<made_up_addresses>(), false, false};
  std::size_t const half = std::size_t{1} << 63;
  void* a = track.allocate(half);
  void* b = track.allocate(half);
  CHECK(track.outstanding_count() == 2);
  CHECK(track.outstanding_bytes() == std::numeric_limits<std::size_t>::max());
  CHECK(track.call_sites().at(0).bytes == std::numeric_limits<std::size_t>::max());
  CHECK_THAT(track.report(), Catch::Contains("2 allocations outstanding"));
  track.deallocate(a, half);
  CHECK(track.outstanding_bytes() == half);
  track.deallocate(b, half);
  CHECK(track.outstanding_bytes() == 0);
}
