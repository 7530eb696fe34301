// Stacks other than `pool > cuda` on a real device under threads and streams: 16 threads,
// each with 4 created non-blocking streams, write, check and free blocks of 4 KiB to
// 8 MiB, with late "poison" writes still queued at some frees and some blocks freed on
// another stream after an event wait (tests/support/poisoned_stream_workers.hpp). Each
// stack is set to move memory as much as it can while the threads run: the arena gives
// chunks back past a small free bound (over cuda) or decommits granules (over vmm), the
// pool over vmm gives free granules back past a small threshold, binning's caches go
// between threads. Every read-back must see its own tag. The same with 16 threads sharing
// 4 streams, where the arenas give each thread its own arena on each stream. A control
// ([.control]) runs the arena with an event seam that does nothing, and must see poison.
#include <catch2/catch.hpp>

#include <poisoned_stream_workers.hpp>

#include <mrstack/spec.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/suballoc/stream_sync.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <cstdio>
#include <string>

using namespace mrstack;
using test::run_poisoned_stream_workers;
using test::stream_worker_options;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string invariants_of(memory_resource& mr) {
  for (memory_resource* layer = &mr; layer != nullptr; layer = layer->upstream()) {
    if (auto* arena = dynamic_cast<arena_memory_resource*>(layer)) { return arena->check_invariants(); }
    if (auto* pool = dynamic_cast<pool_memory_resource*>(layer)) { return pool->check_invariants(); }
  }
  return "";
}

/// Times memory went back to the device while the stack served (not counting release()):
/// granules unmapped over a virtual range, else chunks an arena returned.
std::size_t give_backs(memory_resource& mr) {
  if (auto* range = dynamic_cast<virtual_range_resource*>(&bottom_of_stack(mr))) { return range->unmap_calls(); }
  for (memory_resource* layer = &mr; layer != nullptr; layer = layer->upstream()) {
    if (auto* arena = dynamic_cast<arena_memory_resource*>(layer)) { return arena->stats().upstream_deallocations; }
  }
  return 0;
}

struct stack_case {
  char const* spec;
  bool gives_back;  // set to give memory back while the threads run
};

/// Runs the workers over `c`'s stack and checks that every block kept its data, that
/// blocks moved between streams, that the stack's invariants hold and (when it is set to)
/// that it gave memory back meanwhile. Returns the stack, not yet released.
resource_ptr run_and_check(stack_case const& c, stream_worker_options const& options) {
  resource_ptr const mr = make_stack(c.spec);
  auto const r = run_poisoned_stream_workers(*mr, options);
  std::size_t const gave_back = give_backs(*mr);
  std::size_t shards = 0;
  if (auto* arena = dynamic_cast<arena_memory_resource*>(mr.get())) { shards = arena->stats().thread_shard_arenas; }
  std::printf("%s: checked %zu blocks, %zu with foreign bytes, %zu freed on another stream, %zu give-backs, "
              "%zu thread shard arenas\n",
              c.spec, r.blocks_checked, r.bad_blocks, r.cross_stream_frees, gave_back, shards);
  INFO(c.spec);
  CHECK(r.errors == 0);
  CHECK(r.blocks_checked > 16 * 100);
  CHECK(r.cross_stream_frees > 16 * 10);
  CHECK(r.bad_blocks == 0);
  CHECK(invariants_of(*mr) == "");
  if (c.gives_back) { CHECK(gave_back > 0); }
  return mr;
}

}  // namespace

TEST_CASE("gpu stack threads: 16 threads x 4 streams keep their data while memory moves between them") {
  stack_case const cases[] = {
      {"pool > cuda", false},
      {"pool(release_threshold=64MiB) > vmm", true},
      {"arena(size=4GiB, max_free=32MiB, minimum_growth=8MiB) > cuda", true},
      {"arena(size=4GiB, max_free=32MiB) > vmm", true},
      {"binning > pool(release_threshold=64MiB) > vmm", true},
  };
  stream_worker_options options;
  options.cross_stream_frees = true;
  for (auto const& c : cases) { run_and_check(c, options)->release(); }
}

TEST_CASE("gpu stack threads: 16 threads sharing 4 streams keep their data; the arenas shard each stream") {
  // Threads meeting on one created stream: the arena gives each its own arena on the
  // stream (thread shards, here from the second thread on), the pool its thread shards.
  // A block freed on a stream goes back to the shard it came from, whichever thread frees
  // it, and is reused there only in the stream's order.
  stack_case const cases[] = {
      {"arena(size=4GiB, max_free=32MiB, minimum_growth=8MiB, shard_after_contentions=0) > cuda", true},
      {"arena(size=4GiB, max_free=32MiB, shard_after_contentions=0) > vmm", true},
      {"pool(shard_after_contentions=0) > cuda", false},
  };
  stream_worker_options options;
  options.shared_streams = 4;
  options.cross_stream_frees = true;
  for (auto const& c : cases) {
    resource_ptr const mr = run_and_check(c, options);
    if (auto* arena = dynamic_cast<arena_memory_resource*>(mr.get())) {
      INFO(c.spec);
      CHECK(arena->stats().thread_shard_arenas >= 4 * 8);
    }
    mr->release();
  }
}

TEST_CASE("gpu stack threads: control - an arena without events sees foreign bytes", "[.control]") {
  arena_options options;
  options.max_free_bytes = 32 * MiB;
  options.minimum_growth = 8 * MiB;
  options.stream_sync = make_host_stream_sync();  // "every free is complete at once": wrong on a GPU
  arena_memory_resource arena{std::make_shared<cuda_memory_resource>(), 4096 * MiB, options};
  stream_worker_options workers;
  workers.cross_stream_frees = true;
  // The arena moves fewer blocks between streams unordered than the pool (a small block
  // freed on another stream synchronizes that stream): 1 to 5 of 3,602 blocks showed
  // poison in one round, so the control runs three.
  std::size_t checked = 0;
  std::size_t bad = 0;
  for (int round = 0; round < 3; ++round) {
    auto const r = run_poisoned_stream_workers(arena, workers);
    CHECK(r.errors == 0);
    checked += r.blocks_checked;
    bad += r.bad_blocks;
  }
  std::printf("control: checked %zu blocks, %zu with foreign bytes\n", checked, bad);
  CHECK(bad > 0);
}
