// The pool's thread shards and the arena under threads, from a hostile review (each case
// failed before its fix; run them under the tsan preset too):
// (The review's third case, fragmentation() while slabs go back to the global blocks, is
// in tests/suballocators_threads_misuse.cpp, whose statistics reader it extends.)
// - the arena's thread exit found the thread's own arena through its cache of 8 arenas:
//   a thread that had used more streams than that left its arena unretired, holding its
//   spare superblocks;
// - a sharded pool's thread whose own shard held another thread's frees on a created
//   stream (in a slab that still held its live blocks) reported out-of-memory where the
//   unsharded pool synchronizes and serves from that memory.
#include <catch2/catch.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

pool_options shard_from_second_thread() {
  pool_options o;
  o.shard_after_contentions = 0;
  return o;
}

}  // namespace

TEST_CASE("arena review: a thread that used more streams than its arena cache holds still retires its own arena") {
  arena_options o;
  o.superblock_size = 1 * MiB;
  o.max_small_size = 64 * KiB;
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, o};
  auto const created = [](int k) { return stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000} * (k + 1))}; };
  int const threads = 40;
  for (int t = 0; t < threads; ++t) {
    std::thread{[&] {
      // Its own default stream's arena first, then more created streams than the thread
      // remembers arenas (8): its own arena's entry is the one pushed out.
      mr.deallocate(mr.allocate(4 * KiB, stream_view::per_thread()), 4 * KiB, stream_view::per_thread());
      for (int k = 0; k < 9; ++k) { mr.deallocate(mr.allocate(4 * KiB, created(k)), 4 * KiB, created(k)); }
    }}.join();
  }
  // The 9 created streams' arenas stay; every exited thread's own arena was retired, its
  // superblocks back, rather than one arena and its spares left per thread (before the
  // fix: 49 arenas, holding the whole 256 MiB maximum against 224 MiB once retired).
  auto const st = mr.fragmentation();
  INFO(st.streams.size() << " stream arenas, " << st.held_bytes << " B held");
  CHECK(st.streams.size() <= 10);
}

TEST_CASE("pool review: a shard's thread uses the memory another thread freed there on a created stream before out-of-memory") {
  // One thread fills a slab, keeps one block and hands the rest to another thread, which
  // frees them on a stream it created and then calls no more. The first thread's shard
  // now holds a slab of that stream's free memory with a live block in it; the thread
  // then needs as much again, in a pool whose maximum leaves no room for another slab.
  // The unsharded pool serves it (a device synchronization makes the stream's memory
  // everyone's before out-of-memory); the shard must too.
  for (std::size_t shards : {std::size_t{0}, std::size_t{64}}) {
    pool_options o = shard_from_second_thread();
    o.thread_shards = shards;
    o.minimum_growth = 4 * MiB;
    o.growth_divisor = 1000;  // slabs of 4 MiB
    pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, 12 * MiB, o};
    mr.deallocate(mr.allocate(256), 256);  // the first thread: the others shard
    stream_view const created{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x7000})};
    std::size_t const n = 64 * KiB;
    int refusals = 0;
    std::string first_refusal;  // reported by this thread: Catch is not called from others
    std::thread{[&] {
      std::vector<void*> first;
      for (int i = 0; i < 60; ++i) { first.push_back(mr.allocate(n, stream_view::per_thread())); }
      void* const kept = first.back();
      first.pop_back();
      std::thread{[&] {
        for (void* p : first) { mr.deallocate(p, n, created); }
      }}.join();
      std::vector<void*> more;
      for (int i = 0; i < 160; ++i) {  // 10 MiB live in all: within the 12 MiB
        try {
          more.push_back(mr.allocate(n, stream_view::per_thread()));
        } catch (out_of_memory const& e) {
          if (refusals++ == 0) { first_refusal = e.what(); }
        }
      }
      for (void* p : more) { mr.deallocate(p, n, stream_view::per_thread()); }
      mr.deallocate(kept, n, stream_view::per_thread());
    }}.join();
    INFO("thread_shards " << shards << ": " << first_refusal);
    CHECK(refusals == 0);
    CHECK(mr.check_invariants() == "");
    CHECK(mr.stats().used_bytes == 0);
  }
}
