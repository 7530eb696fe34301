// simulated_vmm (and through it everything vmm shares with it): the plain-upstream path,
// the virtual_range capability (claim, commit, decommit), capacity, accounting and the
// helpers an IPC path uses to recognise virtual-range memory.
#include <catch2/catch.hpp>

#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <map>
#include <memory>
#include <random>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = 2 * MiB;

std::byte* at(virtual_range const& r, std::size_t offset) { return r.range_base() + offset; }
}  // namespace

TEST_CASE("simulated_vmm: defaults: 2 MiB granules, 16 per physical allocation, like vmm on current GPUs") {
  simulated_vmm_memory_resource vmm;
  CHECK(vmm.granularity() == 2 * MiB);
  CHECK(vmm.map_granules() == 16);
  CHECK(vmm.range_bytes() == std::size_t{1} << 40);
}

TEST_CASE("simulated_vmm: as a plain upstream, allocations are whole granules, committed, and checked") {
  simulated_vmm_memory_resource vmm{64 * G};
  CHECK(vmm.name() == "simulated_vmm");
  CHECK(vmm.kind() == memory_kind::none);
  CHECK(vmm.granularity() == G);
  CHECK(vmm.range_bytes() == 64 * G);
  void* a = vmm.allocate(1);
  void* b = vmm.allocate(3 * MiB);
  CHECK(detail::is_aligned(a, G));
  CHECK(detail::is_aligned(b, G));
  CHECK(vmm.committed_bytes() == 3 * G);  // 1 B -> one granule, 3 MiB -> two
  CHECK(vmm.mapped_bytes() == 3 * G);
  CHECK(vmm.is_accessible(a, G));
  CHECK(vmm.is_accessible(b, 2 * G));
  CHECK(vmm.owns(a));
  CHECK_THROWS_WITH(vmm.deallocate(b, 3 * MiB + 1), Catch::Contains("allocated with 3145728 B"));
  int local = 0;
  CHECK_THROWS_WITH(vmm.deallocate(&local, 4), Catch::Contains("did not hand out"));
  vmm.deallocate(a, 1);
  CHECK(vmm.committed_bytes() == 2 * G);
  CHECK_FALSE(vmm.is_accessible(a, 1));
  CHECK_THROWS_WITH(vmm.deallocate(a, 1), Catch::Contains("already freed"));
  void* big_aligned = vmm.allocate(G, {}, 8 * G);
  CHECK(detail::is_aligned(big_aligned, 8 * G));
  CHECK_THROWS_WITH(vmm.deallocate(big_aligned, G),
                    Catch::Contains("with size 2097152 B and alignment 256, but it was allocated with 2097152 B and "
                                    "alignment 16777216 (nothing was freed)"));
  CHECK(vmm.committed_bytes() == 3 * G);
  vmm.deallocate(big_aligned, G, {}, 8 * G);
  vmm.deallocate(b, 3 * MiB);
  CHECK(vmm.mapped_bytes() == 0);
  CHECK(vmm.map_calls() == vmm.unmap_calls());
  CHECK(vmm.peak_mapped_bytes() == 3 * G);
  vmm.check_invariants();
}

TEST_CASE("simulated_vmm: capacity and range exhaustion refuse with out_of_memory that says which") {
  simulated_vmm_memory_resource vmm{8 * G, G, 4 * G};
  void* a = vmm.allocate(3 * G);
  try {
    (void)vmm.allocate(2 * G);
    FAIL("mapped past capacity");
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), Catch::Contains("capacity reached"));
    CHECK(e.info().limit_bytes == 4 * G);
  }
  CHECK(vmm.mapped_bytes() == 3 * G);  // the failed allocation left nothing mapped
  vmm.check_invariants();
  vmm.deallocate(a, 3 * G);
  CHECK_THROWS_WITH(vmm.allocate(9 * G), Catch::Contains("larger than its reserved range"));
  std::vector<void*> blocks;
  simulated_vmm_memory_resource roomy{4 * G};
  for (int i = 0; i < 4; ++i) { blocks.push_back(roomy.allocate(G)); }
  CHECK_THROWS_WITH(roomy.allocate(1), Catch::Contains("no free stretch"));
  roomy.deallocate(blocks[1], G);
  roomy.deallocate(blocks[2], G);
  void* two = roomy.allocate(2 * G);  // the freed neighbours coalesced
  CHECK(two == blocks[1]);
  roomy.deallocate(two, 2 * G);
  roomy.deallocate(blocks[0], G);
  roomy.deallocate(blocks[3], G);
}

constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

TEST_CASE("simulated_vmm: commit touches, decommit gives back only whole granules inside") {
  simulated_vmm_memory_resource vmm{64 * G, G, unlimited, 1};  // one granule per mapping: exact release
  CHECK_THROWS_WITH(vmm.commit(at(vmm, 0), G), Catch::Contains("without a claim"));
  vmm.claim("test");
  CHECK(vmm.claimant() == "test");
  CHECK_THROWS_WITH(vmm.claim("other"), Catch::Contains("already claimed by test"));
  CHECK_THROWS_WITH(vmm.allocate(1), Catch::Contains("claimed by test"));

  CHECK(vmm.commit(at(vmm, G - 1), 2) == 2 * G);  // two bytes straddling a boundary touch two granules
  CHECK(vmm.commit(at(vmm, G), 10) == 0);         // idempotent
  CHECK(vmm.is_committed(at(vmm, 0), 2 * G));
  CHECK(vmm.commit(at(vmm, 0), 5 * G + 1) == 4 * G);
  CHECK(vmm.committed_bytes() == 6 * G);
  CHECK(vmm.is_accessible(at(vmm, 0), 6 * G));

  CHECK(vmm.decommit(at(vmm, 1), G) == 0);                  // [1, G+1) holds no whole granule
  CHECK(vmm.decommit(at(vmm, G - 1), 2 * G + 2) == 2 * G);  // wholly holds granules 1 and 2
  CHECK_FALSE(vmm.is_committed(at(vmm, G), 1));
  CHECK(vmm.is_committed(at(vmm, 0), G));
  CHECK(vmm.is_committed(at(vmm, 3 * G), 3 * G));
  CHECK(vmm.mapped_bytes() == 4 * G);
  CHECK_THROWS_WITH(vmm.commit(at(vmm, 63 * G), G + 1), Catch::Contains("outside its reserved range"));
  int local = 0;
  CHECK_THROWS_WITH(vmm.decommit(&local, 4), Catch::Contains("outside its reserved range"));
  vmm.check_invariants();

  vmm.unclaim();  // gives back what the claimant left committed
  CHECK(vmm.mapped_bytes() == 0);
  CHECK(vmm.claimant().empty());
  void* a = vmm.allocate(1);
  CHECK_THROWS_WITH(vmm.claim("pool"), Catch::Contains("1 allocations from it are outstanding"));
  vmm.deallocate(a, 1);
}

TEST_CASE("simulated_vmm: decommit of 1 byte short of a granule keeps it (the [ptr, ptr+bytes) edge)") {
  simulated_vmm_memory_resource vmm{8 * G};
  vmm.claim("test");
  vmm.commit(at(vmm, 0), 8 * G);
  CHECK(vmm.decommit(at(vmm, 0), G - 1) == 0);
  CHECK(vmm.decommit(at(vmm, 0), G) == G);
  CHECK(vmm.decommit(at(vmm, 7 * G + 1), G - 1) == 0);
  CHECK(vmm.decommit(at(vmm, 7 * G), G) == G);
  CHECK(vmm.committed_bytes() == 6 * G);
  vmm.unclaim();
}

TEST_CASE("simulated_vmm: several granules per physical allocation strand until wholly free") {
  simulated_vmm_memory_resource vmm{64 * G, G, unlimited, 4};
  CHECK(vmm.map_granules() == 4);
  vmm.claim("test");
  vmm.commit(at(vmm, 0), 8 * G);
  CHECK(vmm.map_calls() == 2);
  CHECK(vmm.decommit(at(vmm, 0), 3 * G) == 3 * G);
  CHECK(vmm.committed_bytes() == 5 * G);
  CHECK(vmm.mapped_bytes() == 8 * G);  // granules 0..2 are stranded in the run [0, 4)
  CHECK(vmm.free_bytes_held() == 3 * G);
  CHECK(vmm.unmap_calls() == 0);
  CHECK(vmm.decommit(at(vmm, 3 * G), G) == G);
  CHECK(vmm.unmap_calls() == 1);
  CHECK(vmm.mapped_bytes() == 4 * G);
  vmm.check_invariants();
  vmm.unclaim();
}

