#pragma once
// The logging adaptor's number text (internal to src/adaptor): decimal and lower-case hex
// written straight into a row buffer. Every row has four or five numbers, so these run
// tens of millions of times a second on a busy log; std::to_chars took 13-17% of a
// per-thread row's time on the 2-core VM (a call through its base switch, a digit count
// that divides in a loop, hex one nibble a step).
//
// The output is exactly std::to_chars's (decimal; hex base 16, lower case):
// tests/adaptor_logging_format.cpp checks it against std::to_chars over edge and random
// values, and whole rows against printf.
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

namespace mrstack::detail {

/// "00", "01", ... "99": two digits per table read, half the divisions of one at a time.
inline constexpr auto digit_pairs = [] {
  std::array<char, 200> t{};
  for (int i = 0; i < 100; ++i) {
    t[2 * i] = static_cast<char>('0' + i / 10);
    t[2 * i + 1] = static_cast<char>('0' + i % 10);
  }
  return t;
}();

/// Writes `v` (< 100) as exactly two digits.
inline void put_two_digits(char* out, std::uint32_t v) noexcept { std::memcpy(out, &digit_pairs[2 * v], 2); }

/// The decimal digits of `v` (1 for 0): the bit length gives the count to within one
/// (1233 / 4096 is just under log10(2)), one compare settles it.
inline unsigned decimal_length(std::uint64_t v) noexcept {
  static constexpr auto powers = [] {
    std::array<std::uint64_t, 20> p{};  // p[0] = 0, so 0 counts as one digit
    std::uint64_t x = 1;
    for (std::size_t i = 1; i < p.size(); ++i) { p[i] = x *= 10; }
    return p;
  }();
  unsigned const below = (static_cast<unsigned>(std::bit_width(v)) * 1233) >> 12;
  return below + (v >= powers[below] ? 1 : 0);
}

/// The eight digits of `v` (< 10^8, zero-padded) as characters packed in memory order
/// (store them with memcpy): two independent halves, four table reads, no loop.
inline std::uint64_t eight_digits(std::uint32_t v) noexcept {
  std::uint32_t const high = v / 10000;
  std::uint32_t const low = v - high * 10000;
  char text[8];
  put_two_digits(text, high / 100);
  put_two_digits(text + 2, high % 100);
  put_two_digits(text + 4, low / 100);
  put_two_digits(text + 6, low % 100);
  std::uint64_t x;
  std::memcpy(&x, text, 8);
  return x;
}

inline char* put_eight_digits(char* out, std::uint32_t v) noexcept {
  std::uint64_t const text = eight_digits(v);
  std::memcpy(out, &text, 8);
  return out + 8;
}

/// Writes `v` (< 10^8) in decimal; returns the end. Always stores 8 bytes at `out`: the
/// eight-digit text with its leading zeros shifted out, so no branch depends on the length
/// (a loop of two digits a step mispredicted its exit as the length changed column to
/// column). The bytes past the end are the caller's next field's to overwrite.
inline char* put_short_decimal(char* out, std::uint32_t v) noexcept {
  unsigned const length = decimal_length(v);
  unsigned const zeros = 8 * (8 - length);  // bits of leading '0's, below 64: length >= 1
  std::uint64_t text = eight_digits(v);
  if constexpr (std::endian::native == std::endian::little) {
    text >>= zeros;  // the first characters are the low bytes
  } else {
    text <<= zeros;
  }
  std::memcpy(out, &text, 8);
  return out + length;
}

/// put_decimal's numbers of nine digits or more (the Stamp column, large sizes): blocks of
/// eight digits below a short head. Kept out of line so the common short path inlines.
[[gnu::noinline]] inline char* put_long_decimal(char* out, std::uint64_t v) noexcept {
  constexpr std::uint64_t block = 100'000'000;
  std::uint64_t const high = v / block;
  auto const low = static_cast<std::uint32_t>(v - high * block);
  if (high < block) {
    out = put_short_decimal(out, static_cast<std::uint32_t>(high));
  } else {  // 17 to 20 digits
    std::uint64_t const top = high / block;  // < 1845
    out = put_short_decimal(out, static_cast<std::uint32_t>(top));
    out = put_eight_digits(out, static_cast<std::uint32_t>(high - top * block));
  }
  return put_eight_digits(out, low);
}

/// Writes `v` in decimal (what std::to_chars writes); returns the end. Stores up to 8
/// bytes past the end (see put_short_decimal): `out` needs 20 bytes of room.
inline char* put_decimal(char* out, std::uint64_t v) noexcept {
  if (v < 100'000'000) [[likely]] { return put_short_decimal(out, static_cast<std::uint32_t>(v)); }
  return put_long_decimal(out, v);
}

/// The eight nibbles of `v` as lower-case hex characters, most significant first, packed
/// in memory order (store the result with memcpy). No loop, no table: the nibbles are
/// spread one per byte with three shift-and-mask steps, and a byte's character is '0' +
/// nibble, plus 'a' - '0' - 10 where the nibble is 10 or more (that test done on all
/// eight bytes at once: nibble + 6 carries into bit 4 exactly then).
inline std::uint64_t hex_eight(std::uint32_t v) noexcept {
  std::uint64_t x = v;
  x = ((x & 0xffff0000u) << 16) | (x & 0xffffu);
  x = ((x & 0x0000ff000000ff00u) << 8) | (x & 0x000000ff000000ffu);
  x = ((x & 0x00f000f000f000f0u) << 4) | (x & 0x000f000f000f000fu);
  // Byte i now holds nibble i (byte 0 the least significant): on a little-endian machine
  // that is the string backwards.
  if constexpr (std::endian::native == std::endian::little) { x = __builtin_bswap64(x); }
  std::uint64_t const letters = ((x + 0x0606060606060606u) >> 4) & 0x0101010101010101u;
  return x + 0x3030303030303030u + letters * ('a' - '0' - 10);
}

/// Writes `v` in lower-case hex, no prefix (what std::to_chars(..., 16) writes); returns
/// the end. Always stores 16 bytes at `out`: the digits first (the value is shifted up so
/// its leading zero nibbles fall off), then bytes the caller's next field overwrites —
/// so `out` needs 16 bytes of room whatever the value.
inline char* put_hex(char* out, std::uint64_t v) noexcept {
  unsigned const digits = (static_cast<unsigned>(std::bit_width(v | 1)) + 3) / 4;
  std::uint64_t const top = v << (64 - 4 * digits);  // digits >= 1: a shift below 64
  std::uint64_t const text[2] = {hex_eight(static_cast<std::uint32_t>(top >> 32)),
                                 hex_eight(static_cast<std::uint32_t>(top))};
  std::memcpy(out, text, 16);
  return out + digits;
}

}  // namespace mrstack::detail
