// A free whose stream-ordering call fails (the seam throws, as the CUDA one does when
// cudaEventCreate fails) after its block went back: the free still succeeds — the block
// stays its stream's own, unrecorded — so the caller is not told it failed and then, on
// retrying, that it freed twice.
#include <catch2/catch.hpp>

#include <failing_create_sync.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <stdexcept>
#include <vector>

using namespace mrstack;

namespace {

using test::failing_create_sync;

stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};

}  // namespace

TEST_CASE("seam failures: a pool's free that parks for a wanting stream succeeds when no event can be made") {
  auto sync = std::make_shared<failing_create_sync>();
  pool_options options;
  options.stream_sync = sync;
  pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 1 << 20, std::nullopt, options};
  void* p = mr.allocate(4096, a);
  void* q = mr.allocate(4096, a);
  mr.deallocate(p, 4096, a);
  void* r = mr.allocate(1 << 20, b);  // wants a's free memory: a parks at its next call
  sync->fail_creates = true;
  CHECK_NOTHROW(mr.deallocate(q, 4096, a));
  sync->fail_creates = false;
  CHECK_THROWS_WITH(mr.deallocate(q, 4096, a), Catch::Contains("0x") && Catch::Contains("4096"));  // now a double free
  mr.deallocate(r, 1 << 20, b);
  void* again = mr.allocate(8192, a);  // a's unrecorded memory is still its own
  mr.deallocate(again, 8192, a);
  CHECK(mr.fragmentation().live_bytes == 0);
}

TEST_CASE("seam failures: fixed_size's recording free succeeds when no event can be made") {
  auto sync = std::make_shared<failing_create_sync>();
  fixed_size_memory_resource mr{std::make_shared<simulated_memory_resource>(), 4096, 16, sync};
  void* kept = mr.allocate(100, b);  // a second stream: frees on created streams record
  void* p = mr.allocate(100, a);
  sync->fail_creates = true;
  CHECK_NOTHROW(mr.deallocate(p, 100, a));
  sync->fail_creates = false;
  CHECK_THROWS_WITH(mr.deallocate(p, 100, a), Catch::Contains("double free"));
  // b takes a's unrecorded block only after ordering: the device is synchronized then.
  std::size_t const sync_alls = sync->inner->sync_alls;
  std::vector<void*> taken;
  for (std::size_t i = 0; i + 1 < mr.total_blocks(); ++i) { taken.push_back(mr.allocate(100, b)); }
  CHECK((sync->inner->sync_alls > sync_alls || sync->inner->waits > 0));
  for (void* t : taken) { mr.deallocate(t, 100, b); }
  mr.deallocate(kept, 100, b);
  CHECK(mr.free_blocks() == mr.total_blocks());
}
