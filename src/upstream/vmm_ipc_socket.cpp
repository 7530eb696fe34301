// vmm IPC's Unix socket: its abstract name, its timeouts, and one message over it with the
// file descriptors it carries (SCM_RIGHTS). Apart because the server and the opener both
// use it, and because a descriptor received is this process's at once: every path that
// takes one must close it, and this file is where they arrive.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

// Abstract socket address: "\0mrstack-vmm-ipc-<pid>-<nonce>".
socklen_t socket_address(std::uint32_t pid, std::uint64_t nonce, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  int const n = std::snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "mrstack-vmm-ipc-%u-%016llx", pid,
                              static_cast<unsigned long long>(nonce));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<std::size_t>(n));
}

std::string socket_name(std::uint32_t pid, std::uint64_t nonce) {
  char name[80];
  std::snprintf(name, sizeof name, "@mrstack-vmm-ipc-%u-%016llx", pid, static_cast<unsigned long long>(nonce));
  return name;
}

// Makes blocking sends and receives on `fd` (connect included) give up after `seconds`.
void set_timeouts(int fd, int seconds) noexcept {
  timeval const limit{seconds, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
}

bool send_all(int fd, void const* data, std::size_t bytes, int const* fds, std::size_t fd_count) {
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * batch_runs)];
  if (fd_count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fd_count);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * fd_count);
  }
  ssize_t const sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
  return sent == static_cast<ssize_t>(bytes);
}

// Receives one message into `data`; appends the descriptors it carries to `fds`. Out of
// host memory to store them, it closes every descriptor the message carried (they were
// this process's the moment recvmsg returned) and throws std::bad_alloc.
bool receive(int fd, void* data, std::size_t bytes, std::vector<int>& fds) {
  iovec iov{data, bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * batch_runs)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got = 0;
  do { got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); } while (got < 0 && errno == EINTR);
  // Failed (a timeout, a reset), recvmsg leaves msg_controllen as set above, over the
  // uninitialized buffer: numbers there (an earlier message's) are no descriptors of this one.
  if (got < 0) { return false; }
  std::size_t const stored_before = fds.size();
  bool out_of_memory = false;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      std::size_t const n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int const* carried = reinterpret_cast<int const*>(CMSG_DATA(cm));
      if (!out_of_memory) {
        try {
          fds.insert(fds.end(), carried, carried + n);  // all or none: ints, and only the growth can throw
          continue;
        } catch (std::bad_alloc const&) {
          out_of_memory = true;
        }
      }
      for (std::size_t k = 0; k < n; ++k) { ::close(carried[k]); }
    }
  }
  if (out_of_memory) {
    for (std::size_t k = stored_before; k < fds.size(); ++k) { ::close(fds[k]); }
    fds.resize(stored_before);
    throw std::bad_alloc{};
  }
  return got == static_cast<ssize_t>(bytes) && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
}

}  // namespace mrstack::vmm_ipc
