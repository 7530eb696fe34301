#pragma once
// Threads calling a logging adaptor, and the check that a per-thread-order log holds their
// calls: every call a row, each thread's rows in its own order with rising stamps; a
// thread_local that frees after the logger's exit hook. Shared by the per-thread, binary,
// thread-buffer and review tests of the logging adaptor.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/log/binary_log.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mrstack::test {

struct logged_call {
  std::string action;
  std::uintptr_t pointer;
  std::size_t bytes;
};

inline cudaStream_t fake_stream(std::uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

/// A per-thread log's CSV text, whichever format it was written in.
inline std::string csv_of(std::string const& bytes) {
  return is_binary_log(bytes) ? binary_log_to_csv(bytes, "log") : bytes;
}

/// Frees its block (48 bytes) when its thread's thread_locals are destroyed: declared
/// thread_local before the thread's first logged call, it is destroyed after the logger's
/// own exit hook — a call the logger must still log.
struct freed_at_thread_exit {
  logging_resource_adaptor* log = nullptr;
  void* block = nullptr;
  freed_at_thread_exit() = default;
  freed_at_thread_exit(freed_at_thread_exit const&) = delete;
  freed_at_thread_exit& operator=(freed_at_thread_exit const&) = delete;
  ~freed_at_thread_exit() {
    if (log != nullptr) { log->deallocate(block, 48); }
  }
};

inline std::vector<std::string> split_row(std::string const& line) {
  std::vector<std::string> fields;
  std::stringstream ls{line};
  for (std::string f; std::getline(ls, f, ',');) { fields.push_back(f); }
  return fields;
}

/// `threads` threads, `ops` calls each, on streams 0x7000 + thread, over an upstream that
/// should reuse freed addresses (so one thread's free and another's allocation of the same
/// address meet). Returns each thread's calls in its order.
inline std::vector<std::vector<logged_call>> run_logged_threads(logging_resource_adaptor& log, int threads, int ops) {
  std::vector<std::vector<logged_call>> expected(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto& mine = expected[static_cast<std::size_t>(t)];
      cudaStream_t const stream = fake_stream(0x7000 + static_cast<std::uintptr_t>(t));
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) * 104729 + 3};
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < ops; ++i) {
        if (held.empty() || rng() % 100 < 52) {
          std::size_t const bytes = 1 + rng() % 4096;
          void* p = log.allocate(bytes, stream);
          held.emplace_back(p, bytes);
          mine.push_back({"allocate", reinterpret_cast<std::uintptr_t>(p), bytes});
        } else {
          std::size_t const k = rng() % held.size();
          auto [p, bytes] = held[k];
          held[k] = held.back();
          held.pop_back();
          log.deallocate(p, bytes, stream);
          mine.push_back({"free", reinterpret_cast<std::uintptr_t>(p), bytes});
        }
      }
      for (auto [p, bytes] : held) {
        log.deallocate(p, bytes, stream);
        mine.push_back({"free", reinterpret_cast<std::uintptr_t>(p), bytes});
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  return expected;
}

/// Checks that the per-thread-order CSV `text` holds exactly the calls in `expected`: its
/// header, one row per call, each thread's rows in its order (found by its stream, as
/// thread ids are the OS's), stamps rising within a thread.
inline void check_rows_per_thread(std::string const& text, std::vector<std::vector<logged_call>> const& expected) {
  std::istringstream in{text};
  std::string line;
  REQUIRE(std::getline(in, line));
  REQUIRE(line == "Thread,Time,Action,Pointer,Size,Stream,Stamp");
  std::map<std::string, std::vector<std::vector<std::string>>> by_thread;
  while (std::getline(in, line)) {
    auto fields = split_row(line);
    REQUIRE(fields.size() == 7);
    by_thread[fields[0]].push_back(std::move(fields));
  }
  REQUIRE(by_thread.size() == expected.size());
  std::size_t matched = 0;
  for (std::size_t t = 0; t < expected.size(); ++t) {
    auto const& mine = expected[t];
    bool found = false;
    for (auto const& [id, rows] : by_thread) {
      if (std::stoull(rows[0][5], nullptr, 16) != 0x7000 + t) { continue; }
      REQUIRE(rows.size() == mine.size());
      found = true;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        INFO("thread " << id << " row " << i);
        REQUIRE(rows[i][2] == mine[i].action);
        REQUIRE(std::stoull(rows[i][3], nullptr, 16) == mine[i].pointer);
        REQUIRE(std::stoull(rows[i][4]) == mine[i].bytes);
        REQUIRE(std::stoull(rows[i][5], nullptr, 16) == 0x7000 + t);
        if (i > 0) { REQUIRE(std::stoull(rows[i][6]) >= std::stoull(rows[i - 1][6])); }
      }
    }
    CHECK(found);
    matched += found ? 1 : 0;
  }
  CHECK(matched == expected.size());
}

}  // namespace mrstack::test
