#include <mrstack/adaptor/logging_resource_adaptor.hpp>

#include "log_rows.hpp"
#include "log_thread_buffers.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <spdlog/details/os.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/base_sink.h>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/sharded_counters.hpp>

namespace mrstack {

struct logging_resource_adaptor::write_failures {
  std::mutex mutex;
  std::string first;  // the first failed write's message; empty while none failed
};

namespace detail {

namespace {

/// An asynchronous row, formatted by the thread that logged it: the writer only merges
/// slots by stamp and copies their text, so formatting scales with the logging threads.
/// The longest row is 113 characters (`row_room`), so one slot is two cache lines; a
/// shorter row stores little past its end (log_rows.hpp), so one that ends in the first
/// line leaves the second to the writer's core untouched.
struct alignas(64) row_slot {
  std::int64_t stamp;  // steady clock, ns
  std::uint8_t is_free;
  std::uint8_t length;
  char text[118];
};
static_assert(sizeof(row_slot) == 128);
static_assert(sizeof(row_slot::text) >= row_room);

}  // namespace

/// The asynchronous half: one single-producer ring per thread shard (threads beyond
/// `counter_shards` share one, behind its producer lock, uncontended otherwise) and one
/// writer thread that merges them by timestamp, formats rows in batches and hands each
/// batch to the sinks as one message of whole lines.
///
/// Why the merge is a valid history: a record is stamped with the monotonic clock inside
/// its producer's *pending window* — the producer marks its queue pending, reads the
/// clock, publishes the record, and clears the mark. The writer reads the clock (the
/// cut), then every queue's mark: a record stamped before the cut is either published or
/// in a window the writer sees as pending (it then emits nothing past that); a window
/// opened after the writer read the mark stamps no earlier than the cut. So every record
/// stamped before min(cut, pending windows) is in the queues, and the writer emits exactly
/// those, merged by (stamp, frees before allocations), each queue in its own order. A
/// free is stamped before it is forwarded and the allocation reusing its memory after
/// the upstream returned it, so in file order the free comes first.
class async_log_writer {
 public:
  async_log_writer(std::shared_ptr<spdlog::logger> logger, std::size_t capacity, bool flush_each_batch)
      : queue_capacity_{std::bit_ceil(std::max<std::size_t>(capacity / 16, 1024))},
        logger_{std::move(logger)},
        flush_each_batch_{flush_each_batch},
        wall_offset_ns_{wall_now_ns() - steady_now_ns()},
        first_queue_{std::make_unique<thread_queue>(queue_capacity_)},
        thread_{[this] { run(); }} {
    queues_[0].store(first_queue_.get(), std::memory_order_release);
  }

  ~async_log_writer() {
    {
      std::lock_guard lock{mutex_};
      stop_ = true;
    }
    wake_cv_.notify_one();
    thread_.join();
    for (std::size_t i = 1; i < counter_shards; ++i) { delete queues_[i].load(std::memory_order_relaxed); }
  }

  async_log_writer(async_log_writer const&) = delete;
  async_log_writer& operator=(async_log_writer const&) = delete;

  /// Stamps `record` (its time set here), formats its row into this thread's queue and
  /// publishes it. Waits while the queue is full. By reference, as log_thread_buffers::push.
  void push(log_record& record) noexcept {
    thread_queue* q = queue_for(detail::this_thread_shard());
    std::lock_guard lock{q->producer};
    std::uint64_t const head = q->head.load(std::memory_order_relaxed);
    // The writer's tail is read only when the last one seen says full: it moves in batches
    // and lives on the writer's cache line.
    while (head - q->tail_seen >= queue_capacity_) {
      q->tail_seen = q->tail.load(std::memory_order_acquire);
      if (head - q->tail_seen < queue_capacity_) { break; }
      wake();  // full: the writer must make room (the window is not open yet, so it can)
      std::this_thread::yield();
    }
    q->pending.store(0, std::memory_order_seq_cst);  // the window opens before the clock is read
    record.time_ns = steady_now_ns();
    row_slot& slot = q->slots[head & (queue_capacity_ - 1)];
    slot.stamp = record.time_ns;
    slot.is_free = record.action == 2 ? 1 : 0;
    record.time_ns += wall_offset_ns_;
    thread_local row_writer writer;
    slot.length = static_cast<std::uint8_t>(writer.put(slot.text, record) - slot.text);
    q->head.store(head + 1, std::memory_order_release);
    q->pending.store(idle, std::memory_order_release);
    if (((head + 1) & (queue_capacity_ / 8 - 1)) == 0 && sleeping_.load(std::memory_order_relaxed)) { wake(); }
  }

