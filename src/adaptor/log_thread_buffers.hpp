#pragma once
// The logging adaptor's per-thread order (internal to src/adaptor): each thread formats
// its rows into a buffer of its own and writes the buffer to the sinks itself, as one
// message, when it fills. No thread merges: the file holds each thread's rows in its own
// order, in runs, and a Stamp column (nanoseconds since logging began, on the monotonic
// clock) orders them all — mrstack's log reader sorts by it.
//
// In binary form (log/binary_log.hpp) a buffer holds one block of 32-byte records instead
// of rows of text: no formatting on the logging thread, and less than half the bytes.
//
// Why: the merged asynchronous log is bounded by its one writer (about 9 M rows a second
// on an H200 host's core), while 16 threads on a bare pool make over 100 M calls a
// second. Here every thread pays for its own rows and nothing else; the sink's lock is
// taken once per buffer (thousands of rows).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/sharded_counters.hpp>

#include "log_rows.hpp"

namespace spdlog {
class logger;
}

namespace mrstack::detail {

class log_thread_buffers {
 public:
  /// Each thread's buffer holds `buffer_bytes` of text; `write_each_row`: no buffering
  /// (auto_flush), every row goes to the sinks at once. `binary`: blocks of records, the
  /// file header written here (the logger's formatter must add no newline).
  log_thread_buffers(std::shared_ptr<spdlog::logger> logger, std::size_t buffer_bytes, bool write_each_row,
                     bool binary = false);
  ~log_thread_buffers();  // writes out what is left
  log_thread_buffers(log_thread_buffers const&) = delete;
  log_thread_buffers& operator=(log_thread_buffers const&) = delete;

  /// Stamps `record` (its time set here) and appends its row to this thread's buffer.
  /// By reference: a copy made by value read the caller's fresh stores back in 16-byte
  /// pieces, which the CPU cannot forward from 8-byte ones (half of log_event's time).
  void push(log_record& record) noexcept;
  /// Writes every buffer out and flushes the sinks: every row logged before is then in them.
  void flush();

 private:
  struct alignas(64) buffer {
    explicit buffer(std::size_t bytes) : text(bytes) {}
    lean_mutex mutex;  // the shard's threads (one, unless more than 64 run) and flush()
    std::vector<char> text;
    std::size_t used = 0;
    std::uint32_t records = 0;  // binary: in the block being filled, thread records included
    std::size_t thread = 0;     // binary: the thread its last thread record named
  };
  buffer* buffer_for(std::size_t shard) noexcept;
  /// Appends `record`'s row (text) or record (binary) to `b`, stamped now.
  void put_row(buffer& b, log_record& record) noexcept;
  void put_binary(buffer& b, log_record const& record) noexcept;
  /// Hands `b`'s rows to the sinks as one message (its mutex held).
  void write_out(buffer& b) noexcept;

  std::shared_ptr<spdlog::logger> logger_;
  std::size_t buffer_bytes_;
  bool write_each_row_;
  bool binary_;
  std::int64_t start_ns_;        // steady clock at construction: Stamp 0
  std::int64_t wall_offset_ns_;  // system_clock - steady_clock then: the Time column from stamps
  lean_mutex create_mutex_;
  std::array<std::atomic<buffer*>, counter_shards> buffers_{};
};

}  // namespace mrstack::detail
