// vmm IPC (see include/mrstack/upstream/vmm_ipc.hpp): the 64-byte handle, the exporter's
// registry and socket server, and the opener's import and mapping.
#include <mrstack/upstream/vmm_ipc.hpp>

#include <mrstack/error.hpp>
#include <mrstack/upstream/virtual_range.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <thread>

#include "cuda_util.hpp"  // peers_of
#include "vmm_driver.hpp"
#include "vmm_ipc_registry.hpp"

namespace mrstack::vmm_ipc {

using namespace vmm_driver;

namespace {

constexpr unsigned char magic[8] = {'M', 'R', 'S', 'V', 'M', 'M', 1, 0};
constexpr std::size_t batch_runs = 64;  // runs per message (SCM_RIGHTS carries at most 253 fds)
// The server answers one connection at a time: a peer that connects and then stays silent
// (hung, stopped in a debugger) would hold every later opener forever. It gets this long
// to send its request and take the answer; an opener waits this long for the exporter
// (which may first have to wait out a few such peers).
constexpr int peer_timeout_s = 2;
constexpr int answer_timeout_s = 30;

// The handle's fields, in this layout (little-endian host order: both ends share a host).
struct handle_fields {
  unsigned char magic[8];
  std::uint32_t pid;
  std::uint32_t type;         // CUmemAllocationHandleType
  std::uint64_t export_id;
  std::uint64_t block_offset;
  std::uint64_t block_bytes;
  std::int32_t device;
  std::uint32_t runs;
  std::uint64_t run_bytes;    // all runs together
  std::uint64_t nonce;        // names the exporter's socket with the pid: a reused pid never matches
};
static_assert(sizeof(handle_fields) == handle_bytes);

struct request {
  std::uint64_t export_id;
};
struct reply_header {
  std::uint32_t status;  // 0: found; else `message` says why
  std::uint32_t runs;
  std::uint32_t type;
  std::int32_t device;
  std::uint64_t block_offset;
  std::uint64_t block_bytes;
  char message[224];
};
struct reply_batch {
  std::uint32_t count;
  std::uint32_t reserved;
  std::uint64_t bytes[batch_runs];
  CUmemFabricHandle fabric[batch_runs];
};

std::uint64_t process_nonce() {
  static std::uint64_t const nonce = [] {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(getpid());
  }();
  return nonce;
}

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

char const* type_name(std::uint32_t type) {
  return type == CU_MEM_HANDLE_TYPE_FABRIC ? "fabric" : type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ? "fd" : "?";
}

char const* type_long_name(std::uint32_t type) {
  return type == CU_MEM_HANDLE_TYPE_FABRIC ? "fabric handles" : "POSIX file descriptors";
}

// Why the block at `ptr` cannot be exported as `asked`: its run `run` of `runs` was
// exported as `had` already.
std::string mixed_types(void const* ptr, std::uint32_t asked, std::uint32_t had, std::size_t run, std::size_t runs) {
  return "vmm IPC: export of " + (ptr != nullptr ? format_hex(ptr) : std::string{"a block"}) + " as " +
         type_long_name(asked) + " (ipc=" + type_name(asked) + ") refused: its physical allocation " +
         std::to_string(run) + " of " + std::to_string(runs) + " was exported as " + type_long_name(had) +
         " (ipc=" + type_name(had) + ") already, and a physical allocation is shared with one handle type only; "
         "share it as " + type_name(had) + " (through an export of its vmm), or allocate the block from a vmm(ipc=" +
         type_name(asked) + ") to share it as " + type_name(asked);
}

handle_fields fields_of(handle const& h) {
  handle_fields f{};
  std::memcpy(&f, h.data(), sizeof f);
  if (std::memcmp(f.magic, magic, sizeof magic) != 0) {
    throw logic_error("vmm IPC: the 64 bytes are not an mrstack vmm IPC handle (no mrstack magic): a legacy CUDA "
                      "IPC handle opens with cudaIpcOpenMemHandle instead");
  }
  return f;
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

}  // namespace

// ---- the handle ------------------------------------------------------------------------------

bool is_handle(void const* bytes, std::size_t length) noexcept {
  return bytes != nullptr && length >= handle_bytes && std::memcmp(bytes, magic, sizeof magic) == 0;
}

handle_info describe(handle const& h) {
  handle_fields const f = fields_of(h);
  return handle_info{f.pid, f.export_id, f.block_bytes, f.device, f.runs, type_name(f.type)};
}

handle export_block(memory_resource const& top, void const* ptr, std::size_t bytes) {
  auto const* range = find_virtual_range(top, ptr);
  auto* vmm = dynamic_cast<vmm_memory_resource*>(const_cast<virtual_range*>(range));
  if (vmm == nullptr) {
    throw logic_error("vmm IPC: " + format_hex(ptr) + " lies in no vmm layer of \"" + describe_stack(top) + "\"" +
                      (range != nullptr ? " (simulated_vmm memory cannot be shared)" : ""));
  }
  return vmm->export_ipc(ptr, bytes);
}

// ---- the exporting side ------------------------------------------------------------------------

export_registry& registry() {
  static export_registry* const instance = new export_registry{};  // outlives every vmm and the server thread
  return *instance;
}

std::array<unsigned char, 64> export_registry::add_export(void const* ptr,
                                                          std::vector<virtual_range_resource::mapped_run> const& runs,
                                                          std::size_t block_offset, std::size_t block_bytes,
                                                          int device, CUmemAllocationHandleType type) {
  auto const export_run = [type](void* out, std::uint64_t run_handle) {
    MRSTACK_CU_TRY(api().mem_export_to_shareable_handle(out, run_handle, type, 0),
                   std::string{"cuMemExportToShareableHandle("} + type_name(type) + ")");
  };
  return add_export_with(runs, block_offset, block_bytes, device, type, export_run, ptr);
}

std::array<unsigned char, 64> export_registry::add_export_with(
    std::vector<virtual_range_resource::mapped_run> const& runs, std::size_t block_offset, std::size_t block_bytes,
    int device, CUmemAllocationHandleType type, run_exporter const& export_run, void const* ptr) {
  if (runs.empty()) { throw logic_error("vmm IPC: an export needs at least one physical allocation"); }
  std::lock_guard lock{mutex_};
  // A run keeps the one shareable handle it was first exported as. Reused under the other
  // type, the export succeeded and its open failed far from the cause: answered with a
  // handle never made (a fabric handle of zeros, descriptor -1) or, for the same block,
  // the earlier export's type ("does not match the handle").
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto const known = runs_.find(runs[i].handle);
    if (known != runs_.end() && known->second.type != type) {
      throw logic_error(mixed_types(ptr, type, known->second.type, i, runs.size()));
    }
  }
  ensure_server();
  std::size_t run_bytes = 0;
  for (auto const& r : runs) {
    run_bytes += r.bytes;
    if (runs_.count(r.handle) != 0) { continue; }
    exported_run e;
    e.bytes = r.bytes;
    e.type = type;
    void* out = type == CU_MEM_HANDLE_TYPE_FABRIC ? static_cast<void*>(&e.fabric) : static_cast<void*>(&e.fd);
    export_run(out, r.handle);
    try {
      runs_.emplace(r.handle, e);
    } catch (...) {  // out of host memory: the descriptor, not yet the registry's, would stay open for good
      if (e.fd >= 0) { ::close(e.fd); }
      throw;
    }
  }
  auto const key = std::make_tuple(runs.front().handle, block_offset, block_bytes);
  std::uint64_t id = 0;
  if (auto const known = by_block_.find(key); known != by_block_.end()) {
    id = known->second;
  } else {
    id = next_id_++;
    export_entry entry;
    for (auto const& r : runs) { entry.runs.push_back(r.handle); }
    entry.block_offset = block_offset;
    entry.block_bytes = block_bytes;
    entry.device = device;
    entry.type = type;
    exports_.emplace(id, std::move(entry));
    by_block_.emplace(key, id);
  }
  handle_fields f{};
  std::memcpy(f.magic, magic, sizeof magic);
  f.pid = static_cast<std::uint32_t>(getpid());
  f.type = static_cast<std::uint32_t>(type);
  f.export_id = id;
  f.block_offset = block_offset;
  f.block_bytes = block_bytes;
  f.device = device;
  f.runs = static_cast<std::uint32_t>(runs.size());
  f.run_bytes = run_bytes;
  f.nonce = process_nonce();
  std::array<unsigned char, 64> out{};
  std::memcpy(out.data(), &f, sizeof f);
  return out;
}

void export_registry::forget_run(std::uint64_t run_handle) noexcept {
  std::lock_guard lock{mutex_};
  auto const run = runs_.find(run_handle);
  if (run == runs_.end()) { return; }
  if (run->second.fd >= 0) { ::close(run->second.fd); }
  runs_.erase(run);
  for (auto it = exports_.begin(); it != exports_.end();) {
    auto const& used = it->second.runs;
    if (std::find(used.begin(), used.end(), run_handle) == used.end()) {
      ++it;
      continue;
    }
    by_block_.erase(std::make_tuple(used.front(), it->second.block_offset, it->second.block_bytes));
    it = exports_.erase(it);
  }
}

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

// ---- the opening side ---------------------------------------------------------------------------

namespace {

struct opened_block {
  CUdeviceptr base = 0;
  std::size_t bytes = 0;
  struct run {
    std::size_t offset;
    std::size_t bytes;
    CUmemGenericAllocationHandle handle;
  };
  std::vector<run> runs;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained while open
};

struct open_table {
  std::mutex mutex;
  std::map<std::uintptr_t, opened_block> blocks;  // the address open() returned -> its mapping
};

open_table& opened() {
  static open_table* const table = new open_table{};
  return *table;
}

// Undoes what was set up of `b` (each step tolerates the ones not reached).
void tear_down(opened_block& b) noexcept {
  if (b.context == nullptr) { return; }
  auto const& d = api();
  if (d.ctx_push(b.context) == CUDA_SUCCESS) {
    (void)d.ctx_synchronize();  // unmapping does not wait for kernels still using the memory
    for (auto const& r : b.runs) {
      (void)d.mem_unmap(b.base + r.offset, r.bytes);
      (void)d.mem_release(r.handle);
    }
    if (b.base != 0) { (void)d.mem_address_free(b.base, b.bytes); }
    CUcontext popped = nullptr;
    (void)d.ctx_pop(&popped);
  }
  (void)d.primary_ctx_release(b.device);
  b = opened_block{};
}

}  // namespace

fetched_export::~fetched_export() {
  for (int fd : fds) { ::close(fd); }
}

namespace {

// The answer comes from another process: the opener maps what it says and returns a
// pointer into it, so it must be the block the handle describes. (A damaged export id
// named another export, whose block was then mapped and handed out as this one.)
void check_answer(handle_fields const& f, reply_header const& header) {
  if (header.runs != f.runs || header.type != f.type || header.device != f.device ||
      header.block_offset != f.block_offset || header.block_bytes != f.block_bytes) {
    throw logic_error("vmm IPC: the answer of process " + std::to_string(f.pid) + " for export " +
                      std::to_string(f.export_id) + " does not match the handle (it describes " +
                      std::to_string(header.block_bytes) + " B at offset " + std::to_string(header.block_offset) +
                      " in " + std::to_string(header.runs) + " allocations; the handle " +
                      std::to_string(f.block_bytes) + " B at offset " + std::to_string(f.block_offset) + " in " +
                      std::to_string(f.runs) + "): the handle is damaged or not from this export");
  }
}

// The block must lie inside the runs received (open() returns the mapping's base plus its
// offset), and every run must have a size.
void check_runs(handle_fields const& f, fetched_export const& got) {
  std::uint64_t total = 0;
  for (std::uint64_t const n : got.bytes) {
    if (n == 0 || n > std::numeric_limits<std::uint64_t>::max() - total) {
      throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent a physical allocation of " +
                        std::to_string(n) + " B for export " + std::to_string(f.export_id));
    }
    total += n;
  }
  if (total != f.run_bytes || got.block_offset > total || got.block_bytes > total - got.block_offset) {
    throw logic_error("vmm IPC: export " + std::to_string(f.export_id) + " of process " + std::to_string(f.pid) +
                      " describes " + std::to_string(got.block_bytes) + " B at offset " +
                      std::to_string(got.block_offset) + ", outside the " + std::to_string(total) +
                      " B of its physical allocations (the handle says " + std::to_string(f.run_bytes) + " B)");
  }
}

}  // namespace

