// Stream-ordered reuse of the pool, model-tested on the CPU through the fake event seam:
// every block handed to a stream must be ordered after the work of whichever stream
// freed it (same stream, an event wait, or a synchronization); events are recorded
// lazily; one stream means no CUDA calls; per-thread default streams are only recorded
// on by their own thread. Longer sweeps: MRSTACK_LONG_TESTS=1.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <freed_ranges.hpp>
#include <simulated_threads.hpp>

#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <map>
#include <random>
#include <thread>
#include <vector>

using namespace mrstack;
using detail::stream_ref;
using test::fake_stream_sync;
using test::freed_ranges;
using test::current_thread;
using test::ptds_handle_base;
using test::ptds_of;
using test::shared_stream;
using test::simulated_thread_key;

namespace {

bool long_tests() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr; }
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct live_block {
  std::size_t size;
  stream_ref stream;
  std::uintptr_t thread;
};

/// A pool over the fake seam; threads 3, 5, 7 and 9 on their per-thread default streams
/// (blocking streams); blocks of `sizes` allocated in order on thread 3's stream from one
/// chunk that holds exactly them.
struct default_streams_setup {
  std::shared_ptr<fake_stream_sync> fake = std::make_shared<fake_stream_sync>();
  detail::stream_ordered_pool core{fake, &simulated_thread_key};
  stream_ref t3 = ptds_of(3), t5 = ptds_of(5), t7 = ptds_of(7), t9 = ptds_of(9);
  std::vector<std::uintptr_t> blocks;

  explicit default_streams_setup(std::initializer_list<std::size_t> sizes) {
    for (auto const& t : {t3, t5, t7, t9}) { fake->set_blocking(t.handle); }
    current_thread = 3;
    std::size_t total = 0;
    for (std::size_t n : sizes) { total += n; }
    core.add_chunk(0x700000000000, total, t3);
    for (std::size_t n : sizes) { blocks.push_back(core.allocate(n, 256, t3)); }
  }
};

}  // namespace

