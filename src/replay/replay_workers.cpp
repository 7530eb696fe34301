// The replay's schedulers: strict log order or per-thread order, with the log's threads
// multiplexed onto a bounded number of OS threads that never spin without bound.
#include "replay_run.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <thread>

#include <mrstack/detail/cpu_pause.hpp>

namespace mrstack::replay_detail {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr char const* not_std_exception = "an exception that is not a std::exception";
constexpr char const* stack_threw_not_std = "the stack threw an exception that is not a std::exception";

/// A worker that cannot run anything: spins a little (the event it waits for is usually
/// quick), yields four times (what std::atomic::wait did before it slept, and on a
/// machine with fewer cores than workers what lets the other worker run the event), then
/// sleeps on the run's gate until `word` differs from `seen`. No longer yielding: on a
/// loaded machine a yield can hand the core to another process for a whole time slice,
/// while a wake-up is scheduled at once.
class idle_waiter {
 public:
  void wait(sleep_gate& gate, std::atomic<std::uint32_t> const& word, std::uint32_t seen) {
    if (rounds_ < 128) {
      detail::cpu_pause();
      ++rounds_;
    } else if (rounds_ < 128 + 4) {
      std::this_thread::yield();
      ++rounds_;
    } else {
      gate.sleep_while(word, seen);
    }
  }
  void reset() noexcept { rounds_ = 0; }

 private:
  unsigned rounds_ = 0;
};

double ns_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

/// The note for a worker thread `w` (0-based) of `count` whose start threw `refusal`.
std::string refusal_note(std::exception_ptr const& refusal, unsigned w, unsigned count) {
  std::string why = not_std_exception;
  try {
    std::rethrow_exception(refusal);
  } catch (std::exception const& e) {
    why = e.what();
  } catch (...) {
  }
  return "the system refused worker thread " + std::to_string(w + 1) + " of " + std::to_string(count) + " (" + why +
         "): replayed on " + std::to_string(w);
}

/// Starts `count - 1` threads running `body(w)` for w = 1..count-1, then runs `body(0)` on
/// the calling thread, and joins. The workers are told how many of them there are only
/// once all are started, so a thread that cannot start just means fewer workers: the
/// system refusing it (std::system_error), or anything else its start throws (no memory
/// for its state), which must not leave the started ones waiting while the exception
/// unwinds past their joinable std::thread objects (that ends the program). `body` must
/// not throw, for the same reason (run_events' body catches everything).
schedule_outcome run_on_workers(unsigned count, std::function<void(unsigned)> const& before_worker_start,
                                std::function<void(unsigned w, unsigned of, double& inside_ns)> const& body) {
  schedule_outcome outcome;
  std::mutex gate_mutex;
  std::condition_variable gate;
  unsigned started_count = 0;  // 0 until every thread that could start has started
  std::vector<double> inside(count, 0.0);
  std::vector<std::thread> threads;
  threads.reserve(count);  // before any thread starts: a failure here leaves none waiting
  auto worker = [&](unsigned w) {
    unsigned of = 0;
    {
      std::unique_lock lock{gate_mutex};
      gate.wait(lock, [&] { return started_count != 0; });
      of = started_count;
    }
    if (w < of) { body(w, of, inside[w]); }
  };
  // Until every started thread is joined nothing may throw past them (a joinable
  // std::thread destroyed ends the program), so a refusal is only noted here — the
  // note's text needs memory, which may be what ran out — and written after the joins.
  unsigned refused_at = 0;
  std::exception_ptr refusal;
  for (unsigned w = 1; w < count; ++w) {
    try {
      if (before_worker_start) { before_worker_start(w); }
      threads.emplace_back(worker, w);
    } catch (...) {
      refused_at = w;
      refusal = std::current_exception();
      break;
    }
  }
  outcome.workers = static_cast<unsigned>(threads.size()) + 1;
  {
    std::lock_guard lock{gate_mutex};
    started_count = outcome.workers;
  }
  gate.notify_all();
  body(0, outcome.workers, inside[0]);
  for (auto& t : threads) { t.join(); }
  for (double const ns : inside) { outcome.inside_ns += ns; }
  if (refusal) { outcome.workers_note = refusal_note(refusal, refused_at, count); }
  return outcome;
}

/// Strict order: worker w runs the events of the log threads t with t mod W == w, each
/// when the global sequence number reaches it.
void strict_worker(run_state& s, unsigned w, unsigned of, double& inside_ns) {
  auto const& threads = s.log->event_threads;
  auto const n = static_cast<std::uint32_t>(s.log->events.size());
  idle_waiter idle;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (threads[i] % of != w) { continue; }
    for (std::uint32_t seen = s.next.load(std::memory_order_acquire); seen != i;
         seen = s.next.load(std::memory_order_acquire)) {
      if (s.stop.load(std::memory_order_relaxed)) { return; }
      idle.wait(s.gate, s.next, seen);
    }
    idle.reset();
    if (s.expect_failures) { s.ask_expected_failures(i); }
    if (s.stop.load(std::memory_order_relaxed) || !s.run_event(i, inside_ns)) {
      s.stop.store(true, std::memory_order_relaxed);
    }
    s.next.store(i + 1, std::memory_order_seq_cst);  // before the gate reads its sleepers
    s.gate.wake_all();
    if (s.stop.load(std::memory_order_relaxed)) { return; }
  }
}

