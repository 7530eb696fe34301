// Replay with real device memory: real streams for the log's streams, threads, the
// footprint of cuda (metered) and cuda_async (the driver pool's high-water mark), and
// mrstack-replay saying REAL on the sample log.
#include <catch2/catch.hpp>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

using namespace mrstack;

namespace {

// Two threads, three streams (the default one and two others), a cross-thread free.
std::string const log_text =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,0,allocate,0x1000,1048576,0\n"
    "2,0,allocate,0x2000,4194304,0x5500\n"
    "1,0,allocate,0x3000,300,0x6600\n"
    "2,0,free,0x1000,1048576,0x5500\n"
    "1,0,free,0x3000,300,0x6600\n"
    "2,0,allocate,0x4000,8388608,0x5500\n"
    "1,0,free,0x2000,4194304,0\n"
    "1,0,free,0x4000,8388608,0x5500\n";

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) { text.append(buf, n); }
  return text;
}

}  // namespace

TEST_CASE("gpu replay: cuda with real streams and threads; footprint metered above it") {
  auto const log = parse_allocation_log(log_text);
  REQUIRE(log.streams.size() == 3);
  REQUIRE(log.events_by_thread.size() == 2);
  replay_options options;  // real memory
  auto const r = replay_stack(log, "cuda", options);
  INFO(r.error << r.first_failure_message);
  CHECK(r.complete());
  CHECK_FALSE(r.simulated);
  // In log order the 300 bytes are freed (line 6) before the 8 MiB are allocated (line 7):
  // 4 MiB + 8 MiB at most (tests/replay.cpp walks it over simulated memory).
  CHECK(r.peak_live_bytes == 4194304 + 8388608);
  CHECK(r.peak_footprint_bytes == r.peak_live_bytes);
  CHECK(r.footprint_measured_by == "footprint_meter above cuda");
}

TEST_CASE("gpu replay: cuda_async's footprint is its pool's reserved high-water mark") {
  auto const log = parse_allocation_log(log_text);
  auto const r = replay_stack(log, "cuda_async", replay_options{});
  INFO(r.error << r.first_failure_message);
  CHECK(r.complete());
  CHECK(r.built_as == "cuda_async");
  CHECK(r.footprint_measured_by == "cuda_async pool's reserved high-water mark");
  CHECK(r.peak_footprint_bytes >= r.peak_live_bytes);
  CHECK_FALSE(r.footprint_lower_bound);
}

/// The sample log: MRSTACK_SAMPLE_LOG (ctest sets it; so does tools/gpu/run-cpp-checks.sh
/// for a bundle), so an installed or bundled test binary finds it wherever it runs.
std::filesystem::path sample_log() {
  char const* env = std::getenv("MRSTACK_SAMPLE_LOG");
  return env != nullptr ? std::filesystem::path{env} : std::filesystem::path{};
}

TEST_CASE("gpu replay: the sample log on real memory, and mrstack-replay says REAL") {
  auto const path = sample_log();
  INFO("MRSTACK_SAMPLE_LOG='" << path.string() << "': set it to data/torch_resnet50_train.csv.gz");
  REQUIRE(!path.empty());
  REQUIRE(std::filesystem::exists(path));
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  int const status = run_replay_tool({path.string(), "-r", "cuda_async", "-r", "cuda"}, out, err);
  std::string const text = read_all(out);
  std::string const errors = read_all(err);
  std::fclose(out);
  std::fclose(err);
  INFO(text << errors);
  CHECK(status == 0);
  CHECK_THAT(text, Catch::Contains("memory:  REAL device memory"));
  CHECK_THAT(text, Catch::Contains("9,094 events"));
}

namespace {

/// A log like the one RMM's logging adaptor writes for a two-thread, two-stream program:
/// 12,000 events, each thread allocating and freeing on its own stream.
std::string two_stream_log() {
  std::mt19937_64 rng{12};
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\n";
  std::vector<std::vector<std::pair<std::uint64_t, std::size_t>>> live(2);
  std::uint64_t address = 0x100000;
  for (int i = 0; i < 12000; ++i) {
    int const t = static_cast<int>(rng() % 2);
    char const* stream = t == 0 ? "0x5500" : "0x6600";
    auto& mine = live[static_cast<std::size_t>(t)];
    bool const allocate = mine.empty() || (mine.size() < 200 && rng() % 2 == 0);
    if (allocate) {
      std::size_t const bytes = std::size_t{256} << (rng() % 12);
      address += 0x100000;
      mine.emplace_back(address, bytes);
      text += std::to_string(t + 1) + ",0,allocate," + std::to_string(address) + "," + std::to_string(bytes) + "," + stream + "\n";
    } else {
      std::size_t const k = rng() % mine.size();
      auto const [a, b] = mine[k];
      mine[k] = mine.back();
      mine.pop_back();
      text += std::to_string(t + 1) + ",0,free," + std::to_string(a) + "," + std::to_string(b) + "," + stream + "\n";
    }
  }
  for (int t = 0; t < 2; ++t) {
    for (auto const& [a, b] : live[static_cast<std::size_t>(t)]) {
      text += std::to_string(t + 1) + ",0,free," + std::to_string(a) + "," + std::to_string(b) + "," +
              (t == 0 ? "0x5500" : "0x6600") + "\n";
    }
  }
  return text;
}

}  // namespace

TEST_CASE("gpu replay: on a two-thread, two-stream log the table times the allocator, not the hand-over") {
  auto const log = parse_allocation_log(two_stream_log(), "two_stream.csv");
  REQUIRE(log.thread_names.size() == 2);
  REQUIRE(log.streams.size() == 2);
  for (auto const order : {replay_order::strict, replay_order::per_thread}) {
    replay_options options;
    options.order = order;
    options.repeat = 3;
    options.warmup = true;
    auto const pool = replay_stack(log, "pool > cuda", options);
    auto const driver = replay_stack(log, "cuda_async", options);
    INFO(pool.error << driver.error);
    REQUIRE(pool.complete());
    REQUIRE(driver.complete());
    WARN(to_string(order) << " order: pool > cuda " << pool.ns_per_call << " ns/call (" << pool.ns_per_event
                          << " ns/event wall), cuda_async " << driver.ns_per_call << " ns/call ("
                          << driver.ns_per_event << " ns/event wall)");
    CHECK(pool.ns_per_call < driver.ns_per_call);  // the verdict's fastest is a suballocator
    // In strict order one call runs at a time, so the time inside the allocator is part of
    // the wall time; per-thread order runs the log's threads at once, and their calls
    // overlap (the wall time per event can then be below the time of one call).
    if (order == replay_order::strict) { CHECK(pool.ns_per_call <= pool.ns_per_event); }
  }
}
