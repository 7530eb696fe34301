// The replay's schedulers and timing: per-thread order keeps each thread's order and makes
// every free after its allocation; thousands of log threads replay on a few workers in
// bounded time; a refused thread means fewer workers, not an abort; ns_per_call is the
// time inside the stack; the verdict's fastest goes by it; a worker asleep on the run's
// gate wakes when its word changes.
#include <catch2/catch.hpp>

#include "../src/replay/replay_run.hpp"

#include <mrstack/detail/format.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>

using namespace mrstack;

// Memory that runs out on cue: the next `fail_allocations` allocations of this thread throw.
namespace {
thread_local int fail_allocations = 0;
}  // namespace
// Memory from malloc goes back to free: GCC cannot see that the replacements pair up.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  if (fail_allocations > 0) {
    --fail_allocations;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) { return p; }
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";

/// Checks, as calls arrive from any thread, that every free is of a live block with its
/// size and that each log thread's calls come in its order (sizes encode the thread and
/// a per-thread sequence number: size = thread * 1e6 + seq + 1).
struct order_checker final : memory_resource {
  explicit order_checker(resource_ptr up) : up_{std::move(up)} {}
  resource_ptr up_;
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<void*, std::size_t>& live() {
    static std::map<void*, std::size_t> l;
    return l;
  }
  static std::vector<std::string>& problems() {
    static std::vector<std::string> p;
    return p;
  }
  static std::size_t& calls() {
    static std::size_t c = 0;
    return c;
  }
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    void* p = up_->allocate(b, s, al);
    std::lock_guard lock{mutex()};
    ++calls();
    live()[p] = b;
    return p;
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override {
    {
      std::lock_guard lock{mutex()};
      ++calls();
      auto const it = live().find(p);
      if (it == live().end() || it->second != b) {
        problems().push_back("free of a block not live: " + std::to_string(b));
      } else {
        live().erase(it);
      }
    }
    up_->deallocate(p, b, s, al);
  }
  std::string do_name() const override { return "test_order_checker"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

/// Spends `ns` nanoseconds (spinning) in every allocate: a stack whose cost is known.
struct slow_layer final : memory_resource {
  slow_layer(resource_ptr up, std::size_t ns) : up_{std::move(up)}, ns_{ns} {}
  resource_ptr up_;
  std::size_t ns_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    auto const until = std::chrono::steady_clock::now() + std::chrono::nanoseconds{ns_};
    while (std::chrono::steady_clock::now() < until) {}
    return up_->allocate(b, s, al);
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override { up_->deallocate(p, b, s, al); }
  std::string do_name() const override { return "test_slow"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

/// Throws from its `after`-th allocate on (an `int` with `not_std`, else a runtime_error):
/// a stack broken in a way the replay must report, on any number of workers.
struct throwing_layer final : memory_resource {
  throwing_layer(resource_ptr up, std::size_t after, bool not_std) : up_{std::move(up)}, left_{after}, not_std_{not_std} {}
  resource_ptr up_;
  std::atomic<std::size_t> left_;
  bool not_std_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    std::size_t n = left_.load();
    while (n != 0 && !left_.compare_exchange_weak(n, n - 1)) {}
    if (n == 0) {
      if (not_std_) { throw 42; }
      throw std::runtime_error("test_throwing: broken");
    }
    return up_->allocate(b, s, al);
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override { up_->deallocate(p, b, s, al); }
  std::string do_name() const override { return "test_throwing"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

void register_test_layers() {
  static bool const once = [] {
    register_resource({"test_throwing", "throws from the Nth allocate on", needs_upstream,
                       {size_param("after", required, "allocations that succeed first"),
                        flag_param("not_std", optional_param, "throw an int, not a std::exception", "false")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<throwing_layer>(std::move(up), *a.size("after"),
                                                                 a.flag("not_std").value_or(false));
                       }});
    register_resource({"test_order_checker", "checks frees", needs_upstream, {},
                       [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                         return std::make_shared<order_checker>(std::move(up));
                       }});
    register_resource({"test_slow", "slow allocations", needs_upstream, {size_param("ns", required, "time per allocate")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<slow_layer>(std::move(up), *a.size("ns"));
                       }});
    return true;
  }();
  (void)once;
}

replay_options simulated() {
  replay_options o;
  o.simulate = true;
  o.simulated_capacity = std::size_t{1} << 40;
  return o;
}

/// A log of `events` events over `threads` thread ids, where about a third of the frees
/// happen on another thread than the allocation (as in a program that hands buffers over).
std::string many_thread_log(std::size_t threads, std::size_t events, unsigned seed) {
  std::mt19937_64 rng{seed};
  std::string text = header;
  std::vector<std::pair<std::uint64_t, std::size_t>> live;  // address, size
  std::uint64_t next_address = 0x100000;
  std::size_t written = 0;
  while (written < events) {
    std::size_t const thread = rng() % threads;
    bool const allocate = live.empty() || (written + live.size() < events && rng() % 2 == 0);
    if (allocate) {
      std::size_t const bytes = 256 + rng() % 65536;
      live.emplace_back(next_address, bytes);
      text += std::to_string(thread) + ",0,allocate,0x" + std::to_string(next_address) + "," + std::to_string(bytes) + ",0\n";
      next_address += 0x100000;
    } else {
      std::size_t const pick = rng() % live.size();
      auto const [address, bytes] = live[pick];
      live[pick] = live.back();
      live.pop_back();
      text += std::to_string(thread) + ",0,free,0x" + std::to_string(address) + "," + std::to_string(bytes) + ",0\n";
    }
    ++written;
  }
  return text;
}

/// Whether the 1-minute load average is above twice the hardware threads.
bool machine_overloaded() {
  double load = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) { load = 0; }
    std::fclose(f);
  }
  return load > 2.0 * std::max(1U, std::thread::hardware_concurrency());
}

}  // namespace

TEST_CASE("replay threads: per-thread order replays every event, each free after its own allocation") {
  register_test_layers();
  auto const log = parse_allocation_log(many_thread_log(16, 4000, 1));
  REQUIRE(log.thread_names.size() == 16);
  for (unsigned workers : {1U, 2U, 5U}) {
    order_checker::problems().clear();
    order_checker::calls() = 0;
    replay_options o = simulated();
    o.order = replay_order::per_thread;
    o.workers = workers;
    auto const r = replay_stack(log, "test_order_checker > pool > cuda", o);
    INFO("workers " << workers << ": " << r.error);
    CHECK(r.complete());
    CHECK(r.workers == workers);
    CHECK(r.order == replay_order::per_thread);
    CHECK(order_checker::problems().empty());
    CHECK(order_checker::calls() == log.events.size());
    CHECK(order_checker::live().empty());
  }
  // Peak live is the one the replay reached: on one worker (sequential, but not the log's
  // interleaving) it is exactly what the meter above cuda saw.
  replay_options one = simulated();
  one.order = replay_order::per_thread;
  one.workers = 1;
  auto const r = replay_stack(log, "cuda", one);
  CHECK(r.complete());
  CHECK(r.peak_live_bytes > 0);
  CHECK(r.peak_live_bytes == r.peak_footprint_bytes);
  CHECK(r.peak_live_bytes != log.peak_live_bytes);  // thread by thread, not the log's order
}

TEST_CASE("replay threads: 4,000 thread ids and 10,000 events replay in seconds on few workers") {
  register_test_layers();
  auto const log = parse_allocation_log(many_thread_log(4000, 10000, 2));
  REQUIRE(log.thread_names.size() > 3500);
  REQUIRE(log.events.size() == 10000);
  for (auto const order : {replay_order::strict, replay_order::per_thread}) {
    auto const t0 = std::chrono::steady_clock::now();
    replay_options o = simulated();
    o.order = order;
    auto const r = replay_stack(log, "pool > cuda", o);
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(to_string(order) << ": " << seconds << " s, " << r.error);
    CHECK(r.complete());
    CHECK(r.workers == std::min(4000U, std::max(1U, std::thread::hardware_concurrency())));
    // Strict order hands every other event to another worker: on a machine whose cores
    // are all taken by other processes, each hand-over waits for the scheduler (ms), which
    // says nothing about the replay. Per-thread order barely hands over, so it is always held
    // to the bound; strict order when the machine is not overloaded.
    if (order == replay_order::per_thread || !machine_overloaded()) {
      CHECK(seconds < 10);
    } else {
      WARN("load average above twice the hardware threads: strict order's time not checked");
    }
    WARN(to_string(order) << " order, 4,000 threads, 10,000 events on " << r.workers << " workers: " << seconds
                          << " s, " << r.ns_per_call << " ns/call");
  }
}

TEST_CASE("replay threads: strict order is exact on many workers") {
  register_test_layers();
  auto const log = parse_allocation_log(many_thread_log(50, 3000, 3));
  // In strict order the stack sees exactly the log's calls, so a free of a block not live
  // (or any reordering that breaks the pairing) cannot happen, and peak live is the log's.
  order_checker::problems().clear();
  replay_options o = simulated();
  o.workers = 7;
  auto const r = replay_stack(log, "test_order_checker > cuda", o);
  CHECK(r.complete());
  CHECK(r.workers == 7);
  CHECK(order_checker::problems().empty());
  CHECK(r.peak_live_bytes == log.peak_live_bytes);
  CHECK(r.peak_footprint_bytes == log.peak_live_bytes);  // the meter saw the log's exact order
}

TEST_CASE("replay threads: a refused thread means fewer workers, never an abort") {
  register_test_layers();
  auto const log = parse_allocation_log(many_thread_log(40, 2000, 4));
  for (auto const order : {replay_order::strict, replay_order::per_thread}) {
    replay_options o = simulated();
    o.order = order;
    o.workers = 8;
    o.before_worker_start = [](unsigned w) {  // the third extra thread is refused
      if (w > 2) { throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again)); }
    };
    auto const r = replay_stack(log, "pool > cuda", o);
    CHECK(r.complete());
    CHECK(r.workers == 3);
    CHECK_THAT(r.workers_note, Catch::Contains("the system refused worker thread 4 of 8"));
    CHECK_THAT(r.workers_note, Catch::Contains("replayed on 3"));
    // Not only std::system_error: a start that runs out of memory for the thread's state
    // (std::bad_alloc) had ended the program, the started workers still waiting.
    o.before_worker_start = [](unsigned w) {
      if (w > 1) { throw std::bad_alloc(); }
    };
    auto const no_memory = replay_stack(log, "pool > cuda", o);
    CHECK(no_memory.complete());
    CHECK(no_memory.workers == 2);
    CHECK_THAT(no_memory.workers_note, Catch::Contains("worker thread 3 of 8 (std::bad_alloc)"));
    o.before_worker_start = [](unsigned) { throw 42; };  // not even a std::exception
    auto const odd = replay_stack(log, "pool > cuda", o);
    CHECK(odd.complete());
    CHECK(odd.workers == 1);
    CHECK_THAT(odd.workers_note, Catch::Contains("not a std::exception"));
    o.before_worker_start = [](unsigned) {  // no thread at all: the calling thread alone
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    };
    auto const alone = replay_stack(log, "pool > cuda", o);
    CHECK(alone.complete());
    CHECK(alone.workers == 1);
  }
}

TEST_CASE("replay threads: a refusal when no memory is left for its note still means fewer workers") {
  // The note's text needs memory; built before the started workers were joined, its
  // std::bad_alloc unwound past them and ended the program (a hostile review's case).
  auto const log = parse_allocation_log(many_thread_log(40, 2000, 11));
  replay_options o = simulated();
  o.workers = 8;
  o.before_worker_start = [](unsigned w) {
    if (w > 2) {
      fail_allocations = 1;  // the next allocation of this thread fails too
      throw std::bad_alloc();
    }
  };
  auto const r = replay_stack(log, "pool > cuda", o);
  fail_allocations = 0;
  // The failing allocation lands in the run instead (the pool's own metadata, a refused
  // event), or nowhere: at most one refusal, no error.
  CHECK(r.error.empty());
  CHECK(r.failures <= 1);
  CHECK(r.workers == 3);
  CHECK_THAT(r.workers_note, Catch::Contains("worker thread 4 of 8 (std::bad_alloc): replayed on 3"));
}

TEST_CASE("replay threads: a stack that throws anything is an error naming its line, on any number of workers") {
  // An exception that is not a std::exception escaped a worker thread and ended the
  // program with several workers, and left replay_stack with one.
  register_test_layers();
  auto const log = parse_allocation_log(many_thread_log(40, 2000, 12));
  for (bool const not_std : {true, false}) {
    for (auto const order : {replay_order::strict, replay_order::per_thread}) {
      for (unsigned const workers : {1U, 4U}) {
        CAPTURE(not_std, static_cast<int>(order), workers);
        replay_options o = simulated();
        o.order = order;
        o.workers = workers;
        std::string const spec = std::string{"test_throwing(after=3"} + (not_std ? ", not_std" : "") + ") > pool > cuda";
        auto const r = replay_stack(log, spec, o);
        CHECK_FALSE(r.complete());
        CHECK_THAT(r.error, Catch::StartsWith("line "));
        CHECK_THAT(r.error, Catch::Contains(not_std ? "not a std::exception" : "test_throwing: broken"));
      }
    }
  }
}

TEST_CASE("replay threads: repeated runs report the fewest workers with that run's note") {
  auto const log = parse_allocation_log(many_thread_log(40, 2000, 9));
  replay_options o = simulated();
  o.workers = 8;
  o.repeat = 2;
  auto runs = std::make_shared<int>(0);
  o.before_worker_start = [runs](unsigned w) {  // threads are short in the first run only
    if (w == 1) { ++*runs; }
    if (*runs == 1 && w > 2) { throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again)); }
  };
  auto const r = replay_stack(log, "pool > cuda", o);
  CHECK(r.complete());
  CHECK(r.workers == 3);  // was 8, the last run's, beside the first run's "replayed on 3"
  CHECK_THAT(r.workers_note, Catch::Contains("replayed on 3"));
}