/// Per-thread order's wake-ups. A log thread whose next event is a free of an allocation
/// not made yet is parked: it leaves its worker's turns until the allocation is settled
/// (made or refused), and whoever settles it hands the thread back through its worker's
/// inbox. So a worker's turn costs what it runs, not what it has parked: scanning every
/// parked thread on every turn made a chain of N threads, each freeing the next one's
/// allocation, cost N^2 checks (80,000 thread ids: 6.4 s on one worker, strict 35 ms).
class per_thread_wakeups {
 public:
  static constexpr std::uint32_t none = ~0U;

  per_thread_wakeups(allocation_log const& log, unsigned workers)
      : parked_on_{std::make_unique<std::atomic<std::uint32_t>[]>(log.events_by_thread.size())},
        inboxes_{std::make_unique<inbox[]>(workers)},
        freed_by_(log.allocation_count, none) {
    for (std::size_t t = 0; t < log.events_by_thread.size(); ++t) { parked_on_[t].store(none, std::memory_order_relaxed); }
    for (std::uint32_t i = 0; i < log.events.size(); ++i) {
      if (log.events[i].action == log_action::free) { freed_by_[log.events[i].allocation] = log.event_threads[i]; }
    }
    // Room for every thread a worker may own (a thread is in at most one inbox, once), so
    // that handing one back does not allocate. When fewer workers start than asked, each
    // owns more: `make_room` grows its inbox as it starts, and a hand-back that comes
    // before may allocate (a failure then stops the run with an error, as any).
    for (unsigned w = 0; w < workers; ++w) { make_room(w, workers, log.events_by_thread.size()); }
  }

  /// Room in worker w's inbox (of `of` workers) for every one of `threads` log threads it owns.
  void make_room(unsigned w, unsigned of, std::size_t threads) {
    inbox& box = inboxes_[w];
    std::lock_guard lock{box.mutex};
    box.threads.reserve((threads + of - 1 - w) / of);
  }

  /// Parks thread `t` on `allocation`. False when the allocation was settled meanwhile
  /// and the thread stays with its caller; true when it is parked (it comes back through
  /// the inbox, perhaps at once).
  bool park(std::uint32_t t, std::uint32_t allocation, run_state const& s) {
    parked_on_[t].store(allocation, std::memory_order_relaxed);
    // Against settled(): either its load sees the thread parked, or this load sees the
    // allocation settled (both fences are sequentially consistent).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (s.states[allocation].load(std::memory_order_relaxed) == allocation_state::pending) { return true; }
    std::uint32_t expected = allocation;
    // Lost: settled() took the thread and hands it back.
    return !parked_on_[t].compare_exchange_strong(expected, none, std::memory_order_acquire);
  }

  /// After `allocation` is settled (made or refused): the thread parked on it, if any, goes
  /// back to its worker (of `of`), which is woken.
  void settled(std::uint32_t allocation, unsigned of, run_state& s) {
    std::uint32_t const t = freed_by_[allocation];
    if (t == none) { return; }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::uint32_t expected = allocation;
    if (parked_on_[t].load(std::memory_order_relaxed) != allocation ||
        !parked_on_[t].compare_exchange_strong(expected, none, std::memory_order_acq_rel)) {
      return;
    }
    inbox& box = inboxes_[t % of];
    {
      std::lock_guard lock{box.mutex};
      box.threads.push_back(t);
    }
    s.made.fetch_add(1, std::memory_order_seq_cst);  // before the gate reads its sleepers
    s.gate.wake_all();
  }

  /// Moves the threads handed back to worker `w` into `ready`.
  void take(unsigned w, std::vector<std::uint32_t>& ready) {
    inbox& box = inboxes_[w];
    std::lock_guard lock{box.mutex};
    ready.insert(ready.end(), box.threads.begin(), box.threads.end());
    box.threads.clear();
  }

