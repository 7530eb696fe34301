// Footprint of a real workload (data/torch_resnet50_train.csv.gz, a PyTorch ResNet-50
// training log) over in-place growth on simulated_vmm: the physical memory a vmm-backed
// pool would hold at its peak, against the peak of live bytes. The target is
// <= 1.05x on the GPU; the simulation replays the same bookkeeping the device would do.
#include <catch2/catch.hpp>

#include <mrstack/detail/in_place_growth.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <alloc_log.hpp>
#include <reference_core.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct replay_result {
  std::size_t peak_mapped = 0;
  std::size_t map_calls = 0;
  std::size_t unmap_calls = 0;
  std::size_t releases = 0;
};

// Replays `log` (several passes: a training loop repeats) over the reference core.
replay_result replay_reference(test::alloc_log const& log, detail::in_place_growth_options const& options, int passes,
                               std::size_t map_granules = 1) {
  simulated_vmm_memory_resource vmm{simulated_vmm_memory_resource::default_reserve,
                                    simulated_vmm_memory_resource::default_granularity,
                                    std::numeric_limits<std::size_t>::max(), map_granules};
  test::reference_core core;
  detail::in_place_growth<test::reference_core> growth{vmm, "replay", options};
  std::vector<std::uintptr_t> address(log.allocation_count, 0);
  for (int pass = 0; pass < passes; ++pass) {
    for (auto const& e : log.events) {
      std::size_t const size = detail::align_up(e.bytes, 256);
      if (e.allocate) {
        std::uintptr_t p = core.allocate(size, 256, 0);
        if (p == 0) {
          growth.grow(core, size, 256, 0);
          p = core.allocate(size, 256, 0);
          REQUIRE(p != 0);
        }
        address[e.id] = p;
      } else {
        REQUIRE(core.deallocate(address[e.id], 0) == size);
        growth.after_deallocate(core);
      }
    }
  }
  replay_result r{vmm.peak_mapped_bytes(), vmm.map_calls(), vmm.unmap_calls(), growth.release_count()};
  growth.release(core);
  CHECK(vmm.committed_bytes() == 0);  // the log frees everything: a release gives it all back
  return r;
}

}  // namespace

TEST_CASE("footprint: ResNet-50 training log over in-place growth (reference best-fit core)") {
  auto const log = test::read_alloc_log(test::data_dir() / "torch_resnet50_train.csv.gz");
  REQUIRE(log.events.size() > 9000);
  REQUIRE(log.peak_live_bytes > 5000 * MiB);
  struct setting {
    char const* name;
    std::size_t threshold;
  };
  for (std::size_t map_granules : {1, 16}) {
    for (auto const& s : {setting{"no threshold", std::numeric_limits<std::size_t>::max()},
                          setting{"threshold 256 MiB", 256 * MiB}, setting{"threshold 64 MiB", 64 * MiB},
                          setting{"threshold 0", 0}}) {
      detail::in_place_growth_options options;
      options.release_threshold = s.threshold;
      auto const r = replay_reference(log, options, 3, map_granules);
      double const ratio = static_cast<double>(r.peak_mapped) / static_cast<double>(log.peak_live_bytes);
      std::printf("resnet50 x3, reference core, map_granules %2zu, %-18s peak mapped %8.1f MiB / peak live %8.1f MiB = "
                  "%.4fx; %zu maps, %zu unmaps, %zu releases\n",
                  map_granules, s.name, static_cast<double>(r.peak_mapped) / MiB,
                  static_cast<double>(log.peak_live_bytes) / MiB, ratio, r.map_calls, r.unmap_calls, r.releases);
      CHECK(ratio >= 1.0);
      if (s.threshold == std::numeric_limits<std::size_t>::max()) { CHECK(ratio <= 1.05); }
    }
  }
}

TEST_CASE("footprint: ResNet-50 training log over pool > simulated_vmm is within 1.05x of peak live") {
  auto const log = test::read_alloc_log(test::data_dir() / "torch_resnet50_train.csv.gz");
  for (std::size_t map_granules : {1, 16}) {
    auto vmm = std::make_shared<simulated_vmm_memory_resource>(simulated_vmm_memory_resource::default_reserve,
                                                               simulated_vmm_memory_resource::default_granularity,
                                                               std::numeric_limits<std::size_t>::max(), map_granules);
    pool_memory_resource pool{vmm};
    REQUIRE(pool.grows_in_place());
    std::vector<void*> address(log.allocation_count, nullptr);
    int const passes = 3;
    double first_pass_ns = 0;
    double later_pass_ns = 0;
    for (int pass = 0; pass < passes; ++pass) {
      auto const t0 = std::chrono::steady_clock::now();
      for (auto const& e : log.events) {
        if (e.allocate) {
          address[e.id] = pool.allocate(e.bytes);
        } else {
          pool.deallocate(address[e.id], e.bytes);
        }
      }
      double const ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                        static_cast<double>(log.events.size());
      (pass == 0 ? first_pass_ns : later_pass_ns) += pass == 0 ? ns : ns / (passes - 1);
    }
    double const ratio = static_cast<double>(vmm->peak_mapped_bytes()) / static_cast<double>(log.peak_live_bytes);
    std::printf("resnet50 x%d, pool > simulated_vmm(map_granules=%zu): peak mapped %.1f MiB / peak live %.1f MiB = "
                "%.4fx; %zu maps; %.0f ns/event first pass, %.0f ns/event later (CPU, simulated)\n",
                passes, map_granules, static_cast<double>(vmm->peak_mapped_bytes()) / MiB,
                static_cast<double>(log.peak_live_bytes) / MiB, ratio, vmm->map_calls(), first_pass_ns, later_pass_ns);
    CHECK(ratio <= 1.05);
    CHECK(pool.used_bytes() == 0);
    pool.release();
    CHECK(vmm->committed_bytes() == 0);
    CHECK(vmm->mapped_bytes() == 0);
  }
}
