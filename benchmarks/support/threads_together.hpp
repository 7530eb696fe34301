#pragma once
// Starts N benchmark threads together and times them until the last one ends, so a
// multi-threaded rate counts no thread creation and no straggling start.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace mrstack::bench {

/// Runs `prepare(t)` on each of `threads` new threads, then — once all are ready — `body(t)`
/// on all at once. Returns the seconds from the start to the last thread's end, or -1 with
/// `error` set to the first exception's message, from a preparation or a body (the other
/// threads still finish; a thread whose preparation threw runs no body). No threads: -1.
template <typename Prepare, typename Body>
double run_threads_together(std::size_t threads, Prepare prepare, Body body, std::string& error) {
  if (threads == 0) {
    error = "no threads to run";
    return -1;
  }
  using state_type = decltype(prepare(std::size_t{0}));
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  auto const fail = [&](std::exception const& e) {
    std::lock_guard lock{error_mutex};
    if (!failed.exchange(true)) { error = e.what(); }
  };
  std::vector<std::thread> workers;
  std::vector<std::chrono::steady_clock::time_point> ends(threads);
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // An exception leaving a thread ends the program: a preparation that throws (out of
      // memory for its slots) is reported like a failing call instead.
      std::optional<state_type> state;
      try {
        state.emplace(prepare(t));
      } catch (std::exception const& e) {
        fail(e);
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {}
      if (state) {
        try {
          body(t, *state);
        } catch (std::exception const& e) {
          fail(e);
        }
      }
      ends[t] = std::chrono::steady_clock::now();
    });
  }
  while (ready.load() != threads) {}
  auto const start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& w : workers) { w.join(); }
  if (failed) { return -1; }
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start).count();
}

}  // namespace mrstack::bench