 private:
  struct inbox {
    std::mutex mutex;
    std::vector<std::uint32_t> threads;
  };
  std::unique_ptr<std::atomic<std::uint32_t>[]> parked_on_;  ///< by log thread: the allocation it waits for
  std::unique_ptr<inbox[]> inboxes_;                        ///< by worker
  std::vector<std::uint32_t> freed_by_;                     ///< by allocation: the log thread that frees it
};

enum class turn { more, parked, finished, stopped };

/// One turn of log thread `t`: up to a batch of its events, until a free whose allocation
/// is not settled parks it.
turn run_turn(run_state& s, per_thread_wakeups& wakeups, std::uint32_t t, std::size_t& at, unsigned of,
              double& inside_ns) {
  constexpr std::size_t batch = 64;  // events of one log thread before the next gets its turn
  auto const& events = s.log->events_by_thread[t];
  for (std::size_t ran = 0; ran < batch && at < events.size(); ++ran) {
    std::uint32_t const i = events[at];
    log_event const& e = s.log->events[i];
    if (e.action == log_action::free &&
        s.states[e.allocation].load(std::memory_order_acquire) == allocation_state::pending &&
        wakeups.park(t, e.allocation, s)) {
      return turn::parked;
    }
    if (!s.run_event(i, inside_ns)) {
      s.stop.store(true, std::memory_order_relaxed);
      s.made.fetch_add(1, std::memory_order_seq_cst);
      s.gate.wake_all();
      return turn::stopped;
    }
    ++at;
    if (e.action == log_action::allocate) { wakeups.settled(e.allocation, of, s); }
  }
  return at == events.size() ? turn::finished : turn::more;
}

/// Per-thread order: worker w runs its log threads (t mod W == w) round-robin, each for up
/// to a batch of events, until each is parked on a free whose allocation is not made yet.
void per_thread_worker(run_state& s, per_thread_wakeups& wakeups, unsigned w, unsigned of, double& inside_ns) {
  auto const& by_thread = s.log->events_by_thread;
  wakeups.make_room(w, of, by_thread.size());
  std::vector<std::size_t> at((by_thread.size() + of - 1 - w) / of, 0);  // by t / of: the next of its events
  std::vector<std::uint32_t> ready;
  std::vector<std::uint32_t> next_round;
  ready.reserve(at.size() * 2);  // each thread is in one list at a time: no allocation once running
  next_round.reserve(at.size());
  for (std::size_t t = w; t < by_thread.size(); t += of) {
    if (!by_thread[t].empty()) { ready.push_back(static_cast<std::uint32_t>(t)); }
  }
  std::size_t unfinished = ready.size();
  idle_waiter idle;
  while (unfinished > 0) {
    std::uint32_t const seen = s.made.load(std::memory_order_acquire);  // before the inbox: no lost wake-up
    wakeups.take(w, ready);
    if (ready.empty()) {
      if (s.stop.load(std::memory_order_relaxed)) { return; }
      idle.wait(s.gate, s.made, seen);
      continue;
    }
    idle.reset();
    next_round.clear();
    for (std::uint32_t const t : ready) {
      switch (run_turn(s, wakeups, t, at[t / of], of, inside_ns)) {
        case turn::more: next_round.push_back(t); break;
        case turn::parked: break;
        case turn::finished: --unfinished; break;
        case turn::stopped: return;
      }
    }
    ready.swap(next_round);
    if (s.stop.load(std::memory_order_relaxed)) { return; }
  }
}

}  // namespace