  void flush() {
    std::uint64_t targets[counter_shards];
    for (std::size_t i = 0; i < counter_shards; ++i) {
      thread_queue* q = queues_[i].load(std::memory_order_acquire);
      targets[i] = q == nullptr ? 0 : q->head.load(std::memory_order_acquire);
    }
    std::unique_lock lock{mutex_};
    ++flush_waiters_;
    for (std::size_t i = 0; i < counter_shards; ++i) {
      thread_queue* q = queues_[i].load(std::memory_order_acquire);
      while (q != nullptr && q->written.load(std::memory_order_acquire) < targets[i]) {
        sleeping_.store(false, std::memory_order_relaxed);
        wake_cv_.notify_one();
        written_cv_.wait_for(lock, std::chrono::milliseconds(1));
      }
    }
    --flush_waiters_;
    lock.unlock();
    logger_->flush();
  }

 private:
  static constexpr std::size_t batch_rows = 1024;
  static constexpr auto nap = std::chrono::milliseconds(5);
  static constexpr std::int64_t idle = std::numeric_limits<std::int64_t>::max();

  struct alignas(64) thread_queue {
    explicit thread_queue(std::size_t capacity) : slots(capacity) {}
    detail::lean_mutex producer;                 // uncontended unless threads share the shard
    std::atomic<std::int64_t> pending{idle};     // 0 while a record is being stamped
    std::atomic<std::uint64_t> head{0};          // records published
    std::uint64_t tail_seen = 0;                 // the producer's last look at `tail`
    alignas(64) std::atomic<std::uint64_t> tail{0};     // records the writer took (published per batch)
    std::atomic<std::uint64_t> written{0};       // records in the sinks
    std::vector<row_slot> slots;
  };

  static std::int64_t steady_now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static std::int64_t wall_now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  thread_queue* queue_for(std::size_t shard) noexcept {
    thread_queue* q = queues_[shard].load(std::memory_order_acquire);
    if (q != nullptr) { return q; }
    std::lock_guard lock{mutex_};
    q = queues_[shard].load(std::memory_order_relaxed);
    if (q == nullptr) {
      try {
        q = new thread_queue(queue_capacity_);
      } catch (...) {
        // No memory for a queue of its own: the thread shares the first one, made with the
        // writer (its producer lock serializes sharers, and a stamp taken under it keeps the
        // queue sorted). The row was dropped before, and the log read as a broken history.
        return first_queue_.get();
      }
      queues_[shard].store(q, std::memory_order_release);
    }
    return q;
  }

  void wake() noexcept {
    if (sleeping_.exchange(false)) {
      std::lock_guard lock{mutex_};
      wake_cv_.notify_one();
    }
  }

