#pragma once
/// Sharing `vmm` memory between processes of one host (CUDA IPC for memory that
/// cudaIpcGetMemHandle refuses: physical allocations made by cuMemCreate).
///
/// The exporting side (`vmm_memory_resource::export_ipc`, or `export_block` for a stack)
/// describes a live block [ptr, ptr + bytes) by a 64-byte handle: which process exported
/// it, an export id, the block's offset into its first physical allocation, its size and
/// device. The handle is plain bytes: it pickles, and it fits where a legacy
/// cudaIpcMemHandle_t goes (Numba's IpcHandle carries it unchanged).
///
/// The opening side (`open`) asks the exporting process for the physical allocations behind
/// the block over a Unix socket (an abstract name derived from the exporter's pid and a
/// per-process nonce): the exporter's server thread, started by the first export, checks
/// that the peer runs as the same user (SO_PEERCRED; root may open anything) and answers
/// with the allocations' sizes and their shareable handles — POSIX file descriptors passed
/// with SCM_RIGHTS (ipc=fd), or fabric handles as bytes (ipc=fabric). The opener imports
/// them (cuMemImportFromShareableHandle), reserves a fresh range, maps them in order, makes
/// them read-write for its device, and returns the range's base plus the block's offset.
/// `close` unmaps and releases them. No ptrace permission is needed (pidfd_getfd would).
///
/// Contract:
/// - The exporter keeps the block live until every opener closed it: the physical memory
///   an opener mapped stays alive while mapped, but once the exporter frees and reuses the
///   block (or its stack sleeps), the two processes no longer see the same bytes. An export
///   ends when its physical allocations are unmapped by the exporter; opening it later is
///   a `logic_error` saying so.
/// - Opening needs the exporting process alive and reachable: same host and network
///   namespace (abstract Unix sockets are per network namespace). Otherwise `open` throws
///   a `logic_error` naming the process and the socket.
/// - `open` of bytes that are not such a handle (`is_handle` false) is a `logic_error`.
/// - Thread-safe.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mrstack {
class memory_resource;
}

namespace mrstack::vmm_ipc {

inline constexpr std::size_t handle_bytes = 64;
using handle = std::array<unsigned char, handle_bytes>;

/// True when `bytes` (at least `length` long) carry an mrstack vmm IPC handle.
[[nodiscard]] bool is_handle(void const* bytes, std::size_t length) noexcept;

/// What a handle says (for messages and tests).
struct handle_info {
  std::uint32_t exporter_pid = 0;
  std::uint64_t export_id = 0;
  std::uint64_t block_bytes = 0;
  std::int32_t device = 0;
  std::uint32_t runs = 0;  ///< physical allocations behind the block
  std::string handle_type; ///< "fd" or "fabric"
};
[[nodiscard]] handle_info describe(handle const& h);

/// The handle of [ptr, ptr + bytes), a live block of the stack under `top` whose vmm layer
/// owns it. Throws `logic_error` when no vmm layer of the stack owns `ptr`.
[[nodiscard]] handle export_block(memory_resource const& top, void const* ptr, std::size_t bytes);

/// Maps the block `h` names on `device` (-1: the current device); returns its address.
[[nodiscard]] void* open(handle const& h, int device = -1);
/// Unmaps what `open` returned. `logic_error` for anything else.
void close(void* ptr);
/// Blocks this process has open now.
[[nodiscard]] std::size_t open_count() noexcept;

}  // namespace mrstack::vmm_ipc
