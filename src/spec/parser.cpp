// The stack-spec syntax: a small hand-written lexer/parser producing `stack_spec`.
//
//   stack    := layer ( '>' layer )*
//   layer    := name [ '(' [ argument ( ',' argument )* ] ')' ]
//   argument := [ name '=' ] value          positional arguments come first (but a flag's
//                                           bare name may stand anywhere: the builder checks)
//   name     := [A-Za-z_][A-Za-z0-9_]*
//   value    := '"' ( [^"\\] | '\\' any )* '"'  |  bare
//   bare     := any text up to the next ',' or ')' (spaces around it trimmed)
//
// Values are context-dependent (a file name may hold '>' or '.'), so the lexer reads a
// value only where the grammar expects one instead of tokenizing the whole line first.
#include <mrstack/spec.hpp>
#include <mrstack/detail/format.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "spec/spec_detail.hpp"

namespace mrstack {

namespace detail {

void throw_spec_error(std::string_view spec_text, std::size_t column, std::string const& what) {
  std::string message = "bad stack spec";
  if (column > 0) { message += " at column " + std::to_string(column); }
  message += ": " + what + "\n  ";
  // Tabs and line breaks (whitespace between tokens) would move the caret off its
  // character: shown as spaces, the byte columns unchanged.
  std::string shown{spec_text};
  for (char& c : shown) {
    if (c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') { c = ' '; }
  }
  message += shown;
  if (column > 0) {
    // Columns count bytes; the caret goes under the character, one space per character
    // before it (a UTF-8 character is several bytes and one place on the screen).
    std::size_t places = 0;
    for (std::size_t i = 0; i + 1 < column && i < spec_text.size(); ++i) {
      places += (static_cast<unsigned char>(spec_text[i]) & 0xC0) != 0x80 ? 1 : 0;
    }
    places += column - 1 > spec_text.size() ? column - 1 - spec_text.size() : 0;  // past the end
    message += "\n  " + std::string(places, ' ') + "^";
  } else {
    message += "\n  (in a part of the spec a tool added)";
  }
  throw spec_error(message, column);
}

std::string join_alternatives(std::vector<std::string> const& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) { out += (i + 1 == names.size()) ? " or " : ", "; }
    out += names[i];
  }
  return out;
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) { row[j] = j; }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t const above = row[j];
      std::size_t const substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_name(std::string_view name, std::vector<std::string> const& candidates) {
  std::string best;
  std::size_t best_distance = 3;
  for (auto const& c : candidates) {
    std::size_t const d = edit_distance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace detail

// ---- sizes ----------------------------------------------------------------------------

std::optional<std::size_t> parse_size(std::string_view text, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<std::size_t> {
    if (why != nullptr) { *why = std::move(reason); }
    return std::nullopt;
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0) { text.remove_prefix(1); }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) { text.remove_suffix(1); }
  if (text.empty()) { return fail("expected a size such as 4096, 64KiB or 1.5GiB"); }
  if (text.front() == '-') { return fail("a size cannot be negative"); }
  std::size_t i = 0;
  std::uint64_t whole = 0;
  std::size_t digits = 0;
  bool too_large = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0; ++i, ++digits) {
    auto const digit = static_cast<std::uint64_t>(text[i] - '0');
    if (whole > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) { too_large = true; }
    whole = whole * 10 + digit;
  }
  // The digits after '.', exactly: fraction_digits / 10^fraction_places. A binary float
  // made 0.05KB 49 bytes and 0.256KB 255. Digits past the 25th are ignored: together they
  // weigh less than 10^-13 of a byte at the largest unit.
  constexpr int max_fraction_places = 25;
  __extension__ using wide = unsigned __int128;  // GCC's and Clang's 128-bit integer
  wide fraction_digits = 0;
  wide fraction_unit = 1;  // 10^fraction_places
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (int places = 0; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0; ++i, ++digits) {
      // Every digit past the 25th is skipped, not just the 26th: multiplying them back in
      // overflowed the 128-bit sums, and past ~154 digits fraction_unit wrapped to 0.
      if (places >= max_fraction_places) { continue; }
      ++places;
      fraction_digits = fraction_digits * 10 + static_cast<unsigned>(text[i] - '0');
      fraction_unit *= 10;
    }
  }
  if (digits == 0) { return fail("expected a number, then an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"); }
  std::string_view unit = text.substr(i);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front())) != 0) { unit.remove_prefix(1); }
  std::string lower;
  for (char c : unit) { lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
  struct unit_scale {
    char const* name;
    std::uint64_t scale;
  };
  static constexpr unit_scale units[] = {
      {"", 1},
      {"b", 1},
      {"kib", 1ULL << 10},
      {"mib", 1ULL << 20},
      {"gib", 1ULL << 30},
      {"tib", 1ULL << 40},
      {"kb", 1000ULL},
      {"mb", 1000ULL * 1000},
      {"gb", 1000ULL * 1000 * 1000},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
  };
  std::uint64_t scale = 0;
  for (auto const& u : units) {
    if (lower == u.name) { scale = u.scale; }
  }
  if (scale == 0) {
    if (lower == "k" || lower == "m" || lower == "g" || lower == "t") {
      std::string const u(1, static_cast<char>(std::toupper(static_cast<unsigned char>(lower[0]))));
      return fail("the unit '" + std::string{unit} + "' is ambiguous: write " + u + "iB (powers of 1024) or " + u +
                  "B (powers of 1000)");
    }
    return fail("unknown unit '" + std::string{unit} + "': expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB");
  }
  // Fractions round down to whole bytes: 0.1KiB is 102 bytes.
  if (too_large || whole > std::numeric_limits<std::size_t>::max() / scale) { return fail("the size is too large"); }
  std::size_t const whole_bytes = static_cast<std::size_t>(whole) * scale;
  // < scale: 10^25 x 2^40 fits in 128 bits.
  auto const fraction_bytes = static_cast<std::size_t>(fraction_digits * scale / fraction_unit);
  if (whole_bytes > std::numeric_limits<std::size_t>::max() - fraction_bytes) { return fail("the size is too large"); }
  return whole_bytes + fraction_bytes;
}

