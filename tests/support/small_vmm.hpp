#pragma once
// The simulated virtual range the in-place growth tests share: 64 GiB of addresses in
// 2 MiB granules, `capacity` bytes of "device" behind them, `map_granules` granules per
// physical allocation.
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

namespace mrstack::test {

inline constexpr std::size_t vmm_granule = std::size_t{2} << 20;

inline std::shared_ptr<simulated_vmm_memory_resource> make_small_vmm(
    std::size_t capacity = std::numeric_limits<std::size_t>::max(), std::size_t map_granules = 1) {
  return std::make_shared<simulated_vmm_memory_resource>(std::size_t{1} << 36, vmm_granule, capacity, map_granules);
}

/// An address as an integer, for comparisons and arithmetic.
inline std::uintptr_t addr(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace mrstack::test
