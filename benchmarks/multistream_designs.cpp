// multistream_designs: two designs for a pool shared by many streams, measured on
// bench_multistream's steps (support/multistream_steps.hpp) without building them into a
// resource. Both run on fake stream handles over simulated memory, so anywhere; the
// contention they are about needs a many-core host (the 2-core CPU VM cannot show it).
//
// partitioned/SPEC/streams:S — one stack per stream, sharing nothing: what a pool split
//   into per-stream partitions would hold, with no call touching another stream's data.
//   One thread takes the streams' steps in turn. Reports the peak of the stacks' mapped
//   memory together (peak_over_cap, ÷ 8 GiB) and the map and unmap calls of their
//   virtual-memory layers per allocator call (maps_per_call, unmaps_per_call): over a real
//   device each is a driver call (cuMemMap / cuMemUnmap) of microseconds. Stacks over
//   simulated_vmm, with a release threshold or without.
// combined/SPEC/streams:S — S threads share one stack, each call handed to a flat
//   combiner: the thread that holds the combiner's lock runs every waiting thread's call
//   in turn, so the stack is used by one thread at a time and in batches (calls_per_batch).
//   Reports calls_per_s. Set beside bench_multistream's multistream/ (each thread calls
//   the stack itself) and multistream_one_thread/ (one thread makes every call): if the
//   shared pool's cost under threads were its lock, combining would run at the
//   one-thread rate; if it is the pool's data moving between cores, it cannot.
#include <benchmark/benchmark.h>

#include <multistream_steps.hpp>
#include <threads_together.hpp>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;
using bench::step;

namespace {

struct stream_steps {
  std::vector<std::vector<step>> steps;
  std::vector<std::size_t> slots;
  std::size_t calls = 0;
};

stream_steps make_all_steps(std::size_t streams) {
  stream_steps all;
  all.steps.resize(streams);
  all.slots.resize(streams);
  for (std::size_t t = 0; t < streams; ++t) {
    all.steps[t] = bench::make_steps(bench::live_cap / streams, 7000 + t, all.slots[t]);
    all.calls += all.steps[t].size();
  }
  return all;
}

stream_view fake_stream(std::size_t t) { return stream_view{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x10000} * (t + 1))}; }

void take(memory_resource& mr, step const& st, void*& slot, stream_view s) {
  if (st.allocate) {
    slot = mr.allocate(st.bytes, s);
  } else {
    mr.deallocate(slot, st.bytes, s);
  }
}

void partitioned(benchmark::State& state, std::string const& spec) {
  auto const streams = static_cast<std::size_t>(state.range(0));
  stream_steps const all = make_all_steps(streams);
  std::size_t peak = 0;
  std::size_t maps = 0;
  std::size_t unmaps = 0;
  for (auto _ : state) {
    std::vector<resource_ptr> stacks;
    std::vector<virtual_range_resource*> ranges;
    for (std::size_t t = 0; t < streams; ++t) {
      stacks.push_back(make_stack(spec));
      ranges.push_back(find_virtual_range_resource(*stacks.back()));
      if (ranges.back() == nullptr) {
        state.SkipWithError("partitioned needs a stack over simulated_vmm (its mapped memory is the footprint)");
        return;
      }
    }
    std::vector<std::vector<void*>> ptrs(streams);
    for (std::size_t t = 0; t < streams; ++t) { ptrs[t].resize(all.slots[t]); }
    std::vector<std::size_t> next(streams, 0);
    for (bool any = true; any;) {
      any = false;
      for (std::size_t t = 0; t < streams; ++t) {
        if (next[t] == all.steps[t].size()) { continue; }
        any = true;
        step const& st = all.steps[t][next[t]++];
        take(*stacks[t], st, ptrs[t][st.slot], fake_stream(t));
        std::size_t mapped = 0;
        for (auto const* r : ranges) { mapped += r->mapped_bytes(); }
        peak = std::max(peak, mapped);
      }
    }
    for (auto const* r : ranges) {
      maps += r->map_calls();
      unmaps += r->unmap_calls();
    }
  }
  double const calls = static_cast<double>(all.calls) * static_cast<double>(state.iterations());
  state.counters["peak_over_cap"] = static_cast<double>(peak) / bench::live_cap;
  state.counters["maps_per_call"] = static_cast<double>(maps) / calls;
  state.counters["unmaps_per_call"] = static_cast<double>(unmaps) / calls;
}

/// Flat combining: a thread publishes its call in its own slot and either finds it done
/// or takes the lock and runs every published call, its own included.
class combiner {
 public:
  combiner(memory_resource& mr, std::size_t threads) : mr_{mr}, threads_{threads} {}

