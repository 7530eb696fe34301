// vmm IPC's export registry (see vmm_ipc_registry.hpp): which runs are exported, as what
// handle type, and which blocks over them have export ids. Apart from the server that
// answers from it (vmm_ipc_server.cpp): this is what an export and an unmap change.
#include <mrstack/detail/format.hpp>
#include <mrstack/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "vmm_driver.hpp"
#include "vmm_ipc_registry.hpp"
#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

using namespace vmm_driver;

export_registry& registry() {
  static export_registry* const instance = new export_registry{};  // outlives every vmm and the server thread
  return *instance;
}

std::array<unsigned char, 64> export_registry::add_export(void const* ptr,
                                                          std::vector<virtual_range_resource::mapped_run> const& runs,
                                                          std::size_t block_offset, std::size_t block_bytes,
                                                          int device, CUmemAllocationHandleType type) {
  auto const export_run = [type](void* out, std::uint64_t run_handle) {
    MRSTACK_CU_TRY(api().mem_export_to_shareable_handle(out, run_handle, type, 0),
                   std::string{"cuMemExportToShareableHandle("} + type_name(type) + ")");
  };
  return add_export_with(runs, block_offset, block_bytes, device, type, export_run, ptr);
}

std::array<unsigned char, 64> export_registry::add_export_with(
    std::vector<virtual_range_resource::mapped_run> const& runs, std::size_t block_offset, std::size_t block_bytes,
    int device, CUmemAllocationHandleType type, run_exporter const& export_run, void const* ptr) {
  if (runs.empty()) { throw logic_error("vmm IPC: an export needs at least one physical allocation"); }
  // Any other type was exported into the descriptor slot and recorded as the run's type:
  // its handle opened as "damaged", and a later export over the run was refused naming
  // the type asked for as the one the run had.
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC) {
    throw logic_error("vmm IPC: export of " + (ptr != nullptr ? format_hex(ptr) : std::string{"a block"}) +
                      " as handle type " + std::to_string(static_cast<unsigned>(type)) +
                      " refused: only POSIX file descriptors (ipc=fd) and fabric handles (ipc=fabric) are shared");
  }
  std::lock_guard lock{mutex_};
  // A run keeps the one shareable handle it was first exported as. Reused under the other
  // type, the export succeeded and its open failed far from the cause: answered with a
  // handle never made (a fabric handle of zeros, descriptor -1) or, for the same block,
  // the earlier export's type ("does not match the handle").
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto const known = runs_.find(runs[i].handle);
    if (known != runs_.end() && known->second.type != type) {
      throw logic_error(mixed_types(ptr, type, known->second.type, i, runs.size()));
    }
  }
  ensure_server();
  // The runs this export records, taken out again if it fails partway (the driver refusing
  // a later run, no host memory for the books): left in, they stayed recorded as this type,
  // so a retry as the other type was refused as mixing types, and their descriptors stayed
  // open until the runs were unmapped. Reserved first, so recording one cannot fail after
  // its export.
  std::vector<std::uint64_t> added;
  added.reserve(runs.size());
  std::size_t run_bytes = 0;
  std::uint64_t id = 0;
  try {
    for (auto const& r : runs) {
      run_bytes += r.bytes;
      if (runs_.count(r.handle) != 0) { continue; }
      exported_run e;
      e.bytes = r.bytes;
      e.type = type;
      void* out = type == CU_MEM_HANDLE_TYPE_FABRIC ? static_cast<void*>(&e.fabric) : static_cast<void*>(&e.fd);
      export_run(out, r.handle);
      try {
        runs_.emplace(r.handle, e);
      } catch (...) {  // out of host memory: the descriptor, not yet the registry's, would stay open for good
        if (e.fd >= 0) { ::close(e.fd); }
        throw;
      }
      added.push_back(r.handle);
    }
    id = export_id_for(runs, block_offset, block_bytes, device, type);
  } catch (...) {
    for (std::uint64_t const handle : added) {
      auto const run = runs_.find(handle);
      if (run->second.fd >= 0) { ::close(run->second.fd); }
      runs_.erase(run);
    }
    throw;
  }
  handle_fields f{};
  std::memcpy(f.magic, magic, sizeof magic);
  f.pid = static_cast<std::uint32_t>(getpid());
  f.type = static_cast<std::uint32_t>(type);
  f.export_id = id;
  f.block_offset = block_offset;
  f.block_bytes = block_bytes;
  f.device = device;
  f.runs = static_cast<std::uint32_t>(runs.size());
  f.run_bytes = run_bytes;
  f.nonce = process_nonce();
  std::array<unsigned char, 64> out{};
  std::memcpy(out.data(), &f, sizeof f);
  return out;
}

std::uint64_t export_registry::export_id_for(std::vector<virtual_range_resource::mapped_run> const& runs,
                                             std::size_t block_offset, std::size_t block_bytes, int device,
                                             CUmemAllocationHandleType type) {
  auto const key = std::make_tuple(runs.front().handle, block_offset, block_bytes);
  if (auto const known = by_block_.find(key); known != by_block_.end()) { return known->second; }
  export_entry entry;
  for (auto const& r : runs) { entry.runs.push_back(r.handle); }
  entry.block_offset = block_offset;
  entry.block_bytes = block_bytes;
  entry.device = device;
  entry.type = type;
  std::uint64_t const id = next_id_;
  auto const made = exports_.emplace(id, std::move(entry)).first;
  try {
    by_block_.emplace(key, id);
  } catch (...) {  // an export no block leads to would outlive its runs: forget_run finds it by them
    exports_.erase(made);
    throw;
  }
  ++next_id_;
  return id;
}

void export_registry::forget_run(std::uint64_t run_handle) noexcept {
  std::lock_guard lock{mutex_};
  auto const run = runs_.find(run_handle);
  if (run == runs_.end()) { return; }
  if (run->second.fd >= 0) { ::close(run->second.fd); }
  runs_.erase(run);
  for (auto it = exports_.begin(); it != exports_.end();) {
    auto const& used = it->second.runs;
    if (std::find(used.begin(), used.end(), run_handle) == used.end()) {
      ++it;
      continue;
    }
    by_block_.erase(std::make_tuple(used.front(), it->second.block_offset, it->second.block_bytes));
    it = exports_.erase(it);
  }
}

}  // namespace mrstack::vmm_ipc
