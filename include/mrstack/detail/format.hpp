#pragma once
/// Text for messages: byte counts and addresses as people read them. CUDA-free, so the
/// algorithm cores (detail/) and the errors (error.hpp) share one formatting.
#include <cstddef>
#include <cstdint>
#include <string>

namespace mrstack {

/// Formats a byte count for people: "1.50 MiB (1572864 B)".
std::string format_bytes(std::size_t bytes);

/// Formats an address or handle for error messages: "0x7f864d700000" (null: "0x0").
std::string format_hex(unsigned long long value);
inline std::string format_hex(void const* ptr) { return format_hex(reinterpret_cast<std::uintptr_t>(ptr)); }

}  // namespace mrstack
