// The CUDA driver entry points behind vmm and its IPC (see vmm_driver.hpp).
#include "vmm_driver.hpp"

#include "device_scope.hpp"  // checked_device

namespace mrstack::vmm_driver {

namespace {

// The ABI version the entry points are asked for: what CUDA 12.0 headers declared. Every
// function used here kept that signature since, so any driver new enough for this runtime has it.
constexpr unsigned int entry_point_version = 12000;

template <typename Fn>
void load(Fn& fn, char const* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t const status =
      cudaGetDriverEntryPointByVersion(symbol, &address, entry_point_version, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    std::string const what = std::string{"vmm: the CUDA driver does not provide "} + symbol +
                             " (virtual memory management needs a driver with CUDA 12.0 or later; "
                             "cudaGetDriverEntryPointByVersion(\"" + symbol + "\")" +
                             (found == cudaDriverEntryPointVersionNotSufficent ? ": driver too old)" : ")");
    throw cuda_error(status != cudaSuccess ? status : cudaErrorSymbolNotFound, what.c_str(), __FILE__, __LINE__);
  }
  fn = reinterpret_cast<Fn>(address);
}

}  // namespace

driver_api const& api() {
  static driver_api const instance = [] {
    driver_api d;
    load(d.init, "cuInit");
    load(d.get_error_name, "cuGetErrorName");
    load(d.get_error_string, "cuGetErrorString");
    load(d.device_get, "cuDeviceGet");
    load(d.device_get_attribute, "cuDeviceGetAttribute");
    load(d.device_total_mem, "cuDeviceTotalMem");
    load(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    load(d.primary_ctx_release, "cuDevicePrimaryCtxRelease");
    load(d.ctx_push, "cuCtxPushCurrent");
    load(d.ctx_pop, "cuCtxPopCurrent");
    load(d.ctx_synchronize, "cuCtxSynchronize");
    load(d.mem_get_info, "cuMemGetInfo");
    load(d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
    load(d.mem_address_reserve, "cuMemAddressReserve");
    load(d.mem_address_free, "cuMemAddressFree");
    load(d.mem_create, "cuMemCreate");
    load(d.mem_release, "cuMemRelease");
    load(d.mem_map, "cuMemMap");
    load(d.mem_unmap, "cuMemUnmap");
    load(d.mem_set_access, "cuMemSetAccess");
    load(d.mem_export_to_shareable_handle, "cuMemExportToShareableHandle");
    load(d.mem_import_from_shareable_handle, "cuMemImportFromShareableHandle");
    return d;
  }();
  return instance;
}

std::string describe(CUresult result) {
  char const* name = nullptr;
  char const* text = nullptr;
  if (api().get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr) { name = "unknown CUresult"; }
  if (api().get_error_string(result, &text) != CUDA_SUCCESS || text == nullptr) { text = ""; }
  return std::string{name} + " (" + std::to_string(static_cast<int>(result)) + "): " + text;
}

// CUresult and cudaError_t share the numbers of the errors that matter here (out of memory,
// invalid value, not supported); the message carries the driver's own name either way.
void throw_driver_error(CUresult result, std::string const& call, char const* file, int line) {
  std::string const what = call + " -> " + describe(result);
  throw cuda_error(static_cast<cudaError_t>(result), what.c_str(), file, line);
}

int resolve_device(int device, char const* who) {
  int const checked = detail::checked_device(device, who);
  if (checked >= 0) { return checked; }
  int current = 0;  // -1 without a runtime: cudaGetDevice says why
  MRSTACK_CUDA_TRY(cudaGetDevice(&current));
  return current;
}

std::vector<CUmemAccessDesc> read_write_access(int device, std::vector<int> const& peers) {
  std::vector<CUmemAccessDesc> access(1 + peers.size());
  for (std::size_t i = 0; i < access.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = i == 0 ? device : peers[i - 1];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return access;
}

scoped_context::scoped_context(CUcontext ctx) { MRSTACK_CU_TRY(api().ctx_push(ctx), "cuCtxPushCurrent"); }

scoped_context::~scoped_context() {
  CUcontext popped = nullptr;
  (void)api().ctx_pop(&popped);
}

}  // namespace mrstack::vmm_driver
