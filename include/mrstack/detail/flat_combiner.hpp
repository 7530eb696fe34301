#pragma once
/// `flat_combiner`: runs short critical sections of many threads on one thread at a time,
/// in batches. CUDA-free.
///
/// Why: under a plain lock, each thread runs its own section, so the data the section
/// touches moves to that thread's core first. The pool's global blocks with eight streams,
/// each on its own thread, cost ~1.3 µs a call that way on a 16-core H200 host, though one
/// thread making the same calls in turn needs ~0.2 µs (docs/benchmarks.md, machine O). Here
/// a thread publishes its section in a slot of its own and the thread that holds the lock
/// runs every published section in turn while the data stays in its cache: the same pool
/// behind a combiner ran 3× as many calls at S = 8.
///
/// Contract:
/// - `run(mutex, section, context, requester)`: section(context) runs under `mutex` once,
///   on this thread or on whichever thread holds the lock through a combiner, before
///   `run` returns; that thread runs it inside `acting_for{requester}` (the caller's
///   `acting_thread_key()`), so code asking which thread calls sees the requester.
///   `section` must not throw (carry errors back through `context`) and must not take
///   `mutex`.
/// - A thread that waited long (the lock held by a slow path) takes its section back
///   when no combiner has started it and runs it itself after a blocking `lock()`, so
///   waiting never spins for more than ~`patience` rounds.
/// - Slots are indexed by `this_thread_shard()` (distinct among up to 64 live threads).
///   A slot another thread holds (past 64 threads) makes `run` lock and run directly.
/// - The `Mutex` is any Lockable with try_lock (lean_mutex).
#include <array>
#include <atomic>
#include <cstdint>
#include <thread>

#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

class flat_combiner {
 public:
  using section_fn = void (*)(void* context) noexcept;
  static constexpr unsigned patience = 4096;  ///< rounds of waiting before taking a section back

  template <typename Mutex>
  void run(Mutex& mutex, section_fn section, void* context) {
    std::size_t const index = this_thread_shard();
    slot& mine = slots_[index];
    int expected = idle;
    if (!mine.state.compare_exchange_strong(expected, claimed, std::memory_order_acquire)) {
      run_alone(mutex, section, context);  // a thread past the 64th shares this slot
      return;
    }
    mine.section = section;
    mine.context = context;
    mine.requester = acting_thread_key();
    note_slot_in_use(index);
    mine.state.store(published, std::memory_order_release);
    for (unsigned round = 0;; ++round) {
      if (mine.state.load(std::memory_order_acquire) == done) { break; }
      if (mutex.try_lock()) {
        run_published();
        mutex.unlock();
        continue;  // ours was among them, unless another combiner took it first
      }
      if (round >= patience) {
        int published_state = published;
        if (mine.state.compare_exchange_strong(published_state, claimed, std::memory_order_acquire)) {
          mine.state.store(idle, std::memory_order_release);
          run_alone(mutex, section, context);
          return;
        }
        // A combiner runs it now: wait for it.
      }
      std::this_thread::yield();
    }
    mine.state.store(idle, std::memory_order_release);
  }

  /// Sections published and not yet started (for tests and diagnostics).
  [[nodiscard]] std::size_t waiting() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < slots_in_use_.load(std::memory_order_acquire); ++i) {
      n += slots_[i].state.load(std::memory_order_acquire) == published ? 1 : 0;
    }
    return n;
  }
  /// Sections run by a combiner for another thread so far (statistics; approximate).
  [[nodiscard]] std::uint64_t combined() const noexcept { return combined_.load(std::memory_order_relaxed); }

 private:
  static constexpr int idle = 0, claimed = 1, published = 2, running = 3, done = 4;
  struct alignas(64) slot {
    std::atomic<int> state{idle};
    section_fn section = nullptr;
    void* context = nullptr;
    std::uintptr_t requester = 0;
  };

  template <typename Mutex>
  static void run_alone(Mutex& mutex, section_fn section, void* context) {
    std::lock_guard lock{mutex};
    section(context);
  }

  void note_slot_in_use(std::size_t index) noexcept {
    std::size_t seen = slots_in_use_.load(std::memory_order_relaxed);
    while (seen <= index && !slots_in_use_.compare_exchange_weak(seen, index + 1, std::memory_order_relaxed)) {}
  }

  /// Under the lock: every published section, until a pass finds none.
  void run_published() noexcept {
    std::uintptr_t const me = this_thread_key();
    std::uint64_t for_others = 0;
    for (bool any = true; any;) {
      any = false;
      std::size_t const n = slots_in_use_.load(std::memory_order_acquire);
      for (std::size_t i = 0; i < n; ++i) {
        slot& s = slots_[i];
        int expected = published;
        if (s.state.load(std::memory_order_relaxed) != published ||
            !s.state.compare_exchange_strong(expected, running, std::memory_order_acquire)) {
          continue;
        }
        {
          acting_for as{s.requester};
          s.section(s.context);
        }
        if (s.requester != me) { ++for_others; }
        s.state.store(done, std::memory_order_release);
        any = true;
      }
    }
    if (for_others != 0) { combined_.fetch_add(for_others, std::memory_order_relaxed); }
  }

  std::array<slot, counter_shards> slots_{};
  std::atomic<std::size_t> slots_in_use_{0};  // 1 + the highest slot index published so far
  std::atomic<std::uint64_t> combined_{0};
};

}  // namespace mrstack::detail
