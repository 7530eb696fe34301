// Sleep and wake of a virtual range (vmm's bookkeeping, tested through simulated_vmm): the
// physical memory goes, the reservation and the committed granules' record stay, and wake
// maps exactly those granules back at the same addresses; a pool above sees no change.
#include <catch2/catch.hpp>

#include <mrstack/spec.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/virtual_range.hpp>

#include <random>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = 2 * MiB;
}  // namespace

TEST_CASE("vmm sleep: the plain upstream gives back every granule and maps the same ones back") {
  auto const map_granules = GENERATE(std::size_t{1}, std::size_t{4});
  simulated_vmm_memory_resource vmm{64 * G, G, 64 * G, map_granules};
  void* a = vmm.allocate(3 * G);
  void* b = vmm.allocate(G + 1);  // two granules
  void* c = vmm.allocate(G);
  CHECK(vmm.committed_bytes() == 6 * G);
  std::size_t const maps_before = vmm.map_calls();

  vmm.sleep(true);
  CHECK(vmm.asleep());
  CHECK(vmm.keeps_contents());
  CHECK(vmm.committed_bytes() == 0);
  CHECK(vmm.mapped_bytes() == 0);
  CHECK(vmm.asleep_bytes() == 6 * G);
  CHECK(vmm.saved_bytes() == 6 * G);
  CHECK_FALSE(vmm.is_accessible(a, G));
  CHECK(vmm.map_calls() == vmm.unmap_calls());
  vmm.check_invariants();

  CHECK_THROWS_WITH(vmm.allocate(G), Catch::Contains("allocate while asleep") && Catch::Contains("wake()"));
  CHECK_THROWS_WITH(vmm.sleep(false), Catch::Contains("sleep while asleep"));
  vmm.deallocate(b, G + 1);  // bookkeeping only: those two granules are not mapped back
  CHECK(vmm.asleep_bytes() == 4 * G);
  CHECK(vmm.mapped_bytes() == 0);
  vmm.check_invariants();

  vmm.wake();
  CHECK_FALSE(vmm.asleep());
  CHECK(vmm.asleep_bytes() == 0);
  CHECK(vmm.committed_bytes() == 4 * G);
  CHECK(vmm.restored_bytes() == 4 * G);
  CHECK(vmm.is_accessible(a, 3 * G));
  CHECK(vmm.is_accessible(c, G));
  CHECK_FALSE(vmm.is_accessible(b, G));
  CHECK(vmm.map_calls() > maps_before);
  CHECK_THROWS_WITH(vmm.wake(), Catch::Contains("wake while awake"));
  vmm.check_invariants();
  void* d = vmm.allocate(2 * G);  // allocation works again, and reuses b's freed addresses
  CHECK(d == b);
  vmm.deallocate(d, 2 * G);
  vmm.deallocate(a, 3 * G);
  vmm.deallocate(c, G);
  CHECK(vmm.mapped_bytes() == 0);
  vmm.check_invariants();
}

TEST_CASE("vmm sleep: without keeping contents nothing is saved or restored") {
  simulated_vmm_memory_resource vmm{16 * G, G};
  void* a = vmm.allocate(2 * G);
  vmm.sleep(false);
  CHECK_FALSE(vmm.keeps_contents());
  CHECK(vmm.saved_bytes() == 0);
  vmm.wake();
  CHECK(vmm.restored_bytes() == 0);
  CHECK(vmm.is_accessible(a, 2 * G));
  vmm.deallocate(a, 2 * G);
}

TEST_CASE("vmm sleep: a claimed range forgets what is decommitted while asleep, and refuses commits") {
  simulated_vmm_memory_resource vmm{32 * G, G, 32 * G, 4};
  vmm.claim("test");
  std::byte* base = vmm.range_base();
  vmm.commit(base, 10 * G);
  vmm.decommit(base + 2 * G, 2 * G);  // stranded inside a run of 4: mapped, not committed
  CHECK(vmm.committed_bytes() == 8 * G);
  CHECK(vmm.mapped_bytes() == 10 * G);
  vmm.sleep(true);
  CHECK(vmm.saved_bytes() == 8 * G);  // stranded granules hold nothing worth keeping
  CHECK_THROWS_WITH(vmm.commit(base + 12 * G, G), Catch::Contains("commit while asleep"));
  CHECK(vmm.decommit(base + 5 * G, 2 * G) == 2 * G);  // splits the stretch [4, 10)
  CHECK(vmm.decommit(base + 5 * G, 2 * G) == 0);      // idempotent
  CHECK(vmm.asleep_bytes() == 6 * G);
  vmm.check_invariants();
  vmm.wake();
  CHECK(vmm.is_committed(base, 2 * G));
  CHECK_FALSE(vmm.is_committed(base + 2 * G, G));
  CHECK(vmm.is_committed(base + 4 * G, G));
  CHECK_FALSE(vmm.is_committed(base + 5 * G, 2 * G));
  CHECK(vmm.is_committed(base + 7 * G, 3 * G));
  CHECK(vmm.committed_bytes() == 6 * G);
  CHECK(vmm.mapped_bytes() == 6 * G);  // woken exactly: nothing stranded any more
  vmm.check_invariants();
  vmm.sleep(false);
  vmm.unclaim();  // nothing stays committed: the sleep ends with it
  CHECK(vmm.asleep_bytes() == 0);
  CHECK_FALSE(vmm.asleep());
  vmm.check_invariants();
}

