#pragma once
/// `logging_resource_adaptor`: writes one CSV row per allocation event of the resource
/// below it, in the format of RMM's logging adaptor so logs move between the two tools
/// (and feed mrstack's replay tool):
///
///     Thread,Time,Action,Pointer,Size,Stream
///     81234,14:03:07.123456,allocate,0x7f864d700000,37632,0
///     81234,14:03:07.123502,free,0x7f864d700000,37632,0
///     81240,14:03:07.123611,allocate failure,(nil),1099511627776,0x55d1c2a3b4c0
///
/// - Thread: the OS thread id (gettid on Linux, the value spdlog's `%t` prints).
/// - Time: local wall-clock time of the event, HH:MM:SS.microseconds (spdlog's
///   `%H:%M:%S.%f`, as RMM writes it).
/// - Action: `allocate`, `allocate failure` (the upstream threw; the row is written and
///   the exception rethrown) or `free`.
/// - Pointer: lower-case hex with `0x`; `(nil)` on an allocate failure (what RMM writes
///   through printf's `%p`). mrstack's readers also take `0` and `0x0` (older RMM) as null.
/// - Size: the bytes the caller asked for, in decimal.
/// - Stream: the `cudaStream_t` handle in hex: `0` for the default stream (as RMM's
///   ostream formatting prints a null handle), `0x...` for any other handle.
///
/// Ordering: an allocation is logged after the upstream returned it and a free before it
/// is forwarded, so in file order a pointer's `free` always precedes its reuse by any
/// thread: the file is a valid serial history. Rows from many threads never interleave
/// within a line (each write to a sink is whole lines under the sink's lock). A free that
/// a checking layer below rejects is still logged: the row records the call.
///
/// Modes:
/// - synchronous (default): the calling thread formats its row and writes it through
///   spdlog before returning. With `auto_flush` each row is flushed at once, so a crash
///   loses nothing.
/// - asynchronous (`async = true`): the calling thread stamps the event (monotonic
///   clock), formats its row and appends it, as a 128-byte slot, to its own queue — one
///   single-producer ring per thread (`detail::this_thread_shard`; threads past 64 share
///   one behind an uncontended lock), each holding `queue_capacity / 16` rows (at least
///   1024), made on the thread's first event. No write is shared between threads on the
///   hot path; it makes no system call in the common case and never allocates after the
///   first event. A writer thread merges the queues in timestamp order with a heap (frees
///   before allocations at equal stamps; a row is emitted only once no thread can still
///   publish an earlier one: see the pending windows in the source) and hands the rows to
///   the sinks in batches, so the file stays a valid serial history. Formatting is thus
///   spread over the logging threads; the writer only compares stamps and copies text.
///   The Time column is the wall-clock time at construction plus the monotonic time
///   since. When a thread's queue is full it waits for room (records are never
///   dropped). `auto_flush` then flushes after each batch the writer takes. `flush()`
///   returns once every event logged before it is in the sinks and they are flushed.
///   The destructor drains.
///
/// - asynchronous in per-thread order (`async = true`, `order = log_order::per_thread`):
///   each thread formats its rows into a buffer of its own (`queue_capacity / 16` rows,
///   at least 1024, for the first 64 threads logging at once, 16 KiB for more; appended
///   without a lock, and left to the next new thread when its thread exits) and, when it
///   fills, writes it to the sinks itself as one message. No
///   thread merges, so nothing bounds the log but the logging threads themselves (the
///   merged mode is bounded by its one writer: about 9 M rows a second). The file holds
///   each thread's rows in its own order, in runs, with a seventh column, `Stamp`:
///   nanoseconds since logging began on the monotonic clock. Merged by Stamp (each
///   thread's rows in their order; at equal stamps a free before another thread's
///   allocation) it is a valid serial history, and mrstack's log reader (so
///   `mrstack-replay`) reads a log whose header has that column in that order. `flush()` writes
///   every buffer out; rows of a thread that logs nothing more wait in its buffer until
///   then (or until the adaptor is destroyed). `auto_flush` writes and flushes every row at once.
///
/// - binary (`format = log_format::binary`, with async and per-thread order): as
///   per-thread order, but each buffer holds 32-byte records — stamp and kind, pointer,
///   size, stream — in blocks that name their thread, after a 32-byte file header
///   (layout: log/binary_log.hpp). The logging thread formats nothing, and the file is
///   under half the CSV's size. Where the kernel keeps time by the CPU's time-stamp
///   counter (x86-64, clocksource `tsc`, a CPU with `rdtscp`) the stamps are its ticks,
///   read with `rdtscp` (ordered after earlier loads, as the monotonic clock's read is) and turned into
///   nanoseconds by the reader; MRSTACK_LOG_CLOCK=steady asks for the monotonic clock (any
///   other non-empty value is a `logic_error`). mrstack's log reader (so `mrstack-replay`, which also
///   writes the CSV out with `--write-csv`) reads it as the CSV this adaptor would have
///   written in per-thread order. The sinks are handed raw bytes with no newline added:
///   give it a file or a binary ostream.
///
/// In a fork()'s child the adaptor writes nothing: the file's buffer, the thread buffers
/// and queues it holds are copies of the parent's (with the parent's unwritten rows), the
/// writer thread does not exist there and the child's addresses repeat the parent's, so
/// its rows would corrupt the parent's log. The child's calls go through unlogged, the
/// reason is its `write_failure()` (said once on stderr), its `flush()` throws it, and its
/// destructor leaves the parent's log, buffers and writer alone.
///
/// Output goes to a file (truncated; the path defaults from `MRSTACK_LOG_FILE`), to a
/// `std::ostream` (which must outlive the adaptor) or to any spdlog sinks (use their
/// `_mt` variants; the adaptor sets their pattern to `%v`, as RMM's does).
///
/// Thread-safe. `name()` is "logging". `free_bytes_held`/`release` go to the upstream.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/common.h>

