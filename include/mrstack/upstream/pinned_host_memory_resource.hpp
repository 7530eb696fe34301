#pragma once
/// `pinned_host_memory_resource`: page-locked host memory from cudaHostAlloc (portable:
/// pinned for every device), readable and writable by host and device, the fast path for
/// host<->device copies. cudaFreeHost synchronizes, so the stream is ignored. Any
/// power-of-two alignment up to 4096 (a page). Thread-safe. Refusals throw `out_of_memory`.
/// Put a pool over it for a pinned host pool (as CuPy's PinnedMemoryPool).
#include <mrstack/resource.hpp>

namespace mrstack {

class pinned_host_memory_resource final : public memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<pinned_host_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "pinned_host"; }
  memory_kind do_kind() const noexcept override { return memory_kind::pinned_host; }
};

}  // namespace mrstack
