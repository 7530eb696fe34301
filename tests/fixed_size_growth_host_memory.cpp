// fixed_size when host memory runs out in the middle of a growth or a release: each host
// allocation of the call fails in turn, and the resource must come out of it with books
// that match the upstream's (every chunk it holds is one it can hand out and give back).
#include <catch2/catch.hpp>

#include <host_allocation_failure.hpp>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <vector>

using namespace mrstack;

namespace {
constexpr std::size_t block = 4096;

/// Made-up, block-aligned addresses (never touched), with the bytes out counted: no host
/// memory of its own, so the only host allocations in a call are the resource's.
class counting_addresses final : public memory_resource {
 public:
  [[nodiscard]] std::size_t bytes_out() const noexcept { return out_.load(); }

 private:
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 40};
  std::atomic<std::size_t> out_{0};
  void* do_allocate(std::size_t bytes, std::size_t, stream_view) override {
    out_ += bytes;
    return reinterpret_cast<void*>(next_.fetch_add((bytes + block - 1) / block * block + block));
  }
  void do_deallocate(void*, std::size_t bytes, std::size_t, stream_view) override { out_ -= bytes; }
  std::string do_name() const override { return "counting"; }
  memory_kind do_kind() const noexcept override { return memory_kind::host; }  // no CUDA calls
};
}  // namespace

TEST_CASE("fixed_size: a growth that runs out of host memory holds no chunk it cannot hand out") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // A chunk the upstream gave stayed in the books when recording its blocks ran out of
  // host memory: held and counted in pool_size() and chunk_count(), but none of its blocks
  // could ever be handed out, and every such failure took another chunk.
  bool failed_somewhere = false;
  bool threw = true;
  for (long n = 0; n < 16 && threw; ++n) {
    INFO("host allocation " << n << " of the growth fails");
    auto up = std::make_shared<counting_addresses>();
    std::vector<void*> out;
    out.reserve(16);  // no host allocation of the test's own while they fail
    {
      fixed_size_memory_resource mr{up, block, 4};
      for (int i = 0; i < 4; ++i) { out.push_back(mr.allocate(block)); }
      threw = false;
      test::fail_host_allocation_in = n;
      try {
        out.push_back(mr.allocate(block));  // grows
      } catch (std::bad_alloc const&) {
        threw = true;
      }
      test::fail_host_allocation_in = -1;
      failed_somewhere = failed_somewhere || threw;
      CHECK(up->bytes_out() == mr.pool_size());
      CHECK(mr.pool_size() == mr.total_blocks() * block);
      // With host memory back, the growth goes through once, and every block is handed out once.
      if (threw) { out.push_back(mr.allocate(block)); }
      while (out.size() < mr.total_blocks()) { out.push_back(mr.allocate(block)); }
      CHECK(mr.total_blocks() == 8);
      CHECK(mr.chunk_count() == 2);
      CHECK(up->bytes_out() == 8 * block);
      CHECK(std::set<void*>(out.begin(), out.end()).size() == out.size());
      for (void* p : out) { mr.deallocate(p, block); }
      mr.release();
      CHECK(up->bytes_out() == 0);
    }
    CHECK(up->bytes_out() == 0);
  }
  CHECK(failed_somewhere);
  CHECK_FALSE(threw);  // the last growth made fewer host allocations: each one failed once
}

TEST_CASE("fixed_size: a release that runs out of host memory keeps books it can hand out from") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // The free stacks were emptied before the chunk lookup was cleared: when that ran out
  // of host memory, the resource kept its chunks and counted their blocks free, with no
  // block left to hand out (each allocation then took a new chunk).
  bool failed_somewhere = false;
  bool threw = true;
  for (long n = 0; n < 16 && threw; ++n) {
    INFO("host allocation " << n << " of the release fails");
    auto up = std::make_shared<counting_addresses>();
    fixed_size_memory_resource mr{up, block, 4};
    std::vector<void*> out;
    out.reserve(16);
    for (int i = 0; i < 8; ++i) { out.push_back(mr.allocate(block)); }  // two chunks
    for (void* p : out) { mr.deallocate(p, block); }
    out.clear();
    threw = false;
    test::fail_host_allocation_in = n;
    try {
      mr.release();
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    test::fail_host_allocation_in = -1;
    failed_somewhere = failed_somewhere || threw;
    CHECK(up->bytes_out() == mr.pool_size());
    CHECK(mr.pool_size() == mr.total_blocks() * block);
    CHECK(mr.free_blocks() == mr.total_blocks());
    // What it still holds is handed out before it grows.
    std::size_t const held = mr.total_blocks();
    for (std::size_t i = 0; i < held; ++i) { out.push_back(mr.allocate(block)); }
    CHECK(mr.total_blocks() == held);
    CHECK(std::set<void*>(out.begin(), out.end()).size() == out.size());
    for (void* p : out) { mr.deallocate(p, block); }
    mr.release();
    CHECK(up->bytes_out() == 0);
  }
  CHECK(failed_somewhere);
  CHECK_FALSE(threw);
}
