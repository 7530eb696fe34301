// The allocation-log reader: CSV (plain or gzip) -> a checked, compact event array.
#include <mrstack/detail/format.hpp>
#include <mrstack/error.hpp>
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/log/binary_log.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace mrstack {

namespace {

constexpr std::string_view expected_header = "Thread,Time,Action,Pointer,Size,Stream";
constexpr std::string_view column_names[] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) { s.remove_prefix(1); }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) { s.remove_suffix(1); }
  return s;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

/// A field as an error message quotes it: at most 80 characters.
std::string clip(std::string_view text) {
  return text.size() <= 80 ? std::string{text} : std::string{text.substr(0, 80)} + "...";
}

struct field {
  std::string_view text;  // trimmed
  std::size_t column;     // 1-based column of the trimmed text
};

/// `H:MM:SS[.f]` (any number of hour digits) or a plain decimal number of seconds.
bool is_time(std::string_view t) {
  auto digits = [&](std::size_t& i) {
    std::size_t const start = i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])) != 0) { ++i; }
    return i - start;
  };
  // Two digits at t[at], below `bound`.
  auto two_digits_below = [&](std::size_t at, int bound) {
    return (t[at] - '0') * 10 + (t[at + 1] - '0') < bound;
  };
  std::size_t i = 0;
  std::size_t const hours = digits(i);
  if (hours == 0) { return false; }
  if (i < t.size() && t[i] == ':') {
    // A time of day, as the logging adaptors write it: hours 0-23, minutes and seconds 0-59.
    if (hours > 2 || (hours == 2 ? !two_digits_below(0, 24) : false)) { return false; }
    ++i;
    if (digits(i) != 2 || !two_digits_below(i - 2, 60) || i >= t.size() || t[i] != ':') { return false; }
    ++i;
    if (digits(i) != 2 || !two_digits_below(i - 2, 60)) { return false; }
  }
  if (i < t.size() && t[i] == '.') {
    ++i;
    if (digits(i) == 0) { return false; }
  }
  return i == t.size();
}

/// The offset of the first byte that keeps `t` from being printable UTF-8 text (a control
/// character, or a byte no well-formed UTF-8 sequence has there), or npos. A thread id is
/// opaque text, but it is written back into JSON (--json, --timeline), which must be UTF-8.
std::size_t first_unprintable(std::string_view t) {
  for (std::size_t i = 0; i < t.size();) {
    auto const b = static_cast<unsigned char>(t[i]);
    if (b < 0x20 || b == 0x7f) { return i; }
    std::size_t const length = utf8_sequence_length(t, i);
    if (length == 0) { return i; }
    i += length;
  }
  return std::string_view::npos;
}

bool parse_hex(std::string_view t, std::uint64_t& out) {
  if (t == "(nil)") {  // how glibc's %p prints a null pointer (the logging adaptor's failure rows)
    out = 0;
    return true;
  }
  if (t.size() >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) { t.remove_prefix(2); }
  if (t.empty() || t.size() > 16) { return false; }
  auto const [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out, 16);
  return ec == std::errc{} && end == t.data() + t.size();
}

class log_parser {
 public:
  log_parser(std::string_view text, std::string source, log_limits const& limits) : text_{text}, limits_{limits} {
    log_.source = std::move(source);
  }

  allocation_log parse() {
    read_header();
    if (has_stamp_) {
      read_rows_by_stamp();
    } else {
      while (next_line()) {
        if (trim(line_).empty()) { continue; }
        read_row();
      }
    }
    finish();
    return std::move(log_);
  }

