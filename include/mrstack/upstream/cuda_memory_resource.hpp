#pragma once
/// `cuda_memory_resource`: device memory straight from cudaMalloc/cudaFree.
///
/// Contract: memory is allocated on the resource's device (given, or the one current at
/// construction), whatever device is current on the calling thread, which is left as it
/// was (a driver context push and pop; no context is created on any other device). 256-byte aligned
/// (cudaMalloc guarantees it; larger alignments are refused with a `logic_error` that
/// points at the aligned adaptor). cudaMalloc and cudaFree synchronize the device, so the
/// stream argument is ignored: memory is usable on any stream at once. A refusal throws
/// `out_of_memory` naming the size and the device's free memory. Thread-safe. Slow
/// (microseconds to milliseconds a call): the upstream for a suballocator, or the
/// baseline in a benchmark. cudaMalloc is made in relaxed graph-capture mode, so a pool can
/// grow while a stream is captured (src/relaxed_capture_scope.hpp says why that is safe).
///
/// `peer_access`: every device that can (cudaDeviceCanAccessPeer) gets peer access to this
/// device's memory at construction (cudaDeviceEnablePeerAccess on each peer, which creates
/// the peers' contexts), so kernels and copies on them may read and write it.
#include <vector>

#include <mrstack/resource.hpp>

namespace mrstack {

class cuda_memory_resource final : public memory_resource {
 public:
  /// `device` -1: the device current at construction (cudaGetDevice, which creates no
  /// context); -1 stays when there is no CUDA runtime, and each call then uses the current one.
  explicit cuda_memory_resource(int device = -1, bool peer_access = false);

  [[nodiscard]] int device() const noexcept { return device_; }
  /// The devices given peer access at construction (empty without `peer_access`).
  [[nodiscard]] std::vector<int> const& peers() const noexcept { return peers_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    auto const* same = dynamic_cast<cuda_memory_resource const*>(&other);
    return same != nullptr && same->device_ == device_;
  }
  std::string do_name() const override { return "cuda"; }
  memory_kind do_kind() const noexcept override { return memory_kind::device; }

  int device_;
  std::vector<int> peers_;
};

}  // namespace mrstack
