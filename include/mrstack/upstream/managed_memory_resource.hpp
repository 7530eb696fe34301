#pragma once
/// `managed_memory_resource`: unified memory from cudaMallocManaged (attached globally),
/// accessible from the host and every device. Synchronous like cudaMalloc, so the stream
/// is ignored. Alignment up to 256. Thread-safe. Refusals throw `out_of_memory`.
/// Calls run on the resource's device (given, or current at construction) and leave the
/// caller's current device as it was. cudaMallocManaged is made in relaxed graph-capture
/// mode, as `cuda`'s cudaMalloc.
#include <mrstack/resource.hpp>

namespace mrstack {

class managed_memory_resource final : public memory_resource {
 public:
  /// `device` -1: the device current at construction (no context is created to find it).
  explicit managed_memory_resource(int device = -1);
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    auto const* same = dynamic_cast<managed_memory_resource const*>(&other);
    return same != nullptr && same->device_ == device_;
  }
  std::string do_name() const override { return "managed"; }
  memory_kind do_kind() const noexcept override { return memory_kind::managed; }

  int device_;
};

}  // namespace mrstack
