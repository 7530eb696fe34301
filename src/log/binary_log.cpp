// Binary allocation logs -> their CSV text (layout: include/mrstack/log/binary_log.hpp).
// The rows are written by the logging adaptor's own row formatter, so a binary log reads
// exactly as the same events logged as CSV in per-thread order would.
#include <mrstack/log/binary_log.hpp>

#include <cstring>

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
  if (h.reserved != 0) { fail_at(source, 24, "the reserved header field is " + hex(h.reserved) + ", expected 0"); }
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

}  // namespace

bool is_binary_log(std::string_view bytes) noexcept {
  return bytes.size() >= sizeof binary_log::file_magic &&
         std::memcmp(bytes.data(), binary_log::file_magic, sizeof binary_log::file_magic) == 0;
}

std::string binary_log_to_csv(std::string_view bytes, std::string const& source, log_limits const& limits) {
  auto const header = checked_header(bytes, source);
  std::string text = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n";
  std::size_t used = text.size();
  detail::row_writer writer;
  for (std::size_t at = binary_log::file_header_bytes; at < bytes.size();) {
    std::uint32_t const count = checked_block(bytes, at, source);
    at += binary_log::block_header_bytes;
    std::uint64_t thread = 0;
    for (std::uint32_t i = 0; i < count; ++i, at += binary_log::record_bytes) {
      auto const r = load<binary_log::record>(bytes, at);
      auto const what = static_cast<binary_log::kind>(r.stamp_and_kind >> binary_log::kind_shift);
      std::uint64_t const stamp = r.stamp_and_kind & binary_log::stamp_mask;
      if (what == binary_log::kind::thread) {
        if (stamp != 0 || r.size != 0 || r.stream != 0) {
          fail_at(source, at, "a thread record with a stamp, size or stream (its fields after the id must be 0)");
        }
        thread = r.pointer;
        continue;
      }
      if (i == 0) { fail_at(source, at, "a block's first record must name its thread (kind 3)"); }
      if (used + detail::max_row_length > limits.max_text_bytes) {
        fail_at(source, at,
                "the log's CSV text is larger than " + std::to_string(limits.max_text_bytes) +
                    " bytes, the reader's limit (raise it with --max-log-bytes)");
      }
      if (text.size() < used + detail::max_row_length) { text.resize(used + detail::max_row_length); }
      // Wrapping, not overflowing, on a damaged start time (the Time column is only shown).
      auto const wall = static_cast<std::int64_t>(static_cast<std::uint64_t>(header.start_wall_ns) + stamp);
      detail::log_record const row{thread, wall, r.pointer, r.size, r.stream, static_cast<std::uint8_t>(what)};
      char* const end = writer.put_stamped(text.data() + used, row, stamp);
      used = static_cast<std::size_t>(end - text.data());
    }
  }
  text.resize(used);
  return text;
}

}  // namespace mrstack
