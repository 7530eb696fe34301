#pragma once
/// `cuda_memory_resource`: device memory straight from cudaMalloc/cudaFree.
///
/// Contract: memory is allocated on the device current at the call; 256-byte aligned
/// (cudaMalloc guarantees it; larger alignments are refused with a `logic_error` that
/// points at the aligned adaptor). cudaMalloc and cudaFree synchronize the device, so the
/// stream argument is ignored: memory is usable on any stream at once. A refusal throws
/// `out_of_memory` naming the size and the device's free memory. Thread-safe. Slow
/// (microseconds to milliseconds a call): the upstream for a suballocator, or the
/// baseline in a benchmark.
#include <mrstack/resource.hpp>

namespace mrstack {

class cuda_memory_resource final : public memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<cuda_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "cuda"; }
  memory_kind do_kind() const noexcept override { return memory_kind::device; }
};

}  // namespace mrstack
