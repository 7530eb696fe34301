// The aligned adaptor: pointers aligned as configured (with the threshold) or as asked,
// the upstream gets back exactly what it handed out, it works over an upstream that
// refuses large alignments, and it holds up under 8 threads.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/aligned_resource_adaptor.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

/// Like the cuda upstream: 256-byte alignment only; anything more is a logic_error.
class only_256_resource final : public memory_resource {
 public:
  explicit only_256_resource(resource_ptr below) : below_{std::move(below)} {}
  std::size_t largest_alignment_seen = 0;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    if (alignment > 256) { throw logic_error("only_256: alignment " + std::to_string(alignment) + " needs aligned(...)"); }
    largest_alignment_seen = std::max(largest_alignment_seen, alignment);
    return below_->allocate(bytes, stream, alignment);
  }
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    below_->deallocate(ptr, bytes, stream, alignment);
  }
  std::string do_name() const override { return "only_256"; }
  memory_resource* do_upstream() const noexcept override { return below_.get(); }
  resource_ptr below_;
};

/// A broken upstream: its pointers are 16 bytes past a 256-byte boundary.
class skewed_resource final : public memory_resource {
 public:
  explicit skewed_resource(resource_ptr below) : below_{std::move(below)} {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    return static_cast<char*>(below_->allocate(bytes + 16, stream, alignment)) + 16;
  }
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    below_->deallocate(static_cast<char*>(ptr) - 16, bytes + 16, stream, alignment);
  }
  std::string do_name() const override { return "skewed"; }
  memory_resource* do_upstream() const noexcept override { return below_.get(); }
  resource_ptr below_;
};

}  // namespace

TEST_CASE("aligned: an upstream pointer that is not 256-aligned is given back and refused, not overrun") {
  // The padding (alignment - 256) reaches an aligned address only from a 256-aligned start:
  // from 16 past one, the block handed out ran 240 bytes past the upstream's.
  auto sim = std::make_shared<simulated_memory_resource>();
  aligned_resource_adaptor al{std::make_shared<skewed_resource>(sim), 4096};
  CHECK_THROWS_WITH(al.allocate(1000), Catch::Contains("aligned: the upstream (skewed) handed out") &&
                                           Catch::Contains("which is not 256-aligned"));
  CHECK(al.outstanding_over_aligned() == 0);
  CHECK(sim->allocation_count() == 0);  // given back
}

TEST_CASE("aligned: every request aligned as configured, over real memory") {
  auto sys = std::make_shared<system_memory_resource>();
  aligned_resource_adaptor al{sys, 4096};
  CHECK(al.name() == "aligned");
  CHECK(al.upstream() == sys.get());
  CHECK(al.alignment() == 4096);
  std::vector<std::pair<unsigned char*, std::size_t>> held;
  for (std::size_t bytes : {1, 100, 255, 256, 4095, 4096, 4097, 100000}) {
    auto* p = static_cast<unsigned char*>(al.allocate(bytes));
    REQUIRE(detail::is_aligned(p, 4096));
    std::memset(p, 0x11, bytes);  // the whole range is ours (ASan would object otherwise)
    held.emplace_back(p, bytes);
  }
  CHECK(al.outstanding_over_aligned() == held.size());
  for (auto [p, bytes] : held) { al.deallocate(p, bytes); }
  CHECK(al.outstanding_over_aligned() == 0);
}

TEST_CASE("aligned: the threshold leaves small requests alone; explicit alignments are always honoured") {
  auto sim = std::make_shared<simulated_memory_resource>();
  aligned_resource_adaptor al{sim, 65536, /*threshold=*/1 << 20};
  void* small = al.allocate(1000);
  CHECK(al.outstanding_over_aligned() == 0);          // passed straight through
  CHECK(sim->footprint() == 1024);                    // with no padding
  void* big = al.allocate(1 << 20);
  CHECK(detail::is_aligned(big, 65536));
  CHECK(al.outstanding_over_aligned() == 1);
  CHECK(sim->footprint() == 1024 + (1 << 20) + 65536 - 256);  // padded by alignment - 256
  void* asked = al.allocate(10, {}, 1 << 14);          // small, but the caller asked for 16 KiB
  CHECK(detail::is_aligned(asked, 1 << 14));
  CHECK(al.outstanding_over_aligned() == 2);
  al.deallocate(asked, 10, {}, 1 << 14);
  al.deallocate(big, 1 << 20);
  al.deallocate(small, 1000);
  CHECK(sim->allocation_count() == 0);  // the simulated upstream checked every free's pointer and size
  CHECK(sim->footprint() == 0);
}