void fetch_export(std::array<unsigned char, 64> const& h, fetched_export& out) {
  handle_fields const f = fields_of(h);
  std::string const name = socket_name(f.pid, f.nonce);
  int const s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) { throw logic_error(std::string{"vmm IPC: socket(AF_UNIX) failed: "} + std::strerror(errno)); }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } const guard{s};
  set_timeouts(s, answer_timeout_s);
  sockaddr_un addr{};
  socklen_t const len = socket_address(f.pid, f.nonce, addr);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    throw logic_error("vmm IPC: cannot reach the exporting process " + std::to_string(f.pid) + " on the Unix socket " +
                      name + " (" + std::strerror(errno) + "): it has exited, or runs in another network namespace "
                      "(container); both processes must share a host and a network namespace");
  }
  request const req{f.export_id};
  reply_header header{};
  // Descriptors belong to the batches only: one carried with the header went first in
  // out.fds, and open() imported it for the first run, every later one shifted by one.
  std::vector<int> stray;
  bool const answered = send_all(s, &req, sizeof req, nullptr, 0) && receive(s, &header, sizeof header, stray);
  for (int fd : stray) { ::close(fd); }
  if (!answered) {
    throw logic_error("vmm IPC: the exporting process " + std::to_string(f.pid) + " did not answer on " + name +
                      " (within " + std::to_string(answer_timeout_s) + " s)");
  }
  if (!stray.empty()) {
    throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent " + std::to_string(stray.size()) +
                      " file descriptors with its answer's header for export " + std::to_string(f.export_id) +
                      " (they come only with the allocations)");
  }
  if (header.status != 0) {
    header.message[sizeof header.message - 1] = '\0';
    throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " refused export " + std::to_string(f.export_id) +
                      ": " + header.message);
  }
  check_answer(f, header);
  if (header.type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && header.type != CU_MEM_HANDLE_TYPE_FABRIC) {
    throw logic_error("vmm IPC: export " + std::to_string(f.export_id) + " of process " + std::to_string(f.pid) +
                      ": handle type " + std::to_string(header.type) +
                      " is neither fd nor fabric (the handle is damaged)");
  }
  out.type = static_cast<CUmemAllocationHandleType>(header.type);
  out.device = header.device;
  out.block_offset = header.block_offset;
  out.block_bytes = header.block_bytes;
  bool const with_fds = header.type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  while (out.bytes.size() < header.runs) {
    reply_batch batch{};
    std::size_t const fds_before = out.fds.size();
    if (!receive(s, &batch, sizeof batch, out.fds) || batch.count == 0 || batch.count > batch_runs ||
        out.bytes.size() + batch.count > header.runs) {
      throw logic_error("vmm IPC: a truncated answer from process " + std::to_string(f.pid));
    }
    if (with_fds && out.fds.size() - fds_before != batch.count) {
      throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent " +
                        std::to_string(out.fds.size() - fds_before) + " file descriptors for " +
                        std::to_string(batch.count) + " allocations");
    }
    for (std::uint32_t k = 0; k < batch.count; ++k) {
      out.bytes.push_back(batch.bytes[k]);
      out.fabric.push_back(batch.fabric[k]);
    }
  }
  check_runs(f, out);
}

