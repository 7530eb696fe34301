#pragma once
/// Alignment arithmetic shared by every layer. CUDA-free.
#include <cstddef>
#include <cstdint>
#include <limits>

namespace mrstack::detail {

[[nodiscard]] constexpr bool is_pow2(std::size_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

/// Rounds `v` up to a multiple of `align` (a power of two). Saturates instead of wrapping:
/// a result of `max` means "too large", which callers turn into out_of_memory.
[[nodiscard]] constexpr std::size_t align_up(std::size_t v, std::size_t align) noexcept {
  std::size_t const mask = align - 1;
  if (v > std::numeric_limits<std::size_t>::max() - mask) { return std::numeric_limits<std::size_t>::max(); }
  return (v + mask) & ~mask;
}

[[nodiscard]] constexpr std::size_t align_down(std::size_t v, std::size_t align) noexcept {
  return v & ~(align - 1);
}

[[nodiscard]] inline bool is_aligned(void const* p, std::size_t align) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & (align - 1)) == 0;
}

}  // namespace mrstack::detail
