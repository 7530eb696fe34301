#pragma once
/// `system_memory_resource`: ordinary host memory from the C++ runtime (aligned operator
/// new), used as an upstream so every suballocator and adaptor runs — and is tested under
/// sanitizers — on a machine without a GPU. Any power-of-two alignment (at least 256).
/// Thread-safe. Streams are ignored. Refusals throw `out_of_memory`.
#include <mrstack/resource.hpp>

namespace mrstack {

class system_memory_resource final : public memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<system_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "system"; }
  memory_kind do_kind() const noexcept override { return memory_kind::host; }
};

}  // namespace mrstack
