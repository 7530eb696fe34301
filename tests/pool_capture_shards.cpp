// A per-thread default stream being captured into a CUDA graph, once the pool shards by
// thread: its frees land in its thread's shard, and the shard's wholly free slab goes back
// to the global blocks (a drain before growth, by its own thread or another). Memory freed
// in the capture must stay out of other streams' reach while the capture lasts, and no
// wholly free chunk holding it may go back to the upstream by growth until its stream
// records (docs/suballocators.md, "Graph captures"). Real threads over the fake event seam,
// each thread's default stream a stream of its own (thread_stream_seam.hpp).
#include <catch2/catch.hpp>

#include <phase_gate.hpp>
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// Forwards to a simulated upstream and remembers every range given back.
class return_recorder final : public memory_resource {
 public:
  /// True when a range given back so far contains `p`.
  bool returned(void const* p) const {
    std::lock_guard lock{mutex_};
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    for (auto const& [base, size] : returns_) {
      if (a >= base && a < base + size) { return true; }
    }
    return false;
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view s) override {
    return sim_.allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_view s) override {
    {
      std::lock_guard lock{mutex_};
      returns_.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
    }
    sim_.deallocate(p, bytes, s, alignment);
  }
  std::string do_name() const override { return "return_recorder"; }
  memory_kind do_kind() const noexcept override { return memory_kind::none; }
  mutable std::mutex mutex_;
  std::vector<std::pair<std::uintptr_t, std::size_t>> returns_;
  simulated_memory_resource sim_;
};

struct sharded_setup {
  explicit sharded_setup(bool sharded, std::size_t shards = 64, std::size_t initial = 0) {
    pool_options o;
    o.stream_sync = seam;
    o.thread_shards = sharded ? shards : 0;
    o.shard_after_contentions = 0;  // shards from the second calling thread on
    pool.emplace(upstream, initial, std::nullopt, o);
  }
  std::shared_ptr<test::thread_stream_seam> seam = std::make_shared<test::thread_stream_seam>();
  std::shared_ptr<return_recorder> upstream = std::make_shared<return_recorder>();
  std::optional<pool_memory_resource> pool;
  stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};
};

bool overlaps(void const* p, std::size_t n, void const* x) {
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  auto const q = reinterpret_cast<std::uintptr_t>(x);
  return q >= a && q < a + n;
}

}  // namespace

