// Failures in replay: recorded `allocate failure` rows as expectations, the stack's
// fragmentation at its first refusal, the --timeline file (parsed back), and --shrink on a
// large inference-like log.
#include <catch2/catch.hpp>

#include "replay_tool_run.hpp"
#include "scratch_files.hpp"

#include "mini_json.hpp"

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/replay/shrink.hpp>
#include <mrstack/replay/timeline.hpp>
#include <mrstack/spec_registry.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include <unistd.h>

using namespace mrstack;

namespace {

std::string const header = "Thread,Time,Action,Pointer,Size,Stream\n";

/// Answers fragmentation() with numbers a test can predict: held = live + 1000, free
/// 1000 bytes in 3 blocks, the largest 500.
struct fragmenting_layer final : memory_resource {
  explicit fragmenting_layer(resource_ptr up) : up_{std::move(up)} {}
  resource_ptr up_;
  mutable std::mutex mutex_;
  std::size_t live_ = 0;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override {
    void* p = up_->allocate(b, s, al);
    std::lock_guard lock{mutex_};
    live_ += b;
    return p;
  }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override {
    up_->deallocate(p, b, s, al);
    std::lock_guard lock{mutex_};
    live_ -= b;
  }
  fragmentation_info do_fragmentation() const override {
    std::lock_guard lock{mutex_};
    fragmentation_info f;
    f.resource = "test_fragmenting";
    f.live_bytes = live_;
    f.held_bytes = live_ + 1000;
    f.free_bytes = 1000;
    f.free_blocks = 3;
    f.largest_free_block = 500;
    return f;
  }
  std::string do_name() const override { return "test_fragmenting"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
};

void register_test_layers() {
  static bool const once = [] {
    register_resource({"test_fragmenting", "reports a known fragmentation", needs_upstream, {},
                       [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                         return std::make_shared<fragmenting_layer>(std::move(up));
                       }});
    return true;
  }();
  (void)once;
}

replay_options simulated(std::size_t capacity) {
  replay_options o;
  o.simulate = true;
  o.simulated_capacity = capacity;
  return o;
}

std::filesystem::path scratch_dir() { return test_support::scratch_dir("mrstack_replay_failures_"); }

std::string write_file(std::string const& name, std::string const& text) {
  return test_support::write_file(scratch_dir(), name, text);
}

using test_support::slurp;

using test_support::captured;
using test_support::run_tool;

// Lines: 2 alloc 1 KiB, 3 failure 1 TiB (refused anywhere), 4 alloc 3 KiB, 5 failure 256
// bytes (a stack with room serves it), 6 free 1 KiB, 7 free 3 KiB, 8 alloc 5 KiB, 9 free
// 5 KiB. (Sizes are multiples of 256: the simulated upstream rounds to 256.)
std::string const log_with_failures = header +
                                      "1,0,allocate,0x1000,1024,0\n"
                                      "1,0,allocate failure,0x0,1099511627776,0\n"
                                      "1,0,allocate,0x2000,3072,0\n"
                                      "1,0,allocate failure,(nil),256,0\n"
                                      "1,0,free,0x1000,1024,0\n"
                                      "1,0,free,0x2000,3072,0\n"
                                      "1,0,allocate,0x3000,5120,0\n"
                                      "1,0,free,0x3000,5120,0\n";

}  // namespace

TEST_CASE("replay failures: recorded failures are expectations the stack must meet") {
  auto const log = parse_allocation_log(log_with_failures);
  REQUIRE(log.recorded_failures.size() == 2);
  CHECK(log.recorded_failures[0].before_event == 1);
  CHECK(log.recorded_failures[1].before_event == 2);
  replay_options o = simulated(std::size_t{1} << 30);
  o.expect_failures = true;
  auto const r = replay_stack(log, "cuda", o);
  CHECK(r.expected_failures == 2);
  CHECK(r.expected_failures_served == 1);  // 256 bytes fit in 1 GiB: the log says they did not
  CHECK(r.first_served_expected_line == 5);
  CHECK_FALSE(r.complete());
  // Under a capacity of 4 KiB, 256 bytes more than the 4 KiB live at line 5 do not fit either.
  auto const tight = replay_stack(log, "cuda", [] {
    replay_options t = simulated(4096);
    t.expect_failures = true;
    return t;
  }());
  CHECK(tight.expected_failures == 2);
  CHECK(tight.expected_failures_served == 0);
  CHECK(tight.failures == 1);  // but 5 KiB at line 8 does not fit 4 KiB either
  CHECK(tight.complete() == false);
  // Without expectations the rows are not asked.
  auto const plain = replay_stack(log, "cuda", simulated(std::size_t{1} << 30));
  CHECK(plain.expected_failures == 0);
  CHECK(plain.complete());
  o.order = replay_order::per_thread;
  CHECK_THROWS_WITH(replay_stack(log, "cuda", o), Catch::Contains("need strict order"));

  auto const path = write_file("failures.csv", log_with_failures);
  auto const c = run_tool({path, "--simulate", "--capacity", "1GiB", "-r", "cuda", "--expect-failures"});
  INFO(c.out << c.err);
  CHECK(c.status == 1);
  CHECK_THAT(c.out, Catch::Contains("each stack must refuse them too (--expect-failures)"));
  CHECK_THAT(c.out, Catch::Contains("cuda: served 1 of the 2 allocations the log records as refused; the first at line 5"));
  auto const without = run_tool({path, "--simulate", "--capacity", "1GiB", "-r", "cuda"});
  CHECK(without.status == 0);
  CHECK_THAT(without.out, Catch::Contains("the log records 2 allocation failures (first at line 3): reported, not replayed"));
  auto const per_thread = run_tool({path, "--expect-failures", "--order", "per-thread"});
  CHECK(per_thread.status == 2);
  CHECK_THAT(per_thread.err, Catch::Contains("--expect-failures asks each recorded failure at its place in the log"));
}

TEST_CASE("replay failures: the first refusal names its event, request and the stack's fragmentation") {
  register_test_layers();
  auto const log = parse_allocation_log(log_with_failures);
  auto const r = replay_stack(log, "test_fragmenting > cuda", simulated(5000));
  REQUIRE(r.failures == 1);
  CHECK(r.first_failure_line == 8);
  CHECK(r.first_failure_event == 4);
  CHECK(r.first_failure_bytes == 5120);
  CHECK(r.first_failure_fragmentation.resource == "test_fragmenting");
  CHECK(r.first_failure_fragmentation.live_bytes == 0);  // everything was freed before line 8
  CHECK(r.first_failure_fragmentation.largest_free_block == 500);

  auto const path = write_file("failures.csv", log_with_failures);
  auto const json = (scratch_dir() / "out.json").string();
  auto const c = run_tool({path, "--simulate", "--capacity", "5000", "-r", "test_fragmenting > cuda", "--json", json});
  INFO(c.out << c.err);
  CHECK(c.status == 1);
  CHECK_THAT(c.out, Catch::Contains("refused; the first at line 8 (event 4, 5.0 KiB): out of memory"));
  CHECK_THAT(c.out, Catch::Contains("then test_fragmenting held 1000 B: 0 B live, 1000 B free in 3 blocks, the largest 500 B"));
  auto const parsed = test::parse_json(slurp(json));
  auto const& f = parsed.at(0).at("first_failure_fragmentation");
  CHECK(f.at("resource").text == "test_fragmenting");
  CHECK(f.at("free_blocks").number == 3);
}

TEST_CASE("replay failures: timeline samples are evenly spaced and end at the last event") {
  CHECK(timeline_sample_events(5, 2000) == std::vector<std::uint32_t>{0, 1, 2, 3, 4});
  CHECK(timeline_sample_events(10, 3) == std::vector<std::uint32_t>{3, 6, 9});
  CHECK(timeline_sample_events(0, 10).empty());
  auto const many = timeline_sample_events(9094, 2000);
  CHECK(many.size() == 2000);
  CHECK(many.back() == 9093);
  CHECK(std::is_sorted(many.begin(), many.end()));
}

TEST_CASE("replay failures: --timeline writes the documented schema") {
  register_test_layers();
  // Two threads, two streams; live after each event: 1000 4000 3000 0 5000 0.
  std::string const text = header +
                           "1,0,allocate,0x1000,1000,0\n"
                           "2,0,allocate,0x2000,3000,0x5500\n"
                           "1,0,free,0x1000,1000,0\n"
                           "2,0,free,0x2000,3000,0x5500\n"
                           "1,0,allocate,0x3000,5000,0\n"
                           "1,0,free,0x3000,5000,0\n";
  auto const path = write_file("timeline.csv", text);
  auto const file = (scratch_dir() / "timeline.json").string();
  auto const c = run_tool({path, "--simulate", "--capacity", "4500", "-r", "test_fragmenting > cuda", "-r", "cuda",
                           "-r", "fixed_size(block_size=256) > cuda", "--timeline", file, "--timeline-points", "3"});
  INFO(c.out << c.err);
  CHECK(c.status == 1);  // 5,000 bytes do not fit 4,500
  auto const t = test::parse_json(slurp(file));
  CHECK(t.at("format").text == "mrstack-timeline/1");
  CHECK(t.at("log").text == path);
  CHECK(t.at("events").number == 6);
  CHECK(t.at("simulated").boolean);
  CHECK(t.at("capacity_bytes").number == 4500);
  CHECK(t.at("sample_event").numbers() == std::vector<double>{1, 3, 5});
  CHECK(t.at("live_bytes").numbers() == std::vector<double>{4000, 0, 0});
  REQUIRE(t.at("stacks").items.size() == 3);
  // What stopped a stack's replay is in the timeline too, not only in results[].
  CHECK(t.at("stacks").at(0).at("error").is_null());
  CHECK_THAT(t.at("stacks").at(2).at("error").text, Catch::Contains("fixed_size"));
  auto const& s = t.at("stacks").at(0);
  CHECK(s.at("resource").text == "test_fragmenting > cuda");
  CHECK(s.at("footprint_bytes").numbers() == std::vector<double>{4000, 0, 0});
  CHECK(s.at("free_held_bytes").numbers() == std::vector<double>{1000, 1000, 1000});
  CHECK(s.at("largest_free_block").numbers() == std::vector<double>{500, 500, 500});
  auto const& failure = s.at("failure");
  CHECK(failure.at("line").number == 6);
  CHECK(failure.at("event").number == 4);
  CHECK(failure.at("bytes").number == 5000);
  CHECK_THAT(failure.at("message").text, Catch::Contains("out of memory"));
  CHECK(failure.at("fragmentation").at("resource").text == "test_fragmenting");
  CHECK(failure.at("fragmentation").at("held_bytes").number == 1000);
  CHECK(t.at("stacks").at(1).at("free_held_bytes").numbers() == std::vector<double>{0, 0, 0});  // no suballocator
  auto const& histogram = t.at("size_histogram");
  REQUIRE(histogram.items.size() == 3);  // 1000 in [512, 1023], 3000 in [2048, 4095], 5000 in [4096, 8191]
  CHECK(histogram.at(0).at("min_bytes").number == 512);
  CHECK(histogram.at(0).at("max_bytes").number == 1023);
  CHECK(histogram.at(1).at("min_bytes").number == 2048);
  CHECK(histogram.at(1).at("allocations").number == 1);
  CHECK(histogram.at(2).at("max_bytes").number == 8191);
  REQUIRE(t.at("threads").items.size() == 2);
  CHECK(t.at("threads").at(0).at("thread").text == "1");
  CHECK(t.at("threads").at(0).at("allocations").number == 2);
  CHECK(t.at("threads").at(0).at("bytes_allocated").number == 6000);
  CHECK(t.at("streams").at(0).at("stream").text == "0");  // as the log writes it
  CHECK(t.at("streams").at(1).at("stream").text == "0x5500");
  CHECK(t.at("streams").at(1).at("frees").number == 1);
  REQUIRE(t.at("results").items.size() == 3);
  CHECK(t.at("results").at(1).at("resource").text == "cuda");
  CHECK(t.at("results").at(1).at("failures").number == 1);
}

TEST_CASE("replay failures: --timeline counts zero-byte allocations in a bucket of their own") {
  // The reader keeps an allocation of 0 bytes at a real pointer (only a null one is
  // skipped); the size histogram indexed its power-of-two bucket with bit_width(0) - 1,
  // before the array, and the tool died freeing the corrupted heap.
  std::string const text = header +
                           "1,0,allocate,0x1000,0,0\n"
                           "1,0,free,0x1000,0,0\n"
                           "1,0,allocate,0x2000,100,0\n"
                           "1,0,free,0x2000,100,0\n";
  auto const log = parse_allocation_log(text, "zero.csv");
  REQUIRE(log.events.size() == 4);
  timeline const t = log_timeline(log, 10);
  REQUIRE(t.size_histogram.size() == 2);
  CHECK(t.size_histogram[0].min_bytes == 0);
  CHECK(t.size_histogram[0].max_bytes == 0);
  CHECK(t.size_histogram[0].allocations == 1);
  CHECK(t.size_histogram[1].min_bytes == 64);
  CHECK(t.size_histogram[1].allocations == 1);
  auto const path = write_file("zero.csv", text);
  auto const file = (scratch_dir() / "zero_timeline.json").string();
  auto const c = run_tool({path, "--simulate", "-r", "pool > cuda", "--timeline", file});
  INFO(c.out << c.err);
  CHECK(c.status == 0);
  CHECK(test::parse_json(slurp(file)).at("size_histogram").at(0).at("allocations").number == 1);
}

namespace {

/// An inference-like log of exactly 126,240 events: 160 weights (256 KiB to 32 MiB)
/// allocated first and freed last, then 62,960 activations, 90% small (512 B to 256 KiB),
/// each freed 1 to 20 allocations later.
std::string inference_log() {
  std::mt19937_64 rng{7};
  std::string text = header;
  std::uint64_t address = 0x10000000;
  auto row = [&](char const* action, std::uint64_t a, std::size_t bytes) {
    text += "1,0,";
    text += action;
    char buf[64];
    std::snprintf(buf, sizeof buf, ",0x%llx,%zu,0\n", static_cast<unsigned long long>(a), bytes);
    text += buf;
  };
  std::size_t const weight_sizes[] = {256 << 10, 1 << 20, 2 << 20, 4 << 20, 9 << 20, 16 << 20, 32 << 20};
  std::size_t const small_sizes[] = {512, 1024, 2048, 4096, 8192, 16384, 65536, 262144};
  std::size_t const large_sizes[] = {1 << 20, 2 << 20, 3 << 20, 6 << 20};
  std::vector<std::pair<std::uint64_t, std::size_t>> weights;
  for (int i = 0; i < 160; ++i) {
    std::size_t const bytes = weight_sizes[rng() % 7] + 256 * (rng() % 17);
    address += 0x100000;
    weights.emplace_back(address, bytes);
    row("allocate", address, bytes);
  }
  struct pending {
    std::size_t due;
    std::uint64_t address;
    std::size_t bytes;
  };
  std::vector<pending> waiting;
  for (std::size_t step = 1; step <= 62960; ++step) {
    std::size_t const bytes = rng() % 10 < 9 ? small_sizes[rng() % 8] : large_sizes[rng() % 4];
    address += 0x100000;
    row("allocate", address, bytes);
    waiting.push_back({step + 1 + rng() % 20, address, bytes});
    std::vector<pending> still;
    for (auto const& p : waiting) {
      if (p.due <= step) {
        row("free", p.address, p.bytes);
      } else {
        still.push_back(p);
      }
    }
    waiting = std::move(still);
  }
  for (auto const& p : waiting) { row("free", p.address, p.bytes); }
  for (auto const& [a, b] : weights) { row("free", a, b); }
  return text;
}

}  // namespace

TEST_CASE("replay failures: --shrink cuts a 126,240-event failing log to a few dozen events") {
  std::string const text = inference_log();
  auto const log = parse_allocation_log(text, "inference.csv");
  REQUIRE(log.events.size() == 126240);
  std::size_t const capacity = log.peak_live_bytes + log.peak_live_bytes / 200;  // peak + 0.5%
  replay_options const o = simulated(capacity);
  auto const full = replay_stack(log, "pool > cuda", o);
  REQUIRE(full.failures > 0);  // the pool's growth needs more than the peak's bytes

  auto const s = shrink_failing_log(log, "pool > cuda", o);
  WARN("shrink: " << log.events.size() << " -> " << s.kept_events.size() << " events in " << s.seconds << " s, "
                  << s.tests << " replays");
  REQUIRE(s.failed);
  CHECK(s.kept_events.size() <= 200);
  CHECK(s.seconds <= 120);
  CHECK(std::is_sorted(s.kept_events.begin(), s.kept_events.end()));
  CHECK_THAT(s.failure, Catch::StartsWith("out_of_memory (line "));
  // The shrunk log is a valid log (every free after its allocation) and fails the same way.
  auto const small = parse_allocation_log(failing_log_csv(log, s.kept_events), "shrunk.csv");
  CHECK(small.events.size() == s.kept_events.size());
  auto const again = replay_stack(small, "pool > cuda", o);
  CHECK(again.failures > 0);
  CHECK_THAT(again.first_failure_message, Catch::Contains("out of memory"));
  CHECK(replay_stack(small, "pool > cuda", simulated(capacity * 2)).complete());  // and only for lack of memory

  // Through the command line: the file, the counts and the exit status.
  auto const path = write_file("inference.csv", text);
  auto const out = (scratch_dir() / "shrunk.csv").string();
  auto const c = run_tool({path, "-r", "pool > cuda", "--capacity", std::to_string(capacity), "--shrink", out});
  INFO(c.out << c.err);
  CHECK(c.status == 1);
  CHECK_THAT(c.out, Catch::Contains("shrink: kept " + std::to_string(s.kept_events.size()) + " of 126,240 events"));
  CHECK(slurp(out) == failing_log_csv(log, s.kept_events));
  // A stack that does not fail has nothing to shrink.
  auto const fine = run_tool({path, "-r", "pool > cuda", "--capacity", "80GiB", "--shrink", out + ".2"});
  CHECK(fine.status == 0);
  CHECK_THAT(fine.out, Catch::Contains("refused nothing on this log: nothing to shrink"));
  CHECK_FALSE(std::filesystem::exists(out + ".2"));
  auto const two = run_tool({path, "-r", "pool > cuda", "-r", "cuda", "--shrink", out});
  CHECK(two.status == 2);
  CHECK_THAT(two.err, Catch::Contains("--shrink needs exactly one --resource"));
}
