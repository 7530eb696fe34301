// Replay against stacks that break in ways a real allocator should not: a free that throws
// std::bad_alloc, an allocate or fragmentation() that throws something other than a
// std::exception. Each is an error naming the log line (or a refusal, for an allocation),
// never a refusal counted for a free, never an abort. Also the counts a replay reports
// when little happens: the timed run's upstream calls after a warm-up, a log where nothing
// is ever live, a 0-byte `allocate failure` row.
#include <catch2/catch.hpp>

#include "replay_tool_run.hpp"
#include "scratch_files.hpp"

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/replay/timeline.hpp>
#include <mrstack/spec_registry.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <new>

using namespace mrstack;

namespace {

/// How a broken layer breaks.
enum class breakage { first_free_bad_alloc, allocate_throws_int, refuses_and_fragmentation_throws_int, free_throws_int };

struct broken_layer final : memory_resource {
  broken_layer(resource_ptr up, breakage how) : up_{std::move(up)}, how_{how} {}
  resource_ptr up_;
  breakage how_;
  std::atomic<int> frees_{0};
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    if (how_ == breakage::allocate_throws_int) { throw 42; }
    if (how_ == breakage::refuses_and_fragmentation_throws_int) { throw std::bad_alloc{}; }
    return up_->allocate(b, s, al);
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override {
    if (how_ == breakage::first_free_bad_alloc && frees_++ == 0) { throw std::bad_alloc{}; }
    if (how_ == breakage::free_throws_int) { throw 42; }
    up_->deallocate(p, b, s, al);
  }
  fragmentation_info do_fragmentation() const override {
    if (how_ == breakage::refuses_and_fragmentation_throws_int) { throw 7; }
    return up_->fragmentation();
  }
  std::string do_name() const override { return "test_broken"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

template <breakage How>
resource_ptr make_broken(spec_arguments const&, resource_ptr up) {
  return std::make_shared<broken_layer>(std::move(up), How);
}

void register_broken_layers() {
  static bool const once = [] {
    register_resource({"test_free_bad_alloc", "breaks on purpose", needs_upstream, {},
                       make_broken<breakage::first_free_bad_alloc>});
    register_resource({"test_allocate_int", "breaks on purpose", needs_upstream, {},
                       make_broken<breakage::allocate_throws_int>});
    register_resource({"test_fragmentation_int", "breaks on purpose", needs_upstream, {},
                       make_broken<breakage::refuses_and_fragmentation_throws_int>});
    register_resource({"test_free_int", "breaks on purpose", needs_upstream, {}, make_broken<breakage::free_throws_int>});
    return true;
  }();
  (void)once;
}

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";
// Line 2 allocates 1000 B, line 3 frees it, line 4 allocates 500 B, line 5 frees them.
std::string const two_blocks =
    header + "1,0,allocate,0x1000,1000,0\n1,0,free,0x1000,1000,0\n1,0,allocate,0x2000,500,0\n1,0,free,0x2000,500,0\n";

replay_options simulated(replay_order order) {
  replay_options o;
  o.simulate = true;
  o.order = order;
  return o;
}

using test_support::captured;
using test_support::run_tool;

std::string scratch(std::string const& name, std::string const& text) {
  return test_support::write_file(test_support::scratch_dir("mrstack_replay_broken_"), name, text);
}

}  // namespace

TEST_CASE("replay: a free that throws std::bad_alloc is an error at its line, not a refused allocation") {
  register_broken_layers();
  auto const log = parse_allocation_log(two_blocks, "two.csv");
  for (auto const order : {replay_order::strict, replay_order::per_thread}) {
    CAPTURE(to_string(order));
    auto const r = replay_stack(log, "test_free_bad_alloc > cuda", simulated(order));
    CHECK(r.failures == 0);
    CHECK_THAT(r.error, Catch::Contains("line 3"));
    CHECK(r.peak_live_bytes <= 1000);  // 1,500 bytes were never live at once
  }
  // The timeline's replay says the same.
  auto const t = sample_stack(log, "test_free_bad_alloc > cuda", simulated(replay_order::strict), {0, 1, 2, 3});
  CHECK(!t.failure);
  CHECK_THAT(t.error, Catch::Contains("line 3") && Catch::Contains("a free threw"));
}

TEST_CASE("replay: a stack that throws something other than a std::exception is an error, never an abort") {
  register_broken_layers();
  std::string const path = scratch("nonstd.csv", two_blocks);
  for (char const* option : {"--timeline", "--shrink"}) {
    CAPTURE(option);
    std::string const out = scratch(std::string{"out"} + (option[2] == 't' ? ".json" : ".csv"), "");
    auto const c = run_tool({path, "--simulate", "-r", "test_allocate_int > cuda", option, out});
    CHECK(c.status == 1);
    CHECK_THAT(c.out + c.err, Catch::Contains("not a std::exception"));
  }
  // A refusal whose stack then cannot describe itself: still one refusal, no error.
  auto const log = parse_allocation_log(two_blocks, "two.csv");
  auto const r = replay_stack(log, "test_fragmentation_int > cuda", simulated(replay_order::strict));
  CHECK(r.failures == 2);
  CHECK(r.first_failure_line == 2);
  CHECK(r.error.empty());
  auto const t = sample_stack(log, "test_fragmentation_int > cuda", simulated(replay_order::strict), {0, 3});
  REQUIRE(t.failure);
  CHECK(t.failure->line == 2);
  CHECK_THAT(t.error, Catch::Contains("fragmentation() threw"));
}

TEST_CASE("replay: a leak whose free throws something other than a std::exception is an error in the result") {
  // The leak is freed after the clock stops; a stack that throws 42 there had the 42 leave
  // replay_stack (and the tool lose its table), where every other breakage is reported.
  register_broken_layers();
  auto const log = parse_allocation_log(header + "1,0,allocate,0x1000,1000,0\n", "leak.csv");
  for (bool const warm : {false, true}) {
    CAPTURE(warm);
    replay_options o = simulated(replay_order::strict);
    o.warmup = warm;
    replay_result r;
    REQUIRE_NOTHROW(r = replay_stack(log, "test_free_int > cuda", o));
    CHECK_THAT(r.error, Catch::Contains("not a std::exception"));
    CHECK(!r.complete());
  }
  std::string const path = scratch("leak.csv", header + "1,0,allocate,0x1000,1000,0\n");
  auto const c = run_tool({path, "--simulate", "-r", "test_free_int > cuda", "-r", "pool > cuda"});
  CHECK(c.status == 1);
  CHECK_THAT(c.out, Catch::Contains("pool > cuda ") && Catch::Contains("verdict:"));
}

TEST_CASE("replay: after a warm-up, the upstream calls counted are the timed run's alone") {
  auto const log = parse_allocation_log(two_blocks, "two.csv");
  for (bool const warm : {false, true}) {
    CAPTURE(warm);
    replay_options o = simulated(replay_order::strict);
    o.warmup = warm;
    CHECK(replay_stack(log, "cuda", o).upstream_allocations == 2);
    // A pool the warm-up grew asks its upstream nothing more.
    CHECK(replay_stack(log, "pool > cuda", o).upstream_allocations == (warm ? 0U : 1U));
  }
}

TEST_CASE("replay: a log where nothing is ever live has no footprint ratio, and no stack is 'most compact' on it") {
  std::string const path = scratch("nothing.csv", header + "1,0,allocate,0x1000,0,0\n1,0,free,0x1000,0,0\n");
  auto const r = replay_stack(read_allocation_log(path), "pool(initial=64MiB) > cuda", simulated(replay_order::strict));
  CHECK(r.peak_live_bytes == 0);
  CHECK(std::isnan(r.footprint_ratio()));
  auto const c = run_tool({path, "--simulate", "-r", "pool(initial=64MiB) > cuda"});
  CHECK(c.status == 0);
  CHECK_THAT(c.out, !Catch::Contains("most compact") && !Catch::Contains("0.000x"));
}

TEST_CASE("replay: a 0-byte 'allocate failure' row is skipped, not asked of the stacks") {
  std::string const log_text =
      header + "1,0,allocate,0x1000,1000,0\n1,0,allocate failure,(nil),0,0\n1,0,free,0x1000,1000,0\n";
  auto const log = parse_allocation_log(log_text, "zero_failure.csv");
  CHECK(log.recorded_failures.empty());
  CHECK(log.skipped_null_rows == 1);
  auto const c = run_tool({scratch("zero_failure.csv", log_text), "--simulate", "-r", "pool > cuda", "--expect-failures"});
  CHECK(c.status == 0);
  CHECK_THAT(c.out, !Catch::Contains("served"));
}

TEST_CASE("replay: a free that throws std::bad_alloc while asking a recorded failure is an error at its line") {
  // The probe's free was inside the catch of the allocation's refusal: the error was
  // swallowed, the stack 'served' the failure and its block stayed out of the books.
  register_broken_layers();
  std::string const log_text =
      header + "1,0,allocate,0x1000,1000,0\n1,0,allocate failure,(nil),64,0\n1,0,free,0x1000,1000,0\n";
  replay_options o = simulated(replay_order::strict);
  o.expect_failures = true;
  auto const r = replay_stack(parse_allocation_log(log_text, "probe.csv"), "test_free_bad_alloc > cuda", o);
  CHECK_THAT(r.error, Catch::Contains("line 3") && Catch::Contains("a recorded failure"));
}
