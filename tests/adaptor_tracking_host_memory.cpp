// The tracking adaptor when the upstream refuses a free or the host runs out of memory
// for its records: a block is tracked exactly while it is live, the counts follow, and
// the caller gets the error that stopped the call.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/tracking_resource_adaptor.hpp>

#include <host_allocation_failure.hpp>
#include <phase_gate.hpp>

#include <atomic>
#include <functional>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace mrstack;
using mrstack::test::fail_host_allocations_from;

namespace {

/// Hands out made-up, 256-aligned addresses (never touched) and counts what is live; no
/// host memory of its own, so the only host allocations in a call are the tracker's.
/// `before_free`, when set, runs at the start of every deallocate and may throw: a free
/// the upstream refuses.
class counted_addresses final : public memory_resource {
 public:
  std::atomic<std::size_t> live{0};
  std::function<void()> before_free;

 private:
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 40};
  void* do_allocate(std::size_t bytes, std::size_t, stream_view) override {
    ++live;
    return reinterpret_cast<void*>(next_.fetch_add((bytes + 255) / 256 * 256 + 256));
  }
  void do_deallocate(void*, std::size_t, std::size_t, stream_view) override {
    if (before_free) { before_free(); }
    --live;
  }
  std::string do_name() const override { return "counted"; }
};

}  // namespace

TEST_CASE("tracking: a free the upstream refuses leaves the block tracked, and it can be freed again") {
  auto up = std::make_shared<counted_addresses>();
  tracking_resource_adaptor tr{up};
  void* p = tr.allocate(256);
  void* q = tr.allocate(512);
  up->before_free = [] { throw std::runtime_error("refused below"); };
  CHECK_THROWS_AS(tr.deallocate(p, 256), std::runtime_error);  // the upstream's error, as it was
  up->before_free = nullptr;
  CHECK(tr.outstanding_count() == 2);
  CHECK(tr.outstanding_bytes() == 768);
  CHECK_NOTHROW(tr.deallocate(p, 256));  // still tracked: not refused as never handed out
  CHECK_NOTHROW(tr.deallocate(q, 512));
  CHECK(tr.outstanding_count() == 0);
  CHECK(up->live == 0);
}

TEST_CASE("tracking: an allocation whose record cannot be stored gives the block back and throws bad_alloc") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto up = std::make_shared<counted_addresses>();
  tracking_resource_adaptor tr{up};
  std::vector<void*> live;
  // One thread, one shard: its table starts at 64 slots and doubles at the 33rd record.
  for (int i = 0; i < 32; ++i) { live.push_back(tr.allocate(256)); }
  fail_host_allocations_from = 4096;  // the 128-slot array; nothing else on this path is that big
  bool bad_alloc = false;
  try {
    (void)tr.allocate(256);
  } catch (std::bad_alloc const&) {
    bad_alloc = true;
  }
  fail_host_allocations_from = 0;
  CHECK(bad_alloc);
  CHECK(up->live == 32);  // the upstream got the block back: nothing leaks below
  CHECK(tr.outstanding_count() == 32);
  CHECK(tr.outstanding_bytes() == 32 * 256);
  live.push_back(tr.allocate(256));  // the same call, made again, succeeds
  for (void* p : live) { CHECK_NOTHROW(tr.deallocate(p, 256)); }
  CHECK(tr.outstanding_count() == 0);
  CHECK(up->live == 0);
}

TEST_CASE("tracking: a refused free puts its record back even when the host is out of memory meanwhile") {
  // A free takes the record out of its shard before it calls the upstream, with the lock
  // let go. Another thread may fill that shard meanwhile (the one that allocated the block
  // keeps allocating): when the upstream then refuses the free, the record's way back into
  // the table must not need the table to grow, which may fail for want of host memory.
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto up = std::make_shared<counted_addresses>();
  tracking_resource_adaptor tr{up};
  std::vector<void*> mine;
  // This thread's shard: 64 slots, which hold up to 32 records before they double.
  for (int i = 0; i < 32; ++i) { mine.push_back(tr.allocate(256)); }
  test::phase_gate gate;
  up->before_free = [&] {
    gate.advance(1);  // the record is out of its shard: let the owner allocate
    gate.wait_for(2);
    fail_host_allocations_from = 4096;  // this thread, from here on: no table can double
    throw std::runtime_error("refused below");
  };
  bool refused = false;
  bool bad_alloc = false;
  std::thread other{[&] {  // frees a block of this thread's shard
    try {
      tr.deallocate(mine[0], 256);
    } catch (std::runtime_error const&) {
      refused = true;
    } catch (std::bad_alloc const&) {
      bad_alloc = true;
    }
    fail_host_allocations_from = 0;
  }};
  gate.wait_for(1);
  mine.push_back(tr.allocate(256));  // 32 records again, as many as 64 slots take
  gate.advance(2);
  other.join();
  up->before_free = nullptr;
  CHECK(refused);  // the caller learns that the upstream refused, not of a failed growth
  CHECK_FALSE(bad_alloc);
  CHECK(tr.outstanding_count() == 33);  // mine[0] is live: the upstream kept it
  CHECK(tr.outstanding_bytes() == 33 * 256);
  for (void* p : mine) { CHECK_NOTHROW(tr.deallocate(p, 256)); }  // mine[0] is still known
  CHECK(tr.outstanding_count() == 0);
  CHECK(up->live == 0);
}