TEST_CASE("simulated_vmm: a commit past capacity maps nothing new, then succeeds once room is made") {
  simulated_vmm_memory_resource vmm{64 * G, G, 10 * G, 1};
  vmm.claim("test");
  vmm.commit(at(vmm, 0), 6 * G);
  CHECK_THROWS_AS(vmm.commit(at(vmm, 4 * G), 8 * G), out_of_memory);  // needs 6 more, 4 left
  CHECK(vmm.committed_bytes() == 6 * G);
  CHECK(vmm.mapped_bytes() == 6 * G);
  vmm.check_invariants();
  vmm.decommit(at(vmm, 0), 2 * G);
  CHECK(vmm.commit(at(vmm, 4 * G), 8 * G) == 6 * G);
  CHECK(vmm.mapped_bytes() == 10 * G);
  vmm.unclaim();
}

TEST_CASE("simulated_vmm: IPC paths can recognise virtual-range memory from the stack or the pointer") {
  auto vmm = std::make_shared<simulated_vmm_memory_resource>(16 * G);
  simulated_memory_resource plain;
  void* p = vmm->allocate(100);
  void* q = plain.allocate(100);
  CHECK(find_virtual_range(*vmm, p) == vmm.get());
  CHECK(find_virtual_range(*vmm, q) == nullptr);
  CHECK(find_virtual_range(plain, q) == nullptr);
  CHECK(is_virtual_range_address(p));
  CHECK(is_virtual_range_address(static_cast<std::byte*>(p) + 5));
  CHECK_FALSE(is_virtual_range_address(q));
  auto const base = vmm->range_base();
  vmm->deallocate(p, 100);
  plain.deallocate(q, 100);
  vmm.reset();
  CHECK_FALSE(is_virtual_range_address(base));  // a destroyed range is forgotten
}

TEST_CASE("simulated_vmm: instances get disjoint fake ranges, and addresses are reused after destruction") {
  std::vector<std::unique_ptr<simulated_vmm_memory_resource>> many;
  for (int i = 0; i < 40; ++i) { many.push_back(std::make_unique<simulated_vmm_memory_resource>()); }  // 40 TiB
  for (std::size_t i = 1; i < many.size(); ++i) {
    auto const prev_end = reinterpret_cast<std::uintptr_t>(many[i - 1]->range_base()) + many[i - 1]->range_bytes();
    CHECK(reinterpret_cast<std::uintptr_t>(many[i]->range_base()) >= prev_end);
  }
  auto const first = many.front()->range_base();
  many.front().reset();
  simulated_vmm_memory_resource again;
  CHECK(again.range_base() == first);
}

TEST_CASE("simulated_vmm: a free with another alignment is refused, naming both, and frees nothing") {
  simulated_vmm_memory_resource vmm{std::size_t{1} << 30};
  void* p = vmm.allocate(1000, {}, 256);
  CHECK_THROWS_WITH(vmm.deallocate(p, 1000, {}, std::size_t{1} << 30),
                    Catch::Contains("deallocate of " + format_hex(p) + " with size 1000 B and alignment 1073741824") &&
                        Catch::Contains("allocated with 1000 B and alignment 256"));
  CHECK(vmm.committed_bytes() == G);
  vmm.deallocate(p, 1000, {}, 16);  // alignments below 256 count as 256, as everywhere
  CHECK(vmm.committed_bytes() == 0);
  vmm.check_invariants();
}

TEST_CASE("simulated_vmm: is_accessible of a span reaching past the address space is false") {
  simulated_vmm_memory_resource vmm{std::size_t{1} << 30};
  void* w = vmm.allocate(3 * MiB);
  CHECK(vmm.is_accessible(w, 3 * MiB));
  CHECK_FALSE(vmm.is_accessible(static_cast<char*>(w) + 3 * MiB, unlimited - 1));  // offset + bytes wraps
  CHECK_FALSE(vmm.is_accessible(w, unlimited));
  vmm.deallocate(w, 3 * MiB);
}