void sleep_gate::sleep_while(std::atomic<std::uint32_t> const& word, std::uint32_t seen) {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);  // before the word is read: see wake_all
  {
    std::unique_lock lock{mutex_};
    if (word.load(std::memory_order_seq_cst) == seen) { changed_.wait_for(lock, max_sleep); }
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void sleep_gate::wake_all() {
  // The caller changed its word with a sequentially consistent operation: either this
  // load sees a sleeper counted, or that sleeper's read of the word sees the change.
  if (sleepers_.load(std::memory_order_seq_cst) == 0) { return; }
  { std::lock_guard lock{mutex_}; }  // a sleeper between its check and its wait is waiting now
  changed_.notify_all();
}

replay_streams::replay_streams(allocation_log const& log, bool real) {
  views_.resize(log.streams.size());
  for (std::size_t i = 0; i < log.streams.size(); ++i) {
    std::uint64_t const handle = log.streams[i];
    if (!real || handle == 0) {
      views_[i] = stream_view{};
    } else if (handle == 1) {
      views_[i] = stream_view::legacy();
    } else if (handle == 2) {
      views_[i] = stream_view::per_thread();
    } else {
      owned_.emplace_back();
      views_[i] = owned_.back().view();
    }
  }
}

void replay_streams::synchronize() const {
  for (auto const& s : owned_) { s.synchronize(); }
}

namespace {

constexpr std::size_t error_text_room = 512;

/// Appends `text` to `out` as far as its capacity allows (never allocates).
void append_within(std::string& out, std::string_view text) noexcept {
  out.append(text.substr(0, std::min(text.size(), out.capacity() - out.size())));
}

}  // namespace

void run_state::prepare(allocation_log const& l, memory_resource* t, stream_view const* s) {
  // Room for the texts a failure writes, so that writing them needs no memory then.
  error.reserve(error_text_room);
  first_failure_message.reserve(error_text_room);
  log = &l;
  top = t;
  streams = s;
  pointers.assign(l.allocation_count, nullptr);
  states = std::make_unique<std::atomic<allocation_state>[]>(l.allocation_count);
  for (std::size_t a = 0; a < l.allocation_count; ++a) { states[a].store(allocation_state::pending, std::memory_order_relaxed); }
}

void run_state::note_error_locked(std::uint32_t event, std::size_t line, char const* context,
                                  char const* what) noexcept {
  stop.store(true, std::memory_order_relaxed);
  if (event >= error_event && !error.empty()) { return; }
  error_event = event;
  error.clear();
  if (line != 0) {
    char digits[24];
    auto const end = std::to_chars(digits, digits + sizeof digits, line).ptr;
    append_within(error, "line ");
    append_within(error, std::string_view(digits, static_cast<std::size_t>(end - digits)));
  }
  append_within(error, context);
  append_within(error, ": ");
  append_within(error, what);
}

void run_state::worker_failed(char const* what) noexcept {
  try {
    std::lock_guard lock{failure_mutex};
    note_error_locked(~0U - 1, 0, "a replay worker stopped", what);
  } catch (...) {
    stop.store(true, std::memory_order_relaxed);  // the lock failed: the run stops without a text
  }
  made.fetch_add(1, std::memory_order_seq_cst);  // per-thread waiters look again
  gate.wake_all();
}

bool run_state::run_event(std::uint32_t i, double& inside_ns) {
  log_event const e = log->events[i];
  try {
    if (e.action == log_action::allocate) {
      auto const t0 = clock_type::now();
      void* const p = top->allocate(e.bytes, streams[e.stream]);
      inside_ns += std::max(0.0, ns_between(t0, clock_type::now()) - clock_cost_ns);
      pointers[e.allocation] = p;
      if (count_live) {  // before `made`: the free that subtracts cannot come first
        std::size_t const now = live_now.fetch_add(e.bytes, std::memory_order_relaxed) + e.bytes;
        std::size_t peak = live_peak.load(std::memory_order_relaxed);
        while (now > peak && !live_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
      }
      states[e.allocation].store(allocation_state::made, std::memory_order_release);
    } else if (states[e.allocation].load(std::memory_order_acquire) == allocation_state::made) {
      auto const t0 = clock_type::now();
      top->deallocate(pointers[e.allocation], e.bytes, streams[e.stream]);
      inside_ns += std::max(0.0, ns_between(t0, clock_type::now()) - clock_cost_ns);
      pointers[e.allocation] = nullptr;
      states[e.allocation].store(allocation_state::freed, std::memory_order_relaxed);
      if (count_live) { live_now.fetch_sub(e.bytes, std::memory_order_relaxed); }
    }  // else refused: its free is skipped
  } catch (std::bad_alloc const& refusal) {
    std::lock_guard lock{failure_mutex};
    if (e.action != log_action::allocate) {
      // A free cannot be refused for want of memory: the stack is broken, and the block
      // stays live (`made`) for the leftovers' frees.
      note_error_locked(i, log->event_lines[i], "", refusal.what());
      return false;
    }
    states[e.allocation].store(allocation_state::refused, std::memory_order_release);
    ++failures;
    if (i < first_failure_event) {
      first_failure_event = i;
      first_failure_message.clear();
      append_within(first_failure_message, refusal.what());
      try {
        first_failure_fragmentation = top->fragmentation();
      } catch (...) {  // a broken introspection must not hide the refusal
        first_failure_fragmentation = {};
      }
    }
  } catch (std::exception const& broken) {
    std::lock_guard lock{failure_mutex};
    note_error_locked(i, log->event_lines[i], "", broken.what());
    return false;
  } catch (...) {
    std::lock_guard lock{failure_mutex};
    note_error_locked(i, log->event_lines[i], "", stack_threw_not_std);
    return false;
  }
  if ((i & 1023U) == 0) { done.store(i, std::memory_order_relaxed); }
  return true;
}

void run_state::ask_expected_failures(std::uint32_t i) {
  auto const& recorded = log->recorded_failures;
  for (; next_expectation < recorded.size() && recorded[next_expectation].before_event <= i; ++next_expectation) {
    recorded_failure const& f = recorded[next_expectation];
    ++expectations_checked;
    void* p = nullptr;
    std::exception_ptr broken;
    try {
      p = top->allocate(f.bytes, streams[f.stream]);
    } catch (std::bad_alloc const&) {
      continue;  // refused, as the log says the program was
    } catch (...) {
      broken = std::current_exception();
    }
    if (!broken) {
      ++expectations_served;
      if (first_served_line == 0) { first_served_line = f.line; }
      try {
        top->deallocate(p, f.bytes, streams[f.stream]);
      } catch (...) {
        broken = std::current_exception();  // a free that throws, std::bad_alloc included, is broken
      }
    }
    if (broken) {
      std::lock_guard lock{failure_mutex};
      try {
        std::rethrow_exception(broken);
      } catch (std::exception const& e) {
        note_error_locked(i, f.line, " (a recorded failure)", e.what());
      } catch (...) {
        note_error_locked(i, f.line, " (a recorded failure)", stack_threw_not_std);
      }
      return;
    }
  }
}

std::vector<bool> run_state::refused() const {
  std::vector<bool> out(log->allocation_count, false);
  for (std::size_t a = 0; a < out.size(); ++a) {
    out[a] = states[a].load(std::memory_order_relaxed) == allocation_state::refused;
  }
  return out;
}

double measure_clock_cost_ns() {
  double best = 1e9;
  for (int k = 0; k < 200; ++k) {
    auto const a = clock_type::now();
    auto const b = clock_type::now();
    best = std::min(best, ns_between(a, b));
  }
  return best;
}

unsigned wanted_workers(allocation_log const& log, replay_options const& options) {
  unsigned cap = options.workers != 0 ? options.workers : std::max(1U, std::thread::hardware_concurrency());
  std::size_t const threads = std::max<std::size_t>(1, log.events_by_thread.size());
  return static_cast<unsigned>(std::min<std::size_t>(cap, threads));
}

schedule_outcome run_events(run_state& s, replay_order order, unsigned workers,
                            std::function<void(unsigned)> const& before_worker_start) {
  if (order == replay_order::strict && workers <= 1) {
    // One thread, or everything on one worker: no hand-over at all.
    schedule_outcome outcome;
    auto const n = static_cast<std::uint32_t>(s.log->events.size());
    for (std::uint32_t i = 0; i < n; ++i) {
      if (s.expect_failures) { s.ask_expected_failures(i); }
      if (s.stop.load(std::memory_order_relaxed) || !s.run_event(i, outcome.inside_ns)) { break; }
    }
    s.next.store(n, std::memory_order_relaxed);
    if (s.expect_failures && s.error.empty()) { s.ask_expected_failures(n); }
    return outcome;
  }
  std::unique_ptr<per_thread_wakeups> wakeups;
  if (order == replay_order::per_thread) {
    try {
      wakeups = std::make_unique<per_thread_wakeups>(*s.log, workers);
    } catch (std::exception const& e) {  // no memory for the wake-up lists: the run stops, reported
      s.worker_failed(e.what());
      return {};
    }
  }
  auto body = [&s, &wakeups, order](unsigned w, unsigned of, double& inside_ns) {
    try {
      if (order == replay_order::strict) {
        strict_worker(s, w, of, inside_ns);
      } else {
        per_thread_worker(s, *wakeups, w, of, inside_ns);
      }
    } catch (std::exception const& e) {  // e.g. no memory for a worker's own list
      s.worker_failed(e.what());
    } catch (...) {
      s.worker_failed(not_std_exception);
    }
  };
  schedule_outcome outcome = run_on_workers(workers, before_worker_start, body);
  if (order == replay_order::strict && s.expect_failures && s.error.empty()) {
    s.ask_expected_failures(static_cast<std::uint32_t>(s.log->events.size()));
  }
  return outcome;
}

}  // namespace mrstack::replay_detail