TEST_CASE("vmm sleep: a pool over simulated_vmm keeps its blocks' addresses across the cycle") {
  auto stack = make_stack("pool > simulated_vmm(capacity=1GiB)");
  auto* range = find_virtual_range_resource(*stack);
  REQUIRE(range != nullptr);
  auto* sim = dynamic_cast<simulated_vmm_memory_resource*>(range);
  REQUIRE(sim != nullptr);
  std::mt19937 rng{7};
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < 200; ++i) {
    std::size_t const bytes = std::size_t{1} << (8 + rng() % 16);
    live.emplace_back(stack->allocate(bytes), bytes);
  }
  for (std::size_t i = 0; i < live.size(); i += 2) { stack->deallocate(live[i].first, live[i].second); }
  std::vector<std::pair<void*, std::size_t>> kept;
  for (std::size_t i = 1; i < live.size(); i += 2) { kept.push_back(live[i]); }
  std::size_t const mapped_before = sim->mapped_bytes();
  REQUIRE(mapped_before > 0);

  CHECK_FALSE(stack_asleep(*stack));
  sleep_stack(*stack, true);
  CHECK(stack_asleep(*stack));
  CHECK(sim->mapped_bytes() == 0);  // the footprint drops to nothing
  CHECK(sim->committed_bytes() == 0);
  CHECK(sim->asleep_bytes() <= mapped_before);  // the pool released its free granules first
  CHECK(sim->saved_bytes() == sim->asleep_bytes());
  for (auto const& [p, n] : kept) { CHECK_FALSE(sim->is_accessible(p, n)); }
  CHECK_THROWS_WITH(sleep_stack(*stack, true), Catch::Contains("already asleep"));
  // Growth would need a commit: refused while asleep.
  CHECK_THROWS_WITH(stack->allocate(std::size_t{512} << 20), Catch::Contains("while asleep"));
  // Frees are bookkeeping only.
  stack->deallocate(kept.back().first, kept.back().second);
  kept.pop_back();

  wake_stack(*stack);
  CHECK_FALSE(stack_asleep(*stack));
  CHECK(sim->mapped_bytes() > 0);
  CHECK(sim->mapped_bytes() <= mapped_before);
  CHECK(sim->restored_bytes() <= sim->saved_bytes());
  for (auto const& [p, n] : kept) { CHECK(sim->is_accessible(p, n)); }  // same addresses, backed again
  CHECK_THROWS_WITH(wake_stack(*stack), Catch::Contains("wake while awake"));
  sim->check_invariants();
  for (auto const& [p, n] : kept) { stack->deallocate(p, n); }
  void* again = stack->allocate(std::size_t{64} << 20);  // growth works again
  CHECK(sim->is_accessible(again, std::size_t{64} << 20));
  stack->deallocate(again, std::size_t{64} << 20);
}

TEST_CASE("vmm sleep: a stack without a virtual range says so") {
  auto stack = make_stack("pool > simulated");
  CHECK(find_virtual_range_resource(*stack) == nullptr);
  CHECK_FALSE(stack_asleep(*stack));
  CHECK_THROWS_WITH(sleep_stack(*stack, true), Catch::Contains("has no vmm") && Catch::Contains("pool > simulated"));
  CHECK_THROWS_WITH(wake_stack(*stack), Catch::Contains("has no vmm"));
}

TEST_CASE("vmm sleep: after a wake, freeing one plain allocation gives its granules back at once") {
  // Woken, two neighbouring allocations were mapped as one run: freeing the first kept its
  // granule mapped (mapped 4 MiB for 2 MiB committed) until the second was freed too.
  for (bool cycle : {false, true}) {
    CAPTURE(cycle);
    simulated_vmm_memory_resource vmm{64 * MiB};  // 2 MiB granules, 16 granules a map
    void* a = vmm.allocate(2 * MiB);
    void* b = vmm.allocate(2 * MiB);
    if (cycle) {
      vmm.sleep(false);
      vmm.wake();
    }
    vmm.deallocate(a, 2 * MiB);
    CHECK(vmm.committed_bytes() == 2 * MiB);
    CHECK(vmm.mapped_bytes() == 2 * MiB);
    vmm.deallocate(b, 2 * MiB);
    CHECK(vmm.mapped_bytes() == 0);
  }
}
