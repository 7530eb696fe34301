#pragma once
// Internal to the replay engine: the state of one run and the two schedulers that drive it
// (replay_workers.cpp), shared by replay.cpp, timeline.cpp and shrink.cpp.
#include <mrstack/replay/replay.hpp>
#include <mrstack/stream.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mrstack::replay_detail {

/// The streams one run uses, one per log stream (all the default stream without a device).
class replay_streams {
 public:
  replay_streams(allocation_log const& log, bool real);
  [[nodiscard]] stream_view const* data() const noexcept { return views_.data(); }
  void synchronize() const;

 private:
  std::vector<stream_view> views_;
  std::vector<stream> owned_;
};

/// What became of one allocation during a run (written by the thread that made it, read
/// by the one that frees it: release/acquire).
enum class allocation_state : std::uint8_t { pending, made, freed, refused };

/// Where the workers of a run sleep when they can run nothing, until the word they wait
/// on (`next` or `made`) changes; whoever changes one calls `wake_all`. A mutex and a
/// condition variable with a count of sleepers, not std::atomic::wait: with that, the
/// strict order's two workers of gpu_test_replay were found asleep together, each waiting
/// for the other, in 9 of 98 whole runs on H100 hosts (never in that case alone, nor on
/// an H200 host). Here a sleeper reads the word under the mutex after counting itself,
/// a waker that sees it counted takes the mutex before notifying, and no sleep lasts
/// longer than `max_sleep`: a missed wake-up would cost time, never the run.
class sleep_gate {
 public:
  /// Sleeps while `word` == `seen`, at most `max_sleep`.
  void sleep_while(std::atomic<std::uint32_t> const& word, std::uint32_t seen);
  /// After a sequentially consistent change of a word: wakes every sleeper.
  void wake_all();
  static constexpr std::chrono::milliseconds max_sleep{2};

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::atomic<std::uint32_t> sleepers_{0};
};

/// State shared by the workers of one run.
struct run_state {
  allocation_log const* log = nullptr;
  memory_resource* top = nullptr;
  stream_view const* streams = nullptr;
  bool expect_failures = false;
  double clock_cost_ns = 0;  ///< subtracted from each timed call

  std::vector<void*> pointers;  ///< by allocation index
  std::unique_ptr<std::atomic<allocation_state>[]> states;  ///< by allocation index

  std::mutex failure_mutex;  ///< guards the failure and expectation records (rare)
  std::size_t failures = 0;
  std::uint32_t first_failure_event = ~0U;  ///< the lowest refused event (log order)
  std::string first_failure_message;
  fragmentation_info first_failure_fragmentation;
  std::string error;         ///< the first event that broke the run (guarded by failure_mutex)
  std::uint32_t error_event = ~0U;
  std::size_t expectations_checked = 0;
  std::size_t expectations_served = 0;
  std::uint32_t first_served_line = 0;
  std::size_t next_expectation = 0;  ///< strict order: the next recorded failure to ask

  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> next{0};     ///< strict order: the next event to run
  std::atomic<std::uint32_t> made{0};     ///< per-thread order: allocations settled (wakes waiters; wraps)
  sleep_gate gate;                        ///< where workers wait for `next` or `made` to change
  std::atomic<std::size_t> done{0};       ///< events done (progress; approximate in per-thread order)
  /// Per-thread order: the live bytes the replay reaches (its interleaving is not the
  /// log's, so neither is its peak). Counted outside the timed calls.
  bool count_live = false;
  std::atomic<std::size_t> live_now{0};
  std::atomic<std::size_t> live_peak{0};

  void prepare(allocation_log const& l, memory_resource* t, stream_view const* s);
  /// Runs event `i`, adding the time inside the call to `inside_ns`. Returns false when
  /// the run must stop.
  bool run_event(std::uint32_t i, double& inside_ns);
  /// Strict order: asks every recorded failure that comes before event `i` (`i` ==
  /// events.size(): those at the end). Called by whichever worker runs event `i`.
  void ask_expected_failures(std::uint32_t i);
  [[nodiscard]] std::vector<bool> refused() const;
  /// Records what broke the run at log line `line` (0: no line), keeping the lowest
  /// `event`, and stops it. Allocates nothing (the texts were reserved in `prepare`, and
  /// a long one is cut), so it works when memory has run out; the caller holds
  /// `failure_mutex`.
  void note_error_locked(std::uint32_t event, std::size_t line, char const* context, char const* what) noexcept;
  /// A worker's whole schedule ended by an exception (nothing in it should throw; this
  /// keeps a thread from ending the program): the run stops, and waiting workers wake.
  void worker_failed(char const* what) noexcept;
};

/// What the schedulers report about one run.
struct schedule_outcome {
  double inside_ns = 0;  ///< summed over workers
  unsigned workers = 1;
  std::string workers_note;
};

/// The cost of one steady_clock::now() pair, in ns (the least of many tries).
double measure_clock_cost_ns();

/// The OS threads a run of `log` wants: min(log threads, options.workers or the hardware's).
unsigned wanted_workers(allocation_log const& log, replay_options const& options);

/// Runs every event of `s.log` in `order` on up to `workers` threads (the calling thread
/// is one of them).
schedule_outcome run_events(run_state& s, replay_order order, unsigned workers,
                            std::function<void(unsigned)> const& before_worker_start);

}  // namespace mrstack::replay_detail

namespace mrstack {
class footprint_meter;
class cuda_async_memory_resource;
class virtual_range_resource;
}  // namespace mrstack

namespace mrstack::replay_detail {

/// A stack built for a replay, with whatever measures its footprint.
struct built_stack {
  resource_ptr top;
  footprint_meter* meter = nullptr;                 ///< the meter above the bottom, if any
  cuda_async_memory_resource* driver_pool = nullptr;  ///< a real cuda_async bottom
  virtual_range_resource* range = nullptr;          ///< a vmm-like bottom measuring its own mapping
  std::string measured_by;

  /// Bytes held from the system now.
  [[nodiscard]] std::size_t footprint_now() const;
  /// Restarts the peak from what is held now.
  void start_peak() const;
  [[nodiscard]] std::size_t peak() const;
  [[nodiscard]] std::size_t upstream_calls() const;
};

/// Builds `spec` (a replay spec: see replay_spec_for). Throws spec_error for a bad spec,
/// other exceptions when the stack cannot be built.
built_stack build_replay_stack(stack_spec const& spec, replay_options const& options);

/// Whether a CUDA device is present (then log streams are real streams).
bool device_present();

}  // namespace mrstack::replay_detail
