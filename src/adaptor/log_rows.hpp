#pragma once
// The logging adaptor's rows (internal to src/adaptor): the record a call leaves and the
// hand-written CSV formatting every mode shares (RMM's columns; see
// include/mrstack/adaptor/logging_resource_adaptor.hpp).
//
// A row is written by the thread that logged it (or, in synchronous mode, at once), tens
// of millions of times a second on a busy log, so what a thread's rows share is kept
// between them in its `row_writer`: the text of its Thread and Stream columns and of the
// current second. Fields are stored in fixed-size blocks that may run past their end
// (the next field overwrites the excess), so no copy's length waits on a computed one;
// the last column is copied exactly. tests/adaptor_logging_format.cpp holds the text to a
// printf reference.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <limits>

#include "log_digits.hpp"

namespace mrstack::detail {

/// One event, stamped on the calling thread; formatted later (asynchronous mode) or at once.
struct log_record {
  std::size_t thread;
  std::int64_t time_ns;  // system_clock, since the epoch
  std::uintptr_t pointer;
  std::size_t bytes;
  std::uintptr_t stream;
  std::uint8_t action;
};

/// Bytes a row may need: the longest row is 113 characters (a 20-digit thread id and
/// size, "allocate failure", 16 hex digits of pointer and stream), and a per-thread row's
/// Stamp column adds at most 21; the rest is the spill of the fixed-size stores.
inline constexpr std::size_t max_row_length = 160;
/// Bytes `row_writer::put` may store at its `out`: the longest row. The blocks a field
/// spills are overwritten by the fields after it, and the last column is copied exactly,
/// so nothing is stored past the longest row (and at most 10 bytes past a shorter one).
inline constexpr std::size_t row_room = 113;

/// Local wall-clock "HH:MM:SS.uuuuuu" (15 characters, stored exactly). The
/// "HH:MM:SS." part is recomputed only when the second changes (localtime_r takes the
/// time-zone lock and costs far more than the rest of a row).
class clock_text {
 public:
  char* put(char* out, std::int64_t time_ns) noexcept {
    constexpr std::int64_t ns_per_second = 1'000'000'000;
    // Floored: the second that contains the instant, also before 1970 (no overflow at
    // the int64 ends, unlike subtracting 999'999'999 first).
    std::int64_t seconds = time_ns / ns_per_second;
    std::int64_t ns = time_ns % ns_per_second;
    if (ns < 0) {
      --seconds;
      ns += ns_per_second;
    }
    if (seconds != second_) [[unlikely]] { set_second(seconds); }
    std::memcpy(out, hms_, 9);
    // Six digits as three pairs: two short divisions beside each other, not six in a row.
    auto const micros = static_cast<std::uint32_t>(ns / 1000);
    std::uint32_t const head = micros / 10000;
    std::uint32_t const tail = micros - head * 10000;
    put_two_digits(out + 9, head);
    put_two_digits(out + 11, tail / 100);
    put_two_digits(out + 13, tail % 100);
    return out + 15;
  }

 private:
  void set_second(std::int64_t seconds) noexcept {
    second_ = seconds;
    std::time_t const t = static_cast<std::time_t>(seconds);
    std::tm local{};  // stays 00:00:00 where localtime_r fails (a year past int)
    localtime_r(&t, &local);
    put_two_digits(hms_ + 0, static_cast<std::uint32_t>(local.tm_hour));
    hms_[2] = ':';
    put_two_digits(hms_ + 3, static_cast<std::uint32_t>(local.tm_min));
    hms_[5] = ':';
    put_two_digits(hms_ + 6, static_cast<std::uint32_t>(local.tm_sec));
    hms_[8] = '.';
  }
  std::int64_t second_{std::numeric_limits<std::int64_t>::min()};  // no second's text yet
  char hms_[9]{};
};

/// A column whose text seldom changes from one of a thread's rows to the next (its
/// Thread, its Stream): kept with the value it shows and rebuilt only when the value
/// changes, so a row copies it as one fixed-size block. Starts as the text of 0, so it
/// needs no first-use flag (and a thread_local of it no guard).
class cached_column {
 public:
  static constexpr std::size_t room = 24;  // the longest text is 21, what formatters spill included

  template <std::size_t N>
  constexpr explicit cached_column(char const (&text_of_zero)[N]) noexcept : length_{N - 1} {
    for (std::size_t i = 0; i + 1 < N; ++i) { text_[i] = text_of_zero[i]; }
  }

  /// Writes the text of `value` (`format(char*, value)` makes it and returns its end);
  /// stores `room` bytes at `out` and returns the text's end.
  template <typename Format>
  char* put(char* out, std::uint64_t value, Format format) noexcept {
    refresh(value, format);
    std::memcpy(out, text_, room);
    return out + length_;
  }