#include <mrstack/resource.hpp>

namespace spdlog {
class logger;
}

namespace mrstack {

namespace detail {
class async_log_writer;
class log_thread_buffers;
}  // namespace detail

/// What a log's rows are written as (see the modes above).
enum class log_format : std::uint8_t {
  csv,     ///< RMM's CSV columns
  binary,  ///< 32-byte records (log/binary_log.hpp); needs async and per-thread order
};

/// How an asynchronous log orders its rows (see the modes above).
enum class log_order : std::uint8_t {
  merged,      ///< one writer merges every thread's rows: the file is a serial history as it stands
  per_thread,  ///< each thread writes its own rows in runs; a Stamp column orders them
};

class logging_resource_adaptor final : public memory_resource {
 public:
  /// The environment variable naming the log file when no path is given.
  static constexpr char const* log_file_variable = "MRSTACK_LOG_FILE";
  /// Sizes the asynchronous queues: each thread's (one per thread shard, up to 64) holds
  /// 1/16 of it, at least 1024 records, before its caller waits for the writer; in
  /// per-thread order each thread's buffer holds about as many rows (the first 64 buffers).
  static constexpr std::size_t default_queue_capacity = std::size_t{1} << 16;
  /// The largest `queue_capacity` (a power of two from 16 up to this, in every mode; a
  /// `logic_error` otherwise).
  static constexpr std::size_t max_queue_capacity = std::size_t{1} << 24;

