// Hostile review of stream_owners::hand_over's legacy-stream record (one record covers
// every default stream's free memory; a default-stream taker that waited on the latest
// record does not wait again), model-tested through the fake seam: random pool work with
// many threads, the legacy stream, failing records, captures, slots recycled past the
// soft limit and exiting threads; real threads through fixed_size, binning, the pool and
// the arena; and the cases the review found (records on a captured stream, which the
// build before made too). REVIEW_VERBOSE=1 prints what a failing run saw;
// REVIEW_SEED_OFFSET=N shifts the seeds.
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>
#include <freed_ranges.hpp>
#include <simulated_threads.hpp>

#include <mrstack/detail/fixed_size_blocks.hpp>
#include <mrstack/detail/stream_ordering.hpp>

#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
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

// What a failing model run saw: into the test's report, and to stderr with REVIEW_VERBOSE.
#define DIAG(x)                                                                  \
  do {                                                                           \
    std::ostringstream diag_;                                                    \
    diag_ << x;                                                                  \
    if (std::getenv("REVIEW_VERBOSE") != nullptr) { std::cerr << diag_.str() << "\n"; } \
    UNSCOPED_INFO(diag_.str());                                                  \
  } while (0)

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

stream_ref const legacy = shared_stream(0);

/// A real thread, with its own key in the registry behind thread_has_exited, that runs
/// the jobs it is given one at a time until told to end.
class worker {
 public:
  worker() {
    thread_ = std::thread{[this] {
      std::unique_lock lock{m_};
      key_ = detail::this_thread_key();
      cv_.notify_all();
      for (;;) {
        cv_.wait(lock, [this] { return job_ || stop_; });
        if (stop_) { return; }
        try {
          job_();
        } catch (...) {
          error_ = std::current_exception();
        }
        job_ = nullptr;
        cv_.notify_all();
      }
    }};
    std::unique_lock lock{m_};
    cv_.wait(lock, [this] { return key_ != 0; });
  }
  ~worker() { end(); }
  worker(worker const&) = delete;
  worker& operator=(worker const&) = delete;
  [[nodiscard]] std::uintptr_t key() const { return key_; }
  void run(std::function<void()> f) {
    std::unique_lock lock{m_};
    job_ = std::move(f);
    cv_.notify_all();
    cv_.wait(lock, [this] { return !job_; });
    if (error_) { std::rethrow_exception(std::exchange(error_, nullptr)); }
  }
  void end() {
    if (!thread_.joinable()) { return; }
    {
      std::lock_guard lock{m_};
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr error_;
  std::uintptr_t key_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

/// Records fail at random (the seam allows it: the caller then synchronizes the device).
class flaky_sync final : public detail::stream_sync {
 public:
  flaky_sync(std::shared_ptr<fake_stream_sync> inner, std::uint64_t seed) : inner_{std::move(inner)}, rng_{seed} {}
  unsigned fail_percent = 0;
  handle create_event() override { return inner_->create_event(); }
  void destroy_event(handle e) noexcept override { inner_->destroy_event(e); }
  bool record(handle e, handle s) override {
    if (fail_percent != 0 && rng_() % 100 < fail_percent) {
      ++failed;
      return false;
    }
    return inner_->record(e, s);
  }
  void wait(handle s, handle e) override { inner_->wait(s, e); }
  void synchronize(handle s) override { inner_->synchronize(s); }
  void synchronize_all() override { inner_->synchronize_all(); }
  bool idle(handle s) override { return inner_->idle(s); }
  bool capturing(handle s) override { return inner_->capturing(s); }
  std::size_t failed = 0;

 private:
  std::shared_ptr<fake_stream_sync> inner_;
  std::mt19937_64 rng_;
};

struct live_block {
  std::size_t size;
  stream_ref stream;
  std::uintptr_t thread;
};

struct model_options {
  int threads = 6;
  int steps = 60000;
  unsigned record_fail_percent = 0;
  bool captures = false;
  bool fresh_streams = false;  // many created streams: slots are recycled past soft_slot_limit
  bool thread_exits = false;   // simulated threads end (their keys read as exited) and new ones start
  bool syncs = false;
  bool idle = false;
  bool on_demand = true;
};

/// A random workload over the pool core; returns the number of unordered reuses seen.
std::uint64_t seed_offset() {
  char const* e = std::getenv("REVIEW_SEED_OFFSET");
  return e != nullptr ? std::strtoull(e, nullptr, 10) : 0;
}

int run_pool_model(std::uint64_t seed, model_options const& opt) {
  seed += seed_offset();
  std::mt19937_64 rng{seed};
  auto fake = std::make_shared<fake_stream_sync>();
  fake->report_idle = opt.idle;
  auto flaky = std::make_shared<flaky_sync>(fake, seed * 7 + 1);
  flaky->fail_percent = opt.record_fail_percent;
  int bad = 0;
  std::vector<std::unique_ptr<worker>> real;  // backing keys for the simulated threads
  std::vector<std::uintptr_t> threads;
  auto start_thread = [&] {
    real.push_back(std::make_unique<worker>());
    threads.push_back(real.back()->key());
    fake->set_blocking(ptds_of(real.back()->key()).handle);
  };
  for (int i = 0; i < opt.threads; ++i) { start_thread(); }
  fake->on_record = [&](std::uintptr_t stream) {
    if (stream >= ptds_handle_base && stream - ptds_handle_base != current_thread) {
      DIAG("recorded on the default stream of thread " << stream - ptds_handle_base << " from thread "
                                                             << current_thread);
      ++bad;
    }
    if (fake->capturing(stream)) { DIAG("record on captured stream " << std::hex << stream << std::dec); }
  };
  detail::stream_ordered_pool core{flaky, &simulated_thread_key, opt.on_demand};
  freed_ranges freed;
  std::map<std::uintptr_t, live_block> live;
  std::uintptr_t next_chunk = 0x500000000000;
  std::uintptr_t next_fresh = 0x1000;
  std::vector<stream_ref> created{shared_stream(0x100), shared_stream(0x200)};
  std::uintptr_t captured_thread = 0;  // a thread whose default stream is being captured
  int capture_left = 0;
  for (int step = 0; step < opt.steps && bad == 0; ++step) {
    // Captures: a thread's default stream; the legacy stream then reports "capturing" too.
    if (opt.captures) {
      if (captured_thread == 0 && rng() % 500 == 0) {
        captured_thread = threads[rng() % threads.size()];
        capture_left = 50 + static_cast<int>(rng() % 200);
        fake->begin_capture(ptds_of(captured_thread).handle);
        fake->begin_capture(0);
      } else if (captured_thread != 0 && --capture_left <= 0) {
        fake->end_capture(ptds_of(captured_thread).handle);
        fake->end_capture(0);
        captured_thread = 0;
      }
    }
    if (opt.syncs && captured_thread == 0 && rng() % 2000 == 0) { core.synchronize_everything(); }
    if (opt.idle && rng() % 50 == 0) {
      // some stream finishes its work
      std::uintptr_t const t = threads[rng() % threads.size()];
      fake->complete(rng() % 2 == 0 ? ptds_of(t).handle : created[rng() % created.size()].handle);
    }
    if (opt.thread_exits && rng() % 3000 == 0 && threads.size() > 2) {
      // A thread ends: it frees what it holds on its default stream first, then exits.
      std::size_t const i = rng() % threads.size();
      std::uintptr_t const t = threads[i];
      if (t != captured_thread) {
        current_thread = t;
        for (auto it = live.begin(); it != live.end();) {
          if (it->second.stream.thread_bound && it->second.thread == t) {
            std::uint64_t const clock = fake->enqueue(it->second.stream.handle);
            core.deallocate(it->first, it->second.stream);
            freed.add(it->first, it->second.size, it->second.stream.handle, clock);
            it = live.erase(it);
          } else {
            ++it;
          }
        }
        for (auto& r : real) {
          if (r->key() == t) { r->end(); }
        }
        threads.erase(threads.begin() + static_cast<std::ptrdiff_t>(i));
        start_thread();
      }
    }
    if (live.empty() || rng() % 100 < 52) {
      current_thread = threads[rng() % threads.size()];
      stream_ref s;
      unsigned const pick = static_cast<unsigned>(rng() % 10);
      if (pick < 5) {
        s = ptds_of(current_thread);
      } else if (pick < 7) {
        s = legacy;
      } else if (opt.fresh_streams && pick == 9) {
        s = shared_stream(next_fresh);
        next_fresh += 0x10;
        created.push_back(s);
      } else {
        s = created[rng() % created.size()];
      }
      if (captured_thread != 0 && s.handle == 0) { s = ptds_of(current_thread); }  // legacy unusable
      std::size_t const size = (1 + rng() % (rng() % 8 == 0 ? 2048 : 32)) * 256;
      std::uintptr_t a = core.allocate(size, 256, s);
      if (a == 0 && opt.syncs && captured_thread == 0 && core.blocks().total_bytes() > 128 * MiB &&
          core.synchronize_everything()) {
        a = core.allocate(size, 256, s);
      }
      if (a == 0) {
        std::size_t const chunk = std::max<std::size_t>(4 * MiB, size);
        core.add_chunk(next_chunk, chunk, s);
        next_chunk += chunk + 64 * MiB;
        a = core.allocate(size, 256, s);
        if (a == 0) { return -1; }
      }
      if (std::string const why = freed.take(a, size, s.handle, *fake); !why.empty()) {
        DIAG(why << "step " << step << " seed " << seed);
        ++bad;
      }
      live.emplace(a, live_block{size, s, current_thread});
      fake->enqueue(s.handle);
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      current_thread = it->second.stream.thread_bound ? it->second.thread : threads[rng() % threads.size()];
      stream_ref const s = it->second.stream;
      if (captured_thread != 0 && s.handle == 0) { continue; }  // the legacy stream waits for the capture
      std::uint64_t const clock = fake->enqueue(s.handle);
      core.deallocate(it->first, s);
      freed.add(it->first, it->second.size, s.handle, clock);
      live.erase(it);
    }
  }
  // A failed record's fallback is a device synchronization, capture or not (the
  // documented last resort): with records failing, only records and waits count here.
  bool const syncs_count = flaky->failed == 0;
  if (fake->records_in_capture != 0 || fake->waits_into_capture != 0 || (syncs_count && fake->syncs_in_capture != 0)) {
    DIAG("records in capture " << fake->records_in_capture << ", waits into capture "
                                        << fake->waits_into_capture << ", syncs in capture " << fake->syncs_in_capture);
    ++bad;
  }
  if (fake->dead_named != 0) {
    DIAG("dead named " << fake->dead_named);
    ++bad;
  }
  DIAG("records " << fake->records << " waits " << fake->waits << " sync_alls " << fake->sync_alls
                           << " failed records " << flaky->failed << " slots " << core.owners().limit());
  if (captured_thread != 0) {
    fake->end_capture(ptds_of(captured_thread).handle);
    fake->end_capture(0);
  }
  current_thread = 3;
  return bad;
}

}  // namespace

TEST_CASE("review: random pool work, many threads and the legacy stream") {
  model_options o;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

TEST_CASE("review: random pool work with failing records") {
  model_options o;
  o.record_fail_percent = 5;
  o.syncs = true;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

TEST_CASE("review: random pool work with captures of default streams") {
  model_options o;
  o.captures = true;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

TEST_CASE("review: random pool work with slots recycled past the soft limit and threads exiting") {
  model_options o;
  o.fresh_streams = true;
  o.thread_exits = true;
  o.steps = 40000;
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {  // past 1,024 slots, each new one scans them all: slow
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

TEST_CASE("review: random pool work, everything at once") {
  model_options o;
  o.fresh_streams = true;
  o.thread_exits = true;
  o.captures = true;
  o.syncs = true;
  o.idle = true;
  o.record_fail_percent = 2;
  o.steps = 40000;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

TEST_CASE("review: random pool work, eager rule") {
  model_options o;
  o.on_demand = false;
  o.thread_exits = true;
  o.syncs = true;
  o.record_fail_percent = 2;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    CHECK(run_pool_model(seed, o) == 0);
  }
}

// ---- real threads ---------------------------------------------------------------------------
// Resources driven through their public API from real threads (one at a time, in lockstep),
// with the seam translating cudaStreamPerThread to the calling thread's own stream, as
// CUDA does. So a record or wait the library means for another thread's stream lands on
// the caller's, and the model sees what the GPU would.

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <functional>

namespace {

std::uintptr_t const per_thread_handle = reinterpret_cast<std::uintptr_t>(cudaStreamPerThread);
std::uintptr_t const legacy_handle = reinterpret_cast<std::uintptr_t>(cudaStreamLegacy);

class ptds_sync final : public detail::stream_sync {
 public:
  explicit ptds_sync(std::shared_ptr<fake_stream_sync> fake) : fake_{std::move(fake)} {}
  static handle tr(handle s) {
    if (s == per_thread_handle) { return ptds_handle_base + detail::this_thread_key(); }
    if (s == legacy_handle) { return 0; }
    return s;
  }
  handle create_event() override { return fake_->create_event(); }
  void destroy_event(handle e) noexcept override { fake_->destroy_event(e); }
  bool record(handle e, handle s) override { return fake_->record(e, tr(s)); }
  void wait(handle s, handle e) override { fake_->wait(tr(s), e); }
  void synchronize(handle s) override { fake_->synchronize(tr(s)); }
  void synchronize_all() override { fake_->synchronize_all(); }
  bool idle(handle s) override { return fake_->idle(tr(s)); }
  bool capturing(handle s) override { return fake_->capturing(tr(s)); }

 private:
  std::shared_ptr<fake_stream_sync> fake_;
};

struct real_live {
  std::size_t size;
  stream_view stream;
  std::size_t thread;  // index into the workers
};

struct real_options {
  int threads = 5;
  int steps = 20000;
  bool created = true;
  bool exits = false;
  std::function<std::size_t(std::mt19937_64&)> size = [](std::mt19937_64&) { return 64 * KiB; };
  std::function<std::size_t(std::size_t)> extent = [](std::size_t n) { return n; };
};

/// Random work through `mr` from real threads; returns the unordered reuses seen.
int run_real_model(std::uint64_t seed, std::shared_ptr<fake_stream_sync> const& fake, memory_resource& mr,
                   real_options const& opt) {
  seed += seed_offset();
  std::mt19937_64 rng{seed};
  std::vector<std::unique_ptr<worker>> workers;
  auto add_worker = [&] {
    workers.push_back(std::make_unique<worker>());
    fake->set_blocking(ptds_handle_base + workers.back()->key());
  };
  for (int i = 0; i < opt.threads; ++i) { add_worker(); }
  std::vector<bool> alive(workers.size(), true);
  int bad = 0;
  fake->on_record = [&](std::uintptr_t stream) {
    if (stream >= ptds_handle_base && stream - ptds_handle_base != detail::this_thread_key()) { ++bad; }
  };
  freed_ranges freed;
  std::map<std::uintptr_t, real_live> live;
  stream_view const created[] = {stream_view{reinterpret_cast<cudaStream_t>(0x100)},
                                 stream_view{reinterpret_cast<cudaStream_t>(0x200)}};
  auto handle_of = [&](stream_view s, std::size_t t) -> std::uintptr_t {
    if (s.id() == per_thread_handle) { return ptds_handle_base + workers[t]->key(); }
    if (s.id() == legacy_handle) { return 0; }
    return s.id();
  };
  auto pick_thread = [&] {
    for (;;) {
      std::size_t const t = rng() % workers.size();
      if (alive[t]) { return t; }
    }
  };
  for (int step = 0; step < opt.steps && bad == 0; ++step) {
    if (opt.exits && rng() % 2000 == 0) {
      std::size_t const t = pick_thread();
      // frees what it used on its own stream, then ends
      for (auto it = live.begin(); it != live.end();) {
        if (it->second.thread == t && it->second.stream.id() == per_thread_handle) {
          std::uint64_t const clock = fake->enqueue(handle_of(it->second.stream, t));
          void* p = reinterpret_cast<void*>(it->first);
          std::size_t const n = it->second.size;
          workers[t]->run([&] { mr.deallocate(p, n, stream_view::per_thread()); });
          freed.add(it->first, opt.extent(n), handle_of(it->second.stream, t), clock);
          it = live.erase(it);
        } else {
          it->second.thread = it->second.thread == t ? pick_thread() : it->second.thread;
          ++it;
        }
      }
      alive[t] = false;
      workers[t]->end();
      add_worker();
      alive.push_back(true);
    }
    if (live.empty() || rng() % 100 < 52) {
      std::size_t const t = pick_thread();
      unsigned const pick = static_cast<unsigned>(rng() % 10);
      stream_view const s = pick < 5 ? stream_view::per_thread()
                             : pick < 7 || !opt.created ? stream_view{}
                                                        : created[rng() % 2];
      std::size_t const n = opt.size(rng);
      void* p = nullptr;
      workers[t]->run([&] { p = mr.allocate(n, s); });
      auto const a = reinterpret_cast<std::uintptr_t>(p);
      std::uintptr_t const h = handle_of(s, t);
      if (std::string const why = freed.take(a, opt.extent(n), h, *fake); !why.empty()) {
        DIAG(why << "step " << step << " seed " << seed << " thread " << t);
        ++bad;
      }
      live.emplace(a, real_live{n, s, t});
      fake->enqueue(h);
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      std::size_t const t = it->second.stream.id() == per_thread_handle ? it->second.thread : pick_thread();
      stream_view const s = it->second.stream;
      std::uintptr_t const h = handle_of(s, it->second.thread);
      std::uint64_t const clock = fake->enqueue(h);
      void* p = reinterpret_cast<void*>(it->first);
      std::size_t const n = it->second.size;
      workers[t]->run([&] { mr.deallocate(p, n, s); });
      freed.add(it->first, opt.extent(n), h, clock);
      live.erase(it);
    }
  }
  for (auto& [a, b] : live) {
    void* p = reinterpret_cast<void*>(a);
    std::size_t const n = b.size;
    stream_view const s = b.stream;
    std::size_t const t = s.id() == per_thread_handle ? b.thread : pick_thread();
    workers[t]->run([&] { mr.deallocate(p, n, s); });
  }
  for (auto& w : workers) { w->end(); }
  fake->on_record = nullptr;
  DIAG("records " << fake->records << " waits " << fake->waits << " sync_alls " << fake->sync_alls);
  if (fake->dead_named != 0) { ++bad; }
  return bad;
}

}  // namespace

TEST_CASE("review: real threads through fixed_size (thread caches)") {
  bool const created_streams = GENERATE(true, false);  // false: default streams only
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(created_streams, seed);
    auto fake = std::make_shared<fake_stream_sync>();
    auto sim = std::make_shared<simulated_memory_resource>();
    fixed_size_memory_resource mr{sim, 64 * KiB, 16, std::make_shared<ptds_sync>(fake)};
    real_options o;
    o.created = created_streams;
    o.exits = true;
    CHECK(run_real_model(seed, fake, mr, o) == 0);
  }
}

TEST_CASE("review: real threads through binning of fixed_size bins") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    CAPTURE(seed);
    auto fake = std::make_shared<fake_stream_sync>();
    auto sim = std::make_shared<simulated_memory_resource>();
    auto seam = std::make_shared<ptds_sync>(fake);
    binning_memory_resource mr{sim};
    for (std::size_t sz : {4 * KiB, 16 * KiB, 64 * KiB}) {
      mr.add_bin(sz, std::make_shared<fixed_size_memory_resource>(sim, sz, 8, seam));
    }
    real_options o;
    o.exits = true;
    o.size = [](std::mt19937_64& r) { return std::size_t{1} << (10 + r() % 7); };
    o.extent = [](std::size_t n) { return std::max<std::size_t>(n, 4 * KiB); };
    CHECK(run_real_model(seed, fake, mr, o) == 0);
  }
}

TEST_CASE("review: real threads through the pool (shards)") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    CAPTURE(seed);
    auto fake = std::make_shared<fake_stream_sync>();
    auto sim = std::make_shared<simulated_memory_resource>();
    pool_options po;
    po.stream_sync = std::make_shared<ptds_sync>(fake);
    pool_memory_resource mr{sim, 0, std::nullopt, po};
    real_options o;
    o.exits = true;
    o.size = [](std::mt19937_64& r) { return (1 + r() % (r() % 8 == 0 ? 2048 : 32)) * 256; };
    CHECK(run_real_model(seed, fake, mr, o) == 0);
  }
}

TEST_CASE("review: real threads through the arena") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    CAPTURE(seed);
    auto fake = std::make_shared<fake_stream_sync>();
    auto sim = std::make_shared<simulated_memory_resource>();
    arena_options ao;
    ao.stream_sync = std::make_shared<ptds_sync>(fake);
    arena_memory_resource mr{sim, 1024 * MiB, ao};
    real_options o;
    o.exits = true;
    o.size = [](std::mt19937_64& r) { return (1 + r() % (r() % 8 == 0 ? 4096 : 64)) * 256; };
    CHECK(run_real_model(seed, fake, mr, o) == 0);
  }
}

