#pragma once
// Internal to mrstack: what both ends of vmm IPC (see vmm_ipc.hpp) agree on — the 64-byte
// handle's layout, the messages on the exporter's Unix socket, and the helpers each side
// uses to name, reach and talk over that socket. Apart from the registry (the exporter's
// state, vmm_ipc_registry.hpp) because the opener shares all of this and none of that.
#include <cuda.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <mrstack/upstream/vmm_ipc.hpp>

struct sockaddr_un;

namespace mrstack::vmm_ipc {

inline constexpr unsigned char magic[8] = {'M', 'R', 'S', 'V', 'M', 'M', 1, 0};
inline constexpr std::size_t batch_runs = 64;  // runs per message (SCM_RIGHTS carries at most 253 fds)
// The server answers one connection at a time: a peer that connects and then stays silent
// (hung, stopped in a debugger) would hold every later opener forever. It gets this long
// to send its request and take the answer; an opener waits this long for the exporter
// (which may first have to wait out a few such peers).
inline constexpr int peer_timeout_s = 2;
inline constexpr int answer_timeout_s = 30;

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

// ---- the handle (vmm_ipc_handle.cpp) -------------------------------------------------------------

/// This process's nonce: with its pid, names its socket.
std::uint64_t process_nonce();
/// The fields of `h`; a `logic_error` when it carries no mrstack magic.
handle_fields fields_of(handle const& h);

// ---- handle types (vmm_ipc_types.cpp) ------------------------------------------------------------

/// "fd", "fabric" or "?".
char const* type_name(std::uint32_t type);
/// "fabric handles" or "POSIX file descriptors".
char const* type_long_name(std::uint32_t type);
/// Why the block at `ptr` cannot be exported as `asked`: its run `run` of `runs` was
/// exported as `had` already.
std::string mixed_types(void const* ptr, std::uint32_t asked, std::uint32_t had, std::size_t run, std::size_t runs);

// ---- the socket (vmm_ipc_socket.cpp) -------------------------------------------------------------

/// Abstract socket address of the exporter `pid` with `nonce`; returns its length.
socklen_t socket_address(std::uint32_t pid, std::uint64_t nonce, sockaddr_un& addr);
/// The same address as messages print it ("@mrstack-vmm-ipc-...").
std::string socket_name(std::uint32_t pid, std::uint64_t nonce);
/// Makes blocking sends and receives on `fd` (connect included) give up after `seconds`.
void set_timeouts(int fd, int seconds) noexcept;
/// Sends one message of `bytes` with `fd_count` descriptors (at most batch_runs); true when all went.
bool send_all(int fd, void const* data, std::size_t bytes, int const* fds, std::size_t fd_count);
/// Receives one message into `data`; appends the descriptors it carries to `fds`. Out of
/// host memory to store them, it closes every descriptor the message carried and throws
/// std::bad_alloc.
bool receive(int fd, void* data, std::size_t bytes, std::vector<int>& fds);

}  // namespace mrstack::vmm_ipc
