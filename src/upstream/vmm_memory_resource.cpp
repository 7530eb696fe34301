// The CUDA driver's virtual memory management behind vmm_memory_resource. The driver API is
// reached through cudaGetDriverEntryPointByVersion (mrstack links only cudart_static);
// <cuda.h> is included for its types and enums only — no libcuda symbol is referenced.
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <string>

namespace mrstack {

namespace {

// The ABI version the entry points are asked for: what CUDA 12.0 headers declared. Every
// function used here kept that signature since, so any driver new enough for this runtime has it.
constexpr unsigned int entry_point_version = 12000;

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
};

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
[[noreturn]] void throw_driver_error(CUresult result, std::string const& call, char const* file, int line) {
  std::string const what = call + " -> " + describe(result);
  throw cuda_error(static_cast<cudaError_t>(result), what.c_str(), file, line);
}

#define MRSTACK_CU_TRY(call, what)                                                            \
  do {                                                                                       \
    CUresult const mrstack_cu_status_ = (call);                                              \
    if (mrstack_cu_status_ != CUDA_SUCCESS) { throw_driver_error(mrstack_cu_status_, (what), __FILE__, __LINE__); } \
  } while (0)

int resolve_device(int device) {
  if (device >= 0) { return device; }
  int current = 0;
  MRSTACK_CUDA_TRY(cudaGetDevice(&current));
  return current;
}

CUmemAllocationProp device_memory_properties(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

}  // namespace

// ---- the per-resource driver state -----------------------------------------------------------

struct vmm_memory_resource::driver {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained
  CUmemAllocationProp properties{};
  CUmemAccessDesc access{};
  std::size_t granularity = 0;
  CUdeviceptr base = 0;
  std::size_t bytes = 0;