TEST_CASE("pool streams: random work on shared and per-thread streams never reuses memory early") {
  int const seeds = long_tests() ? 40 : 5;
  int const steps = long_tests() ? 300000 : 100000;
  std::uintptr_t const threads[] = {3, 5, 7};
  stream_ref const shared[] = {shared_stream(0x100), shared_stream(0x200), shared_stream(0)};
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng{static_cast<std::uint64_t>(seed)};
    auto fake = std::make_shared<fake_stream_sync>();
    for (std::uintptr_t t : threads) { fake->set_blocking(ptds_of(t).handle); }
    fake->on_record = [&](std::uintptr_t stream) {
      if (stream >= ptds_handle_base) {
        INFO("recorded on the per-thread stream of thread " << stream - ptds_handle_base << " from thread "
                                                            << current_thread);
        REQUIRE(stream - ptds_handle_base == current_thread);
      }
    };
    detail::stream_ordered_pool core{fake, &simulated_thread_key};
    freed_ranges freed;
    std::map<std::uintptr_t, live_block> live;
    std::uintptr_t next_chunk = 0x500000000000;
    std::size_t syncs = 0;
    for (int step = 0; step < steps; ++step) {
      if (live.empty() || rng() % 100 < 52) {
        current_thread = threads[rng() % 3];
        stream_ref const s = rng() % 2 == 0 ? shared[rng() % 3] : ptds_of(current_thread);
        std::size_t const size = (1 + rng() % (rng() % 8 == 0 ? 4096 : 64)) * 256;
        std::size_t const alignment = rng() % 8 == 0 ? 4 * KiB : 256;
        std::uintptr_t a = core.allocate(size, alignment, s);
        if (a == 0 && core.blocks().total_bytes() > 256 * MiB && core.synchronize_everything()) {
          ++syncs;  // the pool's last resort before growing past a cap
          a = core.allocate(size, alignment, s);
        }
        if (a == 0) {
          std::size_t const chunk = std::max<std::size_t>(8 * MiB, size + alignment);
          core.add_chunk(next_chunk, chunk, s);
          next_chunk += chunk + 64 * MiB;
          a = core.allocate(size, alignment, s);
          REQUIRE(a != 0);
        }
        REQUIRE(a % alignment == 0);
        REQUIRE(freed.take(a, size, s.handle, *fake) == "");
        auto next = live.lower_bound(a);
        if (next != live.end()) { REQUIRE(a + size <= next->first); }
        if (next != live.begin()) { REQUIRE(std::prev(next)->first + std::prev(next)->second.size <= a); }
        live.emplace(a, live_block{size, s, current_thread});
        fake->enqueue(s.handle);  // work on the new block
      } else {
        auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
        // Freed on the stream it was used on; a per-thread stream only by its own thread.
        current_thread = it->second.stream.thread_bound ? it->second.thread : threads[rng() % 3];
        std::uint64_t const clock = fake->enqueue(it->second.stream.handle);  // its last use
        REQUIRE(core.deallocate(it->first, it->second.stream) == it->second.size);
        freed.add(it->first, it->second.size, it->second.stream.handle, clock);
        live.erase(it);
      }
      if (step % 128 == 0) { REQUIRE(core.blocks().check_invariants() == ""); }
    }
    INFO("records " << fake->records << ", waits " << fake->waits << ", device syncs " << fake->sync_alls);
    CHECK(fake->records > 0);  // the test did exercise cross-stream handovers
    CHECK(fake->waits > 0);
    for (auto const& [a, b] : live) {
      current_thread = b.thread;
      REQUIRE(core.deallocate(a, b.stream) == b.size);
    }
    core.synchronize_everything();
    REQUIRE(core.blocks().check_invariants() == "");
    std::size_t free_blocks = 0;
    core.blocks().for_each_free_block([&](std::uintptr_t, std::size_t, detail::owner_id) { ++free_blocks; });
    CHECK(free_blocks == core.blocks().chunk_count());
    (void)syncs;
  }
  current_thread = 3;
}

TEST_CASE("pool streams: the pool fails the model when the event wait is skipped (the model can fail)") {
  // A stand-in seam that "forgets" to make the waiting stream wait: the model must notice.
  class forgetful final : public detail::stream_sync {
   public:
    explicit forgetful(std::shared_ptr<fake_stream_sync> inner) : inner_{std::move(inner)} {}
    handle create_event() override { return inner_->create_event(); }
    void destroy_event(handle e) noexcept override { inner_->destroy_event(e); }
    bool record(handle e, handle s) override { return inner_->record(e, s); }
    void wait(handle, handle) override {}
    void synchronize(handle s) override { inner_->synchronize(s); }
    void synchronize_all() override { inner_->synchronize_all(); }

   private:
    std::shared_ptr<fake_stream_sync> inner_;
  };
  auto fake = std::make_shared<fake_stream_sync>();
  detail::stream_ordered_pool core{std::make_shared<forgetful>(fake), &simulated_thread_key};
  core.add_chunk(0x600000000000, 1 * MiB, shared_stream(0x100));
  std::uintptr_t const a = core.allocate(512 * KiB, 256, shared_stream(0x100));
  std::uintptr_t const a2 = core.allocate(512 * KiB, 256, shared_stream(0x100));
  std::uint64_t const clock = fake->enqueue(0x100);
  core.deallocate(a, shared_stream(0x100));
  CHECK(core.allocate(1 * MiB, 256, shared_stream(0x200)) == 0);  // asks A to park; nothing yet
  core.deallocate(a2, shared_stream(0x100));                      // A's call: records, parks both
  std::uintptr_t const b = core.allocate(1 * MiB, 256, shared_stream(0x200));
  REQUIRE(b == a);
  CHECK_FALSE(fake->ordered_after(0x200, 0x100, clock));
}

