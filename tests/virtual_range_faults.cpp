// virtual_range_resource (what vmm and simulated_vmm share) when its backend fails: a
// backend that fails on demand and keeps its own record of what is really mapped, so the
// resource's books can be checked against the "device" after each failure.
#include <catch2/catch.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <fake_stream_sync.hpp>

#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t G = 4096;

class faulty_range final : public virtual_range_resource, private detail::granule_backend {
 public:
  long fail_map_in = -1;          // fail the n-th map from now (0: the next)
  long fail_unmap_in = -1;        // fail the n-th unmap from now (0: the next)
  bool unmap_then_fail = false;   // that unmap unmaps first (cuMemUnmap worked, cuMemRelease did not)
  bool fail_access = false;
  bool fail_sync = false;
  std::map<std::size_t, std::size_t> real;  // offset -> bytes really mapped
  std::map<std::size_t, bool> accessible;   // offset -> access enabled
  std::size_t maps = 0;

  explicit faulty_range(std::size_t granules, std::size_t map_granules = 1)
      : virtual_range_resource("faulty", 0, granules * G, G, map_granules, *this) {}
  ~faulty_range() override {
    fail_map_in = -1;
    fail_unmap_in = -1;
    fail_sync = false;
    release_everything();
  }

  [[nodiscard]] std::size_t really_mapped_bytes() const {
    std::size_t n = 0;
    for (auto const& [offset, bytes] : real) { n += bytes; }
    return n;
  }
  [[nodiscard]] bool granule_accessible(std::size_t g) const {
    auto it = real.upper_bound(g * G);
    if (it == real.begin()) { return false; }
    --it;
    return g * G < it->first + it->second && accessible.at(it->first);
  }
  [[nodiscard]] std::byte* at(std::size_t g) const { return range_base() + g * G; }

 private:
  std::uint64_t map(std::size_t offset, std::size_t bytes) override {
    if (fail_map_in >= 0 && fail_map_in-- == 0) { throw std::runtime_error("injected map failure"); }
    if (!real.emplace(offset, bytes).second) { throw std::logic_error("map over mapped memory"); }
    accessible[offset] = false;
    ++maps;
    return offset + 1;
  }
  void enable_access(std::size_t offset, std::size_t bytes) override {
    if (fail_access) { throw std::runtime_error("injected access failure"); }
    for (auto it = real.lower_bound(offset); it != real.end() && it->first < offset + bytes; ++it) {
      accessible[it->first] = true;
    }
  }
  void before_unmap() override {
    if (fail_sync) { throw std::runtime_error("injected sync failure"); }
  }
  void unmap(std::size_t offset, std::size_t, std::uint64_t) override {
    bool const fail = fail_unmap_in >= 0 && fail_unmap_in-- == 0;
    if (fail && !unmap_then_fail) { throw std::runtime_error("injected unmap failure at offset " + std::to_string(offset)); }
    if (real.erase(offset) != 1) { throw std::logic_error("unmap of unmapped memory"); }
    accessible.erase(offset);
    if (fail) {
      throw detail::unmapped_with_error{std::make_exception_ptr(std::runtime_error{"injected release failure"})};
    }
  }
};

}  // namespace

TEST_CASE("virtual_range faults: a free whose first unmap fails still gives back every other granule") {
  faulty_range r{64};
  void* p = r.allocate(4 * G);
  r.fail_unmap_in = 0;
  CHECK_THROWS_WITH(r.deallocate(p, 4 * G), Catch::Contains("injected unmap failure at offset 0"));
  CHECK(r.committed_bytes() == 0);  // no granule is left committed with no owner
  CHECK(r.mapped_bytes() == G);     // only the run that failed
  CHECK(r.really_mapped_bytes() == G);
  r.check_invariants();
}