  /// One merge round: emits every record stamped before the safe bound (all of them when
  /// `final`); returns the rows written.
  std::size_t merge_round(std::string& batch, bool final) {
    // The cut, read before the marks. Less a margin: the CPU may start the loads of the
    // marks a little before the clock read completes (out-of-order execution), and a
    // window opened in between must still stamp after the bound.
    constexpr std::int64_t reorder_margin_ns = 2000;
    std::int64_t bound = final ? idle : steady_now_ns() - reorder_margin_ns;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    merge_source sources[counter_shards];
    std::size_t n = 0;
    for (auto& slot : queues_) {
      thread_queue* q = slot.load(std::memory_order_acquire);
      if (q == nullptr) { continue; }
      bound = std::min(bound, q->pending.load(std::memory_order_seq_cst));
      sources[n++] = merge_source{q, q->tail.load(std::memory_order_relaxed), 0};
    }
    for (std::size_t i = 0; i < n; ++i) { sources[i].end = sources[i].queue->head.load(std::memory_order_acquire); }
    // A min-heap of the sources whose next row is eligible, ordered by that row.
    std::size_t heap[counter_shards];
    std::size_t live = 0;
    auto next_of = [&](std::size_t i) -> row_slot const& { return sources[i].queue->slots[sources[i].next & (queue_capacity_ - 1)]; };
    auto eligible = [&](std::size_t i) { return sources[i].next != sources[i].end && next_of(i).stamp < bound; };
    auto less = [&](std::size_t a, std::size_t b) { return before(next_of(b), next_of(a)); };  // std heaps are max-heaps
    for (std::size_t i = 0; i < n; ++i) {
      if (eligible(i)) { heap[live++] = i; }
    }
    std::make_heap(heap, heap + live, less);
    std::size_t rows = 0;
    char* out = batch.data();
    auto flush_batch = [&] {
      for (std::size_t i = 0; i < n; ++i) { sources[i].queue->tail.store(sources[i].next, std::memory_order_release); }
      if (out == batch.data()) { return; }
      // One message of whole lines (the sink appends the last newline).
      logger_->log(spdlog::level::info, spdlog::string_view_t{batch.data(), static_cast<std::size_t>(out - batch.data() - 1)});
      if (flush_each_batch_) { logger_->flush(); }
      for (std::size_t i = 0; i < n; ++i) { sources[i].queue->written.store(sources[i].next, std::memory_order_release); }
      out = batch.data();
    };
    while (live != 0) {
      std::pop_heap(heap, heap + live, less);
      std::size_t const i = heap[live - 1];
      row_slot const& r = next_of(i);
      // The slots were written on other cores: ask for this queue's next ones early.
      __builtin_prefetch(&sources[i].queue->slots[(sources[i].next + 4) & (queue_capacity_ - 1)]);
      std::memcpy(out, r.text, r.length);
      out += r.length;
      ++sources[i].next;
      if (eligible(i)) {
        std::push_heap(heap, heap + live, less);
      } else {
        --live;
      }
      if (++rows % batch_rows == 0) { flush_batch(); }
    }
    flush_batch();
    return rows;
  }

  struct merge_source {
    thread_queue* queue;
    std::uint64_t next;  // its next row to emit
    std::uint64_t end;   // rows published when the round began
  };

  static bool before(row_slot const& a, row_slot const& b) noexcept {
    if (a.stamp != b.stamp) { return a.stamp < b.stamp; }
    return a.is_free > b.is_free;  // a free first: its memory may be the other's
  }

  void run() {
    std::string batch;
    batch.resize(batch_rows * sizeof(row_slot::text));
    for (;;) {
      if (merge_round(batch, false) > 0) {
        if (flush_waiters_.load(std::memory_order_relaxed) > 0) {
          std::lock_guard lock{mutex_};
          written_cv_.notify_all();
        }
        continue;
      }
      std::unique_lock lock{mutex_};
      if (stop_) {
        // The owner is being destroyed: no producer is left; everything is published.
        lock.unlock();
        merge_round(batch, true);
        break;
      }
      sleeping_.store(true);
      wake_cv_.wait_for(lock, nap, [this] { return !sleeping_.load() || stop_ || flush_waiters_.load() > 0; });
      sleeping_.store(false);
      if (flush_waiters_.load() > 0) { written_cv_.notify_all(); }
    }
    logger_->flush();
  }

  std::size_t queue_capacity_;  // a power of two
  std::atomic<thread_queue*> queues_[counter_shards]{};
  std::shared_ptr<spdlog::logger> logger_;
  bool flush_each_batch_;
  std::int64_t wall_offset_ns_;  // system_clock - steady_clock at the start: Time column from stamps
  std::mutex mutex_;
  std::condition_variable wake_cv_;
  std::condition_variable written_cv_;
  std::atomic<bool> sleeping_{false};
  std::atomic<int> flush_waiters_{0};
  bool stop_{false};  // guarded by mutex_
  // Shard 0's queue, made with the writer: a thread that cannot get a queue of its own
  // shares it (and an impossible capacity fails at construction, not at the first row).
  std::unique_ptr<thread_queue> const first_queue_;  // owned here (queues_[0]): freed if the thread cannot start
  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace detail

namespace {

/// spdlog's ostream sink writes and never looks at the stream again: a stream that failed
/// (an ofstream on a full disk, one never opened) lost every row while the constructor and
/// flush() reported nothing. This one throws after a write or flush that left the stream
/// failed, so the logger's error handler records it as it does a file's.
class checked_ostream_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit checked_ostream_sink(std::ostream& out) : out_{out} {}

