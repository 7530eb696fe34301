#pragma once
/// Text for messages: byte counts and addresses as people read them. CUDA-free, so the
/// algorithm cores (detail/) and the errors (error.hpp) share one formatting.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mrstack {

/// Formats a byte count for people: "1.50 MiB (1572864 B)".
std::string format_bytes(std::size_t bytes);

/// Formats an address or handle for error messages: "0x7f864d700000" (null: "0x0").
std::string format_hex(unsigned long long value);
inline std::string format_hex(void const* ptr) { return format_hex(reinterpret_cast<std::uintptr_t>(ptr)); }

/// Bytes of the well-formed UTF-8 sequence that starts at text[at] (1 to 4), or 0 when none
/// does: a continuation or lead byte no sequence starts with, a sequence cut short, an
/// overlong form, a UTF-16 surrogate, a code point past U+10FFFF. Text that goes into JSON
/// (thread ids, paths, specs) is checked with it.
std::size_t utf8_sequence_length(std::string_view text, std::size_t at) noexcept;

}  // namespace mrstack
