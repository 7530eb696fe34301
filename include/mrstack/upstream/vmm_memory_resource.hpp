#pragma once
/// `vmm_memory_resource` (spec name `vmm`): one reserved virtual address range on a device,
/// backed by physical device memory on demand through the CUDA driver's virtual memory
/// management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess; cuMemUnmap and
/// cuMemRelease to give memory back). The driver API is reached through the runtime
/// (cudaGetDriverEntryPointByVersion), so mrstack still links only cudart_static.
///
/// Contract (beyond virtual_range_resource.hpp and virtual_range.hpp):
/// - Construction reserves `reserve_bytes` of addresses on `device` (default: twice the
///   device's memory, rounded up to the granularity; addresses cost no memory) and throws
///   `cuda_error` naming the reason when it cannot — including a device or driver without
///   virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).
/// - The granularity is the driver's minimum for device memory (2 MiB on current GPUs).
///   Up to `map_granules` granules share one physical allocation (see granule_map.hpp: 1
///   gives exact release, larger values fewer driver calls). Physical memory is made
///   read-write for `device` and, with `peer_access` (the default), for every device that
///   can access it as a peer (cudaDeviceCanAccessPeer), so copies and kernels on other
///   devices may use it as they may use cudaMalloc memory (without access, a copy from
///   another device's context fails with CUDA_ERROR_INVALID_VALUE). Granting access
///   creates no context on the peers. `peer_access=false` keeps it to `device`.
/// - Running out of device memory throws `out_of_memory` with the device's free memory.
/// - Giving memory back (decommit, deallocate) first waits for all work on the device's
///   primary context: unmapping does not wait for kernels that may still use the memory.
/// - IPC: this memory cannot be exported with cudaIpcGetMemHandle; `export_ipc` shares it
///   instead (see vmm_ipc.hpp). `ipc` chooses what the physical allocations can be exported
///   as: `fd` (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: processes of one host), `fabric`
///   (CU_MEM_HANDLE_TYPE_FABRIC: needs a driver, device and IMEX channel that support it),
///   `none`, or `automatic` (fd where the device supports it and cuMemCreate accepts it,
///   else none). Asking for a type
///   the device does not support throws `cuda_error` saying which attribute refused and
///   what to use instead.
/// - Sleep and wake (virtual_range_resource.hpp): with contents kept, sleep copies every
///   committed granule to one pinned host buffer (one async copy per committed stretch, one
///   synchronization) and wake copies them back the same way after mapping; the staging
///   buffer is freed on a background thread after wake.
/// - Memory is stream-agnostic (mapping is synchronous), like cudaMalloc's.
/// Driver calls happen with the device's primary context pushed, so any thread may call.
#include <array>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include <mrstack/upstream/virtual_range_resource.hpp>

namespace mrstack {

class vmm_memory_resource final : public virtual_range_resource, private detail::granule_backend {
 public:
  /// Granules per physical allocation by default: 16 (32 MiB on current GPUs). Replaying a
  /// ResNet-50 training log, 16 made 8x fewer driver calls than 1 at the same peak
  /// footprint; it only coarsens what a release can give back while blocks stay live
  /// (docs/vmm.md).
  static constexpr std::size_t default_map_granules = 16;

  /// What physical allocations can be exported as (see the contract).
  enum class ipc_mode { automatic, none, fd, fabric };
  /// "auto", "none", "fd", "fabric" -> the mode; anything else: logic_error listing them.
  static ipc_mode parse_ipc_mode(std::string_view text);
  static char const* to_string(ipc_mode mode) noexcept;

  /// `reserve_bytes` 0: twice the device's total memory; past half the address space a
  /// `logic_error` naming it. `map_granules` at least 1 (0 is a `logic_error` naming it).
  /// Both are checked before any driver call. `device` -1: the current device.
  /// `peer_access`: every device that can access this one (cudaDeviceCanAccessPeer) may
  /// read and write the memory too (see the contract).
  explicit vmm_memory_resource(std::size_t reserve_bytes = 0, std::size_t map_granules = default_map_granules,
                               int device = -1, ipc_mode ipc = ipc_mode::automatic, bool peer_access = true);
  ~vmm_memory_resource() override;

  [[nodiscard]] int device() const noexcept;
  /// The devices besides `device()` that may read and write the memory (empty without peer access).
  [[nodiscard]] std::vector<int> peers() const;
  /// The export type in force (never `automatic`).
  [[nodiscard]] ipc_mode ipc() const noexcept;

  /// A 64-byte handle another process opens with `vmm_ipc::open` (vmm_ipc.hpp) to map
  /// [ptr, ptr + bytes), a live block of this range. Throws `logic_error` when the range
  /// was made with ipc=none (saying how to enable it) or the bytes are not committed.
  [[nodiscard]] std::array<unsigned char, 64> export_ipc(void const* ptr, std::size_t bytes);

  /// The driver's minimum granularity for device memory on `device` (-1: current).
  static std::size_t device_granularity(int device = -1);

  struct driver;  // the driver entry points and this device's handles (src/upstream/vmm_memory_resource.cpp)

 private:
  vmm_memory_resource(std::unique_ptr<driver> drv, std::size_t map_granules);

  // granule_backend: the driver calls
  std::uint64_t map(std::size_t offset, std::size_t bytes) override;
  void enable_access(std::size_t offset, std::size_t bytes) override;
  void before_unmap() override;
  void unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) override;
  void save_contents(stretches const& saved) override;
  void restore_contents(stretches const& restored) override;
  void drop_saved_contents() noexcept override;

  memory_kind do_kind() const noexcept override { return memory_kind::device; }
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }

  std::unique_ptr<driver> driver_;
};

}  // namespace mrstack