TEST_CASE("replay threads: a progress report that throws ends the reports, not the program") {
  register_test_layers();
  std::string text = header;  // 400 allocations of 1 ms: the reports (every 200 ms) come
  for (int i = 0; i < 400; ++i) {
    text += "1,0,allocate,0x" + std::to_string(1000 + i) + ",4096,0\n";
    text += "1,0,free,0x" + std::to_string(1000 + i) + ",4096,0\n";
  }
  auto const log = parse_allocation_log(text);
  replay_options o = simulated();
  int reports = 0;
  o.progress = [&reports](std::size_t, std::size_t) {
    ++reports;
    throw std::runtime_error("the progress bar broke");
  };
  auto const r = replay_stack(log, "test_slow(ns=1000000) > pool > cuda", o);
  CHECK(r.complete());
  CHECK(reports == 1);
}

TEST_CASE("replay threads: ns_per_call is the time inside the stack, and the verdict goes by it") {
  register_test_layers();
  std::string text = header;
  for (int i = 0; i < 200; ++i) {
    text += "1,0,allocate,0x" + std::to_string(1000 + i) + ",4096,0\n";
    text += "2,0,free,0x" + std::to_string(1000 + i) + ",4096,0\n";
  }
  auto const log = parse_allocation_log(text);
  replay_options o = simulated();
  auto const slow = replay_stack(log, "test_slow(ns=50000) > cuda", o);
  auto const fast = replay_stack(log, "cuda", o);
  REQUIRE(slow.complete());
  REQUIRE(fast.complete());
  // Half the events are 50 us allocations: at least 25 us per event inside the stack,
  // and the wall time holds that too.
  CHECK(slow.ns_per_call >= 25000);
  CHECK(slow.ns_per_event >= slow.ns_per_call);
  // One preemption inside a timed call adds its length over 400 to the mean: on a loaded
  // machine 2 ms of it (one time slice) failed the bound in 8 of 100 runs. So the least of
  // up to five runs: a replay that counted the workers' waits as time inside the stack
  // is slow in every one.
  double fast_ns = fast.ns_per_call;
  for (int again = 0; again < 4 && fast_ns >= 5000; ++again) {
    auto const rerun = replay_stack(log, "cuda", o);
    REQUIRE(rerun.complete());
    fast_ns = std::min(fast_ns, rerun.ns_per_call);
  }
  CHECK(fast_ns < 5000);
  CHECK(slow.ns_per_call_per_run.size() == 1);

  char const* path = "replay_threads_verdict.csv";
  {
    std::FILE* f = std::fopen(path, "w");
    REQUIRE(f != nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  int const status = run_replay_tool({path, "--simulate", "-r", "test_slow(ns=50000) > cuda", "-r", "pool > cuda",
                                      "--order", "per-thread"},
                                     out, err);
  std::rewind(out);
  std::string text_out(1 << 16, '\0');
  text_out.resize(std::fread(text_out.data(), 1, text_out.size(), out));
  std::fclose(out);
  std::fclose(err);
  std::remove(path);
  INFO(text_out);
  CHECK(status == 0);
  CHECK_THAT(text_out, Catch::Contains("per-thread order on"));
  CHECK_THAT(text_out, Catch::Contains("verdict: fastest pool > cuda ("));
}

TEST_CASE("replay: workers asleep on the gate are woken by the change, not by the time bound") {
  // Two threads hand a counter back and forth a thousand times, each sleeping until it is
  // its turn, as the strict order's workers do. Woken by wake_all, a hand-over takes
  // microseconds; a missed wake-up costs the sleep's bound (2 ms) each time: 2 s in all.
  replay_detail::sleep_gate gate;
  std::atomic<std::uint32_t> word{0};
  constexpr std::uint32_t turns = 1000;
  auto player = [&](std::uint32_t parity) {
    for (std::uint32_t t = parity; t < turns; t += 2) {
      for (std::uint32_t seen = word.load(); seen != t; seen = word.load()) { gate.sleep_while(word, seen); }
      word.store(t + 1, std::memory_order_seq_cst);
      gate.wake_all();
    }
  };
  auto const t0 = std::chrono::steady_clock::now();
  std::thread other{player, 1U};
  player(0);
  other.join();
  auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  INFO(turns << " hand-overs took " << ms << " ms");
  CHECK(word.load() == turns);
  CHECK(ms < 500);
}

TEST_CASE("replay threads: per-thread order's cost grows with the events, not with threads waiting on each other") {
  // A chain: each thread frees the allocation of the thread after it (in thread index
  // order), then allocates its own. Thread ids are interned first (null rows), so on one
  // worker the thread that can run is always the last one scanned: a worker that rescans
  // every waiting thread on each turn does N^2 checks (80,000 threads: seconds), one
  // that parks them does N.
  constexpr std::size_t threads = 80000;
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (std::size_t t = 0; t < threads; ++t) { text += std::to_string(t) + ",0,allocate,0,0,0\n"; }
  auto row = [&](std::size_t t, char const* action, std::size_t block) {
    text += std::to_string(t) + ",0," + action + "," + format_hex((block + 1) << 12) + ",64,0\n";
  };
  row(threads - 1, "allocate", threads - 1);
  for (std::size_t t = threads - 1; t-- > 0;) {
    row(t, "free", t + 1);
    row(t, "allocate", t);
  }
  auto const log = parse_allocation_log(text);
  REQUIRE(log.events.size() == 2 * threads - 1);
  auto timed = [&](replay_order order, unsigned workers) {
    replay_options o = simulated();
    o.order = order;
    o.workers = workers;
    auto const t0 = std::chrono::steady_clock::now();
    auto const r = replay_stack(log, "pool > cuda", o);
    INFO(r.error);
    CHECK(r.complete());
    CHECK(r.leaks == 1);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double const strict = timed(replay_order::strict, 1);
  double const per_thread = timed(replay_order::per_thread, 1);
  INFO("strict " << strict << " s, per-thread " << per_thread << " s on one worker");
  CHECK(per_thread < 10 * strict + 1.0);
  (void)timed(replay_order::per_thread, 2);  // hands over at every thread: complete, each free after its allocation
}