TEST_CASE("pool streams: one stream makes no CUDA calls; with two, created streams record only when asked") {
  auto fake = std::make_shared<fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.stream_sync = fake;
  options.park_minimum = 0;  // the share of the pool alone (tests/pool_contention.cpp has the minimum)
  auto const a_stream = stream_view{reinterpret_cast<cudaStream_t>(0x100)};
  auto const b_stream = stream_view{reinterpret_cast<cudaStream_t>(0x200)};
  options.initial_stream = a_stream;
  pool_memory_resource pool{sim, 64 * MiB, std::nullopt, options};
  CHECK(fake->syncs == 1);  // the initial chunk: waited for once, then usable by any stream
  std::size_t const at_start = fake->calls();

  std::mt19937_64 rng{42};
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      std::size_t const size = 1 + rng() % (256 * KiB);
      live.emplace_back(pool.allocate(size, a_stream), size);
    } else {
      std::size_t const k = rng() % live.size();
      pool.deallocate(live[k].first, live[k].second, a_stream);
      live[k] = live.back();
      live.pop_back();
    }
  }
  CHECK(fake->calls() == at_start);  // one stream: not a single event call, however many frees
  std::uint64_t const clock_a = fake->enqueue(0x100);  // A's last work on its blocks
  for (auto& [p, size] : live) { pool.deallocate(p, size, a_stream); }
  live.clear();
  CHECK(fake->calls() == at_start);  // frees never record

  // B wants memory. A's frees are covered by no event, and A is not named by this call
  // (it may be destroyed): B takes nothing of A's and grows; A is asked to record.
  void* on_b = pool.allocate(32 * MiB, b_stream);
  CHECK(fake->records == 0);
  CHECK(fake->waits == 0);
  CHECK(fake->sync_alls == 0);
  std::size_t const grown = pool.pool_size();
  CHECK(grown > 64 * MiB);
  // A's next call records once and parks everything A holds free under that event.
  void* small = pool.allocate(4 * KiB, a_stream);
  CHECK(fake->records == 1);
  // Two streams busy: frees record nothing while nobody asks, until a stream has freed
  // 1/park_divisor of the pool since its last record: one record per 25 frees here, not
  // one per free. B's first block comes from A's parked memory (one wait); then each
  // stream reuses its own frees.
  std::size_t const park_above = pool.pool_size() / detail::park_policy::default_divisor;
  std::size_t const frees_per_record = park_above / (4 * KiB) + 1;
  for (int i = 0; i < 1000; ++i) {
    pool.deallocate(pool.allocate(4 * KiB, b_stream), 4 * KiB, b_stream);
    pool.deallocate(pool.allocate(4 * KiB, a_stream), 4 * KiB, a_stream);
  }
  std::size_t const records = 1 + 2 * (1000 / frees_per_record);
  CHECK(frees_per_record == 25);
  CHECK(fake->records == records);
  CHECK(fake->waits == 1);
  std::size_t a_entries = 0;  // A's memory, parked or not, is one stream's in the report
  for (auto const& share : pool.fragmentation().streams) { a_entries += share.stream == 0x100 ? 1 : 0; }
  CHECK(a_entries == 1);
  // B takes a large block of A's parked memory: one more wait on A's event, no sync, no growth.
  void* more_b = pool.allocate(40 * MiB, b_stream);
  CHECK(fake->waits == 2);
  CHECK(fake->sync_alls == 0);
  CHECK(fake->ordered_after(0x200, 0x100, clock_a));
  CHECK(pool.pool_size() == grown);
  CHECK(pool.stats().stream_waits == 2);
  CHECK(pool.stats().events_recorded == records);
  pool.deallocate(more_b, 40 * MiB, b_stream);
  pool.deallocate(on_b, 32 * MiB, b_stream);
  pool.deallocate(small, 4 * KiB, a_stream);
  CHECK(pool.check_invariants() == "");
  CHECK(fake->dead_named == 0);
}

