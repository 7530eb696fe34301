#pragma once
/// The `virtual_range` capability (detail/virtual_range.hpp) seen from a stack: which
/// resource of a stack, or of the process, owns an address.
#include <mrstack/detail/virtual_range.hpp>

namespace mrstack {

class memory_resource;

/// The virtual range in the stack under (and including) `top` whose reserved range holds
/// `ptr`, or nullptr. For IPC paths: such memory cannot go through cudaIpcGetMemHandle.
[[nodiscard]] virtual_range const* find_virtual_range(memory_resource const& top, void const* ptr) noexcept;

/// True when `ptr` lies in the range of any live virtual-range resource in this process
/// (vmm or simulated_vmm), whichever stack it belongs to.
[[nodiscard]] bool is_virtual_range_address(void const* ptr) noexcept;

}  // namespace mrstack
