#pragma once
/// Allocation logs: the CSV the logging adaptor writes (and RMM's logging adaptor), read
/// into a compact event array that a replay walks without hashing or parsing.
///
/// Format: a header line `Thread,Time,Action,Pointer,Size,Stream` (names compared without
/// case; more columns after these are allowed and ignored), then one row per event:
/// - Thread: any non-empty text (a thread id); each distinct value is one replay thread;
/// - Time: a time of day `H:MM:SS[.ffffff]` (hours 0-23, minutes and seconds 0-59, as
///   both logging adaptors write it) or a number of seconds; checked, not used;
/// - Action: `allocate`, `allocate failure` or `free`;
/// - Pointer, Stream: hexadecimal, with or without `0x` (a stream may be `0`; `(nil)`, as
///   glibc prints a null pointer, is 0);
/// - Size: bytes, decimal.
/// - Stamp (optional, the seventh column, named so in the header): nanoseconds on one
///   monotonic clock, as the logging adaptor writes in per-thread order. A log that has it
///   is read as each thread's rows in file order, the threads merged by stamp (at equal
///   stamps a free before another thread's allocation), whatever the order of its rows in
///   the file; events keep their own line numbers.
/// Blank lines are skipped, and a UTF-8 byte order mark before the header; a file may be
/// gzip-compressed (detected by its content). A binary log (the logging adaptor's
/// `log_format::binary`; log/binary_log.hpp) is read as its CSV text, wherever text is
/// taken.
///
/// The reader checks the whole log before anything replays: a malformed line, a free of
/// a pointer that is not live, a second allocation of a live pointer or a free whose size
/// differs from its allocation's is a `log_error` naming the file, line and column, what
/// was found and what was expected (quoting at most `quoted_line_chars` characters of the
/// line). Rows with a null pointer and size 0 (an allocation of nothing, or a free of
/// nullptr) are skipped; a free of a null pointer with a non-zero size is an error (no
/// allocation could have returned it). Live bytes, or the log's total allocated bytes,
/// that would pass 2^64 - 1 are an error (no real log holds them; a sum that wrapped would
/// report nonsense). `allocate failure` rows are recorded (see `recorded_failures`) and are
/// not events; one of 0 bytes (a refusal of nothing) is skipped, as null rows are.
///
/// Bounds (`log_limits`, overridable): the decompressed text may hold at most
/// `max_text_bytes` (default 4 GiB: the text is held in memory while it is parsed) and a
/// line at most `max_line_bytes` (default 64 KiB; a row is under 200 bytes). A NUL byte is
/// an error naming its line and byte offset; bytes after the last gzip stream that do not
/// start another gzip stream are an error.
///
/// Each allocation gets a dense index (`log_event::allocation`): a replay keeps its live
/// pointers in a plain array indexed by it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <mrstack/error.hpp>

namespace mrstack {

enum class log_action : std::uint8_t { allocate, free };

/// One replayable event (16 bytes).
struct log_event {
  std::size_t bytes = 0;
  std::uint32_t allocation = 0;  ///< dense index of the allocation this event makes or frees
  std::uint16_t stream = 0;      ///< index into `allocation_log::streams`
  log_action action = log_action::allocate;
};

/// An `allocate failure` row: the program asked for `bytes` and was refused.
struct recorded_failure {
  std::uint32_t line = 0;
  std::size_t bytes = 0;
  std::uint32_t thread = 0;
  std::uint32_t before_event = 0;  ///< the index of the event that follows it in the log (events.size() at the end)
  std::uint16_t stream = 0;        ///< index into `allocation_log::streams`
};

/// Bounds on what the reader accepts (see the header comment).
struct log_limits {
  std::size_t max_text_bytes = std::size_t{4} << 30;
  std::size_t max_line_bytes = std::size_t{64} << 10;
};

/// At most this many characters of an offending line are quoted in a `log_error`.
inline constexpr std::size_t quoted_line_chars = 200;

struct allocation_log {
  std::string source;                     ///< the file name (or what the caller called it)
  std::vector<log_event> events;          ///< allocate/free rows, in log order
  std::vector<std::uint32_t> event_lines; ///< the line each event came from
  std::vector<std::uint32_t> event_threads;  ///< the thread index of each event
  std::vector<std::vector<std::uint32_t>> events_by_thread;  ///< per thread: its event indices, in order
  std::vector<std::string> thread_names;  ///< the log's thread ids, by thread index
  std::vector<std::uint64_t> streams;     ///< the log's stream handles, by stream index (first seen first)
  std::vector<std::string> stream_names;  ///< each stream as the log first writes it ("0x5500", "0")
  std::size_t allocation_count = 0;       ///< allocate events (= distinct allocation indices)
  std::vector<std::uint32_t> allocation_events;   ///< per allocation: the index of its allocate event
  std::vector<std::uint32_t> leaked_allocations;  ///< allocations the log never frees
  std::size_t leaked_bytes = 0;
  std::vector<recorded_failure> recorded_failures;  ///< `allocate failure` rows
  std::size_t peak_live_bytes = 0;        ///< most bytes live at once, replaying in log order
  std::size_t total_allocated_bytes = 0;
  std::size_t skipped_null_rows = 0;      ///< null-pointer, zero-size rows skipped
  std::uint32_t line_count = 0;           ///< lines read, header included

  [[nodiscard]] std::size_t free_count() const noexcept { return events.size() - allocation_count; }
};

/// A malformed or inconsistent log: what, and where (1-based line and column; column 0
/// when the problem is the whole line or file).
class log_error : public logic_error {
 public:
  log_error(std::string const& message, std::string file, std::size_t line, std::size_t column)
      : logic_error{message}, file_{std::move(file)}, line_{line}, column_{column} {}
  [[nodiscard]] std::string const& file() const noexcept { return file_; }
  [[nodiscard]] std::size_t line() const noexcept { return line_; }
  [[nodiscard]] std::size_t column() const noexcept { return column_; }

 private:
  std::string file_;
  std::size_t line_;
  std::size_t column_;
};

/// Reads and checks a log file, plain or gzip-compressed. Throws `log_error` (also for a
/// file that cannot be opened or read).
allocation_log read_allocation_log(std::string const& path, log_limits const& limits = {});

/// Parses and checks log text; `source` names it in errors.
allocation_log parse_allocation_log(std::string_view text, std::string source = "<log>", log_limits const& limits = {});

/// The log's text: the file's bytes, gunzipped when they start with the gzip magic number
/// (several gzip streams one after another are one text), and a binary log's CSV text
/// when they (so gunzipped) start with its magic. Throws `log_error` for a file
/// that cannot be read, damaged or cut-short gzip data, bytes after the last gzip stream,
/// or text over `limits.max_text_bytes`.
std::string read_log_text(std::string const& path, log_limits const& limits = {});

/// Peak live bytes when the allocations flagged in `skipped` (by allocation index; e.g.
/// those a replay failed to allocate) never happen, nor their frees.
std::size_t peak_live_bytes_without(allocation_log const& log, std::vector<bool> const& skipped);

}  // namespace mrstack
