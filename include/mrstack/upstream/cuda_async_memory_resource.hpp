#pragma once
/// `cuda_async_memory_resource`: the CUDA driver's stream-ordered allocator
/// (cudaMallocFromPoolAsync / cudaFreeAsync) over a `cudaMemPool_t` of its own.
///
/// Contract: the pool is created on `device` (-1: the device current at construction) and
/// every call runs there, whatever device is current on the calling thread, which is left
/// as it was (a null stream is that device's default stream); memory is usable
/// on the allocating stream at once and returned to the pool in the order of the freeing
/// stream (the driver handles cross-stream reuse). `initial_pool_size` bytes are
/// allocated and freed once at construction so the pool starts warm; the release
/// threshold (default: keep everything) bounds what the pool keeps when the device
/// synchronizes. `pool_handle()` exposes the pool for tuning. Alignment up to 256.
/// Thread-safe. Refusals throw `out_of_memory` with the device's free memory and what the
/// pool holds. Destruction synchronizes the device and destroys the pool.
/// `peer_access`: every device that can (cudaDeviceCanAccessPeer) may read and write the
/// pool's memory (cudaMemPoolSetAccess; no peer context is created).
#include <cstdint>
#include <optional>
#include <vector>

#include <mrstack/resource.hpp>

namespace mrstack {

class cuda_async_memory_resource final : public memory_resource {
 public:
  explicit cuda_async_memory_resource(std::size_t initial_pool_size = 0,
                                      std::optional<std::size_t> release_threshold = std::nullopt,
                                      int device = -1, bool peer_access = false);
  ~cuda_async_memory_resource() override;

  [[nodiscard]] cudaMemPool_t pool_handle() const noexcept { return pool_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  /// The devices given access to the pool's memory (empty without `peer_access`).
  [[nodiscard]] std::vector<int> const& peers() const noexcept { return peers_; }
  /// Bytes the driver's pool holds reserved (cudaMemPoolAttrReservedMemCurrent).
  [[nodiscard]] std::size_t reserved_bytes() const;
  /// Bytes in use by allocations (cudaMemPoolAttrUsedMemCurrent).
  [[nodiscard]] std::size_t used_bytes() const;
  /// The most bytes the pool has held reserved since the last reset (cudaMemPoolAttrReservedMemHigh).
  [[nodiscard]] std::size_t peak_reserved_bytes() const;
  /// Starts a new peak at what is reserved now.
  void reset_peak_reserved_bytes();

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "cuda_async"; }
  memory_kind do_kind() const noexcept override { return memory_kind::device; }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;

  cudaMemPool_t pool_{};
  int device_{0};
  std::vector<int> peers_;
};

}  // namespace mrstack