TEST_CASE("pool streams: another thread's default stream is waited for through the legacy stream, then precisely") {
  auto fake = std::make_shared<fake_stream_sync>();
  fake->on_record = [](std::uintptr_t stream) {
    if (stream >= ptds_handle_base) { REQUIRE(stream - ptds_handle_base == current_thread); }
  };
  detail::stream_ordered_pool core{fake, &simulated_thread_key};
  stream_ref const t1 = ptds_of(3);
  stream_ref const t2 = ptds_of(5);
  fake->set_blocking(t1.handle);
  fake->set_blocking(t2.handle);
  current_thread = 3;
  core.add_chunk(0x700000000000, 16 * MiB, t1);
  std::uintptr_t const a = core.allocate(8 * MiB, 256, t1);
  std::uintptr_t const c = core.allocate(8 * MiB, 256, t1);
  std::uint64_t const clock_a = fake->enqueue(t1.handle);
  core.deallocate(a, t1);

  current_thread = 5;  // thread 2 wants it: thread 1's stream cannot be named from here
  CHECK(core.allocate(8 * MiB, 256, t2) == a);
  CHECK(fake->records == 1);  // on the legacy stream: it waits for every blocking stream
  CHECK(fake->waits == 1);
  CHECK(fake->ordered_after(t2.handle, t1.handle, clock_a));

  current_thread = 3;  // thread 1 was asked to record: its next free does, on its own stream
  std::uint64_t const clock_c = fake->enqueue(t1.handle);
  core.deallocate(c, t1);
  CHECK(fake->records == 2);

  current_thread = 5;  // now a precise wait on thread 1's event is enough
  CHECK(core.allocate(8 * MiB, 256, t2) == c);
  CHECK(fake->records == 2);
  CHECK(fake->waits == 2);
  CHECK(fake->ordered_after(t2.handle, t1.handle, clock_c));
  current_thread = 3;
}

TEST_CASE("pool streams: one legacy-stream record covers every default stream's free memory, waited on once") {
  default_streams_setup x{8 * MiB, 8 * MiB, 8 * MiB};
  auto& fake = x.fake;
  std::uintptr_t const a = x.blocks[0], b = x.blocks[1], c = x.blocks[2];
  std::uint64_t const clock_a = fake->enqueue(x.t3.handle);
  x.core.deallocate(a, x.t3);
  current_thread = 5;  // b and c are used and freed on thread 5's stream
  std::uint64_t const clock_b = fake->enqueue(x.t5.handle);
  x.core.deallocate(b, x.t5);

  current_thread = 7;  // takes both freed blocks: one record covers both streams' frees
  std::uintptr_t const first = x.core.allocate(8 * MiB, 256, x.t7);
  std::uintptr_t const second = x.core.allocate(8 * MiB, 256, x.t7);
  CHECK(((first == a && second == b) || (first == b && second == a)));
  CHECK(fake->records == 1);
  CHECK(fake->waits == 1);  // the second takeover: already ordered after that record
  CHECK(fake->ordered_after(x.t7.handle, x.t3.handle, clock_a));
  CHECK(fake->ordered_after(x.t7.handle, x.t5.handle, clock_b));

  current_thread = 5;  // a free after the record is not covered by it
  std::uint64_t const clock_c = fake->enqueue(x.t5.handle);
  x.core.deallocate(c, x.t5);
  current_thread = 7;
  CHECK(x.core.allocate(8 * MiB, 256, x.t7) == c);
  CHECK(fake->records == 2);
  CHECK(fake->waits == 2);
  CHECK(fake->ordered_after(x.t7.handle, x.t5.handle, clock_c));
  current_thread = 3;
}

