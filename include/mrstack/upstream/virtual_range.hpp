#pragma once
/// The `virtual_range` capability (detail/virtual_range.hpp) seen from a stack: which
/// resource of a stack, or of the process, owns an address.
#include <mrstack/detail/virtual_range.hpp>

namespace mrstack {

class memory_resource;
class virtual_range_resource;

/// The virtual range in the stack under (and including) `top` whose reserved range holds
/// `ptr`, or nullptr. For IPC paths: such memory cannot go through cudaIpcGetMemHandle.
[[nodiscard]] virtual_range const* find_virtual_range(memory_resource const& top, void const* ptr) noexcept;

/// True when `ptr` lies in the range of any live virtual-range resource in this process
/// (vmm or simulated_vmm), whichever stack it belongs to.
[[nodiscard]] bool is_virtual_range_address(void const* ptr) noexcept;

/// The first layer of the stack under (and including) `top` that owns a virtual range
/// (vmm or simulated_vmm), or nullptr.
[[nodiscard]] virtual_range_resource* find_virtual_range_resource(memory_resource& top) noexcept;

/// Sleep and wake for a whole stack (see virtual_range_resource.hpp): asks the stack to
/// `release()` what it holds free (so free granules are neither copied nor mapped back),
/// then puts its virtual-range layer to sleep. Throws `logic_error` naming the stack when
/// it has no vmm/simulated_vmm layer. The layers above see no address change: a pool's
/// blocks keep their addresses. Until `wake_stack`, nothing may allocate from the stack or
/// touch its memory (the C ABI and the EMM adapter refuse allocations with a clear error).
void sleep_stack(memory_resource& top, bool keep_contents);
void wake_stack(memory_resource& top);
[[nodiscard]] bool stack_asleep(memory_resource& top) noexcept;

}  // namespace mrstack
