// Binary allocation logs -> their CSV text (layout: include/mrstack/log/binary_log.hpp).
// The rows are written by the logging adaptor's own row formatter, so a binary log reads
// exactly as the same events logged as CSV in per-thread order would.
#include <mrstack/log/binary_log.hpp>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>

#include "../adaptor/log_rows.hpp"

namespace mrstack {

namespace {

[[noreturn]] void fail_at(std::string const& source, std::size_t offset, std::string const& what) {
  throw log_error(source + ": binary log, byte offset " + std::to_string(offset) + ": " + what, source, 0, 0);
}

std::string hex(std::uint64_t v) {
  char text[19] = "0x";
  char* const end = detail::put_hex(text + 2, v);
  return std::string{text, end};
}

template <typename T>
T load(std::string_view bytes, std::size_t at) noexcept {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

binary_log::file_header checked_header(std::string_view bytes, std::string const& source) {
  if (bytes.size() < binary_log::file_header_bytes) {
    fail_at(source, 0,
            "cut short: the file header takes " + std::to_string(binary_log::file_header_bytes) + " bytes, the log has " +
                std::to_string(bytes.size()));
  }
  auto const h = load<binary_log::file_header>(bytes, 0);
  if (std::memcmp(h.magic, binary_log::file_magic, sizeof h.magic) != 0) {
    fail_at(source, 0, "not a binary log (its first 8 bytes are not the magic \"MRSTLOG\\x01\")");
  }
  if (h.version != binary_log::format_version) {
    fail_at(source, 8,
            "format version " + std::to_string(h.version) + "; this reader reads version " +
                std::to_string(binary_log::format_version));
  }
  if (h.record_size != binary_log::record_bytes) {
    fail_at(source, 12,
            "records of " + std::to_string(h.record_size) + " bytes; version 1 records are " +
                std::to_string(binary_log::record_bytes));
  }
  if (h.clock != binary_log::clock_ns && h.clock != binary_log::clock_ticks) {
    fail_at(source, 24, "clock " + hex(h.clock) + ": expected 0 (nanoseconds) or 1 (time-stamp counter ticks)");
  }
  return h;
}

/// Checks the block header at `at`; returns its record count.
std::uint32_t checked_block(std::string_view bytes, std::size_t at, std::string const& source) {
  if (bytes.size() - at < binary_log::block_header_bytes) {
    fail_at(source, at,
            "cut short: " + std::to_string(bytes.size() - at) + " bytes where a block header (" +
                std::to_string(binary_log::block_header_bytes) + " bytes) was expected");
  }
  auto const magic = load<std::uint32_t>(bytes, at);
  if (magic != binary_log::block_magic) {
    fail_at(source, at, "expected a block (magic " + hex(binary_log::block_magic) + "), found " + hex(magic));
  }
  auto const count = load<std::uint32_t>(bytes, at + 4);
  if (count == 0) { fail_at(source, at + 4, "a block of 0 records"); }
  std::size_t const follow = bytes.size() - at - binary_log::block_header_bytes;
  if (count > follow / binary_log::record_bytes) {
    fail_at(source, at,
            "the block holds " + std::to_string(count) + " records (" +
                std::to_string(std::size_t{count} * binary_log::record_bytes) + " bytes) but " + std::to_string(follow) +
                " bytes follow: the log is cut short (did the logging process end before it flushed?)");
  }
  return count;
}

/// Calls `visit(offset, record, index in its block)` for every record, block by block,
/// each block's header checked first.
template <typename Visit>
void for_each_record(std::string_view bytes, std::string const& source, Visit visit) {
  for (std::size_t at = binary_log::file_header_bytes; at < bytes.size();) {
    std::uint32_t const count = checked_block(bytes, at, source);
    at += binary_log::block_header_bytes;
    for (std::uint32_t i = 0; i < count; ++i, at += binary_log::record_bytes) {
      visit(at, load<binary_log::record>(bytes, at), i);
    }
  }
}

/// Tick stamps to nanoseconds: piecewise linear through (ticks, ns) points taken together,
/// (0, 0) the first; past the last point at the rate of the whole span. Points that would
/// make time run backwards are left out, so the conversion never reverses two stamps.
class tick_scale {
 public:
  void add(std::uint64_t ticks, std::uint64_t ns) { points_.push_back({ticks, ns}); }
  [[nodiscard]] std::uint64_t ns(std::uint64_t ticks) {
    if (!sorted_) { sort_points(); }
    auto const next = std::upper_bound(points_.begin(), points_.end(), ticks,
                                       [](std::uint64_t t, point const& p) { return t < p.ticks; });
    point const& a = next == points_.end() ? points_.front() : *std::prev(next);
    point const& b = next == points_.end() ? points_.back() : *next;
    if (b.ticks == a.ticks) { return a.ns; }  // only the origin: no rate known
    // Exact, in integers: a rate rounded first put a stamp lying on a point's line one ns
    // early, and a free then sorted with the allocation it follows. Both factors are below
    // 2^64, so the product fits in 128 bits; the quotient is floored, as Python's // is.
    __extension__ using u128 = unsigned __int128;
    u128 const scaled = static_cast<u128>(ticks - a.ticks) * (b.ns - a.ns) / (b.ticks - a.ticks);
    u128 const value = static_cast<u128>(a.ns) + scaled;
    return value >= binary_log::stamp_mask ? binary_log::stamp_mask : static_cast<std::uint64_t>(value);
  }

 private:
  struct point {
    std::uint64_t ticks;
    std::uint64_t ns;
  };
  void sort_points() {
    // By (ticks, ns): of points at equal ticks the smallest ns is kept, whatever their order
    // in the file (the Python reader keeps the same one).
    std::sort(points_.begin(), points_.end(),
              [](point const& a, point const& b) { return a.ticks != b.ticks ? a.ticks < b.ticks : a.ns < b.ns; });
    std::vector<point> kept{{0, 0}};
    for (point const& p : points_) {
      if (p.ticks > kept.back().ticks && p.ns >= kept.back().ns) { kept.push_back(p); }
    }
    points_ = std::move(kept);
    sorted_ = true;
  }
  std::vector<point> points_;
  bool sorted_ = false;
};

}  // namespace

bool is_binary_log(std::string_view bytes) noexcept {
  return bytes.size() >= sizeof binary_log::file_magic &&
         std::memcmp(bytes.data(), binary_log::file_magic, sizeof binary_log::file_magic) == 0;
}

std::string binary_log_to_csv(std::string_view bytes, std::string const& source, log_limits const& limits) {
  auto const header = checked_header(bytes, source);
  bool const ticks = header.clock == binary_log::clock_ticks;
  // Tick stamps become nanoseconds through the points the thread records carry (a pass of
  // its own: a block's stamps come before the point its write-out took).
  tick_scale scale;
  for_each_record(bytes, source, [&](std::size_t at, binary_log::record const& r, std::uint32_t) {
    bool const is_thread = (r.stamp_and_kind >> binary_log::kind_shift) == 3;
    if (!is_thread) { return; }
    if ((r.stamp_and_kind & binary_log::stamp_mask) != 0 || (!ticks && (r.size != 0 || r.stream != 0))) {
      fail_at(source, at,
              ticks ? "a thread record with a stamp (its stamp field must be 0)"
                    : "a thread record with a stamp, size or stream (its fields after the id must be 0)");
    }
    if (ticks && r.size != 0) { scale.add(r.size, r.stream); }
  });
  std::string text = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n";
  std::size_t used = text.size();
  detail::row_writer writer;
  std::uint64_t thread = 0;
  for_each_record(bytes, source, [&](std::size_t at, binary_log::record const& r, std::uint32_t index) {
    auto const what = static_cast<binary_log::kind>(r.stamp_and_kind >> binary_log::kind_shift);
    if (what == binary_log::kind::thread) {
      thread = r.pointer;
      return;
    }
    if (index == 0) { fail_at(source, at, "a block's first record must name its thread (kind 3)"); }
    if (text.size() < used + detail::max_row_length) { text.resize(used + detail::max_row_length); }
    std::uint64_t const raw = r.stamp_and_kind & binary_log::stamp_mask;
    std::uint64_t const stamp = ticks ? scale.ns(raw) : raw;
    // Wrapping, not overflowing, on a damaged start time (the Time column is only shown).
    auto const wall = static_cast<std::int64_t>(static_cast<std::uint64_t>(header.start_wall_ns) + stamp);
    detail::log_record const row{thread, wall, r.pointer, r.size, r.stream, static_cast<std::uint8_t>(what)};
    char* const end = writer.put_stamped(text.data() + used, row, stamp);
    used = static_cast<std::size_t>(end - text.data());
    // The row's exact length, as a CSV log's text is held to the limit (the room for one
    // more row is all it holds past it).
    if (used > limits.max_text_bytes) {
      fail_at(source, at,
              "the log's CSV text is larger than " + std::to_string(limits.max_text_bytes) +
                  " bytes, the reader's limit (raise it with --max-log-bytes)");
    }
  });
  text.resize(used);
  return text;
}

}  // namespace mrstack
