// The pool on a real device under threads and streams: 16 threads, each with 4 streams
// of its own (non-blocking), write, check and free blocks with late "poison" writes
// still queued at some frees (tests/support/poisoned_stream_workers.hpp): memory moves
// between streams and threads (takeover of other streams' free memory) and the pool
// grows; every read-back must see its own tag. A control ([.control]) runs the same over
// a pool whose event seam does nothing, and must see poison: the check can fail.
#include <catch2/catch.hpp>

#include <poisoned_stream_workers.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/suballoc/stream_sync.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <cstdio>

using namespace mrstack;
using test::run_poisoned_stream_workers;
using test::stream_worker_options;

TEST_CASE("gpu pool threads: 16 threads x 4 streams keep their data through reuse, takeover and growth") {
  // Sharding when the threads contend (the default), and from the second thread on.
  for (std::size_t const after : {std::size_t{256}, std::size_t{0}}) {
    pool_options options;
    options.shard_after_contentions = after;
    auto upstream = std::make_shared<cuda_memory_resource>();
    pool_memory_resource pool{upstream, 0, std::nullopt, options};
    auto const r = run_poisoned_stream_workers(pool);
    auto const st = pool.stats();
    std::printf("shard after %zu contentions: checked %zu blocks, %zu with foreign bytes; %zu chunks taken, %zu "
                "records, %zu waits, %zu shards\n",
                after, r.blocks_checked, r.bad_blocks, st.upstream_allocations, st.events_recorded, st.stream_waits,
                st.thread_shards);
    INFO("shard_after_contentions " << after);
    CHECK(r.errors == 0);
    CHECK(r.blocks_checked > 16 * 100);
    CHECK(r.bad_blocks == 0);
    CHECK(st.used_bytes == 0);
    CHECK(st.upstream_allocations > 1);  // it grew while running
    if (after == 0) { CHECK(st.thread_shards >= 2); }
    CHECK(pool.check_invariants() == "");
  }
}

TEST_CASE("gpu pool threads: control - without events the same run sees foreign bytes", "[.control]") {
  pool_options options;
  options.stream_sync = make_host_stream_sync();  // "every free is complete at once": wrong on a GPU
  auto upstream = std::make_shared<cuda_memory_resource>();
  pool_memory_resource pool{upstream, 0, std::nullopt, options};
  auto const r = run_poisoned_stream_workers(pool);
  std::printf("control: checked %zu blocks, %zu with foreign bytes\n", r.blocks_checked, r.bad_blocks);
  CHECK(r.errors == 0);
  CHECK(r.bad_blocks > 0);
}
