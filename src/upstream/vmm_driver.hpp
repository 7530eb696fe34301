#pragma once
// Internal to mrstack: the CUDA driver entry points vmm and its IPC use, reached through
// cudaGetDriverEntryPointByVersion (mrstack links only cudart_static); <cuda.h> is included
// for its types and enums only — no libcuda symbol is referenced.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include <mrstack/error.hpp>

namespace mrstack::vmm_driver {

struct driver_api {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDeviceTotalMem) device_total_mem = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuMemGetInfo) mem_get_info = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&::cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) mem_address_free = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle = nullptr;
};

/// The entry points, looked up once; throws cuda_error naming a missing one.
driver_api const& api();

/// "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
std::string describe(CUresult result);

[[noreturn]] void throw_driver_error(CUresult result, std::string const& call, char const* file, int line);

/// `device` when >= 0, else the current device; `who` names the caller in the errors. What
/// names no device (below -1, at or past the device count) is a `logic_error` before any
/// driver call (detail::checked_device), not read as "current" or left to the driver.
int resolve_device(int device, char const* who);

/// Read-write access to device memory for `device` (first) and each of `peers`.
std::vector<CUmemAccessDesc> read_write_access(int device, std::vector<int> const& peers);

/// Runs driver calls with a context current, whatever the calling thread has.
struct scoped_context {
  explicit scoped_context(CUcontext ctx);
  ~scoped_context();
  scoped_context(scoped_context const&) = delete;
  scoped_context& operator=(scoped_context const&) = delete;
};

}  // namespace mrstack::vmm_driver

#define MRSTACK_CU_TRY(call, what)                                                            \
  do {                                                                                       \
    CUresult const mrstack_cu_status_ = (call);                                              \
    if (mrstack_cu_status_ != CUDA_SUCCESS) {                                                \
      ::mrstack::vmm_driver::throw_driver_error(mrstack_cu_status_, (what), __FILE__, __LINE__); \
    }                                                                                        \
  } while (0)