 protected:
  void sink_it_(spdlog::details::log_msg const& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    out_.write(formatted.data(), static_cast<std::streamsize>(formatted.size()));
    check("a write to");
  }
  void flush_() override {
    out_.flush();
    check("a flush of");
  }

 private:
  void check(char const* what) {
    if (!out_) { throw spdlog::spdlog_ex(std::string{what} + " the output stream failed (the stream is bad or failed)"); }
  }
  std::ostream& out_;
};

/// A caller's sink, behind one that turns whatever it throws into an spdlog_ex: spdlog hands
/// a std::exception to the logger's error handler (so it is recorded) but rethrows anything
/// else, out of the calls that log (noexcept) and the writer thread, ending the program.
class guarded_sink final : public spdlog::sinks::sink {
 public:
  explicit guarded_sink(spdlog::sink_ptr inner) : inner_{std::move(inner)} {}
  void log(spdlog::details::log_msg const& msg) override {
    if (inner_->should_log(msg.level)) { guarded([&] { inner_->log(msg); }); }
  }
  void flush() override {
    guarded([&] { inner_->flush(); });
  }
  void set_pattern(std::string const& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  template <typename Call>
  static void guarded(Call&& call) {
    try {
      call();
    } catch (std::exception const&) {
      throw;
    } catch (...) {
      throw spdlog::spdlog_ex("a sink threw something that is not a std::exception");
    }
  }
  spdlog::sink_ptr inner_;
};

std::string resolve_path(std::string const& path) {
  if (!path.empty()) { return path; }
  char const* from_env = std::getenv(logging_resource_adaptor::log_file_variable);
  if (from_env == nullptr || *from_env == '\0') {
    // Set but empty is said as such: "unset" sent the reader looking for a missing export.
    throw logic_error(std::string{"logging: no log file given and "} + logging_resource_adaptor::log_file_variable +
                      (from_env == nullptr ? " is unset" : " is set but empty"));
  }
  return from_env;
}

/// The log files this process's adaptors write, by their absolute path with symbolic links
/// resolved. Never destroyed: an adaptor may outlive static destruction.
std::mutex& claims_mutex() {
  static auto* const mutex = new std::mutex;
  return *mutex;
}
std::set<std::string>& claimed_files() {
  static auto* const files = new std::set<std::string>;
  return *files;
}

spdlog::sink_ptr open_file_sink(std::string const& path) {
  try {
    return std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/true);
  } catch (spdlog::spdlog_ex const& e) {
    throw std::runtime_error("logging: cannot open log file '" + path + "' for writing (" + e.what() + ")");
  }
}

/// Keeps the first failed write's message and says it once on stderr.
void record_failure(std::mutex& mutex, std::string& first, std::string const& path, std::string const& message) {
  std::lock_guard lock{mutex};
  if (!first.empty()) { return; }
  // Kept non-empty: empty is what "none failed" reads as, and a sink's error may say nothing.
  first = message.empty() ? std::string{"a sink failed with no message"} : message;
  std::fprintf(stderr, "mrstack: logging%s%s: a write failed (%s); rows from here on are lost\n",
               path.empty() ? "" : " to ", path.c_str(), first.c_str());
}

resource_ptr checked_upstream(resource_ptr upstream) {
  if (upstream == nullptr) { throw logic_error("logging: upstream resource is null"); }
  return upstream;
}

}  // namespace

/// A second adaptor opening a file that another one writes truncated the first's log, and
/// the two then appended to it together: a file that reads as no one history. So a regular
/// file is claimed before it is opened, and refused while claimed. A device (/dev/null, a
/// terminal) is not: nothing there is truncated or read back as one log.
struct logging_resource_adaptor::file_claim {
  explicit file_claim(std::string const& path) {
    std::error_code error;
    auto resolved = std::filesystem::absolute(path, error);
    if (!error) { resolved = std::filesystem::weakly_canonical(resolved, error); }
    key = error ? path : resolved.string();  // unresolvable: the path as given, still a key
    auto const status = std::filesystem::status(key, error);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      key.clear();
      return;
    }
    std::lock_guard lock{claims_mutex()};
    if (!claimed_files().insert(key).second) {
      throw logic_error("logging: the log file '" + path + "'" + (key == path ? "" : " ('" + key + "')") +
                        " is already being written by another logging adaptor of this process: give each its own file");
    }
  }
  ~file_claim() {
    if (key.empty()) { return; }
    std::lock_guard lock{claims_mutex()};
    claimed_files().erase(key);
  }
  file_claim(file_claim const&) = delete;
  file_claim& operator=(file_claim const&) = delete;
  std::string key;
};

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::string const& path, bool auto_flush,
                                                   bool async, std::size_t queue_capacity, log_order order,
                                                   log_format format)
    : logging_resource_adaptor(checked_upstream(std::move(upstream)), std::vector<spdlog::sink_ptr>{},
                               resolve_path(path), auto_flush, async, queue_capacity, order, format, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::ostream& stream, bool auto_flush,
                                                   bool async, std::size_t queue_capacity, log_order order,
                                                   log_format format)
    : logging_resource_adaptor(std::move(upstream),
                               std::vector<spdlog::sink_ptr>{std::make_shared<checked_ostream_sink>(stream)},
                               std::string{}, auto_flush, async, queue_capacity, order, format, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks,
                                                   bool auto_flush, bool async, std::size_t queue_capacity,
                                                   log_order order, log_format format)
    : logging_resource_adaptor(std::move(upstream), std::move(sinks), std::string{}, auto_flush, async,
                               queue_capacity, order, format, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks,
                                                   std::string path, bool auto_flush, bool async,
                                                   std::size_t queue_capacity, log_order order, log_format format, int)
    : upstream_{checked_upstream(std::move(upstream))},
      path_{std::move(path)},
      format_{format},
      forks_{detail::watch_forks()} {
  if (order == log_order::per_thread && !async) {
    throw logic_error("logging: per-thread order is a way of writing asynchronously: it needs async");
  }
  if (format == log_format::binary && order != log_order::per_thread) {
    throw logic_error("logging: the binary format is written in per-thread order: it needs async and per_thread");
  }
  // Every argument is checked before the file is opened: opening truncates it, and a
  // refused construction must leave an existing log as it was. The capacity in every mode,
  // as the spec checks it: a synchronous log took any value.
  if (!detail::is_pow2(queue_capacity) || queue_capacity < 16 || queue_capacity > max_queue_capacity) {
    throw logic_error("logging: queue capacity " + std::to_string(queue_capacity) +
                      " must be a power of two from 16 to " + std::to_string(max_queue_capacity));
  }
  for (auto& sink : sinks) {
    if (sink == nullptr) { throw logic_error("logging: a sink is null"); }
    sink = std::make_shared<guarded_sink>(std::move(sink));
  }
  bool const ticks = format == log_format::binary && detail::binary_stamps_in_ticks();
  if (!path_.empty()) {
    claim_ = std::make_unique<file_claim>(path_);
    sinks.push_back(open_file_sink(path_));
  }
  if (sinks.empty()) { throw logic_error("logging: no sink to write to"); }
  logger_ = std::make_shared<spdlog::logger>("mrstack.logging", sinks.begin(), sinks.end());
  logger_->set_level(spdlog::level::info);
  // spdlog's own handler printed a rate-limited line and the program never knew; the first
  // failure is kept for flush() and write_failure(), and said once on stderr.
  failures_ = std::make_shared<write_failures>();
  logger_->set_error_handler(
      [failures = failures_, path = path_](std::string const& message) {
        record_failure(failures->mutex, failures->first, path, message);
      });
  // Rows are formatted by us: the sinks add only the newline, and to binary blocks nothing.
  logger_->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      "%v", spdlog::pattern_time_type::local,
      format == log_format::binary ? std::string{} : std::string{spdlog::details::os::default_eol}));
  if (auto_flush && !async) { logger_->flush_on(spdlog::level::info); }
  if (format == log_format::csv) { logger_->log(spdlog::level::info, header(order)); }
  if (async && order == log_order::per_thread) {
    // A thread's buffer holds as many rows as its merged-mode queue would (rows are at
    // most `max_row_length` plus the stamp, most far shorter; a binary record is 32 bytes).
    std::size_t const rows = std::max<std::size_t>(queue_capacity / 16, 1024);
    per_thread_ = std::make_unique<detail::log_thread_buffers>(logger_, rows * 80, auto_flush,
                                                               format == log_format::binary, ticks);
  } else if (async) {
    writer_ = std::make_unique<detail::async_log_writer>(logger_, queue_capacity, auto_flush);
  }
  // The header is in the file at once, in every mode: a process that ends without running
  // destructors (os._exit, a fork's child) leaves a log that reads as one, not an empty file.
  logger_->flush();
  if (auto const failed = write_failure(); !failed.empty()) {
    throw std::runtime_error("logging: cannot write the log's header: " + failed);
  }
}

