// Replay with real device memory: real streams for the log's streams, threads, the
// footprint of cuda (metered) and cuda_async (the driver pool's high-water mark), and
// mrstack-replay saying REAL on the sample log.
#include <catch2/catch.hpp>

#include <mrstack/log/allocation_log.hpp>
#include <mrstack/replay/replay.hpp>
#include <mrstack/spec.hpp>

#include <cstdio>
#include <filesystem>

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

TEST_CASE("gpu replay: the sample log on real memory, and mrstack-replay says REAL") {
  auto const path = std::filesystem::path{__FILE__}.parent_path().parent_path().parent_path() / "data" /
                    "torch_resnet50_train.csv.gz";
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
