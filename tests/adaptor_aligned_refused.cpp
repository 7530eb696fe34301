// The aligned adaptor when something below it says no: an upstream that refuses a free
// (a checking layer, a stream error) and host memory that runs out while the adaptor
// records or restores a block. The block must stay known to the adaptor until the
// upstream has really taken it back, and the upstream must only ever see what it handed out.
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>

#include <mrstack/adaptor/aligned_resource_adaptor.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace mrstack;

namespace {

// Host allocations of 2048 bytes or more fail (test::fail_host_allocations_from): a
// pointer_map's first table (64 slots of 32 bytes) is 2048 bytes, so no table can be made
// or grown, while the small allocations of the test itself go through.
using test::fail_host_allocations_from;

/// Hands out made-up addresses 256 past a 4 KiB boundary (never touched, never 4 KiB
/// aligned, so an aligned block's address always differs from the upstream's pointer),
/// refuses any free that does not name a live block with its exact size, and can refuse
/// the first free of one chosen pointer, as a stream error would.
class checked_upstream final : public memory_resource {
 public:
  checked_upstream() { frees.reserve(1 << 14); }  // no growth while host memory is short

  std::map<std::uintptr_t, std::size_t> live;                // upstream pointer -> bytes
  std::vector<std::pair<std::uintptr_t, std::size_t>> frees;  // every free that went through
  std::uintptr_t last_allocated = 0;
  std::uintptr_t refuse_once = 0;      // the first free of this pointer throws
  std::function<void()> while_refusing;  // runs inside that refused free, before it throws

 private:
  void* do_allocate(std::size_t bytes, std::size_t, stream_view) override {
    if (bytes > 8192 - 256) { throw std::logic_error("checked: only small blocks here"); }
    last_allocated = (std::uintptr_t{1} << 40) + next_++ * 8192 + 256;
    live.emplace(last_allocated, bytes);
    return reinterpret_cast<void*>(last_allocated);
  }
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t, stream_view) override {
    auto const address = reinterpret_cast<std::uintptr_t>(ptr);
    auto const it = live.find(address);
    if (it == live.end() || it->second != bytes) { throw std::logic_error("checked: a free of what was not handed out"); }
    if (address == refuse_once) {
      refuse_once = 0;
      if (while_refusing) { while_refusing(); }
      throw std::runtime_error("checked: stream error, nothing freed");
    }
    live.erase(it);
    frees.emplace_back(address, bytes);
  }
  std::string do_name() const override { return "checked"; }
  std::uintptr_t next_ = 0;
};

constexpr std::size_t padded = 1000 + 4096 - 256;  // what the upstream hands out for 1000 B at 4 KiB

}  // namespace

TEST_CASE("aligned: a free the upstream refuses leaves the block known; a retry frees what the upstream gave") {
  auto up = std::make_shared<checked_upstream>();
  aligned_resource_adaptor al{up, 4096, /*threshold=*/512};
  void* a = al.allocate(1000);
  void* b = al.allocate(1000);
  std::uintptr_t const original_b = up->last_allocated;
  void* c = al.allocate(1000);
  REQUIRE(reinterpret_cast<std::uintptr_t>(b) != original_b);

  up->refuse_once = original_b;
  CHECK_THROWS_WITH(al.deallocate(b, 1000), Catch::Contains("stream error"));  // the upstream's error, as is
  CHECK(up->live.count(original_b) == 1);
  CHECK(al.outstanding_over_aligned() == 3);  // still out, so still remembered
  // Both of its addresses: a pass-through free of the upstream's pointer is still refused.
  CHECK_THROWS_WITH(al.deallocate(reinterpret_cast<void*>(original_b), 100),
                    Catch::Contains("behind the live allocation"));

  CHECK_NOTHROW(al.deallocate(b, 1000));  // the retry
  REQUIRE(up->frees.size() == 1);
  CHECK(up->frees.back() == std::make_pair(original_b, padded));  // the upstream's own pointer and size
  CHECK_THROWS_WITH(al.deallocate(b, 1000), Catch::Contains("did not hand out"));  // and now it is gone
  al.deallocate(a, 1000);
  al.deallocate(c, 1000);
  CHECK(up->live.empty());
  CHECK(up->frees.size() == 3);
  CHECK(al.outstanding_over_aligned() == 0);
}

TEST_CASE("aligned: putting a refused free's block back needs no host memory") {
  // While the upstream is busy refusing, other allocations (another thread's; here, made
  // from inside the upstream's free) may fill the table the block was taken out of, and
  // host memory may be short: the block's way back must not need the table to grow.
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto up = std::make_shared<checked_upstream>();
  aligned_resource_adaptor al{up, 4096};
  void* a = al.allocate(1000);
  void* b = al.allocate(1000);
  std::uintptr_t const original_b = up->last_allocated;
  std::vector<void*> others;
  others.reserve(4096);
  up->refuse_once = original_b;
  up->while_refusing = [&] {
    fail_host_allocations_from = 2048;  // no table can grow from here on
    for (int i = 0; i < 4096; ++i) {
      try {
        others.push_back(al.allocate(1000));
      } catch (std::bad_alloc const&) {  // its table is full: it went back upstream
      }
    }
  };
  bool out_of_memory_instead = false;
  std::string what;
  try {
    al.deallocate(b, 1000);
  } catch (std::bad_alloc const&) {
    out_of_memory_instead = true;
  } catch (std::exception const& e) {
    fail_host_allocations_from = 0;
    what = e.what();
  }
  fail_host_allocations_from = 0;
  CHECK_FALSE(out_of_memory_instead);
  CHECK_THAT(what, Catch::Contains("stream error"));
  CHECK(al.outstanding_over_aligned() == 2 + others.size());
  CHECK(up->live.size() == 2 + others.size());

  std::size_t const frees_before = up->frees.size();
  CHECK_NOTHROW(al.deallocate(b, 1000));
  REQUIRE(up->frees.size() == frees_before + 1);
  CHECK(up->frees.back() == std::make_pair(original_b, padded));
  al.deallocate(a, 1000);
  for (void* p : others) { al.deallocate(p, 1000); }
  CHECK(up->live.empty());
  CHECK(al.outstanding_over_aligned() == 0);
}

TEST_CASE("aligned: an allocation that cannot be recorded goes back upstream, and the error is clean") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  auto up = std::make_shared<checked_upstream>();
  // Configured 512, asked 4096: the two addresses of a block are usually remembered in
  // different shards, so a record can fail at either of its two tables.
  aligned_resource_adaptor al{up, 512};
  std::vector<std::pair<void*, std::size_t>> held;
  held.reserve(4096);
  for (int i = 0; i < 8; ++i) { held.emplace_back(al.allocate(1000, {}, 4096), 4096); }
  std::size_t refused = 0;
  fail_host_allocations_from = 2048;
  for (int i = 0; i < 2000; ++i) {
    std::size_t const alignment = i % 2 == 0 ? 4096 : 256;
    try {
      held.emplace_back(al.allocate(1000, {}, alignment), alignment);
    } catch (std::bad_alloc const&) {  // anything else (a bad free upstream) fails the case
      ++refused;
    }
  }
  fail_host_allocations_from = 0;
  CHECK(refused > 0);
  CHECK(up->live.size() == held.size());  // every refused one went back
  CHECK(up->frees.size() == refused);     // with exactly what the upstream gave (checked there)
  CHECK(al.outstanding_over_aligned() == held.size());
  for (auto [p, alignment] : held) { al.deallocate(p, 1000, {}, alignment); }
  CHECK(up->live.empty());
  CHECK(al.outstanding_over_aligned() == 0);
}
