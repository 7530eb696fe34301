// vmm IPC's server: the thread the first export starts, answering openers on the Unix
// socket one at a time from the registry. Apart from the registry because its rules are
// the peer's (who may ask, how long one may take, what is sent without the lock).
#include <mrstack/error.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "vmm_ipc_registry.hpp"
#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

void export_registry::ensure_server() {
  int const pid = static_cast<int>(getpid());
  if (server_pid_ == pid) { return; }
  int const listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listener < 0) { throw logic_error(std::string{"vmm IPC: socket(AF_UNIX) failed: "} + std::strerror(errno)); }
  sockaddr_un addr{};
  socklen_t const len = socket_address(static_cast<std::uint32_t>(pid), process_nonce(), addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 64) != 0) {
    int const err = errno;
    ::close(listener);
    throw logic_error("vmm IPC: cannot listen on the Unix socket " + socket_name(static_cast<std::uint32_t>(pid), process_nonce()) +
                      ": " + std::strerror(err));
  }
  // Detached on purpose: it serves until the process exits; the registry it uses is never destroyed.
  std::thread{[this, listener] {
    for (;;) {
      int const connection = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection < 0) {
        if (errno == EINTR || errno == ECONNABORTED) { continue; }
        // Out of descriptors or kernel memory for a moment (the opener stays queued): a
        // return here left every later opener unanswered for the process's life.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          continue;
        }
        return;
      }
      set_timeouts(connection, peer_timeout_s);
      serve(connection);
      ::close(connection);
    }
  }}.detach();
  server_pid_ = pid;
}

// An answer as taken from the registry under its lock, then sent without it (a peer that
// does not read would otherwise hold every allocation and free of this process that takes
// the lock for the send timeout). Its descriptors are duplicates, its own: a run unmapped
// meanwhile closes the registry's descriptor, not these, and each keeps its allocation
// alive (cuMemRelease frees it only once its shareable handles are closed too), so the
// opener never receives a closed or reused descriptor.
struct export_registry::answer {
  reply_header header{};
  std::vector<reply_batch> batches;
  std::vector<int> fds;  // per run (ipc=fd)
  answer() = default;
  answer(answer const&) = delete;
  answer& operator=(answer const&) = delete;
  ~answer() {
    for (int fd : fds) { ::close(fd); }
  }
};

namespace {

// Makes `header` a refusal saying why (no host allocation: the server may be out of it).
[[gnu::format(printf, 2, 3)]] void refuse(reply_header& header, char const* format, ...) noexcept {
  header = reply_header{};
  header.status = 1;
  va_list args;
  va_start(args, format);
  std::vsnprintf(header.message, sizeof header.message, format, args);
  va_end(args);
}

}  // namespace

void export_registry::take_answer(std::uint64_t export_id, answer& out) noexcept {
  std::lock_guard lock{mutex_};
  auto const id = static_cast<unsigned long long>(export_id);
  if (export_id == 0 || export_id >= next_id_) {  // ids count up from 1 and are never reused
    return refuse(out.header, "there is no export %llu in this process: the handle is damaged", id);
  }
  auto const found = exports_.find(export_id);
  if (found == exports_.end()) {
    return refuse(out.header, "export %llu has ended: the exporting process freed the block's physical memory (or "
                  "its stack slept) since the handle was made", id);
  }
  export_entry const& e = found->second;
  bool const with_fds = e.type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  try {
    out.batches.resize((e.runs.size() + batch_runs - 1) / batch_runs);
    if (with_fds) { out.fds.reserve(e.runs.size()); }  // push_back below never allocates
  } catch (std::bad_alloc const&) {
    return refuse(out.header, "out of host memory for the answer of export %llu (%zu physical allocations)", id,
                  e.runs.size());
  }
  for (std::size_t i = 0; i < e.runs.size(); ++i) {
    exported_run const& r = runs_.at(e.runs[i]);
    reply_batch& batch = out.batches[i / batch_runs];
    batch.bytes[batch.count] = r.bytes;
    batch.fabric[batch.count] = r.fabric;
    ++batch.count;
    if (!with_fds) { continue; }
    int const copy = fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {  // the duplicates made so far close with `out`
      return refuse(out.header, "export %llu: cannot duplicate the descriptor of physical allocation %zu of %zu: %s",
                    id, i, e.runs.size(), std::strerror(errno));
    }
    out.fds.push_back(copy);
  }
  out.header.runs = static_cast<std::uint32_t>(e.runs.size());
  out.header.type = static_cast<std::uint32_t>(e.type);
  out.header.device = e.device;
  out.header.block_offset = e.block_offset;
  out.header.block_bytes = e.block_bytes;
}

void export_registry::serve(int connection) noexcept {
  answer a;
  ucred peer{};
  socklen_t peer_len = sizeof peer;
  request req{};
  std::vector<int> unexpected;
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 ||
      (peer.uid != geteuid() && peer.uid != 0)) {
    refuse(a.header, "the opening process runs as another user (uid %u)", static_cast<unsigned>(peer.uid));
  } else {
    try {
      unexpected.reserve(batch_runs);  // all a message can carry: receiving them never allocates
    } catch (std::bad_alloc const&) {
      return;  // the opener is told it got no answer
    }
    bool const received = receive(connection, &req, sizeof req, unexpected);
    for (int fd : unexpected) { ::close(fd); }  // a request carries none: even a cut-short one's are closed
    if (!received) { return; }
    take_answer(req.export_id, a);
  }
  // The registry's lock is released: sending may wait up to the peer timeout a message.
  if (!send_all(connection, &a.header, sizeof a.header, nullptr, 0) || a.header.status != 0) { return; }
  bool const with_fds = a.header.type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  for (std::size_t b = 0; b < a.batches.size(); ++b) {
    reply_batch const& batch = a.batches[b];
    int const* fds = with_fds ? a.fds.data() + b * batch_runs : nullptr;
    if (!send_all(connection, &batch, sizeof batch, fds, with_fds ? batch.count : 0)) { return; }
  }
}

}  // namespace mrstack::vmm_ipc