TEST_CASE("virtual_range faults: a sleep whose unmap fails is asleep with nothing committed, and wakes") {
  faulty_range r{64};
  void* p = r.allocate(4 * G);
  r.fail_unmap_in = 0;
  CHECK_THROWS_WITH(r.sleep(false), Catch::Contains("injected unmap failure"));
  CHECK(r.asleep());
  CHECK(r.committed_bytes() == 0);
  CHECK(r.asleep_bytes() == 4 * G);
  CHECK(r.really_mapped_bytes() == G);
  r.check_invariants();
  r.wake();  // revives the run left mapped, maps the rest
  CHECK(r.committed_bytes() == 4 * G);
  CHECK(r.really_mapped_bytes() == 4 * G);
  CHECK(r.maps == 4 + 3);
  r.check_invariants();
  r.deallocate(p, 4 * G);
  CHECK(r.really_mapped_bytes() == 0);
  r.check_invariants();
}

TEST_CASE("virtual_range faults: a free whose unmap fails gives its addresses back for reuse") {
  // The addresses stayed out of circulation for the resource's life, unmapped granules
  // too: a 4-granule range then refused a 1-granule allocation.
  faulty_range r{4};
  void* p = r.allocate(4 * G);
  r.fail_unmap_in = 0;
  CHECK_THROWS(r.deallocate(p, 4 * G));
  void* q = nullptr;
  CHECK_NOTHROW(q = r.allocate(4 * G));  // the run left mapped is revived, the rest mapped afresh
  CHECK(r.really_mapped_bytes() == 4 * G);
  r.check_invariants();
  r.deallocate(q, 4 * G);
  CHECK(r.really_mapped_bytes() == 0);
}

TEST_CASE("virtual_range faults: a failed wake whose rollback hits an unmap failure still gives back every stretch") {
  // The rollback stopped at the first decommit that threw: later stretches stayed
  // committed while asleep, owned by nobody.
  faulty_range r{64};
  void* p = r.allocate(4 * G);  // four runs of one granule: four stretches asleep
  r.sleep(false);
  r.fail_map_in = 3;    // the wake maps three stretches, then fails
  r.fail_unmap_in = 0;  // and the rollback's first unmap fails
  CHECK_THROWS_WITH(r.wake(), Catch::Contains("injected map failure"));
  CHECK(r.asleep());
  CHECK(r.committed_bytes() == 0);
  CHECK(r.really_mapped_bytes() == G);  // only the run whose unmap failed
  r.check_invariants();
  r.wake();
  CHECK(r.committed_bytes() == 4 * G);
  r.check_invariants();
  r.deallocate(p, 4 * G);
  CHECK(r.really_mapped_bytes() == 0);
  r.check_invariants();
}

TEST_CASE("virtual_range faults: a failed wait before unmapping unmaps nothing, and the next free retries") {
  faulty_range r{64};
  r.claim("test");
  r.commit(r.at(0), 3 * G);
  r.fail_sync = true;
  CHECK_THROWS_WITH(r.decommit(r.at(0), 3 * G), "injected sync failure");
  CHECK(r.committed_bytes() == 0);
  CHECK(r.mapped_bytes() == 3 * G);
  CHECK(r.really_mapped_bytes() == 3 * G);
  r.check_invariants();
  r.fail_sync = false;
  CHECK(r.decommit(r.at(0), 3 * G) == 0);  // nothing left committed, but the runs are given back
  CHECK(r.mapped_bytes() == 0);
  CHECK(r.really_mapped_bytes() == 0);
  r.unclaim();
}

TEST_CASE("virtual_range faults: a run unmapped before its release failed is mapped afresh by the next commit") {
  faulty_range r{64};
  r.claim("test");
  r.commit(r.at(0), G);
  r.fail_unmap_in = 0;
  r.unmap_then_fail = true;
  CHECK_THROWS_WITH(r.decommit(r.at(0), G), "injected release failure");
  CHECK(r.mapped_bytes() == 0);
  CHECK(r.unmap_calls() == 1);  // the addresses were given back
  r.check_invariants();
  CHECK(r.commit(r.at(0), G) == G);
  CHECK(r.maps == 2);
  CHECK(r.really_mapped_bytes() == G);  // not "revived" without memory behind it
  CHECK(r.granule_accessible(0));
  r.unclaim();
}

