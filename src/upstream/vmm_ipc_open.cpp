// vmm IPC's opener, mapping: open() imports the runs fetched from the exporter, maps them
// into a fresh range of this process, and close() undoes it. Apart from the fetch because
// this is the driver's side (contexts, imports, access) and the table of open blocks.
#include <mrstack/upstream/vmm_ipc.hpp>

#include <mrstack/error.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_util.hpp"  // peers_of
#include "vmm_driver.hpp"
#include "vmm_ipc_registry.hpp"
#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

using namespace vmm_driver;

namespace {

struct opened_block {
  CUdeviceptr base = 0;
  std::size_t bytes = 0;
  struct run {
    std::size_t offset;
    std::size_t bytes;
    CUmemGenericAllocationHandle handle;
  };
  std::vector<run> runs;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained while open
};

struct open_table {
  std::mutex mutex;
  std::map<std::uintptr_t, opened_block> blocks;  // the address open() returned -> its mapping
};

open_table& opened() {
  static open_table* const table = new open_table{};
  return *table;
}

// Undoes what was set up of `b` (each step tolerates the ones not reached).
void tear_down(opened_block& b) noexcept {
  if (b.context == nullptr) { return; }
  auto const& d = api();
  if (d.ctx_push(b.context) == CUDA_SUCCESS) {
    (void)d.ctx_synchronize();  // unmapping does not wait for kernels still using the memory
    for (auto const& r : b.runs) {
      (void)d.mem_unmap(b.base + r.offset, r.bytes);
      (void)d.mem_release(r.handle);
    }
    if (b.base != 0) { (void)d.mem_address_free(b.base, b.bytes); }
    CUcontext popped = nullptr;
    (void)d.ctx_pop(&popped);
  }
  (void)d.primary_ctx_release(b.device);
  b = opened_block{};
}

}  // namespace

void* open(handle const& h, int device) {
  (void)fields_of(h);  // bytes that are no handle say so first
  // Before the exporter is asked: a bad ordinal is the caller's error, not worth its descriptors.
  int const ordinal = resolve_device(device, "vmm IPC open");
  fetched_export got;
  fetch_export(h, got);
  auto const& d = api();
  opened_block b;
  MRSTACK_CU_TRY(d.init(0), "cuInit(0)");
  MRSTACK_CU_TRY(d.device_get(&b.device, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  MRSTACK_CU_TRY(d.primary_ctx_retain(&b.context, b.device), "cuDevicePrimaryCtxRetain");
  try {
    scoped_context const ctx{b.context};
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    std::size_t granularity = 0;
    MRSTACK_CU_TRY(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity");
    for (auto const n : got.bytes) { b.bytes += n; }
    MRSTACK_CU_TRY(d.mem_address_reserve(&b.base, b.bytes, granularity, 0, 0),
                   "cuMemAddressReserve(" + format_bytes(b.bytes) + ")");
    // Room first: a run mapped and then not recorded (push_back out of host memory) would
    // escape tear_down.
    b.runs.reserve(got.bytes.size());
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.bytes.size(); ++i) {
      CUmemGenericAllocationHandle imported = 0;
      void* shareable = got.type == CU_MEM_HANDLE_TYPE_FABRIC
                            ? static_cast<void*>(&got.fabric[i])
                            : reinterpret_cast<void*>(static_cast<std::intptr_t>(got.fds[i]));
      MRSTACK_CU_TRY(d.mem_import_from_shareable_handle(&imported, shareable, got.type),
                     std::string{"cuMemImportFromShareableHandle("} + type_name(got.type) + ")");
      CUresult const mapped = d.mem_map(b.base + at, got.bytes[i], 0, imported, 0);
      if (mapped != CUDA_SUCCESS) {
        (void)d.mem_release(imported);
        throw_driver_error(mapped, "cuMemMap(imported " + format_bytes(got.bytes[i]) + ")", __FILE__, __LINE__);
      }
      b.runs.push_back({at, got.bytes[i], imported});
      at += got.bytes[i];
    }
    // This device and its peers, as cudaIpcOpenMemHandle's lazy peer access gives: Numba
    // opens a handle on the exporter's device and copies from it on another.
    auto const access = read_write_access(ordinal, detail::peers_of(ordinal));
    MRSTACK_CU_TRY(d.mem_set_access(b.base, b.bytes, access.data(), access.size()), "cuMemSetAccess(imported block)");
  } catch (...) {
    tear_down(b);
    throw;
  }
  auto const address = static_cast<std::uintptr_t>(b.base) + got.block_offset;
  std::lock_guard lock{opened().mutex};
  try {
    opened().blocks.emplace(address, std::move(b));
  } catch (...) {  // out of host memory for the table: unmapped, not left mapped and unknown to close()
    tear_down(b);
    throw;
  }
  return reinterpret_cast<void*>(address);
}

void close(void* ptr) {
  opened_block b;
  {
    std::lock_guard lock{opened().mutex};
    auto const it = opened().blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == opened().blocks.end()) {
      throw logic_error("vmm IPC: close of " + format_hex(ptr) + ", which vmm_ipc::open did not return (or it was "
                        "closed already)");
    }
    b = std::move(it->second);
    opened().blocks.erase(it);
  }
  tear_down(b);
}

std::size_t open_count() noexcept {
  std::lock_guard lock{opened().mutex};
  return opened().blocks.size();
}

}  // namespace mrstack::vmm_ipc