// ---- directed cases ---------------------------------------------------------------------------

namespace {
/// A pool core over the fake; threads 3, 5, 7, 9 on their per-thread default streams.
struct directed_setup {
  std::shared_ptr<fake_stream_sync> fake = std::make_shared<fake_stream_sync>();
  detail::stream_ordered_pool core{fake, &simulated_thread_key};
  stream_ref t3 = ptds_of(3), t5 = ptds_of(5), t7 = ptds_of(7), t9 = ptds_of(9);
  directed_setup() {
    for (auto const& t : {t3, t5, t7, t9}) { fake->set_blocking(t.handle); }
    current_thread = 3;
  }
  ~directed_setup() { current_thread = 3; }
};
}  // namespace

TEST_CASE("review: the legacy stream's own free memory is not recorded on while a blocking stream is captured") {
  // CUDA: while a blocking stream (a per-thread default stream) is being captured, any
  // work on the legacy stream -- an event record included -- invalidates that capture
  // (hand_over's own comment: "a record there ends that capture, relaxed or not"). The
  // fake reports the legacy stream as capturing then, as cudaStreamIsCapturing does.
  directed_setup x;
  x.core.add_chunk(0x700000000000, 8 * MiB, legacy);
  std::uintptr_t const a = x.core.allocate(8 * MiB, 256, legacy);
  x.fake->enqueue(0);
  x.core.deallocate(a, legacy);  // the legacy stream's free memory, recorded by nothing yet
  x.fake->begin_capture(x.t5.handle);  // thread 5 captures its default stream
  x.fake->begin_capture(0);
  current_thread = 7;  // thread 7 wants memory on a stream it created
  std::uintptr_t const b = x.core.allocate(8 * MiB, 256, shared_stream(0x100));
  CHECK(x.fake->records_in_capture == 0);  // a record on the legacy stream ends thread 5's capture
  CHECK(x.fake->syncs_in_capture == 0);
  (void)b;
  x.fake->end_capture(x.t5.handle);
  x.fake->end_capture(0);
}

