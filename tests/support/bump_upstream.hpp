#pragma once
// A stand-in for the arena core's upstream: chunks at made-up addresses (never touched),
// each 16 MiB-aligned and 16 MiB apart or more, and a record of those handed back.
#include <mrstack/detail/arena_core.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace mrstack::test {

struct bump_upstream final : detail::arena_upstream {
  static constexpr std::size_t spacing = std::size_t{16} << 20;
  std::uintptr_t next = std::uintptr_t{1} << 40;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> returned;  // (base, stream handle)
  std::uintptr_t allocate(std::size_t size, detail::stream_ref const&) override {
    std::uintptr_t const p = next;
    next += (size + spacing - 1) / spacing * spacing;
    return p;
  }
  void deallocate(std::uintptr_t base, std::size_t, detail::stream_ref const& s) noexcept override {
    returned.emplace_back(base, s.handle);
  }
};

}  // namespace mrstack::test
