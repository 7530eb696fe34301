#pragma once
// The other side of vmm IPC's wire, for the tests that talk to an exporter's server
// directly (src/upstream/vmm_ipc.cpp): the name of its socket, a connection to it, and
// this process's open descriptors (to see that none is left open).
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include <dirent.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mrstack::test {

/// The abstract Unix socket on which process `pid` serves with `nonce` (what a handle
/// carries at bytes 8 and 56); returns the address's length.
inline socklen_t exporter_address(std::uint32_t pid, std::uint64_t nonce, sockaddr_un& addr) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  int const n = std::snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "mrstack-vmm-ipc-%u-%016llx", pid,
                              static_cast<unsigned long long>(nonce));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<std::size_t>(n));
}

/// The socket of the process that made `h`.
inline socklen_t exporter_address(vmm_ipc::handle const& h, sockaddr_un& addr) {
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;
  std::memcpy(&pid, h.data() + 8, sizeof pid);
  std::memcpy(&nonce, h.data() + 56, sizeof nonce);
  return exporter_address(pid, nonce, addr);
}

/// A socket connected to the server of the process that made `h`; `receive_timeout_s`
/// (0: none) bounds each receive on it.
inline int connect_to_exporter(vmm_ipc::handle const& h, long receive_timeout_s = 0) {
  sockaddr_un addr{};
  socklen_t const length = exporter_address(h, addr);
  int const s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  if (receive_timeout_s > 0) {
    timeval const limit{receive_timeout_s, 0};
    REQUIRE(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0);
  }
  REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&addr), length) == 0);
  return s;
}

/// This process's open descriptors' numbers, sorted (the directory's own left out).
inline std::vector<int> open_descriptors() {
  std::vector<int> fds;
  DIR* dir = opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  while (dirent const* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') { fds.push_back(std::atoi(entry->d_name)); }
  }
  fds.erase(std::find(fds.begin(), fds.end(), dirfd(dir)));
  closedir(dir);
  std::sort(fds.begin(), fds.end());
  return fds;
}

}  // namespace mrstack::test