  driver(std::size_t reserve_bytes, int requested_device) {
    int count = 0;
    MRSTACK_CUDA_TRY(cudaGetDeviceCount(&count));  // also initializes the runtime and the driver
    ordinal = resolve_device(requested_device);
    if (ordinal >= count) {
      throw logic_error("vmm: device " + std::to_string(ordinal) + " does not exist (" + std::to_string(count) +
                        " devices)");
    }
    auto const& d = api();
    MRSTACK_CU_TRY(d.init(0), "cuInit(0)");
    MRSTACK_CU_TRY(d.device_get(&device, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
    int supported = 0;
    MRSTACK_CU_TRY(d.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
                   "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    if (supported == 0) {
      std::string const what = "vmm: device " + std::to_string(ordinal) +
                               " or its driver does not support virtual memory management "
                               "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); use pool > cuda instead";
      throw cuda_error(cudaErrorNotSupported, what.c_str(), __FILE__, __LINE__);
    }
    properties = device_memory_properties(ordinal);
    access.location = properties.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MRSTACK_CU_TRY(d.mem_get_allocation_granularity(&granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity(device " + std::to_string(ordinal) + ")");
    if (reserve_bytes == 0) {
      std::size_t total = 0;
      MRSTACK_CU_TRY(d.device_total_mem(&total, device), "cuDeviceTotalMem");
      // Twice the device: addresses cost nothing, and the headroom lets a pool keep growing
      // at its end while some released holes behind it stay unused.
      reserve_bytes = 2 * total;
    }
    bytes = detail::align_up(reserve_bytes, granularity);
    MRSTACK_CU_TRY(d.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain");
    try {
      MRSTACK_CU_TRY(d.mem_address_reserve(&base, bytes, granularity, 0, 0),
                     "cuMemAddressReserve(" + format_bytes(bytes) + ")");
    } catch (...) {
      (void)d.primary_ctx_release(device);
      throw;
    }
  }

  ~driver() {
    auto const& d = api();
    if (base != 0) {
      CUresult const r = d.mem_address_free(base, bytes);
      if (r != CUDA_SUCCESS) { std::fprintf(stderr, "mrstack: vmm: cuMemAddressFree -> %s\n", describe(r).c_str()); }
    }
    (void)d.primary_ctx_release(device);
  }
  driver(driver const&) = delete;
  driver& operator=(driver const&) = delete;

  // Driver calls run with this device's primary context current, whatever the calling thread has.
  struct scoped_context {
    explicit scoped_context(CUcontext ctx) { MRSTACK_CU_TRY(api().ctx_push(ctx), "cuCtxPushCurrent"); }
    ~scoped_context() {
      CUcontext popped = nullptr;
      (void)api().ctx_pop(&popped);
    }
    scoped_context(scoped_context const&) = delete;
    scoped_context& operator=(scoped_context const&) = delete;
  };

  std::string device_memory_report() const {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (api().mem_get_info(&free_bytes, &total_bytes) != CUDA_SUCCESS) { return "device memory unknown"; }
    return "device " + std::to_string(ordinal) + " has " + format_bytes(free_bytes) + " free of " +
           format_bytes(total_bytes);
  }
};

// ---- the resource -------------------------------------------------------------------------------

vmm_memory_resource::vmm_memory_resource(std::size_t reserve_bytes, std::size_t map_granules, int device)
    : vmm_memory_resource(std::make_unique<driver>(reserve_bytes, device), map_granules) {}

vmm_memory_resource::vmm_memory_resource(std::unique_ptr<driver> drv, std::size_t map_granules)
    : virtual_range_resource("vmm", static_cast<std::uintptr_t>(drv->base), drv->bytes, drv->granularity,
                             map_granules, *this),
      driver_{std::move(drv)} {}

vmm_memory_resource::~vmm_memory_resource() { release_everything(); }

int vmm_memory_resource::device() const noexcept { return driver_->ordinal; }

std::size_t vmm_memory_resource::device_granularity(int device) {
  int const ordinal = resolve_device(device);
  auto const& d = api();
  MRSTACK_CU_TRY(d.init(0), "cuInit(0)");
  CUmemAllocationProp const prop = device_memory_properties(ordinal);
  std::size_t granularity = 0;
  MRSTACK_CU_TRY(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 "cuMemGetAllocationGranularity(device " + std::to_string(ordinal) + ")");
  return granularity;
}

std::uint64_t vmm_memory_resource::map(std::size_t offset, std::size_t bytes) {
  auto const& d = api();
  driver::scoped_context const ctx{driver_->context};
  CUmemGenericAllocationHandle handle = 0;
  CUresult const created = d.mem_create(&handle, bytes, &driver_->properties, 0);
  if (created == CUDA_ERROR_OUT_OF_MEMORY) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "vmm";
    info.footprint_bytes = mapped_bytes();
    info.detail = "cuMemCreate found no physical memory; " + driver_->device_memory_report();
    throw out_of_memory(std::move(info));
  }
  MRSTACK_CU_TRY(created, "cuMemCreate(" + format_bytes(bytes) + ")");
  CUresult const mapped = d.mem_map(driver_->base + offset, bytes, 0, handle, 0);
  if (mapped != CUDA_SUCCESS) {
    (void)d.mem_release(handle);
    throw_driver_error(mapped, "cuMemMap(" + format_bytes(bytes) + " at offset " + std::to_string(offset) + ")",
                       __FILE__, __LINE__);
  }
  return handle;
}

void vmm_memory_resource::enable_access(std::size_t offset, std::size_t bytes) {
  driver::scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(api().mem_set_access(driver_->base + offset, bytes, &driver_->access, 1),
                 "cuMemSetAccess(" + format_bytes(bytes) + ")");
}

void vmm_memory_resource::before_unmap() {
  driver::scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(api().ctx_synchronize(), "cuCtxSynchronize (before unmapping)");
}

void vmm_memory_resource::unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) {
  auto const& d = api();
  driver::scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(d.mem_unmap(driver_->base + offset, bytes), "cuMemUnmap(" + format_bytes(bytes) + ")");
  MRSTACK_CU_TRY(d.mem_release(handle), "cuMemRelease");
}

}  // namespace mrstack
