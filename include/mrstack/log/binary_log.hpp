#pragma once
/// Binary allocation logs: what the logging adaptor writes with `log_format::binary`
/// (per-thread order, 32 bytes an event instead of some 75 characters of CSV, and no
/// formatting on the logging thread), and their CSV form.
///
/// Layout (little-endian, as written on the x86-64 and AArch64 hosts mrstack runs on):
/// - a 32-byte file header: the 8 bytes `file_magic`, u32 `format_version`, u32
///   `record_bytes` (32), i64 the wall-clock time (system clock, ns since the epoch) at
///   stamp 0, u64 the clock of the stamps: `clock_ns` (0: nanoseconds on the monotonic
///   clock) or `clock_ticks` (1: the CPU's time-stamp counter, see below);
/// - then blocks, each written whole by one thread: u32 `block_magic`, u32 the number
///   of records that follow (at least one), then the records;
/// - a record is four u64: the stamp (ns since logging began, on the monotonic clock,
///   below 2^62) with the record's kind in its top two bits, the pointer, the size and
///   the stream handle. Kinds: 0 allocate, 1 allocate failure, 2 free, 3 thread: the
///   pointer field holds the OS thread id of the event records after it, its stamp is 0,
///   and its size and stream are 0 — or, with `clock_ticks`, a point (ticks, ns) since
///   stamp 0 read together when the block was written (ticks 0: none). A block's first
///   record is a thread record.
/// - `clock_ticks` stamps are time-stamp counter ticks since stamp 0 (read with `rdtscp`,
///   which waits for the loads before it, as the monotonic clock's read does); a reader
///   turns them into nanoseconds piecewise linearly through the points, so their order is
///   kept. The adaptor uses them where the kernel keeps time by the same counter.
///
/// A block holds one thread's records in its order (a thread record switches thread
/// when threads share a buffer); merged by stamp (each thread's records in file order, at
/// equal stamps a free before another thread's allocation) the events are a valid serial
/// history, as in the CSV per-thread order.
///
/// Reading: `read_allocation_log`, `read_log_text` and `parse_allocation_log` accept a
/// binary log (also gzip-compressed) wherever they accept CSV: its text is the CSV the
/// adaptor would have written in per-thread order (`binary_log_to_csv`), so a row's line
/// in an error is its event record's number plus one (the header is line 1).
#include <cstdint>
#include <string>
#include <string_view>

#include <mrstack/log/allocation_log.hpp>

namespace mrstack {

namespace binary_log {

inline constexpr char file_magic[8] = {'M', 'R', 'S', 'T', 'L', 'O', 'G', '\x01'};
inline constexpr std::uint32_t format_version = 1;
inline constexpr std::uint32_t record_bytes = 32;
inline constexpr std::uint32_t block_magic = 0x4B4C4252;  // "RBLK" in the file's bytes
inline constexpr std::size_t file_header_bytes = 32;
inline constexpr std::size_t block_header_bytes = 8;
inline constexpr std::uint64_t clock_ns = 0;
inline constexpr std::uint64_t clock_ticks = 1;

enum class kind : std::uint8_t { allocate = 0, allocate_failure = 1, free = 2, thread = 3 };
inline constexpr int kind_shift = 62;
inline constexpr std::uint64_t stamp_mask = (std::uint64_t{1} << kind_shift) - 1;

struct record {
  std::uint64_t stamp_and_kind;
  std::uint64_t pointer;
  std::uint64_t size;
  std::uint64_t stream;
};
static_assert(sizeof(record) == record_bytes);

struct file_header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t record_size;
  std::int64_t start_wall_ns;
  std::uint64_t clock;  // clock_ns or clock_ticks
};
static_assert(sizeof(file_header) == file_header_bytes);

}  // namespace binary_log

/// Whether `bytes` begin as a binary log does (its file magic).
[[nodiscard]] bool is_binary_log(std::string_view bytes) noexcept;

/// The CSV text of a binary log: the per-thread order's header
/// (`Thread,Time,Action,Pointer,Size,Stream,Stamp`) and one row per event record, in file
/// order, as the logging adaptor would have written them (Time in this machine's local
/// time zone; tick stamps converted to nanoseconds). A damaged layout — a wrong magic,
/// version, record size or clock, a block cut short, a block that does not start with a
/// thread record, a thread record with data it may not hold, text past
/// `limits.max_text_bytes` — is a `log_error` naming `source` and the byte offset.
[[nodiscard]] std::string binary_log_to_csv(std::string_view bytes, std::string const& source,
                                            log_limits const& limits = {});

}  // namespace mrstack
