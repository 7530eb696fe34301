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

}  // namespace mrstack
