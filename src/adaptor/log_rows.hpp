#pragma once
// The logging adaptor's rows (internal to src/adaptor): the record a call leaves and the
// hand-written CSV formatting every mode shares (RMM's columns; see
// include/mrstack/adaptor/logging_resource_adaptor.hpp).
#include <cstddef>
#include <cstring>
#include <string_view>
#include <cstdint>
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

inline constexpr char const* action_text[] = {"allocate", "allocate failure", "free"};

/// Local wall-clock "HH:MM:SS", recomputed only when the second changes (localtime_r
/// takes the time-zone lock and costs far more than the rest of a row).
class clock_text {
 public:
  char* put(char* out, std::int64_t time_ns) {
    std::int64_t const seconds = time_ns >= 0 ? time_ns / 1'000'000'000 : (time_ns - 999'999'999) / 1'000'000'000;
    if (seconds != second_) {
      second_ = seconds;
      std::time_t const t = static_cast<std::time_t>(seconds);
      std::tm local{};
      localtime_r(&t, &local);
      two_digits(hms_ + 0, local.tm_hour);
      hms_[2] = ':';
      two_digits(hms_ + 3, local.tm_min);
      hms_[5] = ':';
      two_digits(hms_ + 6, local.tm_sec);
    }
    for (char c : hms_) { *out++ = c; }
    *out++ = '.';
    // Six digits as three pairs: two short divisions beside each other, not six in a row.
    auto const micros = static_cast<std::uint32_t>((time_ns - seconds * 1'000'000'000) / 1000);
    std::uint32_t const head = micros / 10000;
    std::uint32_t const tail = micros - head * 10000;
    put_two_digits(out, head);
    put_two_digits(out + 2, tail / 100);
    put_two_digits(out + 4, tail % 100);
    return out + 6;
  }

 private:
  static void two_digits(char* out, int v) {
    out[0] = static_cast<char>('0' + v / 10);
    out[1] = static_cast<char>('0' + v % 10);
  }
  std::int64_t second_{std::numeric_limits<std::int64_t>::min()};
  char hms_[8]{};
};

inline constexpr std::size_t max_row_length = 160;

/// Writes one row, newline included; returns the end.
inline char* put_row(char* out, log_record const& r, clock_text& clock) {
  out = put_decimal(out, r.thread);
  *out++ = ',';
  out = clock.put(out, r.time_ns);
  *out++ = ',';
  std::string_view const action = action_text[r.action];
  std::memcpy(out, action.data(), action.size());
  out += action.size();
  *out++ = ',';
  if (r.pointer == 0) {
    for (char c : {'(', 'n', 'i', 'l', ')'}) { *out++ = c; }
  } else {
    *out++ = '0';
    *out++ = 'x';
    out = put_hex(out, r.pointer);
  }
  *out++ = ',';
  out = put_decimal(out, r.bytes);
  *out++ = ',';
  if (r.stream == 0) {
    *out++ = '0';
  } else {
    *out++ = '0';
    *out++ = 'x';
    out = put_hex(out, r.stream);
  }
  *out++ = '\n';
  return out;
}

/// Writes one row of per-thread order: the row, then the Stamp column (`stamp`, ns since
/// logging began) before the newline; returns the end.
inline char* put_stamped_row(char* out, log_record const& r, clock_text& clock, std::uint64_t stamp) {
  out = put_row(out, r, clock);
  out[-1] = ',';
  out = put_decimal(out, stamp);
  *out++ = '\n';
  return out;
}

}  // namespace mrstack::detail