  /// Runs `st` on `s` for thread `t` (one of the constructor's `threads`).
  void call(std::size_t t, step const& st, void*& ptr, stream_view s) {
    slot& mine = slots_[t];
    mine.work = &st;
    mine.ptr = &ptr;
    mine.stream = s;
    mine.state.store(pending, std::memory_order_release);
    while (mine.state.load(std::memory_order_acquire) != done) {
      if (mutex_.try_lock()) {
        run_published();
        mutex_.unlock();
      } else {
        std::this_thread::yield();  // the holder runs this call too, or soon releases the lock
      }
    }
    mine.state.store(idle, std::memory_order_relaxed);
    if (mine.error) { std::rethrow_exception(std::exchange(mine.error, nullptr)); }
  }
  [[nodiscard]] double calls_per_batch() const noexcept {
    return batches_ == 0 ? 0.0 : static_cast<double>(calls_) / static_cast<double>(batches_);
  }

 private:
  static constexpr int idle = 0, pending = 1, done = 2;
  struct alignas(64) slot {
    std::atomic<int> state{idle};
    step const* work = nullptr;
    void** ptr = nullptr;
    stream_view stream;
    std::exception_ptr error;
  };

  void run_published() {
    ++batches_;
    for (bool any = true; any;) {  // until a pass finds nothing more
      any = false;
      for (std::size_t i = 0; i < threads_; ++i) {
        slot& sl = slots_[i];
        if (sl.state.load(std::memory_order_acquire) != pending) { continue; }
        try {
          take(mr_, *sl.work, *sl.ptr, sl.stream);
        } catch (...) {
          sl.error = std::current_exception();
        }
        ++calls_;
        any = true;
        sl.state.store(done, std::memory_order_release);
      }
    }
  }

  memory_resource& mr_;
  std::size_t threads_;
  detail::lean_mutex mutex_;
  std::array<slot, 64> slots_{};
  std::size_t batches_ = 0;  // under mutex_
  std::size_t calls_ = 0;
};

void combined(benchmark::State& state, std::string const& spec) {
  auto const threads = static_cast<std::size_t>(state.range(0));
  stream_steps const all = make_all_steps(threads);
  resource_ptr const mr = make_stack(spec);
  double per_batch = 0;
  auto run_once = [&](combiner& c, std::string& error) {
    return bench::run_threads_together(
        threads, [&](std::size_t t) { return std::vector<void*>(all.slots[t]); },
        [&](std::size_t t, std::vector<void*>& ptrs) {
          for (step const& st : all.steps[t]) { c.call(t, st, ptrs[st.slot], fake_stream(t)); }
        },
        error);
  };
  {  // warm-up, untimed: the pool's growth happens here, as in bench_multistream's rows
    combiner c{*mr, threads};
    std::string error;
    if (run_once(c, error) < 0) {
      state.SkipWithError(("a call failed: " + error).c_str());
      return;
    }
  }
  for (auto _ : state) {
    combiner c{*mr, threads};
    std::string error;
    double const seconds = run_once(c, error);
    if (seconds < 0) {
      state.SkipWithError(("a call failed: " + error).c_str());
      return;
    }
    state.SetIterationTime(seconds);
    per_batch = c.calls_per_batch();
  }
  state.counters["calls_per_s"] =
      benchmark::Counter(static_cast<double>(all.calls), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["calls_per_batch"] = per_batch;
}

}  // namespace

int main(int argc, char** argv) {
  for (char const* spec : {"pool > simulated_vmm(capacity=80GiB)",
                           "pool(release_threshold=64MiB) > simulated_vmm(capacity=80GiB)",
                           "pool(release_threshold=256MiB) > simulated_vmm(capacity=80GiB)"}) {
    auto* b = benchmark::RegisterBenchmark((std::string{"partitioned/"} + spec).c_str(),
                                           [s = std::string{spec}](benchmark::State& st) { partitioned(st, s); });
    b->ArgName("streams")->Iterations(1)->Unit(benchmark::kMillisecond);
    for (std::int64_t n : {1, 2, 4, 8}) { b->Arg(n); }
  }
  for (char const* spec : {"pool > simulated_vmm(capacity=80GiB)"}) {
    auto* b = benchmark::RegisterBenchmark((std::string{"combined/"} + spec).c_str(),
                                           [s = std::string{spec}](benchmark::State& st) { combined(st, s); });
    b->ArgName("streams")->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
    for (std::int64_t n : {1, 2, 4, 8}) { b->Arg(n); }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