TEST_CASE("pool capture shards: a captured default stream's shard frees reach no other stream and no upstream return") {
  sharded_setup f{true};
  auto& pool = *f.pool;
  auto& seam = *f.seam;
  pool.deallocate(pool.allocate(256, f.b), 256, f.b);  // the first thread: the next one shards
  test::phase_gate gate;
  void* x = nullptr;
  std::thread a{[&] {
    x = pool.allocate(64 * KiB, stream_view::per_thread());  // in a's shard, in a slab of its own
    seam.begin_capture_here();
    (void)seam.enqueue_here();  // the graph's use of x
    pool.deallocate(x, 64 * KiB, stream_view::per_thread());
    gate.advance(1);
    gate.wait_for(2);
    // Still captured: a's own drain gives its slab back, and a grows; the chunk stays.
    void* big = pool.allocate(32 * MiB, stream_view::per_thread());
    CHECK_FALSE(f.upstream->returned(x));
    pool.deallocate(big, 32 * MiB, stream_view::per_thread());
    gate.advance(3);
    gate.wait_for(4);
    seam.end_capture_here();
  }};
  gate.wait_for(1);
  REQUIRE(pool.stats().thread_shards >= 1);
  REQUIRE(pool.stats().slab_bytes > 0);
  // Another stream wants more than any free block: the drain takes a's wholly free slab
  // back into the global blocks (a's shard is not busy), but b may not take it.
  void* on_b = pool.allocate(5 * MiB, f.b);  // b's own chunk holds 4 MiB
  CHECK(pool.stats().slab_bytes == 0);  // the slab went back
  CHECK_FALSE(overlaps(on_b, 5 * MiB, x));
  void* more_on_b = pool.allocate(2 * MiB, f.b);
  CHECK_FALSE(overlaps(more_on_b, 2 * MiB, x));
  // This thread's own default stream: a slab for its shard, not out of a's memory.
  void* mine = pool.allocate(64 * KiB, stream_view::per_thread());
  CHECK_FALSE(overlaps(mine, 64 * KiB, x));
  CHECK_FALSE(f.upstream->returned(x));
  gate.advance(2);
  gate.wait_for(3);
  void* after_a_grew = pool.allocate(8 * MiB, f.b);  // growth by another stream keeps it too
  CHECK_FALSE(overlaps(after_a_grew, 8 * MiB, x));
  CHECK_FALSE(f.upstream->returned(x));
  seam.ask([](test::fake_stream_sync& fake) {
    CHECK(fake.records_in_capture == 0);
    CHECK(fake.waits_into_capture == 0);
    CHECK(fake.syncs_in_capture == 0);
    return 0;
  });
  gate.advance(4);
  a.join();
  pool.deallocate(on_b, 5 * MiB, f.b);
  pool.deallocate(more_on_b, 2 * MiB, f.b);
  pool.deallocate(after_a_grew, 8 * MiB, f.b);
  pool.deallocate(mine, 64 * KiB, stream_view::per_thread());
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool capture shards: a slab handed back after the capture keeps the capture's mark until its stream records") {
  // Two threads share the one shard. The other thread wants a's memory during a's
  // capture: the shard then knows a freed in a capture (a's record is declined), and that
  // memory may not go back to the upstream until a records again. a's growth after the capture
  // drains the slab into the global blocks first, and then consolidates: the mark has to
  // go with the slab.
  // Every chunk is grown whole for one thread (2 MiB-aligned over `simulated`), and the
  // global blocks hold no free memory of a's stream that another stream could ask for:
  // nothing records on a's stream there.
  sharded_setup f{true, 1};
  auto& pool = *f.pool;
  auto& seam = *f.seam;
  void* first = pool.allocate(4 * MiB, stream_view::per_thread());  // a chunk of its own, live throughout
  test::phase_gate gate;
  void* x1 = nullptr;
  std::thread a{[&] {
    x1 = pool.allocate(64 * KiB, stream_view::per_thread());  // a 4 MiB slab of a 6 MiB chunk
    void* x2 = pool.allocate(64 * KiB, stream_view::per_thread());
    void* rest = pool.allocate(2 * MiB, stream_view::per_thread());  // the chunk's 2 MiB beside the slab
    seam.begin_capture_here();
    (void)seam.enqueue_here();  // the graph's use of x1 and x2
    pool.deallocate(x1, 64 * KiB, stream_view::per_thread());
    gate.advance(1);
    gate.wait_for(2);
    pool.deallocate(x2, 64 * KiB, stream_view::per_thread());  // wanted: a record, declined in the capture
    seam.end_capture_here();
    pool.deallocate(rest, 2 * MiB, stream_view::per_thread());
    std::uintptr_t const mine = seam.mine();
    std::size_t records_on_a = 0;
    seam.ask([&](test::fake_stream_sync& fake) { return fake.on_record = [&, mine](std::uintptr_t h) { records_on_a += h == mine; }; });
    void* big = pool.allocate(64 * MiB, stream_view::per_thread());
    seam.ask([](test::fake_stream_sync& fake) { return fake.on_record = nullptr; });
    CHECK(records_on_a == 0);  // a's stream recorded nothing since the capture
    CHECK(pool.stats().slab_bytes < 8 * MiB);  // a's slab went back to the global blocks
    CHECK_FALSE(f.upstream->returned(x1));
    pool.deallocate(big, 64 * MiB, stream_view::per_thread());
    gate.advance(3);
  }};
  std::thread other{[&] {
    gate.wait_for(1);
    void* y = pool.allocate(512 * KiB, stream_view::per_thread());  // a's free memory would do: asked for
    CHECK_FALSE(overlaps(y, 512 * KiB, x1));
    gate.advance(2);
    gate.wait_for(3);  // y stays live meanwhile: no other default stream's memory is free
    pool.deallocate(y, 512 * KiB, stream_view::per_thread());
  }};
  a.join();
  other.join();
  pool.deallocate(first, 4 * MiB, stream_view::per_thread());
  CHECK(pool.check_invariants() == "");
}