TEST_CASE("pool streams: a default stream covered by its own event keeps it when the legacy record is made") {
  // A wait on the legacy stream also waits for every other blocking stream's work; an
  // owner that recorded precisely is taken from after a wait on its own event.
  default_streams_setup x{8 * MiB, 4 * MiB, 8 * MiB};
  auto& fake = x.fake;
  std::uintptr_t const a = x.blocks[0], c = x.blocks[1], b = x.blocks[2];
  x.core.deallocate(a, x.t3);
  current_thread = 5;
  CHECK(x.core.allocate(8 * MiB, 256, x.t5) == a);  // through the legacy stream; thread 3 is asked to record
  current_thread = 3;
  std::uint64_t const clock_c = fake->enqueue(x.t3.handle);
  x.core.deallocate(c, x.t3);  // answers with a record on its own stream
  CHECK(fake->records == 2);
  current_thread = 9;
  x.core.deallocate(b, x.t9);
  current_thread = 7;
  CHECK(x.core.allocate(8 * MiB, 256, x.t7) == b);  // a new legacy record
  CHECK(fake->records == 3);
  CHECK(fake->waits == 2);
  CHECK(x.core.allocate(4 * MiB, 256, x.t7) == c);  // after a wait on thread 3's own event
  CHECK(fake->records == 3);
  CHECK(fake->waits == 3);
  CHECK(fake->ordered_after(x.t7.handle, x.t3.handle, clock_c));
  current_thread = 3;
}

TEST_CASE("pool streams: a created stream waits on the legacy record at every takeover") {
  // Default streams remember that they waited on the record; a created stream may not: its
  // handle can be destroyed and come back as a new stream that never waited.
  default_streams_setup x{8 * MiB, 8 * MiB};
  stream_ref const user = shared_stream(0x100);
  x.core.deallocate(x.blocks[0], x.t3);
  current_thread = 5;
  x.core.deallocate(x.blocks[1], x.t5);
  current_thread = 7;
  (void)x.core.allocate(8 * MiB, 256, user);
  (void)x.core.allocate(8 * MiB, 256, user);
  CHECK(x.fake->records == 1);
  CHECK(x.fake->waits == 2);
  current_thread = 3;
}

TEST_CASE("pool streams: a stream that never calls again is reached after one device synchronization") {
  auto fake = std::make_shared<fake_stream_sync>();
  detail::stream_ordered_pool core{fake, &simulated_thread_key};
  stream_ref const a = shared_stream(0x100);
  stream_ref const b = shared_stream(0x200);
  core.add_chunk(0x710000000000, 4 * MiB, a);
  std::uintptr_t const p = core.allocate(4 * MiB, 256, a);
  std::uint64_t const clock = fake->enqueue(a.handle);
  core.deallocate(p, a);
  fake->kill(a.handle);  // destroyed
  CHECK(core.allocate(4 * MiB, 256, b) == 0);  // a is asked to park, but it never calls again
  CHECK(core.synchronize_everything());        // what the pool does when it cannot grow
  CHECK(core.allocate(4 * MiB, 256, b) == p);
  CHECK(fake->sync_alls == 1);
  CHECK(fake->dead_named == 0);  // a destroyed stream is never named: that is a crash on a GPU
  CHECK(fake->ordered_after(b.handle, a.handle, clock));
}

namespace {

/// Forwards to a simulated upstream and checks that memory is never returned on a stream
/// the test has destroyed (cudaFreeAsync on a destroyed stream crashes).
class stream_checking_upstream final : public memory_resource {
 public:
  explicit stream_checking_upstream(std::shared_ptr<fake_stream_sync> fake) : fake_{std::move(fake)} {}
  std::size_t returned_on_dead = 0;
  std::size_t returns = 0;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view s) override {
    return sim_.allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_view s) override {
    ++returns;
    if (fake_->is_dead(reinterpret_cast<std::uintptr_t>(s.value()))) { ++returned_on_dead; }
    sim_.deallocate(p, bytes, s, alignment);
  }
  std::string do_name() const override { return "stream_checking"; }
  memory_kind do_kind() const noexcept override { return memory_kind::none; }
  std::shared_ptr<fake_stream_sync> fake_;
  simulated_memory_resource sim_;
};

}  // namespace

