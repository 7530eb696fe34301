// vmm IPC's 64-byte handle (see include/mrstack/upstream/vmm_ipc.hpp): made by the
// registry, read by the opener, and the public calls that only look at one (is_handle,
// describe) or lead to the exporting vmm (export_block). Apart because neither side owns it.
#include <mrstack/upstream/vmm_ipc.hpp>

#include <mrstack/error.hpp>
#include <mrstack/upstream/virtual_range.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <unistd.h>

#include <cstring>
#include <random>

#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

std::uint64_t process_nonce() {
  static std::uint64_t const nonce = [] {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(getpid());
  }();
  return nonce;
}

handle_fields fields_of(handle const& h) {
  handle_fields f{};
  std::memcpy(&f, h.data(), sizeof f);
  if (std::memcmp(f.magic, magic, sizeof magic) != 0) {
    throw logic_error("vmm IPC: the 64 bytes are not an mrstack vmm IPC handle (no mrstack magic): a legacy CUDA "
                      "IPC handle opens with cudaIpcOpenMemHandle instead");
  }
  return f;
}

bool is_handle(void const* bytes, std::size_t length) noexcept {
  return bytes != nullptr && length >= handle_bytes && std::memcmp(bytes, magic, sizeof magic) == 0;
}

handle_info describe(handle const& h) {
  handle_fields const f = fields_of(h);
  return handle_info{f.pid, f.export_id, f.block_bytes, f.device, f.runs, type_name(f.type)};
}

handle export_block(memory_resource const& top, void const* ptr, std::size_t bytes) {
  auto const* range = find_virtual_range(top, ptr);
  auto* vmm = dynamic_cast<vmm_memory_resource*>(const_cast<virtual_range*>(range));
  if (vmm == nullptr) {
    throw logic_error("vmm IPC: " + format_hex(ptr) + " lies in no vmm layer of \"" + describe_stack(top) + "\"" +
                      (range != nullptr ? " (simulated_vmm memory cannot be shared)" : ""));
  }
  return vmm->export_ipc(ptr, bytes);
}

}  // namespace mrstack::vmm_ipc