std::string logging_resource_adaptor::write_failure() const {
  std::lock_guard lock{failures_->mutex};
  return failures_->first;
}

logging_resource_adaptor::~logging_resource_adaptor() {
  if (in_forked_child()) [[unlikely]] {
    // Left as they are: the writer thread is not in this process (joining it would hang or
    // worse), the buffers hold the parent's rows and closing the file would write its
    // stdio buffer, the parent's rows too. The parent writes them; the child only ends.
    static_cast<void>(writer_.release());
    static_cast<void>(per_thread_.release());
    static_cast<void>(new std::shared_ptr<spdlog::logger>(std::move(logger_)));
    return;
  }
  writer_.reset();      // drains and joins the writer before the logger goes
  per_thread_.reset();  // writes every buffer out
  logger_->flush();
}

std::string logging_resource_adaptor::header(log_order order) {
  return order == log_order::per_thread ? "Thread,Time,Action,Pointer,Size,Stream,Stamp"
                                        : "Thread,Time,Action,Pointer,Size,Stream";
}

std::size_t logging_resource_adaptor::thread_buffer_count() const {
  return per_thread_ ? per_thread_->buffer_count() : 0;
}

std::size_t logging_resource_adaptor::current_thread_id() noexcept { return spdlog::details::os::thread_id(); }

