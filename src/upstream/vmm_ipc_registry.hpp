#pragma once
// Internal to mrstack: the exporting side of vmm IPC (see vmm_ipc.hpp) — which physical
// allocations are exported, their shareable handles, and the socket server that hands
// them to openers.
#include <cuda.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <mrstack/upstream/virtual_range_resource.hpp>

namespace mrstack::vmm_ipc {

class export_registry {
 public:
  /// Exports the runs behind the block at `ptr` (call with the runs' owner locked and its
  /// context current) and returns the block's 64-byte handle.
  std::array<unsigned char, 64> add_export(void const* ptr, std::vector<virtual_range_resource::mapped_run> const& runs,
                                           std::size_t block_offset, std::size_t block_bytes, int device,
                                           CUmemAllocationHandleType type);
  /// The same, with `export_run(out, run handle)` making a run's shareable handle (an int
  /// file descriptor or a CUmemFabricHandle at `out`) instead of the driver: tests drive
  /// the transport with pipes on a machine without a GPU. `ptr` only names the block in
  /// messages (tests that need no name leave it out).
  using run_exporter = std::function<void(void* out, std::uint64_t run_handle)>;
  std::array<unsigned char, 64> add_export_with(std::vector<virtual_range_resource::mapped_run> const& runs,
                                                std::size_t block_offset, std::size_t block_bytes, int device,
                                                CUmemAllocationHandleType type, run_exporter const& export_run,
                                                void const* ptr = nullptr);
  /// The run `handle` is being unmapped: its shareable handle is closed and every export
  /// that uses it ends.
  void forget_run(std::uint64_t handle) noexcept;

  /// Serves one opener on a connected socket (the server thread's body).
  void serve(int connection) noexcept;

 private:
  struct exported_run {
    std::size_t bytes = 0;
    CUmemAllocationHandleType type{};  // what it was exported as: the only type it is shared as
    int fd = -1;
    CUmemFabricHandle fabric{};
  };
  struct export_entry {
    std::vector<std::uint64_t> runs;
    std::size_t block_offset = 0;
    std::size_t block_bytes = 0;
    int device = 0;
    CUmemAllocationHandleType type{};
  };
  struct answer;  // what one opener is sent (vmm_ipc_server.cpp)
  void ensure_server();  // mutex_ held
  /// The id of the export of the block at `block_offset` over `runs`, made and recorded if
  /// the block has none (mutex_ held). Records nothing when it throws.
  std::uint64_t export_id_for(std::vector<virtual_range_resource::mapped_run> const& runs, std::size_t block_offset,
                              std::size_t block_bytes, int device, CUmemAllocationHandleType type);
  /// Copies export `export_id`'s answer (duplicating its descriptors) into `out` under the
  /// lock, or makes `out` a refusal saying why.
  void take_answer(std::uint64_t export_id, answer& out) noexcept;

  std::mutex mutex_;
  std::map<std::uint64_t, exported_run> runs_;        // run handle -> its shareable handle
  std::map<std::uint64_t, export_entry> exports_;     // export id -> the block
  std::map<std::tuple<std::uint64_t, std::size_t, std::size_t>, std::uint64_t> by_block_;  // (first run, offset, bytes) -> id
  std::uint64_t next_id_ = 1;
  int server_pid_ = 0;  // the process whose server thread runs (a forked child starts its own)
};

export_registry& registry();

/// What an opener receives from the exporting process for one handle.
struct fetched_export {
  CUmemAllocationHandleType type{};
  int device = 0;
  std::size_t block_offset = 0;
  std::size_t block_bytes = 0;
  std::vector<std::uint64_t> bytes;            // per run
  std::vector<CUmemFabricHandle> fabric;       // per run (ipc=fabric)
  std::vector<int> fds;                        // per run (ipc=fd); closed by the destructor
  fetched_export() = default;
  fetched_export(fetched_export const&) = delete;
  fetched_export& operator=(fetched_export const&) = delete;
  ~fetched_export();
};

/// Asks the process that made `h` for the block's runs over its socket. Throws
/// `logic_error` naming the process when it cannot be reached or refuses.
void fetch_export(std::array<unsigned char, 64> const& h, fetched_export& out);

}  // namespace mrstack::vmm_ipc