TEST_CASE("simulated_vmm: out_of_memory names the caller's request, its alignment and the real cause") {
  simulated_vmm_memory_resource vmm{std::size_t{1} << 30, G, G, 16};
  // An alignment no address of the range meets is not a matter of reserving more.
  std::size_t const huge = std::size_t{1} << 63;  // fake ranges lie in [2^62, 0x7 << 60): none is aligned to it
  try {
    (void)vmm.allocate(1, {}, huge);
    FAIL("allocated with an alignment the range cannot meet");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == 1);
    CHECK_THAT(e.what(), Catch::Contains("alignment " + std::to_string(huge)) && Catch::Contains("cannot be met") &&
                             !Catch::Contains("no free stretch"));
  }
  // Capacity: the caller asked for 1 B; the backend's mapping of a whole granule failed.
  void* first = vmm.allocate(1);
  try {
    (void)vmm.allocate(1);
    FAIL("mapped past capacity");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == 1);
    CHECK(e.info().limit_bytes == G);
    CHECK_THAT(e.what(), Catch::Contains("could not allocate 1 B") && Catch::Contains("alignment 256") &&
                             Catch::Contains("physical allocation of 2.00 MiB") && Catch::Contains("capacity reached"));
  }
  vmm.deallocate(first, 1);
  vmm.claim("test");
  vmm.commit(at(vmm, 0), G);
  try {
    (void)vmm.commit(at(vmm, G), 100);
    FAIL("committed past capacity");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == 100);
    CHECK_THAT(e.what(), Catch::Contains("committing [") && Catch::Contains("capacity reached"));
  }
  vmm.unclaim();
  vmm.check_invariants();
}

TEST_CASE("simulated_vmm: bad parameters name themselves") {
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(G, 3000), Catch::Contains("granularity 3000 B must be a power of two"));
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(0), Catch::Contains("must be non-zero"));
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(G, G, 1, 0), Catch::Contains("map_granules must be at least 1"));
  simulated_vmm_memory_resource rounded{G + 1};
  CHECK(rounded.range_bytes() == 2 * G);
}

TEST_CASE("simulated_vmm: randomized plain-upstream traffic keeps committed == live granules") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng{seed};
    std::size_t const per_run = std::size_t{1} << (rng() % 3);
    simulated_vmm_memory_resource vmm{256 * G, G, 200 * G, per_run};
    std::map<void*, std::size_t> live;
    std::size_t live_granules = 0;
    for (int step = 0; step < 500; ++step) {
      if (live.empty() || rng() % 3 != 0) {
        std::size_t const bytes = 1 + rng() % (6 * G);
        try {
          void* p = vmm.allocate(bytes);
          REQUIRE(vmm.is_accessible(p, bytes));
          live.emplace(p, bytes);
          live_granules += detail::align_up(bytes, G) / G;
        } catch (out_of_memory const&) {
          REQUIRE(vmm.committed_bytes() == live_granules * G);  // nothing leaked by the refusal
        }
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        vmm.deallocate(it->first, it->second);
        live_granules -= detail::align_up(it->second, G) / G;
        live.erase(it);
      }
      REQUIRE(vmm.committed_bytes() == live_granules * G);
      REQUIRE(vmm.mapped_bytes() >= vmm.committed_bytes());
      if (per_run == 1) { REQUIRE(vmm.mapped_bytes() == vmm.committed_bytes()); }
    }
    vmm.check_invariants();
    for (auto const& [p, n] : live) { vmm.deallocate(p, n); }
    CHECK(vmm.mapped_bytes() == 0);
  }
}

TEST_CASE("simulated_vmm: a reserve of more granules than it keeps books for, or no granules per map, is refused clearly") {
  // A bit per granule is made up front: 16 TiB of 256-byte granules took 8 GB and 21 s;
  // 256 TiB threw a bare bad_alloc.
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(std::size_t{16} << 40, 256), Catch::Contains("more than the 2147483648"));
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(std::size_t{0x7fffffffffffffff}, 2 * MiB), Catch::Contains("granules"));
  CHECK_THROWS_WITH(simulated_vmm_memory_resource(64 * MiB, 2 * MiB, unlimited, 0),
                    Catch::Contains("simulated_vmm: map_granules must be at least 1"));
  CHECK_THROWS_AS(make_stack("simulated_vmm(reserve=16TiB, granularity=256B)"), spec_error);
}
