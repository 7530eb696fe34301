// The replay engine and mrstack-replay, over simulated memory: exact peak live and
// footprint on hand-made logs, failures, leaks, broken layers, the cross-thread order of a
// multi-thread log, the rewritten spec, and the tool's output, exit codes and --json.
#include <catch2/catch.hpp>

#include "replay_tool_run.hpp"
#include "scratch_files.hpp"

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

using namespace mrstack;

namespace {

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";

/// Asks its upstream for every request rounded up to `to` bytes: a footprint one can
/// compute by hand.
struct round_up_layer final : memory_resource {
  round_up_layer(resource_ptr up, std::size_t to) : up_{std::move(up)}, to_{to} {}
  resource_ptr up_;
  std::size_t to_;
  std::size_t rounded(std::size_t b) const { return (b + to_ - 1) / to_ * to_; }
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override { return up_->allocate(rounded(b), s, al); }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override {
    up_->deallocate(p, rounded(b), s, al);
  }
  std::string do_name() const override { return "test_round_up"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

/// Keeps every allocation from its upstream until it is destroyed: footprint = all bytes
/// ever allocated.
struct hoard_layer final : memory_resource {
  explicit hoard_layer(resource_ptr up) : up_{std::move(up)} {}
  ~hoard_layer() override {
    for (auto const& [p, b] : kept_) { up_->deallocate(p, b); }
  }
  resource_ptr up_;
  std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> kept_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override { return up_->allocate(b, s, al); }
  void do_deallocate(void* p, std::size_t b, std::size_t, stream_view) override {
    std::lock_guard lock{mutex_};
    kept_.emplace_back(p, b);
  }
  std::string do_name() const override { return "test_hoard"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

/// Records the order of calls it sees (the test reads it after the replay).
struct recorder_layer final : memory_resource {
  explicit recorder_layer(resource_ptr up) : up_{std::move(up)} {}
  resource_ptr up_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    record('a', b);
    return up_->allocate(b, s, al);
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override {
    record('f', b);
    up_->deallocate(p, b, s, al);
  }
  std::string do_name() const override { return "test_recorder"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
  static void record(char what, std::size_t b) {
    std::lock_guard lock{mutex()};
    calls().emplace_back(what, b);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::pair<char, std::size_t>>& calls() {
    static std::vector<std::pair<char, std::size_t>> c;
    return c;
  }
};

/// Breaks its contract (a logic_error) on the n-th call.
struct breaking_layer final : memory_resource {
  breaking_layer(resource_ptr up, std::uint64_t n) : up_{std::move(up)}, left_{n} {}
  resource_ptr up_;
  std::uint64_t left_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    if (--left_ == 0) { throw logic_error("broken on purpose"); }
    return up_->allocate(b, s, al);
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override { up_->deallocate(p, b, s, al); }
  std::string do_name() const override { return "test_breaks"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

/// Rounds its first `first` allocations up to `to` bytes, later ones not: a warm-up run
/// with a higher peak than the timed run after it.
struct first_pass_rounding_layer final : memory_resource {
  first_pass_rounding_layer(resource_ptr up, std::size_t to, std::uint64_t first)
      : up_{std::move(up)}, to_{to}, first_{first} {}
  resource_ptr up_;
  std::size_t to_;
  std::uint64_t first_;
  std::uint64_t seen_ = 0;
  std::map<void*, std::size_t> asked_;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    std::size_t const ask = seen_++ < first_ ? (b + to_ - 1) / to_ * to_ : b;
    void* p = up_->allocate(ask, s, al);
    asked_[p] = ask;
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t al, stream_view s) override {
    auto const it = asked_.find(p);
    up_->deallocate(p, it->second, s, al);
    asked_.erase(it);
  }
  std::string do_name() const override { return "test_first_pass_rounding"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

void register_test_layers() {
  static bool const once = [] {
    register_resource({"test_round_up", "rounds requests up", needs_upstream, {size_param("to", required, "granule")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<round_up_layer>(std::move(up), *a.size("to"));
                       }});
    register_resource({"test_hoard", "never gives memory back", needs_upstream, {},
                       [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                         return std::make_shared<hoard_layer>(std::move(up));
                       }});
    register_resource({"test_recorder", "records calls", needs_upstream, {},
                       [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                         return std::make_shared<recorder_layer>(std::move(up));
                       }});
    register_resource({"test_first_pass_rounding", "rounds its first allocations up", needs_upstream,
                       {size_param("to", required, "granule"), count_param("first", required, "how many")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<first_pass_rounding_layer>(std::move(up), *a.size("to"),
                                                                            *a.count("first"));
                       }});
    register_resource({"test_breaks", "throws logic_error on the n-th allocate", needs_upstream,
                       {count_param("at", required, "which allocate breaks")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<breaking_layer>(std::move(up), *a.count("at"));
                       }});
    return true;
  }();
  (void)once;
}

replay_options simulated(std::size_t capacity = std::size_t{1} << 40) {
  replay_options o;
  o.simulate = true;
  o.simulated_capacity = capacity;
  return o;
}

// allocate 1000, allocate 3000, free 1000, allocate 5000, free 3000, free 5000
// live: 1000, 4000, 3000, 8000, 5000, 0 -> peak live 8000 (line 5)
std::string const small_log = header +
                              "1,0,allocate,0x1000,1000,0\n"   // line 2
                              "1,0,allocate,0x2000,3000,0\n"   // line 3
                              "1,0,free,0x1000,1000,0\n"       // line 4
                              "1,0,allocate,0x3000,5000,0\n"   // line 5
                              "1,0,free,0x2000,3000,0\n"       // line 6
                              "1,0,free,0x3000,5000,0\n";      // line 7

using test_support::captured;
using test_support::run_tool;
using test_support::read_all;

std::filesystem::path scratch_dir() { return test_support::scratch_dir("mrstack_replay_test_"); }

std::string write_file(std::string const& name, std::string const& text) {
  return test_support::write_file(scratch_dir(), name, text);
}

using test_support::slurp;

}  // namespace

TEST_CASE("replay: peak live and footprint are exact on a hand-made log") {
  register_test_layers();
  auto const log = parse_allocation_log(small_log);
  REQUIRE(log.peak_live_bytes == 8000);

  auto const plain = replay_stack(log, "cuda", simulated());
  CHECK(plain.complete());
  CHECK(plain.events == 6);
  CHECK(plain.peak_live_bytes == 8000);
  CHECK(plain.peak_footprint_bytes == 8000);  // the meter counts the bytes asked of the bottom
  CHECK(plain.footprint_lower_bound);
  CHECK(plain.built_as == "footprint_meter > simulated(capacity=1099511627776)");
  CHECK(plain.upstream_allocations == 3);

  // Rounded to 4096: 4096 + 4096, then 4096 (free 1000), then 4096 + 8192 = 12288.
  auto const rounded = replay_stack(log, "test_round_up(to=4KiB) > cuda", simulated());
  CHECK(rounded.complete());
  CHECK(rounded.peak_footprint_bytes == 12288);
  CHECK(rounded.footprint_ratio() == Approx(12288.0 / 8000.0));
  CHECK_FALSE(rounded.footprint_lower_bound);
  CHECK(rounded.footprint_measured_by == "footprint_meter above simulated");
  CHECK(rounded.built_as == "test_round_up(to=4KiB) > footprint_meter > simulated(capacity=1099511627776)");

  // Keeping everything: 1000 + 3000 + 5000.
  auto const hoard = replay_stack(log, "test_hoard > system", simulated());
  CHECK(hoard.peak_footprint_bytes == 9000);
  CHECK(hoard.leaks == 0);
  CHECK(hoard.failures == 0);
}

TEST_CASE("replay: a refused allocation is counted, its free skipped, and peak live recomputed") {
  register_test_layers();
  auto const log = parse_allocation_log(small_log);
  // Capacity 6000: the simulated bottom takes spans rounded to 256 (1024, 3072, 5120);
  // 3072 + 5120 > 6000, so line 5 is refused.
  auto const r = replay_stack(log, "cuda", simulated(6000));
  CHECK_FALSE(r.complete());
  CHECK(r.error.empty());
  CHECK(r.failures == 1);
  CHECK(r.first_failure_line == 5);
  CHECK(r.first_failure_bytes == 5000);
  CHECK_THAT(r.first_failure_message, Catch::Contains("simulated could not allocate"));
  CHECK(r.peak_live_bytes == 4000);  // without the refused 5000
  CHECK(r.peak_footprint_bytes == 4000);
}

TEST_CASE("replay: leaks are allocations the log never frees, freed after the clock stops") {
  register_test_layers();
  auto const log = parse_allocation_log(header +
                                        "1,0,allocate,0x1000,1000,0\n"
                                        "1,0,allocate,0x2000,3000,0\n"
                                        "1,0,free,0x1000,1000,0\n"
                                        "1,0,allocate,0x3000,5000,0\n");
  auto const r = replay_stack(log, "test_round_up(to=1KiB) > cuda", simulated());
  CHECK(r.complete());
  CHECK(r.leaks == 2);
  CHECK(r.leaked_bytes == 8000);
  CHECK(r.peak_live_bytes == 8000);
  // A 0-byte allocation the stack answers with nullptr is still one the log never frees
  // (counted by the pointer it was missing, while the log's note counted it); one the log
  // frees is no leak.
  auto const zeros = parse_allocation_log(header +
                                          "1,0,allocate,0x1000,0,0\n"
                                          "1,0,allocate,0x2000,10,0\n"
                                          "1,0,allocate,0x3000,0,0\n"
                                          "1,0,free,0x3000,0,0\n");
  auto const z = replay_stack(zeros, "pool > cuda", simulated());
  CHECK(z.complete());
  CHECK(z.leaks == 2);
  CHECK(z.leaked_bytes == 10);
}

TEST_CASE("replay: a layer that breaks its contract stops the run, naming the line") {
  register_test_layers();
  auto const log = parse_allocation_log(small_log);
  auto const r = replay_stack(log, "test_breaks(at=3) > cuda", simulated());
  CHECK_FALSE(r.complete());
  CHECK_THAT(r.error, Catch::Contains("line 5: broken on purpose"));
  // A stack that cannot be built is reported, not thrown.
  auto const b = replay_stack(log, "test_round_up(to=1KiB) > cuda", simulated(0));
  CHECK(b.failures == 3);
  // Percentages are shares of the simulated capacity: 50% of 1 MiB is a 512 KiB granule.
  auto const half = replay_stack(log, "test_round_up(to=50%) > cuda", simulated(std::size_t{1} << 20));
  CHECK(half.complete());
  CHECK(half.peak_footprint_bytes == std::size_t{1} << 20);
  // A bad spec is an error to the caller.
  CHECK_THROWS_AS(replay_stack(log, "pol > cuda", simulated()), spec_error);
}

TEST_CASE("replay: a multi-thread log replays in exactly the log's order across threads") {
  register_test_layers();
  std::mt19937_64 rng{11};
  std::ostringstream text;
  text << header;
  std::map<std::uint64_t, std::size_t> live;
  std::vector<std::pair<char, std::size_t>> expected;
  std::uint64_t next = 0x10000;
  std::size_t live_bytes = 0;
  std::size_t reference_peak = 0;  // walked here, in log order, independently of the reader
  char const* const streams[] = {"0", "0x5500", "0x6600"};
  for (int i = 0; i < 3000; ++i) {
    int const thread = static_cast<int>(rng() % 4);
    char const* const stream = streams[rng() % 3];  // frees often on another stream than their allocation
    if (live.empty() || rng() % 2 == 0) {
      std::size_t const bytes = 1 + rng() % 5000;
      live[next] = bytes;
      text << thread << ",0,allocate,0x" << std::hex << next << std::dec << "," << bytes << "," << stream << "\n";
      expected.emplace_back('a', bytes);
      next += 0x10000;
      live_bytes += bytes;
      reference_peak = std::max(reference_peak, live_bytes);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      // Often a thread other than the allocating one frees: the order across threads matters.
      text << thread << ",0,free,0x" << std::hex << it->first << std::dec << "," << it->second << "," << stream << "\n";
      expected.emplace_back('f', it->second);
      live_bytes -= it->second;
      live.erase(it);
    }
  }
  auto const log = parse_allocation_log(text.str());
  REQUIRE(log.events_by_thread.size() == 4);
  REQUIRE(log.streams.size() == 3);
  recorder_layer::calls().clear();
  auto const r = replay_stack(log, "test_recorder > cuda", simulated());
  CHECK(r.complete());
  CHECK(r.peak_live_bytes == reference_peak);
  // The meter counts what the threads really did: equal only if they kept the log's order.
  CHECK(r.peak_footprint_bytes == reference_peak);
  std::vector<std::pair<char, std::size_t>> seen = recorder_layer::calls();
  // The leaks are freed after the replay; the replay itself is the first expected.size() calls.
  REQUIRE(seen.size() == expected.size() + live.size());
  seen.resize(expected.size());
  CHECK(seen == expected);
}

TEST_CASE("replay: peak live of a two-thread, three-stream log is the log's order, not the sum of its largest") {
  // The log tests/gpu/replay.cpp replays on a GPU. Live bytes in log order:
  // 1 MiB; +4 MiB; +300; -1 MiB (thread 2 frees thread 1's); -300; +8 MiB -> 12 MiB at
  // line 7, when the 300 bytes are already freed. 4 MiB + 8 MiB + 300 never coexist.
  register_test_layers();
  auto const log = parse_allocation_log(header +
                                        "1,0,allocate,0x1000,1048576,0\n"
                                        "2,0,allocate,0x2000,4194304,0x5500\n"
                                        "1,0,allocate,0x3000,300,0x6600\n"
                                        "2,0,free,0x1000,1048576,0x5500\n"
                                        "1,0,free,0x3000,300,0x6600\n"
                                        "2,0,allocate,0x4000,8388608,0x5500\n"
                                        "1,0,free,0x2000,4194304,0\n"
                                        "1,0,free,0x4000,8388608,0x5500\n");
  REQUIRE(log.streams.size() == 3);
  REQUIRE(log.events_by_thread.size() == 2);
  CHECK(log.peak_live_bytes == 12582912);
  for (int round = 0; round < 20; ++round) {  // two real threads each time: any reordering shows in the meter
    auto const r = replay_stack(log, "cuda", simulated());
    REQUIRE(r.complete());
    CHECK(r.peak_live_bytes == 12582912);
    CHECK(r.peak_footprint_bytes == 12582912);  // had line 6 run after line 7: 12 MiB + 300
    CHECK(r.upstream_allocations == 4);
  }
}

TEST_CASE("replay: repeats time each run and report the median") {
  register_test_layers();
  auto const log = parse_allocation_log(small_log);
  auto options = simulated();
  options.repeat = 3;
  std::size_t progress_calls = 0;
  options.progress = [&](std::size_t, std::size_t total) {
    ++progress_calls;
    CHECK(total == 6);
  };
  auto const r = replay_stack(log, "test_round_up(to=4KiB) > cuda", options);
  REQUIRE(r.seconds.size() == 3);
  std::vector<double> sorted = r.seconds;
  std::sort(sorted.begin(), sorted.end());
  CHECK(r.median_seconds == sorted[1]);
  CHECK(r.ns_per_event == Approx(sorted[1] * 1e9 / 6));
  CHECK(r.peak_footprint_bytes == 12288);  // each run builds a fresh stack
}

TEST_CASE("replay: a pool over simulated_vmm is measured by the physical memory mapped") {
  register_test_layers();
  auto const log = parse_allocation_log(small_log);
  // One granule of 2 MiB holds all 8000 live bytes, mapped one granule at a time.
  auto const r = replay_stack(log, "pool > vmm(map_granules=1)", simulated());
  CHECK(r.complete());
  CHECK(r.built_as == "pool > simulated_vmm(map_granules=1, capacity=1099511627776)");
  CHECK(r.footprint_measured_by == "simulated_vmm's peak mapped physical memory");
  CHECK(r.peak_footprint_bytes == (2u << 20));
  CHECK_FALSE(r.footprint_lower_bound);
  auto const plain = replay_stack(log, "simulated_vmm(granularity=4KiB, map_granules=1)", simulated());
  CHECK(plain.complete());
  CHECK(plain.peak_footprint_bytes == 12288);  // each allocation rounded to 4 KiB granules: 4096 + 8192
}

TEST_CASE("replay: a warm-up run on the same stack first; the footprint is the timed run's") {
  register_test_layers();
  // A hoard keeps every block: after the warm-up it holds 9000 bytes, and the timed run
  // adds 9000 more, so the footprint proves both runs used the same stack.
  auto const log = parse_allocation_log(small_log);
  auto options = simulated();
  options.warmup = true;
  auto const r = replay_stack(log, "test_hoard > cuda", options);
  CHECK(r.complete());
  CHECK(r.peak_footprint_bytes == 18000);
  CHECK(r.seconds.size() == 1);
  auto const leaky = parse_allocation_log(header + "1,0,allocate,0x1000,1000,0\n");
  auto const l = replay_stack(leaky, "test_round_up(to=4KiB) > cuda", options);
  CHECK(l.complete());
  CHECK(l.leaks == 1);                      // counted once, for the timed run
  CHECK(l.peak_footprint_bytes == 4096);    // the warm-up's leak was freed before the timed run
  // A warm-up whose peak (4096 + 8192 = 12288, rounded) is above the timed run's (8000,
  // exact) does not count: the footprint is measured over the timed run alone.
  auto const cold = replay_stack(log, "test_first_pass_rounding(to=4KiB, first=3) > cuda", simulated());
  CHECK(cold.peak_footprint_bytes == 12288);
  auto const warm = replay_stack(log, "test_first_pass_rounding(to=4KiB, first=3) > cuda", options);
  CHECK(warm.complete());
  CHECK(warm.peak_footprint_bytes == 8000);
  // Over a virtual range too (4 KiB granules, unmapped when freed): the warm-up maps
  // 8 KiB + 8 KiB at its peak, the timed run 4 KiB + 8 KiB.
  auto const vmm = replay_stack(log, "test_first_pass_rounding(to=8KiB, first=3) > simulated_vmm(granularity=4KiB, map_granules=1)", options);
  CHECK(vmm.complete());
  CHECK(vmm.peak_footprint_bytes == 12288);
  auto const c = run_tool({write_file("small.csv", small_log), "--simulate", "--warmup", "--repeat", "3", "-r", "cuda"});
  CHECK(c.status == 0);
  CHECK_THAT(c.out, Catch::Contains("timing:  median of 3 runs per stack, each after an untimed warm-up run on the same stack"));
}

TEST_CASE("replay: the spec it builds: bottom replaced under simulation, meter above the bottom") {
  CHECK(to_string(replay_spec_for("cuda", true, 1024)) == "footprint_meter > simulated(capacity=1024)");
  CHECK(to_string(replay_spec_for("system", false, 1024)) == "footprint_meter > system");
  CHECK(to_string(replay_spec_for("cuda_async", false, 1024)) == "cuda_async");  // measured by the driver pool
  CHECK(to_string(replay_spec_for("cuda_async(initial=1GiB)", true, 1024)) ==
        "footprint_meter > simulated(capacity=1024)");
  CHECK(to_string(replay_spec_for("footprint_meter > simulated", false, 1024)) == "footprint_meter > simulated");
  // A bottom that is a simulation already keeps the capacity the spec gives it.
  CHECK(to_string(replay_spec_for("simulated(capacity=1MiB)", true, 1024)) ==
        "footprint_meter > simulated(capacity=1MiB)");
  CHECK_THROWS_AS(replay_spec_for("cuda > cuda", true, 1024), spec_error);
  // vmm's arguments that its twin takes too go with it (they were dropped: map_granules=1
  // replayed as the default, reserve=1GiB never ran out); the rest mean nothing there.
  CHECK(to_string(replay_spec_for("pool > vmm(reserve=1GiB, map_granules=1, peer_access=false)", true, 1024)) ==
        "pool > simulated_vmm(reserve=1GiB, map_granules=1, capacity=1024)");
  CHECK(to_string(replay_spec_for("pool > vmm(2GiB, ipc=none)", true, 1024)) ==
        "pool > simulated_vmm(reserve=2147483648, capacity=1024)");
  // vmm's reserve=0 means its default; simulated_vmm's range starts at 1, so its default stands in.
  CHECK(to_string(replay_spec_for("pool > vmm(reserve=0, map_granules=1)", true, 1024)) ==
        "pool > simulated_vmm(map_granules=1, capacity=1024)");
  CHECK(to_string(replay_spec_for("pool > vmm(0B)", true, 1024)) == "pool > simulated_vmm(capacity=1024)");
  // vmm is simulated by its twin, and measures its own footprint: no meter between it and the pool.
  CHECK(to_string(replay_spec_for("pool > vmm(map_granules=1)", true, 1024)) ==
        "pool > simulated_vmm(map_granules=1, capacity=1024)");
  CHECK(to_string(replay_spec_for("pool > simulated_vmm", false, 1024)) == "pool > simulated_vmm");
}

TEST_CASE("replay: a spec of the most layers allowed has no room for the meter, and the error says so") {
  // 64 layers pass check_stack_spec; the meter made 65, refused as "the stack has 65
  // layers" under a spec that has 64.
  std::string spec;
  for (std::size_t i = 0; i + 1 < max_stack_layers; ++i) { spec += "statistics > "; }
  for (std::string const bottom : {"system", "simulated"}) {
    INFO(bottom);
    check_stack_spec(parse_stack_spec(spec + bottom));
    CHECK_THROWS_WITH(replay_spec_for(spec + bottom, false, 1024),
                      Catch::Contains("footprint_meter") && Catch::Contains("64 layers") &&
                          !Catch::Contains("65 layers"));
  }
  // With the meter written in (in place of a layer), nothing is added: 64 layers build.
  std::string const with_meter = spec.substr(std::string{"statistics > "}.size()) + "footprint_meter > simulated";
  CHECK(replay_spec_for(with_meter, false, 1024).layers.size() == max_stack_layers);
}

TEST_CASE("mrstack-replay: the table, the header and the verdict") {
  register_test_layers();
  auto const log_path = write_file("small.csv", small_log);
  auto const c = run_tool({log_path, "--simulate", "-r", "test_round_up(to=4KiB) > cuda", "--resource=test_hoard > cuda",
                           "-r", "cuda", "--capacity", "1GiB"});
  INFO(c.out << c.err);
  CHECK(c.status == 0);
  CHECK(c.err.empty());
  CHECK_THAT(c.out, Catch::Contains("6 events (3 allocations, 3 frees) on 1 thread and 1 stream; peak live 7.8 KiB"));
  CHECK_THAT(c.out, Catch::Contains("memory:  SIMULATED (--simulate);\n"
                                    "           each stack's bottom is simulated(capacity=1.00 GiB), touching no memory"));
  CHECK_THAT(c.out, Catch::Contains("events  wall time  ns/event  ns/call   peak live  peak footprint  footprint/live  leaks  failures"));
  CHECK_THAT(c.out, Catch::Contains("12.0 KiB          1.536x      0         0"));  // 12288 / 8000
  CHECK_THAT(c.out, Catch::Contains("8.8 KiB          1.125x      0         0"));   // 9000 / 8000
  CHECK_THAT(c.out, Catch::Contains("\ncuda*  "));
  CHECK_THAT(c.out, Catch::Contains("most compact test_hoard > cuda (1.125x of peak live); all 3 stacks replayed the whole log."));
}

TEST_CASE("mrstack-replay: exit 1 when an allocation fails; --json holds the numbers") {
  register_test_layers();
  auto const log_path = write_file("small.csv", small_log);
  auto const json = (scratch_dir() / "out.json").string();
  std::filesystem::remove(json);
  auto const c = run_tool({log_path, "--simulate", "--capacity", "6000", "-r", "cuda", "-r",
                           "test_round_up(to=1KiB) > cuda", "--json", json});
  INFO(c.out << c.err);
  CHECK(c.status == 1);
  CHECK_THAT(c.out, Catch::Contains("1 (line 5)"));
  CHECK_THAT(c.out, Catch::Contains("cuda: 1 allocation refused; the first at line 5 (event 3, 4.9 KiB): out of memory"));
  CHECK_THAT(c.out, Catch::Contains("no stack replayed the whole log"));
  std::string const j = slurp(json);
  INFO(j);
  CHECK_THAT(j, Catch::StartsWith("[\n  {\"resource\": \"cuda\", \"built_as\": \"footprint_meter > simulated(capacity=6000)\""));
  CHECK_THAT(j, Catch::Contains("\"events\": 6, \"failures\": 1, \"first_failure_line\": 5, \"first_failure_bytes\": 5000"));
  CHECK_THAT(j, Catch::Contains("\"peak_live_bytes\": 4000, \"peak_footprint_bytes\": 4000"));
  CHECK_THAT(j, Catch::Contains("\"seconds\": "));
  CHECK_THAT(j, Catch::Contains("{\"resource\": \"test_round_up(to=1KiB) > cuda\""));
  CHECK_THAT(j, Catch::EndsWith("}\n]\n"));
  // Every object has the keys machines rely on.
  for (char const* key : {"\"built_as\"", "\"events\"", "\"failures\"", "\"seconds\"", "\"peak_live_bytes\"",
                          "\"peak_footprint_bytes\""}) {
    std::size_t count = 0;
    for (std::size_t at = j.find(key); at != std::string::npos; at = j.find(key, at + 1)) { ++count; }
    CHECK(count == 2);
  }
}

TEST_CASE("mrstack-replay: exit 2 for unusable input, with a clear message and no --json file") {
  register_test_layers();
  auto const good = write_file("small.csv", small_log);
  auto const bad_log = write_file("bad.csv", header + "1,0,allocate,0x1000,1000,0\n1,0,free,0x1000,999,0\n");
  auto const json = (scratch_dir() / "never.json").string();
  std::filesystem::remove(json);
  struct case_t {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<case_t> const cases = {
      {{}, "mrstack-replay: no log given"},
      {{good, "--repeat", "0"}, "--repeat '0': expected a whole number of runs, at least 1"},
      {{good, "--repeat"}, "--repeat needs a value"},
      {{good, "--capacity", "lots"}, "--capacity 'lots': expected a number"},
      {{good, "--frobnicate"}, "unknown option '--frobnicate'"},
      {{good, good}, "one log at a time"},
      {{good, "--simulate=yes"}, "--simulate takes no value"},
      {{good, "-r", "pol > cuda", "--json", json}, "--resource: bad stack spec at column 1: unknown resource 'pol'"},
      {{good, "-r", "test_round_up > cuda", "--json", json}, "test_round_up needs its parameter 'to'"},
      {{(scratch_dir() / "missing.csv").string(), "--json", json}, "missing.csv: cannot open the log"},
      {{bad_log, "--json", json, "-r", "cuda"}, "bad.csv:3:17: free of 0x1000 with Size 999"},
  };
  for (auto const& k : cases) {
    auto const c = run_tool(k.args);
    INFO(c.out << c.err);
    CHECK(c.status == 2);
    CHECK_THAT(c.err, Catch::Contains(k.message));
    CHECK_FALSE(std::filesystem::exists(json));
  }
  // Nothing half-written: no temporary file is left beside the --json target either.
  for (auto const& entry : std::filesystem::directory_iterator{scratch_dir()}) {
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
  }
  auto const help = run_tool({"--help"});
  CHECK(help.status == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: mrstack-replay LOG[.gz]"));
  // The usage lines (before the first blank line) name every option, and the option list
  // explains each.
  std::string const usage = help.out.substr(0, help.out.find("\n\n"));
  for (char const* option : {"--resource", "--simulate", "--capacity", "--repeat", "--warmup", "--order", "--workers",
                             "--expect-failures", "--json", "--timeline", "--timeline-points", "--shrink",
                             "--write-csv", "--max-log-bytes", "--max-line-bytes", "--list-resources"}) {
    INFO(option);
    CHECK_THAT(usage, Catch::Contains(std::string{"["} + option) || Catch::Contains(std::string{" "} + option));
    CHECK_THAT(help.out.substr(usage.size()), Catch::Contains(std::string{"  "} + option) || Catch::Contains(std::string{", "} + option));
    if (std::string{option} != "--resource" && std::string{option} != "--list-resources") {
      // An option the parser does not know would be refused as unknown.
      auto const probe = run_tool({good, option});
      CHECK_THAT(probe.err, !Catch::Contains("unknown option"));
    }
  }
  // --json into a folder that does not exist: the message names the path given.
  auto const nowhere = run_tool({good, "--simulate", "-r", "cuda", "--json", "/no/such/dir/o.json"});
  CHECK(nowhere.status == 2);
  CHECK_THAT(nowhere.err, Catch::Contains("--json: cannot write /no/such/dir/o.json: No such file or directory"));
  CHECK_THAT(nowhere.err, !Catch::Contains(".tmp."));
  auto const list = run_tool({"--list-resources"});
  CHECK(list.status == 0);
  CHECK_THAT(list.out, Catch::Contains("cuda_async  (bottom: takes no upstream)"));
  CHECK_THAT(list.out, Catch::Contains("release_threshold"));
  // Each bounded parameter with its range, as docs/spec.md says.
  CHECK_THAT(list.out, Catch::Contains("(default 2MiB; 256B to 1GiB, a power of two)"));
  CHECK_THAT(list.out, Catch::Contains("(default 12; 1 to 1024)"));
}

TEST_CASE("mrstack-replay --write-csv: a checked log written as CSV, binary logs decoded; nothing replayed") {
  register_test_layers();
  auto const csv_in = write_file("convert.csv", small_log);
  auto const out_path = (scratch_dir() / "converted.csv").string();
  std::filesystem::remove(out_path);
  auto const plain = run_tool({csv_in, "--write-csv", out_path});
  INFO(plain.out << plain.err);
  CHECK(plain.status == 0);
  CHECK_THAT(plain.out, Catch::Contains("as CSV to " + out_path));
  CHECK(slurp(out_path) == small_log);
  // A binary log, made by the adaptor, comes out as the CSV its reader sees.
  auto const bin_path = (scratch_dir() / "two.bin").string();
  {
    logging_resource_adaptor log{std::make_shared<simulated_memory_resource>(), bin_path, false, true,
                                 logging_resource_adaptor::default_queue_capacity, log_order::per_thread,
                                 log_format::binary};
    log.deallocate(log.allocate(100), 100);
  }
  auto const binary = run_tool({bin_path, "--write-csv", out_path});
  CHECK(binary.status == 0);
  CHECK_THAT(binary.out, Catch::Contains("(2 events, 1 thread)"));
  CHECK(slurp(out_path) == read_log_text(bin_path));
  CHECK(slurp(out_path).rfind("Thread,Time,Action,Pointer,Size,Stream,Stamp\n", 0) == 0);
  // A log that does not check out writes nothing; replay options are refused with it.
  std::filesystem::remove(out_path);
  auto const bad_log = write_file("bad_convert.csv", header + "1,0,free,0x1000,16,0\n");
  auto const bad = run_tool({bad_log, "--write-csv", out_path});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("bad_convert.csv:2:"));
  CHECK_FALSE(std::filesystem::exists(out_path));
  auto const mixed = run_tool({csv_in, "--write-csv", out_path, "-r", "pool > cuda"});
  CHECK(mixed.status == 2);
  CHECK_THAT(mixed.err, Catch::Contains("--write-csv converts the log and replays nothing"));
}

TEST_CASE("mrstack-replay --write-csv: a log the reader refuses for a NUL byte is refused, not written") {
  register_test_layers();
  using namespace std::string_literals;
  // parse_allocation_log takes a NUL in the Thread column; read_allocation_log (what a
  // replay reads the file with) refuses the file. --write-csv must not write out a CSV
  // that mrstack-replay would then refuse.
  auto const nul_log = write_file("nul_convert.csv", header + "A\0B,0,allocate,0x1000,16,0\n1,0,free,0x1000,16,0\n"s);
  CHECK_THROWS_AS(read_allocation_log(nul_log), log_error);
  auto const out_path = (scratch_dir() / "nul_converted.csv").string();
  std::filesystem::remove(out_path);
  auto const c = run_tool({nul_log, "--write-csv", out_path});
  CHECK(c.status == 2);
  CHECK_THAT(c.err, Catch::Contains("a NUL byte"));
  CHECK_FALSE(std::filesystem::exists(out_path));
}

TEST_CASE("mrstack-replay: the sample log over simulated memory") {
  register_test_layers();
  char const* env = std::getenv("MRSTACK_SAMPLE_LOG");  // ctest sets it
  auto const path = env != nullptr ? std::filesystem::path{env}
                                   : std::filesystem::path{__FILE__}.parent_path().parent_path() / "data" /
                                         "torch_resnet50_train.csv.gz";
  if (!std::filesystem::exists(path)) {
    WARN("sample log not found at " << path.string());
    return;
  }
  auto const log = read_allocation_log(path.string());
  // A reference for the rounded stack: replay the log by hand, rounding every request to 2 MiB.
  std::size_t constexpr granule = std::size_t{2} << 20;
  std::size_t live = 0;
  std::size_t peak = 0;
  for (auto const& e : log.events) {
    std::size_t const rounded = (e.bytes + granule - 1) / granule * granule;
    if (e.action == log_action::allocate) {
      live += rounded;
      peak = std::max(peak, live);
    } else {
      live -= rounded;
    }
  }
  auto const r = replay_stack(log, "test_round_up(to=2MiB) > cuda", simulated());
  CHECK(r.complete());
  CHECK(r.events == 9094);
  CHECK(r.peak_live_bytes == log.peak_live_bytes);
  CHECK(r.peak_footprint_bytes == peak);
  auto const c = run_tool({path.string(), "--simulate", "-r", "cuda", "-r", "cuda_async"});
  CHECK(c.status == 0);
  CHECK_THAT(c.out, Catch::Contains("9,094 events (4,547 allocations, 4,547 frees)"));
}

TEST_CASE("mrstack-replay: an output that is the log or another output is refused before anything is written") {
  register_test_layers();
  auto const log_path = write_file("same.csv", small_log);
  auto const json = (scratch_dir() / "same.json").string();
  std::filesystem::remove(json);
  // --json onto the log would replace the log with JSON; two outputs on one path would
  // leave only the last written.
  auto const onto_log = run_tool({log_path, "-r", "cuda", "--json", log_path});
  INFO(onto_log.out << onto_log.err);
  CHECK(onto_log.status == 2);
  CHECK_THAT(onto_log.err, Catch::Contains("--json '" + log_path + "' is the log itself"));
  CHECK(slurp(log_path) == small_log);
  auto const two = run_tool({log_path, "-r", "cuda", "--json", json, "--timeline", json});
  INFO(two.out << two.err);
  CHECK(two.status == 2);
  CHECK_THAT(two.err, Catch::Contains("--timeline '" + json + "' is also the --json file"));
  CHECK_FALSE(std::filesystem::exists(json));
}

TEST_CASE("mrstack-replay: output it cannot write (stdout on a full disk) is exit 2, not 0") {
  register_test_layers();
  auto const log_path = write_file("full.csv", small_log);
  std::FILE* out = std::fopen("/dev/full", "w");
  std::FILE* err = std::tmpfile();
  REQUIRE(out != nullptr);
  REQUIRE(err != nullptr);
  int const status = run_replay_tool({log_path, "-r", "cuda"}, out, err);
  std::string const message = read_all(err);
  std::fclose(out);
  std::fclose(err);
  INFO(message);
  CHECK(status == 2);
  CHECK_THAT(message, Catch::Contains("mrstack-replay: cannot write the output: No space left on device"));
}

TEST_CASE("mrstack-replay: an output that is a device is written to, not replaced by a file") {
  register_test_layers();
  auto const log_path = write_file("device.csv", small_log);
  auto const is_device = [](char const* p) { return std::filesystem::is_character_file(std::filesystem::symlink_status(p)); };
  REQUIRE(is_device("/dev/full"));
  REQUIRE(is_device("/dev/null"));
  auto const full = run_tool({log_path, "-r", "cuda", "--json", "/dev/full"});
  INFO(full.out << full.err);
  CHECK(full.status == 2);
  CHECK_THAT(full.err, Catch::Contains("--json: cannot write /dev/full: No space left on device"));
  CHECK(is_device("/dev/full"));
  auto const null = run_tool({log_path, "-r", "cuda", "--timeline", "/dev/null"});
  INFO(null.out << null.err);
  CHECK(null.status == 0);
  CHECK(is_device("/dev/null"));
}

TEST_CASE("mrstack-replay: an option that takes a value, given twice, is refused, not silently the last") {
  register_test_layers();
  auto const log_path = write_file("twice.csv", small_log);
  auto const json = (scratch_dir() / "twice.json").string();
  std::filesystem::remove(json);
  for (auto const& args : std::vector<std::vector<std::string>>{
           {log_path, "-r", "cuda", "--json", json, "--json", json + "2"},
           {log_path, "-r", "cuda", "--capacity", "1GiB", "--capacity=2GiB", "--json", json},
           {log_path, "-r", "cuda", "--order", "strict", "--order", "per-thread", "--json", json}}) {
    auto const c = run_tool(args);
    INFO(c.out << c.err);
    CHECK(c.status == 2);
    CHECK_THAT(c.err, Catch::Contains(" given twice"));
    CHECK_FALSE(std::filesystem::exists(json));
  }
}

TEST_CASE("mrstack-replay: --timeline-points without --timeline, or --list-resources with a log, is refused") {
  register_test_layers();
  auto const log_path = write_file("ignored.csv", small_log);
  auto const json = (scratch_dir() / "ignored.json").string();
  std::filesystem::remove(json);
  auto const points = run_tool({log_path, "-r", "cuda", "--timeline-points", "5", "--json", json});
  INFO(points.out << points.err);
  CHECK(points.status == 2);
  CHECK_THAT(points.err, Catch::Contains("--timeline-points needs --timeline"));
  auto const list = run_tool({log_path, "--list-resources", "--json", json});
  INFO(list.out << list.err);
  CHECK(list.status == 2);
  CHECK_THAT(list.err, Catch::Contains("--list-resources takes no log and no other option"));
  CHECK_FALSE(std::filesystem::exists(json));
}

TEST_CASE("mrstack-replay: an output it cannot write is refused before the replay, leaving no other output") {
  register_test_layers();
  auto const log_path = write_file("early.csv", small_log);
  auto const json = (scratch_dir() / "early.json").string();
  std::filesystem::remove(json);
  auto const c = run_tool({log_path, "-r", "cuda", "--json", json, "--timeline", "/no/such/dir/t.json"});
  INFO(c.out << c.err);
  CHECK(c.status == 2);
  CHECK_THAT(c.err, Catch::Contains("--timeline: cannot write /no/such/dir/t.json: No such file or directory"));
  CHECK(c.out.empty());  // nothing replayed
  CHECK_FALSE(std::filesystem::exists(json));
  auto const folder = run_tool({log_path, "-r", "cuda", "--shrink", scratch_dir().string()});
  CHECK(folder.status == 2);
  CHECK_THAT(folder.err, Catch::Contains("--shrink: cannot write " + scratch_dir().string() + ": Is a directory"));
}

TEST_CASE("mrstack-replay --shrink: a stack that broke is a failure, exit 1, even with nothing to shrink") {
  // The replay's exit status held 1 for the broken stack; with --shrink the shrink's own
  // probe decided, and it said "refused nothing" and exit 0.
  register_test_layers();
  auto const log_path = write_file("shrink_broken.csv", small_log);
  auto const out = (scratch_dir() / "shrink_broken_out.csv").string();
  auto const plain = run_tool({log_path, "--simulate", "-r", "test_breaks(at=3) > cuda"});
  CHECK(plain.status == 1);
  auto const c = run_tool({log_path, "--simulate", "-r", "test_breaks(at=3) > cuda", "--shrink", out});
  INFO(c.out << c.err);
  CHECK(c.status == 1);
  CHECK_THAT(c.out, !Catch::Contains("refused nothing on this log"));
  CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("mrstack-replay --json: a log path or spec that is not UTF-8 is written as U+FFFD, so the file stays JSON") {
  // Copied through, the byte made the file unreadable (json.load: UnicodeDecodeError).
  auto const log_path = write_file("not_utf8_\xff.csv", small_log);
  auto const json = (scratch_dir() / "not_utf8.json").string();
  auto const c = run_tool({log_path, "--simulate", "-r", "cuda", "--json", json});
  INFO(c.out << c.err);
  REQUIRE(c.status == 0);
  std::ifstream in{json, std::ios::binary};
  std::string const text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  CHECK(text.find('\xff') == std::string::npos);
  CHECK(text.find("not_utf8_\xEF\xBF\xBD.csv") != std::string::npos);
  // Well-formed UTF-8 goes through as it is.
  auto const accented = write_file("caf\xC3\xA9.csv", small_log);
  auto const d = run_tool({accented, "--simulate", "-r", "cuda", "--json", json});
  REQUIRE(d.status == 0);
  std::ifstream again{json, std::ios::binary};
  std::string const text2{std::istreambuf_iterator<char>{again}, std::istreambuf_iterator<char>{}};
  CHECK(text2.find("caf\xC3\xA9.csv") != std::string::npos);
}

TEST_CASE("mrstack-replay: a spec the replay cannot build is refused before the log is read") {
  // 64 layers pass the spec check, but the replay adds a footprint_meter: said only after
  // the log was read and the header printed.
  std::string deep;
  for (int i = 0; i < 63; ++i) { deep += "statistics > "; }
  deep += "cuda";
  auto const c = run_tool({(scratch_dir() / "no such log.csv").string(), "--simulate", "-r", deep});
  INFO(c.out << c.err);
  CHECK(c.status == 2);
  CHECK_THAT(c.err, Catch::Contains("--resource: bad stack spec"));
  CHECK_THAT(c.err, Catch::Contains("footprint_meter"));
  CHECK(c.out.find("log:") == std::string::npos);
}

TEST_CASE("mrstack-replay: a logging layer that would write the log being replayed is refused before anything is written") {
  // It truncated the log as the stack was built, and the replay's own rows replaced it.
  auto const log_path = write_file("logged_onto.csv", small_log);
  for (std::string const& spec : {"logging(file=" + log_path + ") > cuda", "logging(\"" + log_path + "\") > cuda",
                                  "statistics > logging(async, file=" + log_path + ") > pool > cuda",
                                  // A bare flag takes no position: the file is the next value (it was missed).
                                  "logging(async, \"" + log_path + "\") > pool > cuda"}) {
    auto const c = run_tool({log_path, "--simulate", "-r", spec});
    INFO(spec << c.out << c.err);
    CHECK(c.status == 2);
    CHECK_THAT(c.err, Catch::Contains("logs to '" + log_path + "', the log itself"));
    std::ifstream in{log_path};
    std::string const text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
    CHECK(text == small_log);
  }
  // No file given: the layer logs to $MRSTACK_LOG_FILE (the flag 'async' was taken for the file).
  ::setenv(logging_resource_adaptor::log_file_variable, log_path.c_str(), 1);
  auto const from_variable = run_tool({log_path, "--simulate", "-r", "logging(async) > pool > cuda"});
  ::unsetenv(logging_resource_adaptor::log_file_variable);
  INFO(from_variable.err);
  CHECK(from_variable.status == 2);
  CHECK_THAT(from_variable.err, Catch::Contains("the log itself"));
  auto const elsewhere = (scratch_dir() / "logged_elsewhere.csv").string();
  CHECK(run_tool({log_path, "--simulate", "-r", "logging(file=" + elsewhere + ") > cuda"}).status == 0);
}

TEST_CASE("footprint_meter: a reset racing allocations never leaves the peak below the bytes held") {
  // reset_peak's store could overwrite the raise of an allocation that had seen a higher
  // peak and left it: the peak ended below the bytes held (4 of 200 rounds).
  for (int round = 0; round < 200; ++round) {
    footprint_meter meter{std::make_shared<simulated_memory_resource>()};
    std::atomic<bool> done{false};
    std::thread resetter{[&] {
      while (!done.load(std::memory_order_relaxed)) { meter.reset_peak(); }
    }};
    std::vector<void*> blocks;
    for (int i = 0; i < 2000; ++i) { blocks.push_back(meter.allocate(256)); }
    done = true;
    resetter.join();
    INFO("round " << round);
    REQUIRE(meter.peak_bytes_held() >= meter.bytes_held());
    for (void* p : blocks) { meter.deallocate(p, 256); }
  }
}
