#pragma once
// The other side of vmm IPC's wire, for the tests that talk to an exporter's server
// directly (src/upstream/vmm_ipc_server.cpp): the name of its socket, a connection to it, and
// this process's open descriptors (to see that none is left open); the wire as an opener
// sees it, and the pieces a fake exporter needs.
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include "../../src/upstream/vmm_ipc_registry.hpp"

#include <dirent.h>
#include <fcntl.h>
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

// The opener's view of the wire (src/upstream/vmm_ipc_wire.hpp).
struct wire_header {
  std::uint32_t status, runs, type;
  std::int32_t device;
  std::uint64_t block_offset, block_bytes;
  char message[224];
};
struct wire_batch {
  std::uint32_t count, reserved;
  std::uint64_t bytes[64];
  CUmemFabricHandle fabric[64];
};

/// Sends `bytes` of `data` as one message carrying descriptor `fd`; whether all went.
inline bool send_with_fd(int socket_fd, void const* data, std::size_t bytes, int fd) {
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  return sendmsg(socket_fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes);
}

/// A run exporter that makes each run's shareable descriptor a duplicate of `fd` (a pipe
/// standing in for the driver's handle).
inline vmm_ipc::export_registry::run_exporter dup_of(int fd) {
  return [fd](void* out, std::uint64_t) { *static_cast<int*>(out) = fcntl(fd, F_DUPFD_CLOEXEC, 0); };
}

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
