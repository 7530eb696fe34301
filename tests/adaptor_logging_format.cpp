// The logging adaptor's row text, on its own: the hand-written formatter
// (src/adaptor/log_rows.hpp) against a plain printf formatter of the documented format,
// over edge values and a million random rows written one after another through one
// formatter (so whatever it keeps between rows — the second's text, a thread's, a
// stream's, a stamp's leading digits — is checked when the value changes and when it
// does not); digits alone against std::to_chars. Also: the writer stores nothing past
// the room it promises, and little past a row's end (fields are stored in fixed-size
// blocks that spill past their end; the merged mode's slots rely on both).
#include <catch2/catch.hpp>

#include "../src/adaptor/log_rows.hpp"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>
#include <string>
#include <vector>

using mrstack::detail::log_record;

namespace {

constexpr std::int64_t ns_per_second = 1'000'000'000;
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

/// The format as docs/adaptors.md states it, by the obvious means.
std::string reference_row(log_record const& r) {
  std::int64_t seconds = r.time_ns / ns_per_second;
  std::int64_t ns = r.time_ns % ns_per_second;
  if (ns < 0) {  // the Time column floors: the second that contains the instant
    --seconds;
    ns += ns_per_second;
  }
  std::time_t const t = static_cast<std::time_t>(seconds);
  std::tm local{};
  localtime_r(&t, &local);
  char pointer[32] = "(nil)";
  if (r.pointer != 0) { std::snprintf(pointer, sizeof pointer, "0x%" PRIxPTR, r.pointer); }
  char stream[32] = "0";
  if (r.stream != 0) { std::snprintf(stream, sizeof stream, "0x%" PRIxPTR, r.stream); }
  static char const* const actions[] = {"allocate", "allocate failure", "free"};
  char row[256];
  int const n = std::snprintf(row, sizeof row, "%zu,%02d:%02d:%02d.%06d,%s,%s,%zu,%s\n", r.thread, local.tm_hour,
                              local.tm_min, local.tm_sec, static_cast<int>(ns / 1000), actions[r.action], pointer,
                              r.bytes, stream);
  return std::string(row, static_cast<std::size_t>(n));
}

std::string reference_stamped_row(log_record const& r, std::uint64_t stamp) {
  std::string row = reference_row(r);
  row.pop_back();
  return row + "," + std::to_string(stamp) + "\n";
}

/// The formatter under test, as the adaptor uses it: one per thread, kept across rows.
struct formatter {
  mrstack::detail::row_writer writer;

  /// A plain row (the synchronous and merged modes): stored within `row_room` bytes, and at
  /// most `max_spill` past its own end — a merged-mode slot's second cache line must stay
  /// untouched by a row that ends before it, or the writer's core pulls it over for nothing.
  std::string row(log_record const& r) {
    constexpr std::size_t max_spill = 10;  // a 1-digit pointer's 16-byte store, before ",0,0\n"
    return checked_write(mrstack::detail::row_room, max_spill, [&](char* out) { return writer.put(out, r); });
  }
  /// A per-thread row: the thread's own buffer, where only the room counts.
  std::string stamped_row(log_record const& r, std::uint64_t stamp) {
    return checked_write(mrstack::detail::max_row_length, mrstack::detail::max_row_length,
                         [&](char* out) { return writer.put_stamped(out, r, stamp); });
  }

 private:
  static constexpr char canary = '\x7f';  // never in a row's text, nor in what spills
  /// Runs `write` on a buffer of canaries and checks what it stored: nothing past `room`
  /// bytes, nor more than `max_spill` past the text's end.
  template <typename Write>
  static std::string checked_write(std::size_t room, std::size_t max_spill, Write write) {
    char buffer[mrstack::detail::max_row_length + 64];
    std::fill(std::begin(buffer), std::end(buffer), canary);
    char* const end = write(buffer);
    REQUIRE(end > buffer);
    auto const stored = static_cast<std::size_t>(
        std::find_if(std::rbegin(buffer), std::rend(buffer), [](char c) { return c != canary; }).base() - buffer);
    REQUIRE(stored <= room);
    REQUIRE(stored <= static_cast<std::size_t>(end - buffer) + max_spill);
    return std::string(buffer, end);
  }
};

/// Numbers every digit routine must get right: each digit count's ends, powers of two
/// either side, zero and the largest.
std::vector<std::uint64_t> edge_numbers() {
  std::vector<std::uint64_t> v{0, 1, u64_max, u64_max - 1};
  for (std::uint64_t p = 1; p <= u64_max / 10; p *= 10) {
    for (std::uint64_t x : {p - 1, p, p + 1, 10 * p - 1, 10 * p}) { v.push_back(x); }
  }
  for (int bit = 0; bit < 64; ++bit) {
    std::uint64_t const p = std::uint64_t{1} << bit;
    for (std::uint64_t x : {p - 1, p, p + 1}) { v.push_back(x); }
  }
  return v;
}

/// Random numbers of every bit length alike (uniform ones would nearly all be 19-20 digits).
std::uint64_t random_number(std::mt19937_64& rng) {
  int const bits = static_cast<int>(rng() % 65);
  return bits == 0 ? 0 : rng() >> (64 - bits);
}

std::string describe(log_record const& r) {
  return "thread " + std::to_string(r.thread) + " time " + std::to_string(r.time_ns) + " action " +
         std::to_string(r.action) + " pointer " + std::to_string(r.pointer) + " bytes " + std::to_string(r.bytes) +
         " stream " + std::to_string(r.stream);
}

/// REQUIRE(got == expected), naming the case only when they differ (a message built for
/// each of millions of rows would be most of the test's time, under the sanitizers most).
template <typename Describe>
void require_same(std::string const& got, std::string const& expected, Describe describe_case) {
  if (got == expected) { return; }
  INFO(describe_case());
  REQUIRE(got == expected);
}

}  // namespace