TEST_CASE("pool streams: streams destroyed while the pool holds their free memory are never named again") {
  // The GPU failures: (1) pool over cuda_async, a block handed from stream a to stream b,
  // both streams destroyed, then the pool destroyed: it returned the chunk with
  // cudaFreeAsync on b. (2) four threads, each with its own stream, destroyed when the
  // thread ends; then a new stream took their memory over by recording an event on each
  // dead stream. Both are undefined behaviour (SIGSEGV on the H100).
  auto fake = std::make_shared<fake_stream_sync>();
  auto upstream = std::make_shared<stream_checking_upstream>(fake);
  pool_options options;
  options.stream_sync = fake;
  auto pool = std::make_unique<pool_memory_resource>(upstream, 0, std::nullopt, options);
  std::vector<std::uintptr_t> const handles{0x100, 0x200, 0x300, 0x400};
  std::map<std::uintptr_t, std::pair<std::uintptr_t, std::uint64_t>> freed;  // address -> freer, clock
  for (std::uintptr_t h : handles) {
    stream_view const s{reinterpret_cast<cudaStream_t>(h)};
    std::vector<void*> mine;
    for (int i = 0; i < 8; ++i) { mine.push_back(pool->allocate((std::size_t{1} << (12 + i)) + 5, s)); }
    std::uint64_t const clock = fake->enqueue(h);  // work on the blocks, still queued
    for (int i = 0; i < 8; ++i) {
      pool->deallocate(mine[static_cast<std::size_t>(i)], (std::size_t{1} << (12 + i)) + 5, s);
      freed[reinterpret_cast<std::uintptr_t>(mine[static_cast<std::size_t>(i)])] = {h, clock};
    }
    fake->kill(h);  // the thread's stream is destroyed with its frees still pending
  }
  stream_view const fresh{reinterpret_cast<cudaStream_t>(0x900)};
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) {
    void* p = pool->allocate(64 * KiB, fresh);
    held.push_back(p);
    auto const it = freed.find(reinterpret_cast<std::uintptr_t>(p));
    if (it != freed.end()) { CHECK(fake->ordered_after(0x900, it->second.first, it->second.second)); }
  }
  CHECK(fake->dead_named == 0);
  for (void* p : held) { pool->deallocate(p, 64 * KiB, fresh); }

  // Handed from a to b, both destroyed, then the pool: no chunk may go back on b.
  stream_view const a{reinterpret_cast<cudaStream_t>(0xa00)};
  stream_view const b{reinterpret_cast<cudaStream_t>(0xb00)};
  void* x = pool->allocate(512 * MiB, a);
  pool->deallocate(x, 512 * MiB, a);
  void* y = pool->allocate(512 * MiB, b);
  pool->deallocate(y, 512 * MiB, b);
  fake->kill(0xa00);
  fake->kill(0xb00);
  fake->kill(0x900);
  pool.reset();
  CHECK(upstream->returns > 0);
  CHECK(upstream->returned_on_dead == 0);
  CHECK(fake->dead_named == 0);
}

TEST_CASE("pool streams: an exited thread's free memory is taken over whole, with one ordering point") {
  auto fake = std::make_shared<fake_stream_sync>();
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.stream_sync = fake;
  pool_memory_resource pool{sim, 0, std::nullopt, options};
  std::thread worker{[&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 100; ++i) { blocks.push_back(pool.allocate(64 * KiB, stream_view::per_thread())); }
    for (void* p : blocks) { pool.deallocate(p, 64 * KiB, stream_view::per_thread()); }
  }};
  worker.join();
  std::size_t const size_before = pool.pool_size();
  std::vector<void*> mine;
  for (int i = 0; i < 100; ++i) { mine.push_back(pool.allocate(64 * KiB, stream_view::per_thread())); }
  CHECK(fake->records == 1);  // one event on the legacy stream covers the exited thread's work
  CHECK(fake->waits == 1);    // and everything it held moved over at once
  CHECK(pool.pool_size() == size_before);
  for (void* p : mine) { pool.deallocate(p, 64 * KiB, stream_view::per_thread()); }
}