  /// As `put`, but stores the text only, for a row's last column: in the merged mode's
  /// slots a spill past the row's end could reach a cache line the row does not need,
  /// which the writer thread, on another core, would then pull over as well.
  template <typename Format>
  char* put_last(char* out, std::uint64_t value, Format format) noexcept {
    refresh(value, format);
    copy_exactly(out, text_, length_);
    return out + length_;
  }

 private:
  template <typename Format>
  void refresh(std::uint64_t value, Format format) noexcept {
    if (value != value_) [[unlikely]] {
      value_ = value;
      length_ = static_cast<std::size_t>(format(text_, value) - text_);
    }
  }

  /// Copies n (1 to 24) bytes in two or three overlapping blocks, not by a call to memcpy;
  /// n is the same row after row, so its branches predict well.
  static void copy_exactly(char* to, char const* from, std::size_t n) noexcept {
    if (n >= 8) {
      std::memcpy(to, from, 8);
      if (n > 16) { std::memcpy(to + 8, from + 8, 8); }
      std::memcpy(to + n - 8, from + n - 8, 8);
    } else if (n >= 4) {
      std::memcpy(to, from, 4);
      std::memcpy(to + n - 4, from + n - 4, 4);
    } else {
      to[0] = from[0];
      if (n > 1) { std::memcpy(to + n - 2, from + n - 2, 2); }
    }
  }

  std::uint64_t value_ = 0;
  std::size_t length_;
  char text_[room]{};
};

/// A thread's row formatter: keep one per thread (thread_local) and write its rows with it.
class row_writer {
 public:
  /// Writes one row, newline included; returns the end. Stores up to `row_room` bytes.
  char* put(char* out, log_record const& r) noexcept {
    out = thread_.put(out, r.thread, [](char* text, std::uint64_t id) { return put_separator(put_decimal(text, id)); });
    out = put_separator(clock_.put(out, r.time_ns));
    out = put_action(out, r.action);
    out = put_separator(put_pointer(out, r.pointer));
    out = put_separator(put_decimal(out, r.bytes));
    return stream_.put_last(out, r.stream, [](char* text, std::uint64_t stream) { return put_stream(text, stream); });
  }

  /// Writes one row of per-thread order: the row with the Stamp column (`stamp`, ns since
  /// logging began) before its newline; returns the end. Stores up to `max_row_length` bytes.
  char* put_stamped(char* out, log_record const& r, std::uint64_t stamp) noexcept {
    out = put(out, r);
    out[-1] = ',';
    out = put_stamp(out, stamp);
    *out++ = '\n';
    return out;
  }

 private:
  /// A thread's stamps rise, and all but their last eight digits change only every 0.1 s:
  /// those are kept as a column's text.
  char* put_stamp(char* out, std::uint64_t stamp) noexcept {
    constexpr std::uint64_t block = 100'000'000;
    if (stamp < block) { return put_short_decimal(out, static_cast<std::uint32_t>(stamp)); }
    std::uint64_t const head = stamp / block;
    out = stamp_head_.put(out, head, [](char* text, std::uint64_t v) { return put_decimal(text, v); });
    return put_eight_digits(out, static_cast<std::uint32_t>(stamp - head * block));
  }

  static char* put_separator(char* out) noexcept {
    *out = ',';
    return out + 1;
  }

  /// The Action column and its comma, from a table of fixed-size entries: 17 bytes copied
  /// whatever the action (the longest, "allocate failure,", is 17), so no copy's length
  /// waits on the action; a shorter one's excess is overwritten by the columns after it.
  static char* put_action(char* out, std::uint8_t action) noexcept {
    struct text {
      char chars[18];  // and the literal's '\0'
      std::size_t length;
    };
    static constexpr text actions[] = {{"allocate,", 9}, {"allocate failure,", 17}, {"free,", 5}};
    std::memcpy(out, actions[action].chars, 17);
    return out + actions[action].length;
  }

  /// "0x" and the hex digits; "(nil)" for the null an allocate failure records.
  static char* put_pointer(char* out, std::uintptr_t pointer) noexcept {
    if (pointer == 0) [[unlikely]] {
      std::memcpy(out, "(nil)", 5);
      return out + 5;
    }
    std::memcpy(out, "0x", 2);
    return put_hex(out + 2, pointer);
  }

  /// The Stream column and the row's newline: "0" for the default stream (as RMM writes a
  /// null handle), else "0x" and the hex digits.
  static char* put_stream(char* out, std::uintptr_t stream) noexcept {
    if (stream == 0) {
      std::memcpy(out, "0\n", 2);
      return out + 2;
    }
    std::memcpy(out, "0x", 2);
    out = put_hex(out + 2, stream);
    *out = '\n';
    return out + 1;
  }

  cached_column thread_{"0,"};
  clock_text clock_;
  cached_column stream_{"0\n"};
  cached_column stamp_head_{"0"};
};

}  // namespace mrstack::detail