 private:
  bool next_line() {
    if (pos_ >= text_.size()) { return false; }
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) { end = text_.size(); }
    line_ = text_.substr(pos_, end - pos_);
    if (!line_.empty() && line_.back() == '\r') { line_.remove_suffix(1); }
    pos_ = end + 1;
    if (line_number_ == std::numeric_limits<std::uint32_t>::max()) { fail(0, "the log has more than 4294967295 lines"); }
    ++line_number_;
    if (line_.size() > limits_.max_line_bytes) {
      fail(0, "the line is " + std::to_string(line_.size()) + " bytes long, more than the reader's limit of " +
                  std::to_string(limits_.max_line_bytes) + " (raise it with --max-line-bytes); it starts: " +
                  quoted(line_.substr(0, quoted_line_chars)));
    }
    return true;
  }

  void split() {
    fields_.clear();
    std::size_t start = 0;
    while (true) {
      std::size_t const comma = line_.find(',', start);
      std::size_t const end = comma == std::string_view::npos ? line_.size() : comma;
      std::string_view raw = line_.substr(start, end - start);
      std::size_t lead = 0;
      while (lead < raw.size() && (raw[lead] == ' ' || raw[lead] == '\t')) { ++lead; }
      fields_.push_back({trim(raw), start + lead + 1});
      if (comma == std::string_view::npos) { break; }
      start = comma + 1;
    }
  }

  void read_header() {
    if (!next_line()) { fail(0, "the log is empty: expected the header " + std::string{expected_header}); }
    split();
    for (std::size_t i = 0; i < std::size(column_names); ++i) {
      if (i >= fields_.size()) {
        fail(line_.size() + 1, "the header ends after " + std::to_string(fields_.size()) +
                                   " columns: expected " + std::string{expected_header} + " (more columns may follow)");
      }
      if (!equal_ignoring_case(fields_[i].text, column_names[i])) {
        fail(fields_[i].column, "header column " + std::to_string(i + 1) + " is '" + clip(fields_[i].text) +
                                    "', expected '" + std::string{column_names[i]} + "': the header must start with " +
                                    std::string{expected_header});
      }
    }
    has_stamp_ = fields_.size() > stamp_column && equal_ignoring_case(fields_[stamp_column].text, "Stamp");
  }

  /// Refuses a row that is the header again (the current line, split): two whole logs
  /// joined, such as two gzipped CSVs concatenated, were reported as "bad Time 'Time'".
  void check_not_a_header() const {
    if (fields_.size() < std::size(column_names)) { return; }
    for (std::size_t i = 0; i < std::size(column_names); ++i) {
      if (!equal_ignoring_case(fields_[i].text, column_names[i])) { return; }
    }
    fail(0, "line " + std::to_string(line_number_) +
                " repeats the header: two logs joined into one (two gzipped CSVs concatenated, say); "
                "replay each log on its own");
  }

  /// A log written in per-thread order (a Stamp column after the six): each thread's rows
  /// in their file order, the threads merged by stamp — at equal stamps a free before an
  /// allocation of another thread, as the adaptor's merged writer does (one thread's own
  /// rows never change places: its allocation and free may share a coarse clock's tick).
  /// Errors still name each row's own line.
  void read_rows_by_stamp() {
    std::vector<stamped_row>& rows = stamped_rows_;
    std::unordered_map<std::string_view, std::vector<std::uint32_t>> rows_of_thread;  // indices, file order
    while (next_line()) {
      if (trim(line_).empty()) { continue; }
      split();
      check_not_a_header();
      if (fields_.size() <= stamp_column) {
        fail(line_.size() + 1, "expected a Stamp in column " + std::to_string(stamp_column + 1) +
                                   " (the header has one), found " + std::to_string(fields_.size()) + " columns");
      }
      field const& f = fields_[stamp_column];
      std::uint64_t stamp = 0;
      auto const [end, ec] = std::from_chars(f.text.data(), f.text.data() + f.text.size(), stamp);
      if (f.text.empty() || ec != std::errc{} || end != f.text.data() + f.text.size()) {
        fail(f.column, "bad Stamp '" + clip(f.text) +
                           "': expected nanoseconds since the log began (decimal digits, at most 18446744073709551615)");
      }
      rows_of_thread[fields_[0].text].push_back(static_cast<std::uint32_t>(rows.size()));
      rows.push_back({stamp, fields_[2].text == "free", line_number_, line_});
    }
    std::uint32_t const last_line = line_number_;
    // A k-way merge of the threads' rows: a heap of each thread's next row.
    struct cursor {
      std::vector<std::uint32_t> const* order;
      std::size_t next;
    };
    std::vector<cursor> heap;
    for (auto const& [thread, order] : rows_of_thread) { heap.push_back({&order, 0}); }
    auto later = [&](cursor const& a, cursor const& b) {  // the heap's top is the earliest row
      stamped_row const& x = rows[(*a.order)[a.next]];
      stamped_row const& y = rows[(*b.order)[b.next]];
      if (x.stamp != y.stamp) { return x.stamp > y.stamp; }
      if (x.is_free != y.is_free) { return y.is_free; }
      return x.line > y.line;
    };
    std::make_heap(heap.begin(), heap.end(), later);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      cursor& c = heap.back();
      stamped_row const& r = rows[(*c.order)[c.next]];
      line_ = r.text;
      line_number_ = r.line;
      row_stamp_ = r.stamp;
      read_row();
      if (++c.next < c.order->size()) {
        std::push_heap(heap.begin(), heap.end(), later);
      } else {
        heap.pop_back();
      }
    }
    line_number_ = last_line;
  }

  /// How an error names another line: in a stamped log, with its Stamp, as rows are
  /// taken in Stamp order and "earlier" means stamped earlier, not above in the file.
  [[nodiscard]] std::string line_ref(std::uint32_t line) const {
    std::string ref = "line " + std::to_string(line);
    if (!has_stamp_) { return ref; }
    auto const it = std::lower_bound(stamped_rows_.begin(), stamped_rows_.end(), line,
                                     [](stamped_row const& r, std::uint32_t l) { return r.line < l; });
    if (it != stamped_rows_.end() && it->line == line) { ref += " (Stamp " + std::to_string(it->stamp) + ")"; }
    return ref;
  }

  /// For a free that no row taken before it allocated, in a stamped log: the row that
  /// allocates `address` after it in Stamp order, if any (its stamp is later, or equal
  /// and its thread's earlier rows come later), named for the message.
  [[nodiscard]] std::string later_allocation_of(std::uint64_t address) {
    std::string found;
    std::string_view const saved_line = line_;
    std::vector<field> const saved_fields = fields_;
    for (stamped_row const& r : stamped_rows_) {
      if (r.is_free) { continue; }
      line_ = r.text;
      split();
      std::uint64_t a = 0;
      if (fields_.size() > 3 && fields_[2].text == "allocate" && parse_hex(fields_[3].text, a) && a == address) {
        found = line_ref(r.line);
        break;
      }
    }
    line_ = saved_line;
    fields_ = saved_fields;
    return found;
  }

  enum class row_kind { allocate, failure, free };

  /// One row's fields, checked: what read_row needs to record it.
  struct row {
    row_kind kind{};
    std::uint64_t address = 0;
    std::size_t bytes = 0;
    std::uint64_t stream_handle = 0;
  };

  /// Checks the fields of the current line (split already) and converts them.
  row parse_fields() {
    check_not_a_header();
    if (fields_.size() < std::size(column_names)) {
      fail(line_.size() + 1, "expected 6 columns (" + std::string{expected_header} + "), found " +
                                 std::to_string(fields_.size()));
    }
    field const& time = fields_[1];
    field const& action = fields_[2];
    field const& pointer = fields_[3];
    field const& size = fields_[4];
    field const& stream = fields_[5];
    if (fields_[0].text.empty()) { fail(fields_[0].column, "the Thread column is empty: expected a thread id"); }
    if (std::size_t const at = first_unprintable(fields_[0].text); at != std::string_view::npos) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(fields_[0].text[at])));
      fail(fields_[0].column + at, std::string{"bad Thread: byte "} + byte +
                                       " is not printable UTF-8 text: expected a thread id");
    }
    if (!is_time(time.text)) {
      fail(time.column, "bad Time '" + clip(time.text) +
                            "': expected a time of day such as 01:00:00.000123 (H:MM:SS[.fraction], hours 0-23, "
                            "minutes and seconds 0-59) or a number of seconds");
    }
    row r;
    if (action.text == "allocate") {
      r.kind = row_kind::allocate;
    } else if (action.text == "free") {
      r.kind = row_kind::free;
    } else if (action.text == "allocate failure") {
      r.kind = row_kind::failure;
    } else {
      fail(action.column, "bad Action '" + clip(action.text) + "': expected allocate, free or allocate failure");
    }
    if (!parse_hex(pointer.text, r.address)) {
      fail(pointer.column, "bad Pointer '" + clip(pointer.text) +
                               "': expected a hexadecimal address such as 0x7f3a00000000 (with or without 0x)");
    }
    std::uint64_t bytes = 0;
    auto const [end, ec] = std::from_chars(size.text.data(), size.text.data() + size.text.size(), bytes);
    if (size.text.empty() || ec != std::errc{} || end != size.text.data() + size.text.size() ||
        bytes > std::numeric_limits<std::size_t>::max()) {
      fail(size.column, "bad Size '" + clip(size.text) + "': expected a number of bytes (decimal digits)" +
                            (ec == std::errc::result_out_of_range ? ", and at most 18446744073709551615" : ""));
    }
    r.bytes = static_cast<std::size_t>(bytes);
    if (!parse_hex(stream.text, r.stream_handle)) {
      fail(stream.column, "bad Stream '" + clip(stream.text) +
                              "': expected a hexadecimal stream handle such as 0x5581c0a0 or 0 (with or without 0x)");
    }
    return r;
  }

  void read_row() {
    split();
    row const r = parse_fields();
    std::size_t const pointer_column = fields_[3].column;
    std::size_t const stream_column = fields_[5].column;
    std::uint32_t const thread_index = intern_thread(fields_[0].text);
    if (r.kind == row_kind::failure) {
      if (r.bytes == 0) {  // a refusal of nothing: no allocator refuses it, no stack can be asked it
        ++log_.skipped_null_rows;
        return;
      }
      std::uint16_t const stream_index = intern_stream(r.stream_handle, stream_column);
      log_.recorded_failures.push_back(
          {line_number_, r.bytes, thread_index, static_cast<std::uint32_t>(log_.events.size()), stream_index});
      return;
    }
    if (r.address == 0) {
      if (r.bytes == 0) {
        ++log_.skipped_null_rows;  // an allocation of nothing, or a free of nullptr: a no-op
        return;
      }
      fail(pointer_column, std::string{r.kind == row_kind::free ? "a free" : "an allocate"} + " row of " +
                               std::to_string(r.bytes) + " bytes has a null Pointer" +
                               (r.kind == row_kind::free ? ": no allocation of that size returns null" : ""));
    }
    std::uint16_t const stream_index = intern_stream(r.stream_handle, stream_column);
    if (log_.events.size() == std::numeric_limits<std::uint32_t>::max()) {
      fail(0, "the log has more than 4294967295 events, more than a replay can index");
    }
    auto const event_index = static_cast<std::uint32_t>(log_.events.size());
    log_event event;
    event.bytes = r.bytes;
    event.stream = stream_index;
    event.action = r.kind == row_kind::allocate ? log_action::allocate : log_action::free;
    event.allocation = r.kind == row_kind::allocate ? record_allocation(r.address, r.bytes, event_index)
                                                     : record_free(r.address, r.bytes);
    log_.events.push_back(event);
    log_.event_lines.push_back(line_number_);
    log_.event_threads.push_back(thread_index);
    log_.events_by_thread[thread_index].push_back(event_index);
  }

  /// Checks and books an allocation; returns its allocation index.
  std::uint32_t record_allocation(std::uint64_t address, std::size_t bytes, std::uint32_t event_index) {
    auto [it, inserted] = pointers_.try_emplace(address);
    auto& state = it->second;
    if (!inserted && state.live) {
      fail(fields_[3].column, "allocate of " + format_hex(address) + ", which is still live: " +
                                  line_ref(state.allocated_line) + " allocated it and no line freed it since" +
                                  stamp_order_note());
    }
    if (__builtin_add_overflow(live_bytes_, bytes, &live_bytes_) ||
        __builtin_add_overflow(log_.total_allocated_bytes, bytes, &log_.total_allocated_bytes)) {
      fail(fields_[4].column, "with this allocation of " + std::to_string(bytes) +
                                  " bytes the log's bytes would pass 2^64 - 1: the sizes are absurd");
    }
    state = pointer_state{static_cast<std::uint32_t>(log_.allocation_count), line_number_, 0, true};
    log_.allocation_events.push_back(event_index);
    ++log_.allocation_count;
    log_.peak_live_bytes = std::max(log_.peak_live_bytes, live_bytes_);
    return state.allocation;
  }

  /// Checks and books a free; returns the allocation index it frees.
  std::uint32_t record_free(std::uint64_t address, std::size_t bytes) {
    auto const it = pointers_.find(address);
    if (it == pointers_.end()) {
      if (!has_stamp_) { fail(fields_[3].column, "free of " + format_hex(address) + ", which no earlier line allocated"); }
      std::string const later = later_allocation_of(address);
      fail(fields_[3].column, "free of " + format_hex(address) + ", which no row stamped before it allocated" +
                                  (later.empty() ? std::string{} : ": " + later + " allocates it later") +
                                  stamp_order_note());
    }
    auto& state = it->second;
    if (!state.live) {
      fail(fields_[3].column, "free of " + format_hex(address) + ", which is not live: " +
                                  line_ref(state.allocated_line) + " allocated it and " + line_ref(state.freed_line) +
                                  " already freed it" + stamp_order_note());
    }
    std::size_t const allocated_bytes = log_.events[log_.allocation_events[state.allocation]].bytes;
    if (allocated_bytes != bytes) {
      fail(fields_[4].column, "free of " + format_hex(address) + " with Size " + std::to_string(bytes) + ", but " +
                                  line_ref(state.allocated_line) + " allocated it with " +
                                  std::to_string(allocated_bytes) + " bytes");
    }
    state.live = false;
    state.freed_line = line_number_;
    live_bytes_ -= bytes;
    return state.allocation;
  }

  std::uint32_t intern_thread(std::string_view name) {
    auto const [it, inserted] = threads_.try_emplace(std::string{name}, static_cast<std::uint32_t>(log_.thread_names.size()));
    if (inserted) {
      log_.thread_names.emplace_back(name);
      log_.events_by_thread.emplace_back();
    }
    return it->second;
  }

  std::uint16_t intern_stream(std::uint64_t handle, std::size_t column) {
    auto const [it, inserted] = streams_.try_emplace(handle, static_cast<std::uint16_t>(log_.streams.size()));
    if (inserted) {
      if (log_.streams.size() == std::numeric_limits<std::uint16_t>::max()) {
        fail(column, "the log uses more than 65535 streams");
      }
      log_.streams.push_back(handle);
      log_.stream_names.emplace_back(fields_[5].text);
    }
    return it->second;
  }

  void finish() {
    log_.line_count = line_number_;
    std::vector<bool> freed(log_.allocation_count, false);
    for (auto const& e : log_.events) {
      if (e.action == log_action::free) { freed[e.allocation] = true; }
    }
    for (std::uint32_t a = 0; a < log_.allocation_count; ++a) {
      if (!freed[a]) {
        log_.leaked_allocations.push_back(a);
        log_.leaked_bytes += log_.events[log_.allocation_events[a]].bytes;
      }
    }
  }

  static std::string quoted(std::string_view text) { return "'" + std::string{text} + "...'"; }

  [[noreturn]] void fail(std::size_t column, std::string const& what) const {
    std::string message = log_.source + ":" + std::to_string(line_number_);
    if (column > 0) { message += ":" + std::to_string(column); }
    message += ": " + what;
    if (line_number_ > 0 && column > 0) {
      // At most quoted_line_chars characters of the line, around the column: a long line
      // must not make a long message.
      std::size_t const first = column - 1 > quoted_line_chars / 2 ? column - 1 - quoted_line_chars / 2 : 0;
      std::string shown{line_.substr(first, quoted_line_chars)};
      std::replace(shown.begin(), shown.end(), '\t', ' ');
      std::string const before = first > 0 ? "..." : "";
      std::string const after = first + shown.size() < line_.size() ? "..." : "";
      message += "\n  " + before + shown + after + "\n  " + std::string(before.size() + column - 1 - first, ' ') + "^";
    }
    throw log_error(message, log_.source, line_number_, column);
  }

  /// In a stamped log, where this row stands in the order the checks follow.
  [[nodiscard]] std::string stamp_order_note() const {
    if (!has_stamp_) { return {}; }
    return " (rows are taken in Stamp order; this row's Stamp is " + std::to_string(row_stamp_) + ")";
  }

  struct pointer_state {
    std::uint32_t allocation = 0;
    std::uint32_t allocated_line = 0;
    std::uint32_t freed_line = 0;
    bool live = false;
  };

  std::string_view text_;
  log_limits limits_;
  std::size_t pos_ = 0;
  std::string_view line_;
  std::uint32_t line_number_ = 0;
  std::vector<field> fields_;
  allocation_log log_;
  std::unordered_map<std::uint64_t, pointer_state> pointers_;
  std::unordered_map<std::string, std::uint32_t> threads_;
  std::unordered_map<std::uint64_t, std::uint16_t> streams_;
  std::size_t live_bytes_ = 0;
  static constexpr std::size_t stamp_column = 6;  // 0-based: the seventh
  bool has_stamp_ = false;
  struct stamped_row {
    std::uint64_t stamp;
    bool is_free;
    std::uint32_t line;
    std::string_view text;
  };
  std::vector<stamped_row> stamped_rows_;  // a stamped log's rows, in file order
  std::uint64_t row_stamp_ = 0;             // the Stamp of the row being read
};