  /// Logs to the file at `path` (created or truncated; parent folders are created). An
  /// empty `path` means the file named by MRSTACK_LOG_FILE; a `logic_error` when that is
  /// unset. A file that cannot be opened throws `std::runtime_error` naming the path; a
  /// regular file that another live adaptor of this process writes (by any path that
  /// resolves to it), a `logic_error` naming it, the file left as it was.
  /// `log_order::per_thread` needs `async`, `log_format::binary` both: otherwise a `logic_error`.
  /// Every argument is checked before the file is opened, so a refused construction leaves
  /// an existing file as it was.
  explicit logging_resource_adaptor(resource_ptr upstream, std::string const& path = {}, bool auto_flush = false,
                                    bool async = false, std::size_t queue_capacity = default_queue_capacity,
                                    log_order order = log_order::merged, log_format format = log_format::csv);
  /// Logs to `stream`, which must outlive the adaptor.
  logging_resource_adaptor(resource_ptr upstream, std::ostream& stream, bool auto_flush = false, bool async = false,
                           std::size_t queue_capacity = default_queue_capacity, log_order order = log_order::merged,
                           log_format format = log_format::csv);
  /// Logs to every sink in `sinks` (at least one). Whatever a sink throws (a
  /// `std::exception` or not) is a failed write, as `flush()` says.
  logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks, bool auto_flush = false,
                           bool async = false, std::size_t queue_capacity = default_queue_capacity,
                           log_order order = log_order::merged, log_format format = log_format::csv);
  ~logging_resource_adaptor() override;

  /// Writes out every row logged so far (in asynchronous mode: waits for the writer to
  /// take them) and flushes the sinks. Throws `std::runtime_error` naming the first failure
  /// when a write to a sink has failed since the adaptor was made (a full disk, a file past
  /// its size limit): from then on rows are lost and the file is cut short, so a program
  /// that flushes learns it. The failure is also printed on stderr once, when it happens;
  /// the calls themselves never throw for it (the allocation or free went through).
  void flush();
  /// The first failed write to a sink, empty while there was none.
  [[nodiscard]] std::string write_failure() const;

  /// The CSV header line, without a newline (per-thread order adds the Stamp column).
  [[nodiscard]] static std::string header(log_order order = log_order::merged);
  /// The id this thread's rows carry in the Thread column.
  [[nodiscard]] static std::size_t current_thread_id() noexcept;

  [[nodiscard]] bool is_async() const noexcept { return writer_ != nullptr || per_thread_ != nullptr; }
  [[nodiscard]] log_order order() const noexcept { return per_thread_ ? log_order::per_thread : log_order::merged; }
  [[nodiscard]] log_format format() const noexcept { return format_; }
  /// Per-thread order: the thread buffers made so far (a thread that exits leaves its
  /// buffer to the next new thread, so this stays at the most threads logging at once);
  /// 0 in the other modes.
  [[nodiscard]] std::size_t thread_buffer_count() const;
  /// The file being written, or empty for ostream/sink output.
  [[nodiscard]] std::string const& path() const noexcept { return path_; }
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks, std::string path,
                           bool auto_flush, bool async, std::size_t queue_capacity, log_order order, log_format format,
                           int /*tag*/);

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "logging"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  enum class action : std::uint8_t { allocate, allocate_failure, free };
  void log_event(action what, void const* ptr, std::size_t bytes, stream_view stream) noexcept;
  /// Whether this process is a fork()'s child of the one that made the adaptor.
  [[nodiscard]] bool in_forked_child() const noexcept;
  /// In a fork's child: records (once) why its rows are not written.
  void note_forked_child() const noexcept;

  resource_ptr upstream_;
  std::string path_;
  struct file_claim;  // path_, as no other adaptor of this process may open it while this one lives
  std::unique_ptr<file_claim> claim_;  // before logger_: let go after the file is closed
  log_format format_;
  std::uint32_t forks_;  // detail::process_forks when made: another count means a fork's child
  std::shared_ptr<spdlog::logger> logger_;
  struct write_failures;  // what the logger's error handler recorded (shared with it)
  std::shared_ptr<write_failures> failures_;
  std::unique_ptr<detail::async_log_writer> writer_;  // asynchronous, merged; else null
  std::unique_ptr<detail::log_thread_buffers> per_thread_;  // asynchronous, per-thread order; else null
};

}  // namespace mrstack