TEST_CASE("review: a thread's captured default stream is not recorded on for its own created stream") {
  // Thread 3 captures its default stream and, on the same thread, allocates on a created
  // stream that is not captured: taking the default stream's memory records an event
  // inside the capture and makes the created stream wait on it, which in CUDA pulls the
  // created stream into the capture (or fails: an event recorded in a capture cannot be
  // waited on from outside it).
  directed_setup x;
  x.core.add_chunk(0x700000000000, 8 * MiB, x.t3);
  std::uintptr_t const a = x.core.allocate(8 * MiB, 256, x.t3);
  x.fake->begin_capture(x.t3.handle);
  x.fake->begin_capture(0);
  x.fake->enqueue(x.t3.handle);
  x.core.deallocate(a, x.t3);  // freed inside the capture
  std::uintptr_t const b = x.core.allocate(8 * MiB, 256, shared_stream(0x100));
  CHECK(x.fake->records_in_capture == 0);
  CHECK(x.fake->syncs_in_capture == 0);
  (void)b;
  x.fake->end_capture(x.t3.handle);
  x.fake->end_capture(0);
}

TEST_CASE("review: a default-stream taker waits again once the barrier is recorded again") {
  directed_setup x;
  x.core.add_chunk(0x700000000000, 24 * MiB, x.t3);
  std::uintptr_t const a = x.core.allocate(8 * MiB, 256, x.t3);
  std::uintptr_t const b = x.core.allocate(8 * MiB, 256, x.t3);
  std::uintptr_t const c = x.core.allocate(8 * MiB, 256, x.t3);
  x.core.deallocate(a, x.t3);
  current_thread = 7;
  CHECK(x.core.allocate(8 * MiB, 256, x.t7) == a);  // record 1, wait
  current_thread = 5;
  std::uint64_t const clock_b = x.fake->enqueue(x.t5.handle);
  x.core.deallocate(b, x.t5);
  current_thread = 9;
  std::uint64_t const clock_c = x.fake->enqueue(x.t9.handle);
  x.core.deallocate(c, x.t9);
  current_thread = 3;  // thread 3 takes thread 5's block: record 2 covers 5 and 9
  CHECK(x.core.allocate(8 * MiB, 256, x.t3) == b);
  current_thread = 7;  // thread 7 waited on record 1 only: it must wait on record 2
  CHECK(x.core.allocate(8 * MiB, 256, x.t7) == c);
  CHECK(x.fake->ordered_after(x.t7.handle, x.t9.handle, clock_c));
  CHECK(x.fake->ordered_after(x.t3.handle, x.t5.handle, clock_b));
}