TEST_CASE("log digits: decimal and hex are std::to_chars's, edge and random values") {
  std::mt19937_64 rng{7};
  std::vector<std::uint64_t> values = edge_numbers();
  for (int i = 0; i < 1'000'000; ++i) { values.push_back(random_number(rng)); }
  for (std::uint64_t v : values) {
    char expected[24];
    char got[24 + 16];
    char* const decimal_end = std::to_chars(expected, expected + sizeof expected, v).ptr;
    require_same(std::string(got, mrstack::detail::put_decimal(got, v)), std::string(expected, decimal_end),
                 [&] { return "decimal " + std::to_string(v); });
    char* const hex_end = std::to_chars(expected, expected + sizeof expected, v, 16).ptr;
    require_same(std::string(got, mrstack::detail::put_hex(got, v)), std::string(expected, hex_end),
                 [&] { return "hex " + std::to_string(v); });
  }
}

TEST_CASE("log row text: edge values match the reference formatter") {
  std::vector<std::int64_t> times{0, -1, 1, 999, 1000, ns_per_second - 1, ns_per_second, -ns_per_second,
                                  -ns_per_second - 1, -ns_per_second + 1, 86'399 * ns_per_second + 999'999'999,
                                  1'700'000'000 * ns_per_second + 123'456'789,
                                  std::numeric_limits<std::int64_t>::max(),
                                  std::numeric_limits<std::int64_t>::min()};
  formatter f;
  std::size_t checked = 0;
  for (std::uint64_t n : edge_numbers()) {
    for (std::uint8_t action = 0; action < 3; ++action) {
      for (std::int64_t t : times) {
        // Each number in every column at once, and with the nulls around it.
        for (log_record const& r : {log_record{n, t, n, n, n, action}, log_record{n, t, 0, n, 0, action},
                                    log_record{0, t, n, 0, n, action}}) {
          require_same(f.row(r), reference_row(r), [&] { return describe(r); });
          require_same(f.stamped_row(r, n), reference_stamped_row(r, n), [&] { return describe(r); });
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 10'000);
}

TEST_CASE("log row text: a million random rows through one formatter match the reference") {
  std::mt19937_64 rng{20240611};
  formatter f;
  // Threads and streams come from small pools most of the time (as in a real log, where
  // they repeat row after row) and are fresh otherwise; times and stamps mostly move
  // forward by a little, sometimes jump (times anywhere within 73 years of the epoch).
  std::vector<std::uint64_t> const threads{1, 81234, 4'194'303, u64_max, 0};
  std::vector<std::uint64_t> const streams{0, 0x55d1c2a3b4c0, 2, u64_max};
  std::int64_t time = 1'700'000'000 * ns_per_second;
  std::uint64_t stamp = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    if (rng() % 1000 == 0) {
      time = static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 62)) - (std::int64_t{1} << 61);
    } else {
      time += static_cast<std::int64_t>(rng() % 3'000'000);
    }
    log_record r{};
    r.thread = rng() % 8 == 0 ? random_number(rng) : threads[rng() % threads.size()];
    r.time_ns = time;
    r.action = static_cast<std::uint8_t>(rng() % 3);
    r.pointer = r.action == 1 ? 0 : random_number(rng);
    r.bytes = random_number(rng);
    r.stream = rng() % 8 == 0 ? random_number(rng) : streams[rng() % streams.size()];
    stamp = rng() % 8 == 0 ? random_number(rng) : stamp + rng() % 3'000'000;  // mostly rising, as on a thread
    auto const what = [&] { return "row " + std::to_string(i) + ": " + describe(r); };
    if (i % 2 == 0) {
      require_same(f.row(r), reference_row(r), what);
    } else {
      require_same(f.stamped_row(r, stamp), reference_stamped_row(r, stamp), what);
    }
  }
}

TEST_CASE("log row text: the longest row is 113 characters") {
  formatter f;
  // 20-digit thread and size, "allocate failure", 16 hex digits of pointer and stream (a
  // failure records a null pointer, but the formatter does not rely on it).
  CHECK(f.row(log_record{u64_max, 0, u64_max, u64_max, u64_max, 1}).size() == 113);
  CHECK(f.row(log_record{u64_max, 0, u64_max, u64_max, u64_max, 0}).size() == 105);
  CHECK(f.row(log_record{u64_max, 0, 0, u64_max, u64_max, 1}).size() == 100);
}