void* open(handle const& h, int device) {
  (void)fields_of(h);  // bytes that are no handle say so first
  // Before the exporter is asked: a bad ordinal is the caller's error, not worth its descriptors.
  int const ordinal = resolve_device(device, "vmm IPC open");
  fetched_export got;
  fetch_export(h, got);
  auto const& d = api();
  opened_block b;
  MRSTACK_CU_TRY(d.init(0), "cuInit(0)");
  MRSTACK_CU_TRY(d.device_get(&b.device, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  MRSTACK_CU_TRY(d.primary_ctx_retain(&b.context, b.device), "cuDevicePrimaryCtxRetain");
  try {
    scoped_context const ctx{b.context};
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    std::size_t granularity = 0;
    MRSTACK_CU_TRY(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity");
    for (auto const n : got.bytes) { b.bytes += n; }
    MRSTACK_CU_TRY(d.mem_address_reserve(&b.base, b.bytes, granularity, 0, 0),
                   "cuMemAddressReserve(" + format_bytes(b.bytes) + ")");
    // Room first: a run mapped and then not recorded (push_back out of host memory) would
    // escape tear_down.
    b.runs.reserve(got.bytes.size());
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.bytes.size(); ++i) {
      CUmemGenericAllocationHandle imported = 0;
      void* shareable = got.type == CU_MEM_HANDLE_TYPE_FABRIC
                            ? static_cast<void*>(&got.fabric[i])
                            : reinterpret_cast<void*>(static_cast<std::intptr_t>(got.fds[i]));
      MRSTACK_CU_TRY(d.mem_import_from_shareable_handle(&imported, shareable, got.type),
                     std::string{"cuMemImportFromShareableHandle("} + type_name(got.type) + ")");
      CUresult const mapped = d.mem_map(b.base + at, got.bytes[i], 0, imported, 0);
      if (mapped != CUDA_SUCCESS) {
        (void)d.mem_release(imported);
        throw_driver_error(mapped, "cuMemMap(imported " + format_bytes(got.bytes[i]) + ")", __FILE__, __LINE__);
      }
      b.runs.push_back({at, got.bytes[i], imported});
      at += got.bytes[i];
    }
    // This device and its peers, as cudaIpcOpenMemHandle's lazy peer access gives: Numba
    // opens a handle on the exporter's device and copies from it on another.
    auto const access = read_write_access(ordinal, detail::peers_of(ordinal));
    MRSTACK_CU_TRY(d.mem_set_access(b.base, b.bytes, access.data(), access.size()), "cuMemSetAccess(imported block)");
  } catch (...) {
    tear_down(b);
    throw;
  }
  auto const address = static_cast<std::uintptr_t>(b.base) + got.block_offset;
  std::lock_guard lock{opened().mutex};
  try {
    opened().blocks.emplace(address, std::move(b));
  } catch (...) {  // out of host memory for the table: unmapped, not left mapped and unknown to close()
    tear_down(b);
    throw;
  }
  return reinterpret_cast<void*>(address);
}

void close(void* ptr) {
  opened_block b;
  {
    std::lock_guard lock{opened().mutex};
    auto const it = opened().blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == opened().blocks.end()) {
      throw logic_error("vmm IPC: close of " + format_hex(ptr) + ", which vmm_ipc::open did not return (or it was "
                        "closed already)");
    }
    b = std::move(it->second);
    opened().blocks.erase(it);
  }
  tear_down(b);
}

std::size_t open_count() noexcept {
  std::lock_guard lock{opened().mutex};
  return opened().blocks.size();
}

}  // namespace mrstack::vmm_ipc