/// A NUL byte cannot be in CSV text: it is binary data (a binary log is converted before
/// this is asked). Refused with its line, column and byte offset in `text`.
void refuse_nul_byte(std::string_view text, std::string const& source) {
  std::size_t const nul = text.find('\0');
  if (nul == std::string_view::npos) { return; }
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < nul; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  std::size_t const column = nul - line_start + 1;
  throw log_error(source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": a NUL byte at byte offset " +
                      std::to_string(nul) + " of the text: the log holds binary data, expected CSV text (or gzip-compressed CSV)",
                  source, line, column);
}

}  // namespace

allocation_log parse_allocation_log(std::string_view text, std::string source, log_limits const& limits) {
  if (is_binary_log(text)) {
    std::string const csv = binary_log_to_csv(text, source, limits);
    return log_parser{csv, std::move(source), limits}.parse();
  }
  refuse_nul_byte(text, source);
  // A UTF-8 byte order mark (spreadsheets and Windows editors save "CSV UTF-8" with one)
  // is no part of the header: read as one, it made the first column name 'Thread'
  // plus three invisible bytes, refused with a message that seemed to contradict itself.
  constexpr std::string_view byte_order_mark = "\xEF\xBB\xBF";
  if (text.starts_with(byte_order_mark)) { text.remove_prefix(byte_order_mark.size()); }
  return log_parser{text, std::move(source), limits}.parse();
}

std::size_t peak_live_bytes_without(allocation_log const& log, std::vector<bool> const& skipped) {
  std::size_t live = 0;
  std::size_t peak = 0;
  for (auto const& e : log.events) {
    if (e.allocation < skipped.size() && skipped[e.allocation]) { continue; }
    if (e.action == log_action::allocate) {
      live += e.bytes;
      peak = std::max(peak, live);
    } else {
      live -= e.bytes;
    }
  }
  return peak;
}

}  // namespace mrstack
