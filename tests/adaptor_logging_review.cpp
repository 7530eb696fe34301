// A hostile review of the per-thread log buffers (src/adaptor/log_thread_buffers.cpp) and
// the binary log: threads that come and go (adopting each other's buffers) while another
// thread flushes; one thread logging to several adaptors, some destroyed while it lives;
// auto_flush for a row written after the thread's exit hook. Run under the tsan preset too.
#include <catch2/catch.hpp>

#include <logged_threads.hpp>
#include <scratch_files.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/error.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/log/binary_log.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <cstring>
#include <barrier>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace mrstack;

namespace {

/// The rows of a per-thread CSV log grouped by Stream (each test thread has its own), in
/// file order: [action, pointer, size, stamp].
std::map<std::uintptr_t, std::vector<std::vector<std::string>>> rows_by_stream(std::string const& text) {
  std::istringstream in{text};
  std::string line;
  std::getline(in, line);
  std::map<std::uintptr_t, std::vector<std::vector<std::string>>> by;
  while (std::getline(in, line)) {
    auto f = test::split_row(line);
    REQUIRE(f.size() == 7);
    by[std::stoull(f[5], nullptr, 16)].push_back({f[2], f[3], f[4], f[6]});
  }
  return by;
}

}  // namespace

TEST_CASE("logging review: threads come and go (adopting buffers) while another flushes: no row lost or repeated") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  INFO("binary " << (format == log_format::binary));
  auto sim = std::make_shared<simulated_memory_resource>(std::size_t{1} << 32);
  std::ostringstream out;
  constexpr int waves = 12;
  constexpr int per_wave = 4;
  constexpr int ops = 300;
  std::vector<std::vector<test::logged_call>> expected(waves * per_wave);
  {
    logging_resource_adaptor log{sim, out, false, true, 16, log_order::per_thread, format};
    std::atomic<bool> done{false};
    std::thread flusher{[&] {
      while (!done.load()) { log.flush(); }
    }};
    // A sliding window of threads: new ones start (and adopt) while old ones exit.
    std::deque<std::thread> pool;
    for (int w = 0; w < waves; ++w) {
      for (int t = 0; t < per_wave; ++t) {
        int const id = w * per_wave + t;
        if (pool.size() == per_wave) {
          pool.front().join();
          pool.pop_front();
        }
        pool.emplace_back([&, id] {
          auto const stream = test::fake_stream(0x7000 + static_cast<std::uintptr_t>(id));
          auto& mine = expected[static_cast<std::size_t>(id)];
          for (int i = 0; i < ops; ++i) {
            std::size_t const bytes = 1 + static_cast<std::size_t>(i % 97);
            void* p = log.allocate(bytes, stream);
            mine.push_back({"allocate", reinterpret_cast<std::uintptr_t>(p), bytes});
            log.deallocate(p, bytes, stream);
            mine.push_back({"free", reinterpret_cast<std::uintptr_t>(p), bytes});
          }
        });
      }
    }
    for (auto& th : pool) { th.join(); }
    done = true;
    flusher.join();
    CHECK(log.thread_buffer_count() <= 2 * static_cast<std::size_t>(per_wave));
  }
  std::string const text = test::csv_of(out.str());
  auto const by = rows_by_stream(text);
  REQUIRE(by.size() == expected.size());
  for (std::size_t t = 0; t < expected.size(); ++t) {
    INFO("thread " << t);
    auto const it = by.find(0x7000 + t);
    REQUIRE(it != by.end());
    auto const& rows = it->second;
    REQUIRE(rows.size() == expected[t].size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      REQUIRE(rows[i][0] == expected[t][i].action);
      REQUIRE(std::stoull(rows[i][1], nullptr, 16) == expected[t][i].pointer);
      REQUIRE(std::stoull(rows[i][2]) == expected[t][i].bytes);
    }
  }
  CHECK_NOTHROW(parse_allocation_log(text, "waves"));
}

