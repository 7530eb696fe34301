// vmm IPC's handle types (fd and fabric) as messages name them, and the refusal of an
// export over a run already exported as the other type. Apart so that every message about
// a handle type reads the same, whichever side prints it.
#include <mrstack/detail/format.hpp>

#include <string>

#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

char const* type_name(std::uint32_t type) {
  return type == CU_MEM_HANDLE_TYPE_FABRIC ? "fabric" : type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ? "fd" : "?";
}

char const* type_long_name(std::uint32_t type) {
  return type == CU_MEM_HANDLE_TYPE_FABRIC ? "fabric handles" : "POSIX file descriptors";
}

// Why the block at `ptr` cannot be exported as `asked`: its run `run` of `runs` was
// exported as `had` already.
std::string mixed_types(void const* ptr, std::uint32_t asked, std::uint32_t had, std::size_t run, std::size_t runs) {
  return "vmm IPC: export of " + (ptr != nullptr ? format_hex(ptr) : std::string{"a block"}) + " as " +
         type_long_name(asked) + " (ipc=" + type_name(asked) + ") refused: its physical allocation " +
         std::to_string(run) + " of " + std::to_string(runs) + " was exported as " + type_long_name(had) +
         " (ipc=" + type_name(had) + ") already, and a physical allocation is shared with one handle type only; "
         "share it as " + type_name(had) + " (through an export of its vmm), or allocate the block from a vmm(ipc=" +
         type_name(asked) + ") to share it as " + type_name(asked);
}

}  // namespace mrstack::vmm_ipc
