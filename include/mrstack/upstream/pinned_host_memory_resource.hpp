#pragma once
/// `pinned_host_memory_resource`: page-locked host memory from cudaHostAlloc (portable:
/// pinned for every device), readable and writable by host and device, the fast path for
/// host<->device copies. cudaFreeHost synchronizes, so the stream is ignored. Any
/// power-of-two alignment up to 4096 (a page). Thread-safe. Refusals throw `out_of_memory`.
/// Put a pool over it for a pinned host pool (as CuPy's PinnedMemoryPool). The calls run
/// with the resource's device current (given, or current at construction), so they create
/// no context on any other device; the caller's current device is left as it was.
/// cudaHostAlloc is made in relaxed graph-capture mode, as `cuda`'s cudaMalloc.
#include <mrstack/resource.hpp>

namespace mrstack {

class pinned_host_memory_resource final : public memory_resource {
 public:
  /// `device` -1: the device current at construction (no context is created to find it).
  explicit pinned_host_memory_resource(int device = -1);
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<pinned_host_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "pinned_host"; }
  memory_kind do_kind() const noexcept override { return memory_kind::pinned_host; }

  int device_;
};

}  // namespace mrstack