TEST_CASE("logging review: one thread, several adaptors, some destroyed and new ones made while it lives") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  INFO("binary " << (format == log_format::binary));
  auto sim = std::make_shared<simulated_memory_resource>();
  constexpr int instances = 7;  // more than the thread cache's four slots
  std::vector<std::ostringstream> outs(2 * instances);
  std::vector<std::unique_ptr<logging_resource_adaptor>> logs;
  for (int i = 0; i < instances; ++i) {
    logs.push_back(std::make_unique<logging_resource_adaptor>(sim, outs[static_cast<std::size_t>(i)], false, true,
                                                              16, log_order::per_thread, format));
  }
  std::vector<int> calls(2 * instances, 0);
  std::thread worker{[&] {
    for (int round = 0; round < 3; ++round) {
      for (std::size_t i = 0; i < logs.size(); ++i) {
        for (int k = 0; k < 50; ++k) {
          auto const stream = test::fake_stream(0x100 + i);
          logs[i]->deallocate(logs[i]->allocate(32, stream), 32, stream);
          calls[i] += 2;
        }
      }
      if (round == 0) {
        // Destroy every other adaptor and make new ones in their place (and more).
        for (std::size_t i = 0; i < logs.size(); i += 2) {
          logs[i].reset();
          std::size_t const next = instances + i / 2;
          logs[i] = std::make_unique<logging_resource_adaptor>(sim, outs[next], false, true, 16, log_order::per_thread,
                                                               format);
        }
      }
    }
  }};
  worker.join();
  logs.clear();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::string const text = test::csv_of(outs[i].str());
    if (text.empty()) { continue; }
    INFO("log " << i);
    auto const parsed = parse_allocation_log(text, "several");
    CHECK(parsed.events.size() % 100 == 0);
    CHECK(parsed.leaked_allocations.empty());
  }
  CHECK(sim->allocation_count() == 0);
}

TEST_CASE("logging review: auto_flush puts a row logged after the thread's exit hook in the file at once") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  INFO("binary " << (format == log_format::binary));
  auto sim = std::make_shared<simulated_memory_resource>();
  auto const path = std::filesystem::temp_directory_path() /
                    ("mrstack_review_autoflush_" + std::to_string(::getpid()) + ".log");
  {
    logging_resource_adaptor log{sim, path.string(), true, true, logging_resource_adaptor::default_queue_capacity,
                                 log_order::per_thread, format};
    std::thread{[&log] {
      thread_local test::freed_at_thread_exit late;  // constructed before the logger's thread_locals: destroyed after its exit hook
      void* p = log.allocate(48);
      late.log = &log;
      late.block = p;
    }}.join();
    // Both the allocation and the free (written alone, after the exit hook) are in the
    // file: auto_flush promises every row is there when its call returns.
    auto const parsed = parse_allocation_log(test::csv_of(test_support::slurp(path.string())), "autoflush");
    CHECK(parsed.events.size() == 2);
  }
  std::filesystem::remove(path);
}

TEST_CASE("logging review: the adaptor destroyed while the threads that logged to it exit") {
  log_format const format = GENERATE(log_format::csv, log_format::binary);
  INFO("binary " << (format == log_format::binary));
  auto sim = std::make_shared<simulated_memory_resource>();
  std::ostringstream out;
  constexpr int threads = 6;
  {
    auto log = std::make_unique<logging_resource_adaptor>(sim, out, false, true, 16, log_order::per_thread, format);
    std::barrier logged{threads + 1};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        auto const stream = test::fake_stream(0x7000 + static_cast<std::uintptr_t>(t));
        for (int i = 0; i < 100; ++i) { log->deallocate(log->allocate(64, stream), 64, stream); }
        logged.arrive_and_wait();  // then exits, racing the destructor
      });
    }
    logged.arrive_and_wait();
    log.reset();
    for (auto& th : pool) { th.join(); }
  }
  auto const parsed = parse_allocation_log(test::csv_of(out.str()), "destroyed");
  CHECK(parsed.events.size() == 2 * 100 * threads);
}

TEST_CASE("logging review: a binary log is held to the text limit by the CSV it stands for, as a CSV log is") {
  namespace bl = binary_log;
  std::string bytes(bl::file_header_bytes, '\0');
  bl::file_header h{};
  std::memcpy(h.magic, bl::file_magic, sizeof h.magic);
  h.version = bl::format_version;
  h.record_size = bl::record_bytes;
  std::memcpy(bytes.data(), &h, sizeof h);
  std::uint32_t const block[2] = {bl::block_magic, 2};
  bl::record const records[2] = {{std::uint64_t{3} << bl::kind_shift, 1, 0, 0}, {5, 0x1000, 16, 0}};
  bytes.append(reinterpret_cast<char const*>(block), sizeof block);
  bytes.append(reinterpret_cast<char const*>(records), sizeof records);
  std::string const csv = binary_log_to_csv(bytes, "exact.bin");
  // The CSV itself reads at a limit of its own size; so must the binary log it stands for.
  CHECK_NOTHROW(parse_allocation_log(csv, "exact.csv", log_limits{.max_text_bytes = csv.size()}));
  CHECK_NOTHROW(binary_log_to_csv(bytes, "exact.bin", log_limits{.max_text_bytes = csv.size()}));
  CHECK_THROWS_AS(binary_log_to_csv(bytes, "exact.bin", log_limits{.max_text_bytes = csv.size() - 1}), log_error);
}
