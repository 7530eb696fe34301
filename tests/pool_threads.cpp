// The pool under real threads (run it under the tsan preset too): each thread has a home
// shard; blocks move between threads and shards, are freed on other streams, and the
// pool must keep the accounting exact, the contents intact (system memory, written and
// checked), the stream-ordering rule (a fake event seam shared by all threads checks
// every handover), misuse detected wherever the block lives, and no shard hoarding free
// memory while another grows or fails. Longer sweeps: MRSTACK_LONG_TESTS=1.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;
using test::fake_stream_sync;

namespace {

bool long_tests() { return std::getenv("MRSTACK_LONG_TESTS") != nullptr; }
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

stream_view created_stream(std::size_t i) {
  return stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x10000} * (i + 1))};
}

/// Failures seen on worker threads (Catch's assertions are for the main thread).
class failures {
 public:
  void add(std::string what) {
    std::lock_guard lock{mutex_};
    if (list_.size() < 10) { list_.push_back(std::move(what)); }
    ++count_;
  }
  [[nodiscard]] std::string report() const {
    std::string out;
    for (auto const& f : list_) { out += f + "\n"; }
    return out;
  }
  [[nodiscard]] std::size_t count() const { return count_; }

 private:
  std::mutex mutex_;
  std::vector<std::string> list_;
  std::size_t count_ = 0;
};

struct block {
  void* ptr;
  std::size_t bytes;
  stream_view stream;
  unsigned char tag;
};

/// Blocks handed from thread to thread: the receiver checks and frees them.
class mailbox {
 public:
  void put(block b) {
    std::lock_guard lock{mutex_};
    blocks_.push_back(b);
  }
  bool take(block& b) {
    std::lock_guard lock{mutex_};
    if (blocks_.empty()) { return false; }
    b = blocks_.back();
    blocks_.pop_back();
    return true;
  }
  std::vector<block> drain() {
    std::lock_guard lock{mutex_};
    return std::move(blocks_);
  }

 private:
  std::mutex mutex_;
  std::vector<block> blocks_;
};

bool intact(block const& b) {
  auto const* p = static_cast<unsigned char const*>(b.ptr);
  for (std::size_t i = 0; i < std::min<std::size_t>(b.bytes, 64); ++i) {
    if (p[i] != b.tag) { return false; }
  }
  return p[b.bytes - 1] == b.tag;
}

void fill(block const& b) {
  std::memset(b.ptr, b.tag, std::min<std::size_t>(b.bytes, 64));
  static_cast<unsigned char*>(b.ptr)[b.bytes - 1] = b.tag;
}

}  // namespace

TEST_CASE("pool threads: random work on 8 threads, blocks passed between them, contents and accounting exact") {
  int const seeds = long_tests() ? 10 : 2;
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    auto sys = std::make_shared<system_memory_resource>();
    pool_options options;
    options.shards = 4;  // fewer shards than threads: shards are shared too
    pool_memory_resource pool{sys, 0, std::nullopt, options};
    constexpr std::size_t threads = 8;
    int const steps = long_tests() ? 20000 : 3000;
    failures failed;
    mailbox box;
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::mt19937_64 rng{static_cast<std::uint64_t>(seed) * 100 + t};
        std::vector<block> live;
        auto free_one = [&](block const& b, stream_view s) {
          if (!intact(b)) { failed.add("a block's contents changed while it was live"); }
          pool.deallocate(b.ptr, b.bytes, s);
        };
        for (int i = 0; i < steps; ++i) {
          auto const r = rng() % 100;
          try {
            if (live.empty() || r < 50) {
              std::size_t const bytes = 1 + rng() % (rng() % 4 == 0 ? 2 * MiB : 16 * KiB);
              // Mostly the thread's own streams, sometimes the one every thread shares.
              stream_view const s = rng() % 5 == 0 ? stream_view::per_thread()
                                    : rng() % 5 == 0 ? stream_view{} : created_stream(t);
              block b{pool.allocate(bytes, s), bytes, s, static_cast<unsigned char>(rng())};
              fill(b);
              live.push_back(b);
            } else if (r < 60) {  // to another thread
              std::size_t const k = rng() % live.size();
              box.put(live[k]);
              live[k] = live.back();
              live.pop_back();
            } else if (block b{}; r < 70 && box.take(b)) {  // from another thread, on our stream
              free_one(b, created_stream(t));
            } else {
              std::size_t const k = rng() % live.size();
              free_one(live[k], rng() % 4 == 0 ? created_stream(t) : live[k].stream);
              live[k] = live.back();
              live.pop_back();
            }
          } catch (std::exception const& e) {
            failed.add(e.what());
          }
        }
        for (auto const& b : live) { free_one(b, b.stream); }
      });
    }
    for (auto& w : workers) { w.join(); }
    for (auto const& b : box.drain()) { pool.deallocate(b.ptr, b.bytes, b.stream); }
    INFO(failed.report());
    REQUIRE(failed.count() == 0);
    auto const st = pool.stats();
    CHECK(st.used_bytes == 0);
    CHECK(st.live_blocks == 0);
    CHECK(st.free_bytes == st.pool_size);
    CHECK(st.shards >= 1);
    CHECK(st.shards <= 4);
    CHECK(pool.check_invariants() == "");
    pool.release();
    CHECK(pool.pool_size() == 0);
  }
}

