// pool_memory_resource's thread shards, cases read off the code against its
// contract: statistics read while a shard is made and takes its first slab; a free in a
// shard that succeeds but whose give-back of free slabs then runs out of host memory; a
// small block whose alignment would make it a large one in a shard; and shards that
// cannot be made for want of host memory.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <phase_gate.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

}  // namespace

TEST_CASE("pool shards: statistics never count a new shard's first slab as used") {
  // A reader that looked at the shards before one existed, and took the global lock after
  // that shard's thread had carved its first slab out of the global blocks, counted the
  // whole slab as a used block (and none of it as free).
  constexpr int threads = 4;
  constexpr std::size_t block = 256;
  int wrong = 0;
  std::size_t worst = 0;
  for (int round = 0; round < 150 && wrong == 0; ++round) {
    pool_options o;
    o.shard_after_contentions = 0;
    pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, std::nullopt, o};
    mr.deallocate(mr.allocate(block), block);  // the first thread: the others shard
    std::atomic<bool> stop{false};
    std::atomic<int> seen{0};
    std::thread reader{[&] {
      while (!stop.load()) {
        auto const st = mr.stats();
        // Each worker holds at most one block at a time.
        if (st.used_bytes > threads * block || st.live_blocks > threads) {
          seen.fetch_add(1);
          worst = std::max(worst, st.used_bytes);
        }
      }
    }};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (int i = 0; i < 20; ++i) {
          mr.deallocate(mr.allocate(block, stream_view::per_thread()), block, stream_view::per_thread());
        }
      });
    }
    for (auto& w : workers) { w.join(); }
    stop = true;
    reader.join();
    wrong += seen.load();
    CHECK(mr.check_invariants() == "");
  }
  INFO("statistics read with a used slab: " << wrong << " (used bytes up to " << worst << ")");
  CHECK(wrong == 0);
}

TEST_CASE("pool shards: a free that went through is not reported as failed when the give-back after it runs out of host memory") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // The mover's shard holds a wholly free slab of created stream a's memory, which a drain
  // on c may not hand back: the shard awaits a call naming a. The next such call is this
  // thread's free of the mover's last block, on a: the block is freed, and then the shard
  // looks for slabs to give back, which needs host memory.
  stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
  stream_view const c{reinterpret_cast<cudaStream_t>(0x300)};
  pool_options o;
  o.shard_after_contentions = 0;
  o.stream_sync = std::make_shared<test::thread_stream_seam>();
  pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, std::nullopt, o};
  mr.deallocate(mr.allocate(256, a), 256, a);  // the first thread
  void* last = nullptr;
  std::thread mover{[&] {
    std::vector<void*> blocks;  // more than the first 4 MiB slab holds: two slabs
    for (int i = 0; i < 100; ++i) { blocks.push_back(mr.allocate(64 * KiB, a)); }
    last = blocks.back();
    blocks.pop_back();
    for (void* p : blocks) { mr.deallocate(p, 64 * KiB, a); }
    // Once freed and taken again: the shard's books have room for the free below.
    mr.deallocate(last, 64 * KiB, a);
    last = mr.allocate(64 * KiB, a);
  }};
  mover.join();
  void* big = mr.allocate(512 * MiB, c);  // its growth's drain awaits a for the free slab
  std::size_t const used = mr.stats().used_bytes;
  std::string error = "none";
  test::fail_host_allocations_from = 1;
  try {
    mr.deallocate(last, 64 * KiB, a);
  } catch (std::exception const& e) {
    error = e.what();
  }
  test::fail_host_allocations_from = 0;
  INFO("the free threw: " << error);
  bool const freed = mr.stats().used_bytes == used - 64 * KiB;
  // Either it was refused with nothing changed, or it went through and said so.
  CHECK((error == "none") == freed);
  if (!freed) { mr.deallocate(last, 64 * KiB, a); }
  mr.deallocate(big, 512 * MiB, c);
  CHECK(mr.stats().used_bytes == 0);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("pool shards: a small block with a large alignment does not strand a slab in its shard") {
  // Sharded, the block took a slab of its padded size (256 MiB) in its thread's shard;
  // while that thread lived, nobody else could use the slab's free bytes, and the main
  // thread ran out of memory at the maximum after 44 of its 100 MiB. Without shards the
  // pool serves them from the padding.
  constexpr std::size_t alignment = 256 * MiB;
  for (std::size_t const shards : {std::size_t{0}, std::size_t{64}}) {
    CAPTURE(shards);
    pool_options o;
    o.shard_after_contentions = 0;
    o.thread_shards = shards;
    pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, 300 * MiB, o};
    mr.deallocate(mr.allocate(256), 256);  // the first thread
    test::phase_gate gate;
    void* aligned = nullptr;
    std::thread holder{[&] {
      aligned = mr.allocate(256, stream_view{}, alignment);
      gate.advance(1);
      gate.wait_for(2);  // alive, so its shard index stays its own
    }};
    gate.wait_for(1);
    std::vector<void*> blocks;
    std::string refused;
    try {
      while (blocks.size() < 1600) { blocks.push_back(mr.allocate(64 * KiB)); }
    } catch (out_of_memory const& e) {
      refused = e.what();
    }
    gate.advance(2);
    holder.join();
    INFO(refused);
    CHECK(blocks.size() == 1600);
    for (void* p : blocks) { mr.deallocate(p, 64 * KiB); }
    mr.deallocate(aligned, 256, stream_view{}, alignment);
    CHECK(mr.stats().used_bytes == 0);
    CHECK(mr.check_invariants() == "");
  }
}

TEST_CASE("pool shards: when the shards cannot be made, a call goes on under the one lock") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // Sharding is an optimization: with no host memory for the shard set, or for a thread's
  // shard, the second thread's request was refused although the pool had 64 MiB free.
  pool_options o;
  o.shard_after_contentions = 0;
  pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 64 * MiB, std::nullopt, o};
  mr.deallocate(mr.allocate(256), 256);  // the first thread
  auto allocate_without_host_memory = [&] {
    std::string error = "none";
    std::thread t{[&] {
      test::fail_host_allocations_from = 512;  // the shard set and a shard are larger
      try {
        mr.deallocate(mr.allocate(256), 256);
      } catch (std::exception const& e) {
        error = e.what();
      }
      test::fail_host_allocations_from = 0;
    }};
    t.join();
    return error;
  };
  CHECK(allocate_without_host_memory() == "none");  // no shard set
  CHECK(mr.stats().thread_shards == 0);
  test::phase_gate gate;
  std::thread sharded{[&] {  // makes the shard set and its own shard, and stays alive
    mr.deallocate(mr.allocate(256), 256);
    gate.advance(1);
    gate.wait_for(2);
  }};
  gate.wait_for(1);
  CHECK(mr.stats().thread_shards == 1);
  CHECK(allocate_without_host_memory() == "none");  // no shard of its own
  gate.advance(2);
  sharded.join();
  CHECK(mr.stats().used_bytes == 0);
  CHECK(mr.check_invariants() == "");
}
