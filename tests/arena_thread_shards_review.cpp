// A hostile review of the arena's thread shards (arena_thread_shards.cpp): what a shard
// adds must not make a call fail that would have succeeded, nor leave a failed call
// having changed anything, nor add a CUDA call for a program on one stream.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <sharded_arena_options.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <new>
#include <optional>
#include <thread>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view const shared{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const other{reinterpret_cast<cudaStream_t>(0x200)};

/// Runs f on a new thread (whose thread shard index differs from the calling thread's,
/// which stays alive meanwhile) and joins it.
template <typename F>
void on_second_thread(F const& f) {
  (void)detail::this_thread_shard();
  std::thread t{[&] {
    (void)detail::this_thread_shard();
    f();
  }};
  t.join();
}

}  // namespace

TEST_CASE("arena thread shards review: a thread that cannot get a shard for lack of host memory still allocates from the stream's arena") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto const seam = std::make_shared<test::thread_stream_seam>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, test::sharded_arena_options(seam)};
  // The stream's arena, made by this thread, with free 1 KiB blocks: serving another one
  // needs no host memory. Sharding (a table, an arena) does; it is an optimization, and
  // must not turn a call the stream's own arena serves into a std::bad_alloc.
  void* const mine = mr.allocate(1024, shared);
  void* theirs = nullptr;
  bool threw = false;
  on_second_thread([&] {
    test::fail_host_allocations_from = 1;
    try {
      theirs = mr.allocate(1024, shared);
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    test::fail_host_allocations_from = 0;
  });
  CHECK_FALSE(threw);
  if (theirs != nullptr) { mr.deallocate(theirs, 1024, shared); }
  mr.deallocate(mine, 1024, shared);
  CHECK(mr.check_invariants() == "");
}

TEST_CASE("arena thread shards review: a free held back in a capture that fails for lack of host memory changes nothing") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto const seam = std::make_shared<test::thread_stream_seam>();
  arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB, test::sharded_arena_options(seam)};
  void* const x = mr.allocate(4096, other);       // `other`'s arena's block
  void* const mine = mr.allocate(1024, shared);   // `shared`'s arena, made by this thread
  auto const capture = [&](bool begin) {
    seam->ask([begin](test::fake_stream_sync& f) {
      begin ? f.begin_capture(0x100) : f.end_capture(0x100);
      return 0;
    });
  };
  // A second thread frees x on `shared` while `shared` is being captured: the free is held
  // back on that thread's arena on `shared`. Host memory is out: whether the free is held
  // back or fails, it must leave the arena consistent, and a failed free must leave x live.
  bool freed = false;
  bool threw = false;
  on_second_thread([&] {
    capture(true);
    test::fail_host_allocations_from = 1;
    try {
      mr.deallocate(x, 4096, shared);
      freed = true;
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    test::fail_host_allocations_from = 0;
    capture(false);
  });
  CHECK(freed != threw);
  CHECK(mr.check_invariants() == "");
  if (!freed) {
    // Nothing changed: x is still live, and freeing it again is no double free.
    CHECK_NOTHROW(mr.deallocate(x, 4096, other));
  }
  mr.deallocate(mine, 1024, shared);  // a call on `shared` after the capture settles a held-back x
  CHECK(mr.check_invariants() == "");
  void* const again = mr.allocate(4096, other);
  CHECK(again == x);  // x is free in `other`'s arena either way
  mr.deallocate(again, 4096, other);
}

TEST_CASE("arena thread shards review: threads sharing the legacy stream add no device synchronization at destruction") {
  // One stream in use (the legacy one, which every call may name): with one arena the
  // destructor gives its chunks back on that stream and makes no CUDA call. The stream's
  // thread shards are no other stream, so they must not change that.
  for (bool const thread_shards : {false, true}) {
    auto const seam = std::make_shared<test::thread_stream_seam>();
    {
      arena_memory_resource mr{std::make_shared<simulated_memory_resource>(), 256 * MiB,
                               test::sharded_arena_options(seam, thread_shards)};
      void* const mine = mr.allocate(1024, stream_view{});
      on_second_thread([&] {
        void* const p = mr.allocate(1024, stream_view{});
        mr.deallocate(p, 1024, stream_view{});
      });
      mr.deallocate(mine, 1024, stream_view{});
      CHECK(mr.stats().thread_shard_arenas == (thread_shards ? 1U : 0U));
    }
    INFO("thread shards " << thread_shards);
    CHECK(seam->ask([](test::fake_stream_sync& f) { return f.records + f.waits + f.syncs + f.sync_alls; }) == 0);
  }
}