namespace {

/// The fake event seam, shared by threads: every call under one lock (the model's too).
class locked_sync final : public detail::stream_sync {
 public:
  explicit locked_sync(std::shared_ptr<fake_stream_sync> fake) : fake_{std::move(fake)} {}
  handle create_event() override {
    std::lock_guard lock{mutex};
    return fake_->create_event();
  }
  void destroy_event(handle event) noexcept override {
    std::lock_guard lock{mutex};
    fake_->destroy_event(event);
  }
  bool record(handle event, handle stream) override {
    std::lock_guard lock{mutex};
    return fake_->record(event, stream);
  }
  void wait(handle stream, handle event) override {
    std::lock_guard lock{mutex};
    if (!skip_waits) { fake_->wait(stream, event); }
  }
  void synchronize(handle stream) override {
    std::lock_guard lock{mutex};
    fake_->synchronize(stream);
  }
  void synchronize_all() override {
    std::lock_guard lock{mutex};
    fake_->synchronize_all();
  }
  std::mutex mutex;
  bool skip_waits = false;  // the control: a pool whose waits do nothing must fail the model

 private:
  std::shared_ptr<fake_stream_sync> fake_;
};

/// Threads on created streams take each other's memory (through other shards and
/// takeovers); every block handed out must be ordered after the work of whoever freed
/// its bytes. Returns how many handouts broke that rule.
std::size_t ordering_violations(bool skip_waits, std::uint64_t seed) {
  auto fake = std::make_shared<fake_stream_sync>();
  auto sync = std::make_shared<locked_sync>(fake);
  sync->skip_waits = skip_waits;
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.stream_sync = sync;
  options.shards = 4;
  options.minimum_growth = 2 * MiB;
  // Chunks go back to the upstream only at the end: the simulated upstream would hand a
  // returned chunk to another stream at once, which the model cannot tell from a bug
  // (a real stream-ordered upstream orders that reuse itself).
  options.consolidate_on_growth = false;
  auto pool = std::make_shared<pool_memory_resource>(sim, 0, 256 * MiB, options);
  struct freed {
    std::uintptr_t end;
    std::uintptr_t stream;
    std::uint64_t clock;
  };
  std::map<std::uintptr_t, freed> freed_ranges;  // under sync->mutex
  std::atomic<std::size_t> violations{0};
  constexpr std::size_t threads = 6;
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng{seed * 31 + t};
      auto const handle = std::uintptr_t{0x10000} * (t + 1);
      stream_view const s{reinterpret_cast<cudaStream_t>(handle)};
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 1500; ++i) {
        std::this_thread::yield();  // interleave the threads even on a machine with few cores
        if (live.empty() || rng() % 100 < 50) {
          std::size_t const bytes = 1 + rng() % (rng() % 8 == 0 ? 4 * MiB : 64 * KiB);
          void* p = nullptr;
          try {
            p = pool->allocate(bytes, s);
          } catch (out_of_memory const&) {
            continue;
          }
          auto const a = reinterpret_cast<std::uintptr_t>(p);
          std::lock_guard lock{sync->mutex};
          std::uintptr_t const end = a + detail::align_up(bytes, 256);
          auto it = freed_ranges.upper_bound(a);
          if (it != freed_ranges.begin() && std::prev(it)->second.end > a) { --it; }
          while (it != freed_ranges.end() && it->first < end) {
            if (!fake->ordered_after(handle, it->second.stream, it->second.clock)) { ++violations; }
            it = freed_ranges.erase(it);  // (parts outside the block are forgotten: fewer checks, never false ones)
          }
          live.emplace_back(p, bytes);
        } else {
          std::size_t const k = rng() % live.size();
          auto const a = reinterpret_cast<std::uintptr_t>(live[k].first);
          {
            std::lock_guard lock{sync->mutex};
            std::uint64_t const clock = fake->enqueue(handle);  // work on the block, then the free
            freed_ranges[a] = freed{a + detail::align_up(live[k].second, 256), handle, clock};
          }
          pool->deallocate(live[k].first, live[k].second, s);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto& [p, n] : live) { pool->deallocate(p, n, s); }
    });
  }
  for (auto& w : workers) { w.join(); }
  std::printf("ordering run (seed %llu%s): %zu records, %zu waits, %zu device syncs, peak %zu MiB\n",
              static_cast<unsigned long long>(seed), skip_waits ? ", waits skipped" : "", fake->records, fake->waits,
              fake->sync_alls, sim->peak_footprint() >> 20);
  if (pool->check_invariants() != "") { return ~std::size_t{0}; }
  return violations.load();
}

}  // namespace