// ---- the spec ----------------------------------------------------------------------------

namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

}  // namespace

bool detail::is_spec_name(std::string_view name) {
  return !name.empty() && is_name_start(name.front()) && std::all_of(name.begin() + 1, name.end(), is_name_char);
}

namespace {

/// The character at text[at] as an error names it: quoted, a whole UTF-8 character
/// included ('ó' was "a control character"), or what kind of byte it is. A character
/// past ASCII also gets its code point: a no-break space pasted from a web page showed as
/// "found ' '", a zero-width space as "found ''", both looking like no error at all.
std::string describe_char(std::string_view text, std::size_t at) {
  char const c = text[at];
  if (c == '\'') { return "\"'\""; }
  auto const byte = static_cast<unsigned char>(c);
  if (byte >= 0x80) {
    if (std::size_t const n = utf8_sequence_length(text, at)) {
      // The lead byte's payload bits (7 - n of them), then 6 bits from each continuation byte.
      char32_t code_point = byte & (0x7Fu >> n);
      for (std::size_t i = 1; i < n; ++i) {
        code_point = code_point << 6 | (static_cast<unsigned char>(text[at + i]) & 0x3Fu);
      }
      char hex[16];
      std::snprintf(hex, sizeof hex, "' (U+%04X)", static_cast<unsigned>(code_point));
      std::string quoted(1, '\'');
      quoted.append(text.substr(at, n)).append(hex);
      return quoted;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", byte);
    return std::string{"byte "} + hex + ", which is not UTF-8";
  }
  if (std::isprint(byte) == 0) { return "a control character"; }
  return std::string{"'"} + c + "'";
}

class spec_parser {
 public:
  explicit spec_parser(std::string_view text) : text_{text} {}

  stack_spec parse() {
    stack_spec spec;
    spec.text = std::string{text_};
    skip_spaces();
    if (at_end()) { fail(column(), "the spec is empty: expected a resource name such as cuda or pool > cuda"); }
    while (true) {
      spec.layers.push_back(parse_layer());
      skip_spaces();
      if (at_end()) { break; }
      if (peek() != '>') {
        fail(column(), "expected '>' (then the layer below) or the end of the spec after layer '" +
                           spec.layers.back().name + "', found " + describe_char(text_, pos_));
      }
      ++pos_;
      skip_spaces();
      if (at_end()) { fail(column(), "expected a resource name after '>'"); }
    }
    return spec;
  }

 private:
  spec_layer parse_layer() {
    spec_layer layer;
    if (!is_name_start(peek())) {
      fail(column(), "expected a resource name (letters, digits and '_'), found " + describe_char(text_, pos_));
    }
    layer.column = column();
    layer.name = read_name();
    skip_spaces();
    if (!at_end() && peek() == '(') { parse_arguments(layer); }
    return layer;
  }

  void parse_arguments(spec_layer& layer) {
    std::size_t const open_column = column();
    ++pos_;  // '('
    skip_spaces();
    if (!at_end() && peek() == ')') {
      ++pos_;
      return;
    }
    // Whether a positional argument may follow a named one depends on the resource (a flag
    // may be written bare anywhere): the builder decides.
    while (true) {
      skip_spaces();
      if (at_end()) { unclosed(layer, open_column, "an argument or ')'"); }
      spec_argument arg;
      std::size_t const start = pos_;
      if (is_name_start(peek())) {
        std::size_t const name_column = column();
        std::string name = read_name();
        skip_spaces();
        if (!at_end() && peek() == '=') {
          ++pos_;
          arg.name = std::move(name);
          arg.name_column = name_column;
        } else {
          pos_ = start;  // a positional value that happens to start with a letter
        }
      }
      read_value(arg, layer);
      layer.arguments.push_back(std::move(arg));
      skip_spaces();
      if (at_end()) { unclosed(layer, open_column, "',' or ')'"); }
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ')') {
        ++pos_;
        return;
      }
      fail(column(), "expected ',' or ')' after the value, found " + describe_char(text_, pos_));
    }
  }

  void read_value(spec_argument& arg, spec_layer const& layer) {
    skip_spaces();
    std::string const what = arg.name.empty() ? "an argument" : "a value for " + arg.name;
    if (at_end()) { fail(column(), "expected " + what + " in " + layer.name + "(...)"); }
    if (peek() == ',' || peek() == ')') {
      fail(column(), "expected " + what + " before " + describe_char(text_, pos_));
    }
    arg.value_column = column();
    if (peek() == '"') {
      ++pos_;
      while (true) {
        if (at_end()) { fail(arg.value_column, "this quoted value is never closed: expected a closing '\"'"); }
        char const c = text_[pos_++];
        if (c == '"') { break; }
        if (c == '\\') {
          if (at_end()) { fail(arg.value_column, "this quoted value is never closed: expected a closing '\"'"); }
          arg.value += text_[pos_++];
        } else {
          arg.value += c;
        }
      }
      return;
    }
    std::size_t const begin = pos_;
    while (!at_end() && peek() != ',' && peek() != ')') { ++pos_; }
    std::size_t end = pos_;
    while (end > begin && std::isspace(static_cast<unsigned char>(text_[end - 1])) != 0) { --end; }
    arg.value = std::string{text_.substr(begin, end - begin)};
    if (arg.name.empty()) { refuse_malformed_name(arg); }
  }

  /// An unquoted positional value with '=' was meant as name=value with a name that is
  /// not one (`queue-capacity=1024`, `=x.csv`): read as a value, it went to the first
  /// parameter (a log file named 'queue-capacity=1024').
  void refuse_malformed_name(spec_argument const& arg) const {
    std::size_t const equals = arg.value.find('=');
    if (equals == std::string::npos) { return; }
    std::string const name = arg.value.substr(0, equals);
    if (name.find_first_not_of(" \t") == std::string::npos) {
      fail(arg.value_column, "a parameter name is missing before '='");
    }
    std::string fixed = name;
    std::replace(fixed.begin(), fixed.end(), '-', '_');
    fail(arg.value_column, "'" + name + "' is not a parameter name (names are letters, digits and '_'" +
                               (fixed != name ? ": " + fixed + "?" : std::string{}) +
                               "); a value with '=' in it must be quoted");
  }

  [[noreturn]] void unclosed(spec_layer const& layer, std::size_t open_column, std::string const& expected) {
    fail(column(), "the '(' of " + layer.name + " at column " + std::to_string(open_column) +
                       " is never closed: expected " + expected);
  }

  std::string read_name() {
    std::size_t const begin = pos_;
    while (!at_end() && is_name_char(peek())) { ++pos_; }
    return std::string{text_.substr(begin, pos_ - begin)};
  }

  void skip_spaces() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(peek())) != 0) { ++pos_; }
  }
  [[nodiscard]] bool at_end() const noexcept { return pos_ >= text_.size(); }
  [[nodiscard]] char peek() const noexcept { return text_[pos_]; }
  [[nodiscard]] std::size_t column() const noexcept { return pos_ + 1; }
  [[noreturn]] void fail(std::size_t column, std::string const& what) const {
    detail::throw_spec_error(text_, column, what);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

bool needs_quotes(std::string_view value, bool positional) {
  if (value.empty()) { return true; }
  if (std::isspace(static_cast<unsigned char>(value.front())) != 0 ||
      std::isspace(static_cast<unsigned char>(value.back())) != 0) {
    return true;
  }
  if (positional && value.find('=') != std::string_view::npos) {
    // Unquoted, `name=x` would read back as a named argument, and any other '=' as a
    // malformed name (the parser refuses it): quoted, it stays a value.
    return true;
  }
  return value.find_first_of(",)\"\\") != std::string_view::npos;
}

}  // namespace

stack_spec parse_stack_spec(std::string_view text) { return spec_parser{text}.parse(); }

std::string to_string(stack_spec const& spec) {
  std::string out;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    auto const& layer = spec.layers[i];
    if (i > 0) { out += " > "; }
    out += layer.name;
    if (layer.arguments.empty()) { continue; }
    out += '(';
    for (std::size_t j = 0; j < layer.arguments.size(); ++j) {
      auto const& arg = layer.arguments[j];
      if (j > 0) { out += ", "; }
      if (!arg.name.empty()) { out += arg.name + "="; }
      if (needs_quotes(arg.value, arg.name.empty())) {
        out += '"';
        for (char c : arg.value) {
          if (c == '"' || c == '\\') { out += '\\'; }
          out += c;
        }
        out += '"';
      } else {
        out += arg.value;
      }
    }
    out += ')';
  }
  return out;
}

}  // namespace mrstack
