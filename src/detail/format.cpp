#include <mrstack/detail/format.hpp>

#include <cstdio>

namespace mrstack {

std::string format_bytes(std::size_t bytes) {
  static constexpr char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s (%zu B)", value, units[unit], bytes);
  }
  return buf;
}

std::string format_hex(unsigned long long value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", value);
  return buf;
}

std::size_t utf8_sequence_length(std::string_view text, std::size_t at) noexcept {
  auto const lead = static_cast<unsigned char>(text[at]);
  if (lead < 0x80) { return 1; }
  // How many continuation bytes the lead byte announces; none start with a continuation
  // byte, 0xc0 or 0xc1 (which could only start overlong forms), or 0xf5 and up.
  std::size_t more = 0;
  if (lead >= 0xc2 && lead < 0xe0) {
    more = 1;
  } else if (lead >= 0xe0 && lead < 0xf0) {
    more = 2;
  } else if (lead >= 0xf0 && lead < 0xf5) {
    more = 3;
  } else {
    return 0;
  }
  if (at + more >= text.size()) { return 0; }
  std::uint32_t code = lead & (0x7fU >> more);
  for (std::size_t k = 1; k <= more; ++k) {
    auto const c = static_cast<unsigned char>(text[at + k]);
    if ((c & 0xc0) != 0x80) { return 0; }
    code = code << 6 | (c & 0x3fU);
  }
  bool const overlong = (more == 2 && code < 0x800) || (more == 3 && code < 0x10000);
  if (overlong || code > 0x10ffff || (code >= 0xd800 && code < 0xe000)) { return 0; }
  return more + 1;
}

}  // namespace mrstack
