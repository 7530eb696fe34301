#pragma once
/// `managed_memory_resource`: unified memory from cudaMallocManaged (attached globally),
/// accessible from the host and every device. Synchronous like cudaMalloc, so the stream
/// is ignored. Alignment up to 256. Thread-safe. Refusals throw `out_of_memory`.
#include <mrstack/resource.hpp>

namespace mrstack {

class managed_memory_resource final : public memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<managed_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "managed"; }
  memory_kind do_kind() const noexcept override { return memory_kind::managed; }
};

}  // namespace mrstack
