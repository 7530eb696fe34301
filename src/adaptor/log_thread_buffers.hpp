#pragma once
// The logging adaptor's per-thread order (internal to src/adaptor): each thread formats
// its rows into a buffer of its own and writes the buffer to the sinks itself, as one
// message, when it fills. No thread merges: the file holds each thread's rows in its own
// order, in runs, and a Stamp column (nanoseconds since logging began, on the monotonic
// clock) orders them all — mrstack's log reader sorts by it.
//
// In binary form (log/binary_log.hpp) a buffer holds 32-byte records instead of rows of
// text: no formatting on the logging thread, and less than half the bytes.
//
// Why: the merged asynchronous log is bounded by its one writer (about 9 M rows a second
// on an H200 host's core), while 16 threads on a bare pool make over 100 M calls a
// second. Here every thread pays for its own rows and nothing else.
//
// A buffer belongs to one live thread, so appending a row takes no lock: a lock and
// unlock (two locked instructions) cost ~20 ns a row on an H200 host, about what a row
// may cost in all. Its owner appends and publishes how far (`committed`, a release
// store); whoever writes rows out — the owner when the buffer is full, `flush()`, the
// destructor — holds the buffer's `consumer` lock and writes from `written` up to what
// was committed. A thread finds its buffer through a thread-local cache keyed by the
// instance's id (never reused). When the thread exits, it writes its buffers out and
// marks them orphaned, and a new thread adopts one rather than growing the set; a call
// after that exit hook ran (a later thread_local destructor freeing memory) writes its
// row on its own, after the thread's earlier rows. Buffers reach the sinks through a
// `sink` they share with the instance, so an exiting thread can write its rows out
// even while the instance is being destroyed.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>

#include "log_rows.hpp"

namespace spdlog {
class logger;
}

namespace mrstack::detail {

/// The fork()s this process and its ancestors made since the library was loaded: each
/// child's count is its parent's at the fork plus one (a pthread_atfork child handler). A
/// log made before a fork is the parent's in the child — its file's stdio buffer, its
/// thread buffers and queues are copies holding the parent's unwritten rows, its writer
/// thread does not exist there, and the child's resources hand out the parent's addresses
/// — so a log compares the count it was made at and writes nothing in a child.
inline std::atomic<std::uint32_t> process_forks{0};
/// Makes sure the handler counting forks is in place; returns the count now.
[[nodiscard]] std::uint32_t watch_forks() noexcept;

/// The variable that picks the binary stamps' clock: unset (or empty), counter ticks where
/// the kernel keeps time by the counter; `steady`, the monotonic clock.
inline constexpr char const* log_clock_variable = "MRSTACK_LOG_CLOCK";

/// Whether binary stamps are time-stamp counter ticks: where the kernel itself keeps time
/// by that counter (so it runs at one rate and in step on every core; x86-64, clocksource
/// `tsc`, and the CPU offers `rdtscp`), unless MRSTACK_LOG_CLOCK=steady asks for the
/// monotonic clock. `rdtscp` costs 24-25 ns on an H200 host against 30-40 for
/// `clock_gettime`, which reads the same counter and scales it. Any other value of the variable is a `logic_error` naming it.
[[nodiscard]] bool binary_stamps_in_ticks();

class log_thread_buffers {
 public:
  /// Each thread's buffer holds `buffer_bytes` of text; `write_each_row`: no buffering
  /// (auto_flush), every row goes to the sinks at once. `binary`: blocks of records, the
  /// file header written here (the logger's formatter must add no newline), stamped in
  /// counter ticks when `ticks` (see binary_stamps_in_ticks).
  log_thread_buffers(std::shared_ptr<spdlog::logger> logger, std::size_t buffer_bytes, bool write_each_row,
                     bool binary = false, bool ticks = false);
  ~log_thread_buffers();  // writes out what is left; no thread may still log
  log_thread_buffers(log_thread_buffers const&) = delete;
  log_thread_buffers& operator=(log_thread_buffers const&) = delete;

  /// Stamps `record` (its time set here) and appends its row to this thread's buffer.
  /// By reference: a copy made by value read the caller's fresh stores back in 16-byte
  /// pieces, which the CPU cannot forward from 8-byte ones (half of log_event's time).
  void push(log_record& record) noexcept;
  /// Writes every buffer out and flushes the sinks: every row logged before is then in them.
  void flush();
  /// Buffers made so far (a diagnostic: threads that come and go adopt, not add).
  [[nodiscard]] std::size_t buffer_count();

  /// Where rows go: the logger, and a lock that keeps one write-out's pieces together.
  struct sink {
    std::shared_ptr<spdlog::logger> logger;
    bool binary = false;
    bool ticks = false;             // binary stamps are time-stamp counter ticks
    std::uint64_t start_ticks = 0;  // stamp 0, in ticks and on the steady clock
    std::int64_t start_ns = 0;
    std::uint32_t forks = 0;  // process_forks when it was made: another count means a fork's child
    lean_mutex mutex;
  };

  struct buffer {
    buffer(std::size_t bytes, std::shared_ptr<sink> to) : text(bytes), out{std::move(to)} {}
    std::vector<char> text;
    std::shared_ptr<sink> out;
    // The owner's.
    std::size_t used = 0;        // bytes appended
    std::size_t thread = 0;      // binary: the thread of the records it appends now
    bool thread_named = false;   // binary: `thread` is set (a record has been appended)
    std::atomic<std::size_t> committed{0};  // `used` as published to consumers
    std::atomic<bool> orphaned{false};      // its thread exited: another may adopt it
    // The consumers', under `consumer`.
    lean_mutex consumer;
    std::size_t written = 0;          // bytes before it are in the sinks
    std::size_t written_thread = 0;   // binary: the thread of the record at `written`
  };

 private:
  /// This thread's buffer (found, adopted or made); null once its thread is exiting, or
  /// when no memory is left for one.
  buffer* this_thread_buffer() noexcept;
  buffer* adopt_or_make() noexcept;
  /// The owner's rows: appended without a lock.
  void append_row(buffer& b, log_record& record) noexcept;
  void append_binary(buffer& b, log_record const& record) noexcept;
  /// A row from a thread past its exit hook: written at once, on its own.
  void write_alone(log_record& record) noexcept;
  [[nodiscard]] std::uint64_t stamp_now() const noexcept;

  static constexpr std::size_t full_size_buffers = 64;
  static constexpr std::size_t small_buffer_bytes = std::size_t{16} << 10;  // ~200 rows, 500 records

  std::shared_ptr<sink> sink_;
  bool ticks_;                 // sink_'s, kept at hand for the stamps
  std::uint64_t start_ticks_;
  std::size_t buffer_bytes_;
  bool write_each_row_;
  bool binary_;
  std::uint64_t id_;             // this instance, in thread caches: never reused
  std::int64_t start_ns_;        // steady clock at construction: Stamp 0
  std::int64_t wall_offset_ns_;  // system_clock - steady_clock then: the Time column from stamps
  std::mutex buffers_mutex_;     // buffers_
  std::vector<std::shared_ptr<buffer>> buffers_;
};

/// For tests: when set, called inside each read of a (ticks, ns) point, between the clock's
/// read and the counter's second one, as a preemption there would fall.
inline std::atomic<void (*)()> tick_point_hook{nullptr};

/// The owner's write-out of its whole buffer, which then starts empty.
void drain(log_thread_buffers::buffer& b) noexcept;
/// Writes b's rows in [b.written, upto) to its sink (b.consumer held).
void write_out(log_thread_buffers::buffer& b, std::size_t upto) noexcept;

}  // namespace mrstack::detail