TEST_CASE("virtual_range faults: a commit whose access change and wait fail rolls back, and a retry works") {
  faulty_range r{64};
  r.claim("test");
  r.fail_access = true;
  r.fail_sync = true;
  CHECK_THROWS_WITH(r.commit(r.at(0), 2 * G), "injected access failure");
  CHECK(r.mapped_bytes() == 0);
  CHECK(r.really_mapped_bytes() == 0);
  r.check_invariants();
  r.fail_access = false;
  r.fail_sync = false;
  CHECK(r.commit(r.at(0), 2 * G) == 2 * G);
  CHECK(r.granule_accessible(1));
  r.unclaim();

  // A piece the rollback cannot unmap stays on the books: the retry enables its access
  // instead of mapping over it.
  r.claim("test");
  r.fail_access = true;
  r.fail_unmap_in = 1;
  CHECK_THROWS_WITH(r.commit(r.at(0), 3 * G), "injected access failure");
  CHECK(r.mapped_bytes() == G);
  CHECK(r.really_mapped_bytes() == G);
  r.check_invariants();
  r.fail_access = false;
  CHECK(r.commit(r.at(0), 3 * G) == 3 * G);
  for (std::size_t g = 0; g < 3; ++g) { CHECK(r.granule_accessible(g)); }
  r.check_invariants();
  r.unclaim();
  CHECK(r.really_mapped_bytes() == 0);
}

TEST_CASE("virtual_range faults: vmm names a map_granules of 0 before any driver call") {
  CHECK_THROWS_AS(vmm_memory_resource(0, 0), logic_error);
  CHECK_THROWS_WITH(vmm_memory_resource(0, 0), Catch::Contains("vmm: map_granules must be at least 1"));
}

TEST_CASE("virtual_range faults: vmm names a reserve no address space holds before any driver call") {
  // Rounded up to the granularity it wrapped around, and the driver refused a reserve of 0 B.
  std::size_t const huge = std::numeric_limits<std::size_t>::max() - 4096;
  CHECK_THROWS_AS(vmm_memory_resource(huge), logic_error);
  CHECK_THROWS_WITH(vmm_memory_resource(huge), Catch::Contains("vmm: a reserve of " + std::to_string(huge) + " B"));
}

TEST_CASE("virtual_range faults: vmm's device_granularity refuses what names no device before any driver call") {
  // An ordinal below -1 was read as "the current device", and answered for that one.
  CHECK_THROWS_AS(vmm_memory_resource::device_granularity(-2), logic_error);
  CHECK_THROWS_WITH(vmm_memory_resource::device_granularity(-2),
                    Catch::Contains("vmm::device_granularity: device -2 is not a device"));
  CHECK_THROWS_WITH(vmm_memory_resource::device_granularity(64), Catch::Contains("device 64 is past the 64 devices"));
}

TEST_CASE("virtual_range faults: a pool's in-place release whose first unmap fails still decommits every other stretch") {
  // Three free stretches between live blocks: a release withdraws each as a hole and
  // decommits them one by one. The first decommit fails; stopping there had left the
  // other two committed, holes the pool never hands out, for the pool's lifetime.
  auto r = std::make_shared<faulty_range>(64);
  pool_options options;
  options.stream_sync = std::make_shared<test::fake_stream_sync>();  // no device here
  pool_memory_resource pool{r, 0, std::nullopt, options};
  std::vector<void*> blocks;
  for (int i = 0; i < 7; ++i) { blocks.push_back(pool.allocate(2 * G)); }
  for (std::size_t i : {1, 3, 5}) { pool.deallocate(blocks[i], 2 * G); }
  std::size_t const committed = r->committed_bytes();
  r->fail_unmap_in = 0;
  CHECK_THROWS_WITH(pool.release(), Catch::Contains("injected unmap failure"));
  r->fail_unmap_in = -1;
  CHECK(r->committed_bytes() == committed - 6 * G);  // all three stretches' granules
  CHECK(r->really_mapped_bytes() == committed - 5 * G);  // all but the granule whose unmap failed
  CHECK(pool.check_invariants().empty());
  for (std::size_t i : {0, 2, 4, 6}) { pool.deallocate(blocks[i], 2 * G); }
  void* again = pool.allocate(6 * G);  // the holes serve a request again
  CHECK(again != nullptr);
  pool.deallocate(again, 6 * G);
  r->check_invariants();
}
