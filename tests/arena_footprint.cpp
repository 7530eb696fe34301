// The arena's on-demand growth judged by footprint on a real allocation log: a PyTorch
// ResNet-50 training run (data/torch_resnet50_train.csv.gz, 9,094 events, one stream,
// 5.37 GiB live at peak). Replayed over an arena on the `simulated` upstream, the peak
// footprint (bytes taken from the upstream) must stay within 1.25x of the peak live bytes
// (an arena taking half an 80 GiB device up front held 12.98x); the eager arena still
// takes its whole size at once. Settings sweep (prints a table): test_arena_footprint "[policy]"
#include <catch2/catch.hpp>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

std::string log_path() {
  std::string const name = "data/torch_resnet50_train.csv.gz";
  if (char const* dir = std::getenv("MRSTACK_DATA_DIR")) { return std::string{dir} + "/torch_resnet50_train.csv.gz"; }
  std::string const here = __FILE__;  // <source>/tests/arena_footprint.cpp, maybe relative to the build directory
  std::string const from_source = here.substr(0, here.rfind("/tests/") + 1) + name;
  // ctest runs this in <build>/tests: a relative __FILE__ is then one level off.
  for (std::string const& candidate : {from_source, "../" + from_source, "../../../" + name, "../../" + name}) {
    if (std::FILE* f = std::fopen(candidate.c_str(), "rb")) {
      std::fclose(f);
      return candidate;
    }
  }
  return from_source;
}

allocation_log const& the_log() {
  static allocation_log const log = read_allocation_log(log_path());
  return log;
}

struct replay_result {
  std::size_t peak_live = 0;
  std::size_t peak_footprint = 0;
  std::size_t upstream_allocations = 0;
  std::size_t upstream_deallocations = 0;
  [[nodiscard]] double ratio() const { return static_cast<double>(peak_footprint) / static_cast<double>(peak_live); }
};

replay_result replay(arena_options const& options, std::size_t arena_size = 40 * GiB) {
  auto const& log = the_log();
  auto sim = std::make_shared<simulated_memory_resource>(80 * GiB);
  replay_result r;
  {
    arena_memory_resource mr{sim, arena_size, options};
    std::vector<void*> pointers(log.allocation_count, nullptr);
    std::size_t live = 0;
    for (auto const& e : log.events) {
      if (e.action == log_action::allocate) {
        pointers[e.allocation] = mr.allocate(e.bytes);
        live += e.bytes;
        r.peak_live = std::max(r.peak_live, live);
      } else {
        mr.deallocate(pointers[e.allocation], e.bytes);
        live -= e.bytes;
      }
      REQUIRE(mr.held_bytes() <= mr.arena_size() + options.superblock_size);
    }
    REQUIRE(mr.check_invariants() == "");
    auto const st = mr.stats();
    r.upstream_allocations = st.upstream_allocations;
    r.upstream_deallocations = st.upstream_deallocations;
  }
  r.peak_footprint = sim->peak_footprint();
  CHECK(sim->footprint() == 0);  // destruction gave everything back
  return r;
}

}  // namespace

TEST_CASE("arena footprint: a real PyTorch training log replays within 1.25x of its peak live bytes") {
  replay_result const r = replay(arena_options{});
  std::printf("torch_resnet50_train over arena: peak live %.1f MiB, peak footprint %.1f MiB, ratio %.3f, "
              "%zu chunks taken, %zu given back\n",
              static_cast<double>(r.peak_live) / MiB, static_cast<double>(r.peak_footprint) / MiB, r.ratio(),
              r.upstream_allocations, r.upstream_deallocations);
  CHECK(r.ratio() >= 1.0);  // a footprint below the live bytes would mean overlapping blocks
  CHECK(r.ratio() <= 1.25);
}

TEST_CASE("arena footprint: eager takes the whole size at construction, in one upstream call") {
  arena_options options;
  options.eager = true;
  replay_result const r = replay(options, 8 * GiB);
  CHECK(r.peak_footprint == 8 * GiB + options.superblock_size - 256);
  CHECK(r.upstream_allocations == 1);
  CHECK(r.upstream_deallocations == 0);
}

TEST_CASE("arena footprint: the free-bytes bound and growth settings", "[.][policy]") {
  std::printf("%12s %10s %12s %8s %8s %8s\n", "max_free", "divisor", "min_growth", "ratio", "taken", "returned");
  for (std::size_t max_free : {64 * MiB, 256 * MiB, 1 * GiB}) {
    for (std::size_t divisor : {std::size_t{4}, std::size_t{12}, std::size_t{32}}) {
      for (std::size_t min_growth : {8 * MiB, 32 * MiB}) {
        arena_options options;
        options.max_free_bytes = max_free;
        options.growth_divisor = divisor;
        options.minimum_growth = min_growth;
        replay_result const r = replay(options);
        std::printf("%9zu MiB %10zu %8zu MiB %8.3f %8zu %8zu\n", max_free / MiB, divisor, min_growth / MiB, r.ratio(),
                    r.upstream_allocations, r.upstream_deallocations);
      }
    }
  }
}