bool logging_resource_adaptor::in_forked_child() const noexcept {
  return detail::process_forks.load(std::memory_order_relaxed) != forks_;
}

void logging_resource_adaptor::note_forked_child() const noexcept {
  try {
    record_failure(failures_->mutex, failures_->first, path_,
                   "this process is a fork() child of the one that made the adaptor: its rows are not written "
                   "(its log buffers are the parent's copies and its addresses repeat the parent's)");
  } catch (...) {
    // No memory for the message: the row is dropped all the same, and a later call tries again.
  }
}

void logging_resource_adaptor::flush() {
  if (in_forked_child()) [[unlikely]] {
    note_forked_child();  // and nothing flushed: what the buffers hold is the parent's to write
  } else if (writer_) {
    writer_->flush();
  } else if (per_thread_) {
    per_thread_->flush();
  } else {
    logger_->flush();
  }
  if (auto const failed = write_failure(); !failed.empty()) {
    throw std::runtime_error("logging" + (path_.empty() ? std::string{} : " to " + path_) +
                             ": a write failed, rows are missing from the log: " + failed);
  }
}

void logging_resource_adaptor::log_event(action what, void const* ptr, std::size_t bytes, stream_view stream) noexcept {
  if (in_forked_child()) [[unlikely]] {
    note_forked_child();
    return;
  }
  detail::log_record record{current_thread_id(), 0, reinterpret_cast<std::uintptr_t>(ptr), bytes, stream.id(),
                            static_cast<std::uint8_t>(what)};
  if (writer_) {
    writer_->push(record);  // stamps it
    return;
  }
  if (per_thread_) {
    per_thread_->push(record);  // stamps it
    return;
  }
  auto const now = std::chrono::system_clock::now();
  record.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  thread_local detail::row_writer writer;
  char row[detail::row_room];
  char* const end = writer.put(row, record);
  // spdlog catches and reports sink errors itself (its error handler), so this never throws.
  logger_->log(now, spdlog::source_loc{}, spdlog::level::info,
               spdlog::string_view_t{row, static_cast<std::size_t>(end - row - 1)});
}

void* logging_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  void* ptr = nullptr;
  try {
    ptr = upstream_->allocate(bytes, stream, alignment);
  } catch (...) {
    log_event(action::allocate_failure, nullptr, bytes, stream);
    throw;
  }
  log_event(action::allocate, ptr, bytes, stream);
  return ptr;
}

void logging_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  log_event(action::free, ptr, bytes, stream);  // before the memory can be reused: file order stays a valid history
  upstream_->deallocate(ptr, bytes, stream, alignment);
}

}  // namespace mrstack
