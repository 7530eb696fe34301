#pragma once
// What tests that set an address-space limit (RLIMIT_AS) in a forked child measure first.
#include <cstddef>
#include <fstream>
#include <string>

namespace mrstack::test {

/// The calling process's address-space size in bytes (VmSize), or 0 when unknown.
inline std::size_t address_space_in_use() {
  std::ifstream status{"/proc/self/status"};
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) { return std::stoull(line.substr(7)) * 1024; }
  }
  return 0;
}

}  // namespace mrstack::test