TEST_CASE("pool threads: six threads on their own streams never reuse memory before its freer's work") {
  int const seeds = long_tests() ? 12 : 3;
  for (int seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    CHECK(ordering_violations(false, static_cast<std::uint64_t>(seed)) == 0);
  }
}

TEST_CASE("pool threads: the model catches a pool whose waits are skipped (the check can fail)") {
  std::size_t total = 0;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) { total += ordering_violations(true, seed); }
  CHECK(total > 0);
}

TEST_CASE("pool threads: bad frees are detected whichever shard holds the block") {
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.shards = 8;
  pool_memory_resource pool{sim, 0, std::nullopt, options};
  std::vector<void*> blocks(8);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < blocks.size(); ++t) {
    workers.emplace_back([&, t] { blocks[t] = pool.allocate(1000 + t, stream_view::per_thread()); });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(pool.stats().shards > 1);
  // Freed here, on this thread: most blocks live in another thread's shard.
  for (std::size_t t = 0; t < blocks.size(); ++t) {
    CHECK_THROWS_WITH(pool.deallocate(static_cast<char*>(blocks[t]) + 256, 10), Catch::Contains("did not hand out"));
    CHECK_THROWS_WITH(pool.deallocate(blocks[t], 5000), Catch::Contains("5000"));  // freed anyway
    CHECK_THROWS_AS(pool.deallocate(blocks[t], 1000 + t), logic_error);          // now a double free
  }
  CHECK(pool.used_bytes() == 0);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool threads: free memory in one thread's shard serves another thread before the pool grows") {
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.shards = 8;
  options.minimum_growth = 2 * MiB;
  pool_memory_resource pool{sim, 0, std::nullopt, options};
  // A thread takes 64 MiB in blocks, frees them and exits: its shard holds them free.
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 64; ++i) { blocks.push_back(pool.allocate(MiB, stream_view::per_thread())); }
    for (void* p : blocks) { pool.deallocate(p, MiB, stream_view::per_thread()); }
  }).join();
  std::size_t const held = pool.pool_size();
  auto const chunks_taken = pool.stats().upstream_allocations;
  CHECK(held >= 64 * MiB);
  // Other threads (other home shards) allocate the same again: no growth.
  std::vector<std::thread> workers;
  std::vector<std::vector<void*>> got(4);
  for (std::size_t t = 0; t < got.size(); ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) { got[t].push_back(pool.allocate(MiB, stream_view::per_thread())); }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(pool.pool_size() == held);
  CHECK(pool.stats().upstream_allocations == chunks_taken);
  for (auto const& v : got) {
    for (void* p : v) { pool.deallocate(p, MiB); }
  }
}

TEST_CASE("pool threads: under a maximum, other shards' free chunks are returned before the pool fails") {
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_options options;
  options.shards = 8;
  options.minimum_growth = 2 * MiB;
  pool_memory_resource pool{sim, 0, 64 * MiB, options};
  // One thread fills most of the maximum with small chunks' worth of blocks and frees them.
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 48; ++i) { blocks.push_back(pool.allocate(MiB, stream_view::per_thread())); }
    for (void* p : blocks) { pool.deallocate(p, MiB, stream_view::per_thread()); }
  }).join();
  // Another asks one block larger than any chunk held: only by returning them can it fit.
  std::thread([&] {
    void* big = pool.allocate(56 * MiB, stream_view::per_thread());
    pool.deallocate(big, 56 * MiB, stream_view::per_thread());
  }).join();
  CHECK(sim->peak_footprint() <= 64 * MiB);
  CHECK(pool.check_invariants() == "");
}

TEST_CASE("pool threads: one thread uses one shard") {
  auto sim = std::make_shared<simulated_memory_resource>();
  pool_memory_resource pool{sim, 0};
  for (int i = 0; i < 100; ++i) { pool.deallocate(pool.allocate(1000), 1000); }
  CHECK(pool.stats().shards == 1);
}