TEST_CASE("aligned: works over an upstream that only does 256") {
  auto sim = std::make_shared<simulated_memory_resource>();
  auto strict = std::make_shared<only_256_resource>(sim);
  CHECK_THROWS_AS(strict->allocate(100, {}, 4096), logic_error);
  aligned_resource_adaptor al{strict, 2048};
  void* p = al.allocate(5000, {}, 8192);
  CHECK(detail::is_aligned(p, 8192));
  CHECK(strict->largest_alignment_seen == 256);
  al.deallocate(p, 5000, {}, 8192);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("aligned: bad input is a clear error") {
  auto sim = std::make_shared<simulated_memory_resource>();
  CHECK_THROWS_WITH(aligned_resource_adaptor(sim, 3000), Catch::Contains("alignment 3000"));
  CHECK_THROWS_WITH(aligned_resource_adaptor(nullptr), Catch::Contains("upstream"));
  aligned_resource_adaptor al{sim, 4096};
  void* p = al.allocate(100);
  CHECK_THROWS_WITH(al.deallocate(static_cast<char*>(p) + 4096, 100), Catch::Contains("did not hand out"));
  al.deallocate(p, 100);
  CHECK_THROWS_AS(al.allocate(~std::size_t{0} - 100), out_of_memory);
  // Alignments up to 256 just pass through.
  aligned_resource_adaptor plain{sim, 64};
  CHECK(plain.alignment() == 256);
  void* q = plain.allocate(100);
  CHECK(plain.outstanding_over_aligned() == 0);
  plain.deallocate(q, 100);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("aligned: a free that asks for no over-alignment of an over-aligned block is refused here, not below") {
  auto sim = std::make_shared<simulated_memory_resource>();
  // Best fit from the range's start: the blocks below start 256 bytes past a 4096 boundary,
  // so each one's aligned address is not the upstream's pointer.
  void* const offset = sim->allocate(256);
  {
    // Allocated at an explicit 4096, freed at 256: the upstream never handed this pointer out.
    aligned_resource_adaptor al{sim};
    void* p = al.allocate(100, stream_view{}, 4096);
    REQUIRE(sim->owns(p) == false);
    CHECK_THROWS_WITH(al.deallocate(p, 100, stream_view{}, 256),
                      Catch::Contains("aligned: deallocate of") &&
                          Catch::Contains("it was allocated with 100 B, alignment 4096; nothing was freed"));
    CHECK(al.outstanding_over_aligned() == 1);
    al.deallocate(p, 100, stream_view{}, 4096);
  }
  {
    // Aligned by size: freed with a size below the threshold.
    aligned_resource_adaptor al{sim, 4096, 1000};
    void* p = al.allocate(2000);
    REQUIRE(sim->owns(p) == false);
    CHECK_THROWS_WITH(al.deallocate(p, 500), Catch::Contains("it was allocated with 2000 B, alignment 4096"));
    al.deallocate(p, 2000);
  }
  sim->deallocate(offset, 256);
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("aligned: a block that was not over-aligned, freed as if it were, is refused as live, not foreign") {
  // The refusal said the adaptor "did not hand it out or it was already freed", while the
  // block was live: allocated below the threshold (the upstream's own block), freed with
  // a size above it.
  auto sim = std::make_shared<simulated_memory_resource>();
  aligned_resource_adaptor al{sim, 4096, 1000};
  void* p = al.allocate(500);
  CHECK_THROWS_WITH(al.deallocate(p, 2000),
                    Catch::Contains("or it was allocated without over-alignment (a size under 1000 B and an alignment of at "
                                                    "most 256 B") &&
                        Catch::Contains("nothing was freed"));
  void* q = al.allocate(100, stream_view{}, 256);
  CHECK_THROWS_WITH(al.deallocate(q, 100, stream_view{}, 4096), Catch::Contains("allocated without over-alignment"));
  al.deallocate(q, 100, stream_view{}, 256);
  al.deallocate(p, 500);  // nothing was freed: the right free still works
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("aligned: 8 threads with random sizes and alignments") {
  constexpr int threads = 8;
  auto sim = std::make_shared<simulated_memory_resource>();
  aligned_resource_adaptor al{sim, 1024, 4096};
  std::vector<std::thread> pool;
  std::atomic<int> misaligned{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 3};
      struct block {
        void* p;
        std::size_t bytes;
        std::size_t align;
      };
      std::vector<block> mine;
      for (int i = 0; i < 5000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          std::size_t const bytes = 1 + rng() % 20000;
          std::size_t const align = std::size_t{1} << (rng() % 16);  // 1 .. 32 KiB
          void* p = al.allocate(bytes, {}, align);
          std::size_t const want = std::max({align, std::size_t{256}, bytes >= 4096 ? std::size_t{1024} : 0});
          if (!detail::is_aligned(p, want)) { misaligned.fetch_add(1); }
          mine.push_back({p, bytes, align});
        } else {
          std::size_t const k = rng() % mine.size();
          al.deallocate(mine[k].p, mine[k].bytes, {}, mine[k].align);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto const& b : mine) { al.deallocate(b.p, b.bytes, {}, b.align); }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(misaligned.load() == 0);
  CHECK(al.outstanding_over_aligned() == 0);
  CHECK(sim->allocation_count() == 0);
  CHECK(sim->footprint() == 0);
}
