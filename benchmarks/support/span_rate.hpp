#pragma once
// An aggregate rate for Google Benchmark runs with several threads that counts the whole
// run. Benchmark's items_per_second divides the threads' items by their MEAN time, each
// thread's time stopping before the loop's closing barrier: a thread that finished early
// counts less time than the run took, and the rate reads high (up to 1.2x seen at 16
// threads on an H200 host). Each thread here measures from its first iteration until it
// is past that barrier, which is when the last thread ended; the counter is summed over
// the threads, so it reads (all threads' iterations) / (the run's span).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

namespace mrstack::bench {

class span_rate {
 public:
  /// Call in the first iteration (the start barrier is behind every thread by then).
  void start() noexcept { start_ = std::chrono::steady_clock::now(); }
  /// Call after the loop: sets `name` to this thread's iterations (times `per_iteration`,
  /// for an iteration that makes several) over its span.
  void report(benchmark::State& state, std::string const& name, double per_iteration = 1) const {
    double const span = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    state.counters[name] = static_cast<double>(state.iterations()) * per_iteration / span;  // summed over the threads
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mrstack::bench
