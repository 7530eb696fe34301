// A free that parks its stream (a created stream's frees past the park share, with a
// second stream about) moves the stream's free memory to its parked owner after the block
// is back; that move needs host memory (the parked owner's slot, its class arrays). Out of
// host memory there, the free threw std::bad_alloc with the block already freed: a caller
// that took the throw at its word and freed again was refused ("did not hand out or has
// already taken back"), and between the two calls the block could be handed to another.
// A free must not fail once its block is back: the park is then made where host memory
// allows, and what it could not move stays its stream's own.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
stream_view const c{reinterpret_cast<cudaStream_t>(0x300)};

pool_options options(bool sharded) {
  pool_options o;
  o.stream_sync = std::make_shared<test::thread_stream_seam>();
  if (sharded) { o.shard_after_contentions = 0; }  // sharded from the second thread on
  return o;
}

/// Frees `p` (`bytes`, on a) with the host allocation `k` from now failing. A free that
/// throws std::bad_alloc must have freed nothing: the same free then goes through. Returns
/// what went wrong, or "".
std::string free_with_allocation_failing(pool_memory_resource& mr, void* p, std::size_t bytes, long k) {
  bool threw = false;
  test::fail_host_allocation_in = k;
  try {
    mr.deallocate(p, bytes, a);
  } catch (std::bad_alloc const&) {
    threw = true;
  }
  test::fail_host_allocation_in = -1;
  if (!threw) { return ""; }
  try {
    mr.deallocate(p, bytes, a);
  } catch (std::exception const& e) {
    return "threw std::bad_alloc, but had freed the block: " + std::string{e.what()};
  }
  return "";
}

/// For k = 0..79: on a fresh pool where stream c has been used, a free on a that parks a,
/// with its k-th host allocation failing (made on the thread `on_thread` runs it on).
template <typename RunOn>
void check_each_allocation_failing(bool sharded, RunOn&& on_thread) {
  int misreported = 0;
  std::string first;
  for (long k = 0; k < 80; ++k) {
    auto upstream = std::make_shared<simulated_memory_resource>();
    pool_memory_resource mr{upstream, 0, std::nullopt, options(sharded)};
    mr.deallocate(mr.allocate(256, c), 256, c);  // a second stream: frees past the share park
    std::string why;
    on_thread([&] {
      void* p = mr.allocate(sharded ? 512 * KiB : 16 * MiB, a);  // past the 8 MiB park minimum unsharded
      if (sharded) {
        // In the shard: stream c too, and frees of a up to the 8 MiB park minimum, which
        // the free below passes.
        mr.deallocate(mr.allocate(256, c), 256, c);
        void* more[16];
        for (void*& q : more) { q = mr.allocate(512 * KiB, a); }
        for (void* q : more) { mr.deallocate(q, 512 * KiB, a); }
      }
      why = free_with_allocation_failing(mr, p, sharded ? 512 * KiB : 16 * MiB, k);
    });
    if (!why.empty() && misreported++ == 0) { first = "with host allocation " + std::to_string(k) + " failing: " + why; }
    CHECK(mr.stats().used_bytes == 0);
    CHECK(mr.check_invariants() == "");
  }
  INFO("first " << first);
  CHECK(misreported == 0);
}

}  // namespace

TEST_CASE("pool: a free whose park runs out of host memory has freed its block, once") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  check_each_allocation_failing(false, [](auto&& call) { call(); });
}

TEST_CASE("pool shards: a free whose park runs out of host memory has freed its block, once") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  check_each_allocation_failing(true, [](auto&& call) {
    std::thread t{call};  // the second thread: its calls go to its shard
    t.join();
  });
}
