// The CUDA driver's virtual memory management behind vmm_memory_resource (the driver API
// through vmm_driver.hpp: mrstack links only cudart_static).
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_util.hpp"  // peers_of
#include "device_scope.hpp"
#include "vmm_driver.hpp"
#include "vmm_ipc_registry.hpp"

namespace mrstack {

using namespace vmm_driver;

namespace {

CUmemAllocationProp device_memory_properties(int ordinal, CUmemAllocationHandleType handle_type) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = handle_type;
  return prop;
}

// The export type `requested` resolves to on `device`; throws when the device cannot.
vmm_memory_resource::ipc_mode resolve_ipc(vmm_memory_resource::ipc_mode requested, CUdevice device, int ordinal) {
  using mode = vmm_memory_resource::ipc_mode;
  if (requested == mode::none) { return mode::none; }
  auto supported = [&](CUdevice_attribute attribute, char const* name) {
    int value = 0;
    CUresult const r = api().device_get_attribute(&value, attribute, device);
    if (r == CUDA_ERROR_INVALID_VALUE) { return false; }  // a driver older than the attribute
    MRSTACK_CU_TRY(r, std::string{"cuDeviceGetAttribute("} + name + ")");
    return value != 0;
  };
  bool const fd = supported(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                            "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED");
  if (requested == mode::automatic) { return fd ? mode::fd : mode::none; }
  auto refuse = [&](std::string const& why) {
    std::string const what = "vmm(ipc=" + std::string{vmm_memory_resource::to_string(requested)} + "): device " +
                             std::to_string(ordinal) + " " + why;
    throw cuda_error(cudaErrorNotSupported, what.c_str(), __FILE__, __LINE__);
  };
  if (requested == mode::fd && !fd) {
    refuse("cannot export memory as POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_"
           "SUPPORTED is 0: not Linux, or WSL); use ipc=fabric where supported, or ipc=none and share through a "
           "stack over the cuda upstream");
  }
  if (requested == mode::fabric &&
      !supported(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, "HANDLE_TYPE_FABRIC_SUPPORTED")) {
    refuse("cannot export memory as fabric handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0: it "
           "needs a fabric-capable system, e.g. NVLink multi-node, and driver); use ipc=fd between processes of "
           "one host");
  }
  return requested;
}

CUmemAllocationHandleType handle_type_of(vmm_memory_resource::ipc_mode mode) {
  switch (mode) {
    case vmm_memory_resource::ipc_mode::fd: return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case vmm_memory_resource::ipc_mode::fabric: return CU_MEM_HANDLE_TYPE_FABRIC;
    default: return CU_MEM_HANDLE_TYPE_NONE;
  }
}

}  // namespace

// ---- the per-resource driver state -----------------------------------------------------------

struct vmm_memory_resource::driver {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained
  CUmemAllocationProp properties{};
  std::vector<CUmemAccessDesc> access;  // this device first, then the peers given access
  std::size_t granularity = 0;
  CUdeviceptr base = 0;
  std::size_t bytes = 0;
  // Atomic: ipc=auto may fall back to none at the first cuMemCreate (see map) while export_ipc reads it.
  std::atomic<vmm_memory_resource::ipc_mode> ipc{vmm_memory_resource::ipc_mode::none};
  bool ipc_automatic = false;  // ipc=auto: fd where it works, silently none where it does not
  bool ever_exportable = false;  // runs may have been exported: unmap tells the IPC registry

  // Sleep with contents kept: one pinned host buffer; range offset of each saved stretch ->
  // its offset in the buffer. A buffer given back after wake is freed on `staging_release`
  // (unpinning gigabytes takes long), joined before the next save and at destruction.
  void* staging = nullptr;
  std::map<std::size_t, std::size_t> staged;
  std::thread staging_release;

  driver(std::size_t reserve_bytes, int requested_device, vmm_memory_resource::ipc_mode requested_ipc,
         bool peer_access) {
    // What names no device is refused as by every upstream (before any driver call for an
    // ordinal below -1, which resolve_device had read as "current").
    ordinal = detail::checked_device(requested_device, "vmm");
    int count = 0;  // asked for its error: without a runtime, checked_device could check nothing
    MRSTACK_CUDA_TRY(cudaGetDeviceCount(&count));  // also initializes the runtime and the driver
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
    ipc = resolve_ipc(requested_ipc, device, ordinal);
    ipc_automatic = requested_ipc == vmm_memory_resource::ipc_mode::automatic;
    ever_exportable = ipc != vmm_memory_resource::ipc_mode::none;
    properties = device_memory_properties(ordinal, handle_type_of(ipc));
    access = read_write_access(ordinal, peer_access ? detail::peers_of(ordinal) : std::vector<int>{});
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
    if (staging_release.joinable()) { staging_release.join(); }
    if (staging != nullptr) { (void)cudaFreeHost(staging); }
    auto const& d = api();
    if (base != 0) {
      CUresult const r = d.mem_address_free(base, bytes);
      if (r != CUDA_SUCCESS) { std::fprintf(stderr, "mrstack: vmm: cuMemAddressFree -> %s\n", describe(r).c_str()); }
    }
    (void)d.primary_ctx_release(device);
  }
  driver(driver const&) = delete;
  driver& operator=(driver const&) = delete;


  std::string device_memory_report() const {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (api().mem_get_info(&free_bytes, &total_bytes) != CUDA_SUCCESS) { return "device memory unknown"; }
    return "device " + std::to_string(ordinal) + " has " + format_bytes(free_bytes) + " free of " +
           format_bytes(total_bytes);
  }
};

// ---- the resource -------------------------------------------------------------------------------

std::vector<int> vmm_memory_resource::peers() const {
  std::vector<int> peers;
  for (std::size_t i = 1; i < driver_->access.size(); ++i) { peers.push_back(driver_->access[i].location.id); }
  return peers;
}

namespace {
// Checks the parameters before any driver call, so a bad one is named as such (not as the
// granule bookkeeping's complaint, nor hidden behind a driver error on a machine without a GPU).
std::unique_ptr<vmm_memory_resource::driver> make_driver(std::size_t reserve_bytes, std::size_t map_granules,
                                                         int device, vmm_memory_resource::ipc_mode ipc,
                                                         bool peer_access) {
  if (map_granules == 0) {
    throw logic_error("vmm: map_granules must be at least 1 (granules per physical allocation; got 0)");
  }
  // Rounded up to the granularity, a reserve this large wrapped around to a few bytes or 0
  // (the driver then refused "cuMemAddressReserve(0 B)", naming nothing the caller gave).
  if (reserve_bytes > std::numeric_limits<std::size_t>::max() / 2) {
    throw logic_error("vmm: a reserve of " + std::to_string(reserve_bytes) +
                      " B is more than any address space holds (0 reserves twice the device's memory)");
  }
  return std::make_unique<vmm_memory_resource::driver>(reserve_bytes, device, ipc, peer_access);
}
}  // namespace

vmm_memory_resource::vmm_memory_resource(std::size_t reserve_bytes, std::size_t map_granules, int device,
                                         ipc_mode ipc, bool peer_access)
    : vmm_memory_resource(make_driver(reserve_bytes, map_granules, device, ipc, peer_access), map_granules) {}

vmm_memory_resource::vmm_memory_resource(std::unique_ptr<driver> drv, std::size_t map_granules)
    : virtual_range_resource("vmm", static_cast<std::uintptr_t>(drv->base), drv->bytes, drv->granularity,
                             map_granules, *this),
      driver_{std::move(drv)} {}

vmm_memory_resource::~vmm_memory_resource() { release_everything(); }

int vmm_memory_resource::device() const noexcept { return driver_->ordinal; }

vmm_memory_resource::ipc_mode vmm_memory_resource::ipc() const noexcept { return driver_->ipc; }

vmm_memory_resource::ipc_mode vmm_memory_resource::parse_ipc_mode(std::string_view text) {
  if (text == "auto") { return ipc_mode::automatic; }
  if (text == "none") { return ipc_mode::none; }
  if (text == "fd") { return ipc_mode::fd; }
  if (text == "fabric") { return ipc_mode::fabric; }
  throw logic_error("vmm: ipc=" + std::string{text} + " is none of auto, none, fd, fabric");
}

char const* vmm_memory_resource::to_string(ipc_mode mode) noexcept {
  switch (mode) {
    case ipc_mode::automatic: return "auto";
    case ipc_mode::none: return "none";
    case ipc_mode::fd: return "fd";
    case ipc_mode::fabric: return "fabric";
  }
  return "?";
}

std::array<unsigned char, 64> vmm_memory_resource::export_ipc(void const* ptr, std::size_t bytes) {
  ipc_mode const mode = driver_->ipc;
  if (mode == ipc_mode::none) {
    throw logic_error("vmm: IPC export of " + format_hex(ptr) + ": this vmm was made with ipc=none (or ipc=auto on a "
                      "device or system that cannot create exportable memory), so its memory cannot be shared; use "
                      "vmm(ipc=fd) or vmm(ipc=fabric), which say why they cannot");
  }
  std::array<unsigned char, 64> out{};
  with_runs_backing(ptr, bytes, [&](std::vector<mapped_run> const& runs) {
    scoped_context const ctx{driver_->context};
    std::size_t const first_offset = runs.front().offset;
    auto const block_offset = reinterpret_cast<std::uintptr_t>(ptr) - driver_->base - first_offset;
    out = vmm_ipc::registry().add_export(ptr, runs, block_offset, bytes, driver_->ordinal, handle_type_of(mode));
  });
  return out;
}

std::size_t vmm_memory_resource::device_granularity(int device) {
  int const ordinal = resolve_device(device, "vmm::device_granularity");
  auto const& d = api();
  MRSTACK_CU_TRY(d.init(0), "cuInit(0)");
  CUmemAllocationProp const prop = device_memory_properties(ordinal, CU_MEM_HANDLE_TYPE_NONE);
  std::size_t granularity = 0;
  MRSTACK_CU_TRY(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 "cuMemGetAllocationGranularity(device " + std::to_string(ordinal) + ")");
  return granularity;
}

std::uint64_t vmm_memory_resource::map(std::size_t offset, std::size_t bytes) {
  auto const& d = api();
  scoped_context const ctx{driver_->context};
  CUmemGenericAllocationHandle handle = 0;
  CUresult created = d.mem_create(&handle, bytes, &driver_->properties, 0);
  if (created != CUDA_SUCCESS && created != CUDA_ERROR_OUT_OF_MEMORY && driver_->ipc_automatic &&
      driver_->ipc != ipc_mode::none) {
    // Some virtualized systems report file-descriptor export but refuse to create such
    // memory: ipc=auto then makes memory that cannot be shared rather than none at all
    // (export_ipc says so). ipc=fd keeps the driver's error. Only when memory without the
    // export can be made was the export at fault: otherwise (a bad device, a size the
    // driver refuses either way) the mode stays, and the first error is the one reported.
    CUmemAllocationProp plain = driver_->properties;
    plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    CUresult const retried = d.mem_create(&handle, bytes, &plain, 0);
    if (retried == CUDA_SUCCESS) {
      driver_->properties = plain;
      driver_->ipc = ipc_mode::none;
      created = CUDA_SUCCESS;
    } else if (retried == CUDA_ERROR_OUT_OF_MEMORY) {
      created = retried;
    }
  }
  if (created == CUDA_ERROR_OUT_OF_MEMORY) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "vmm";
    info.footprint_bytes = mapped_bytes();
    info.detail = "cuMemCreate found no physical memory for a physical allocation of " + format_bytes(bytes) + "; " +
                  driver_->device_memory_report();
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
  scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(api().mem_set_access(driver_->base + offset, bytes, driver_->access.data(), driver_->access.size()),
                 "cuMemSetAccess(" + format_bytes(bytes) + ")");
}

void vmm_memory_resource::before_unmap() {
  scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(api().ctx_synchronize(), "cuCtxSynchronize (before unmapping)");
}

void vmm_memory_resource::unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) {
  auto const& d = api();
  scoped_context const ctx{driver_->context};
  MRSTACK_CU_TRY(d.mem_unmap(driver_->base + offset, bytes), "cuMemUnmap(" + format_bytes(bytes) + ")");
  if (driver_->ever_exportable) { vmm_ipc::registry().forget_run(handle); }  // its exports end with it
  CUresult const released = d.mem_release(handle);
  if (released == CUDA_SUCCESS) { return; }
  // The addresses have no memory behind them any more: the granule map must forget the
  // run (a later commit has to map afresh, not revive it), though the error still reaches
  // the caller.
  try {
    throw_driver_error(released,
                       "cuMemRelease(" + format_bytes(bytes) + " at offset " + std::to_string(offset) +
                           ", after cuMemUnmap succeeded: the physical allocation may leak)",
                       __FILE__, __LINE__);
  } catch (...) {
    throw detail::unmapped_with_error{std::current_exception()};
  }
}

// ---- sleep and wake: contents through one pinned staging buffer ----------------------------

void vmm_memory_resource::save_contents(stretches const& saved) {
  driver& drv = *driver_;
  if (drv.staging_release.joinable()) { drv.staging_release.join(); }
  scoped_context const ctx{drv.context};
  MRSTACK_CU_TRY(api().ctx_synchronize(), "cuCtxSynchronize (before saving contents)");
  std::size_t total = 0;
  for (auto const& [offset, bytes] : saved) { total += bytes; }
  if (total == 0) { return; }
  void* staging = nullptr;
  MRSTACK_CUDA_TRY(cudaHostAlloc(&staging, total, cudaHostAllocDefault));
  cudaStream_t stream = nullptr;
  auto cleanup = [&] {
    if (stream != nullptr) { (void)cudaStreamDestroy(stream); }
  };
  try {
    MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::size_t at = 0;
    std::map<std::size_t, std::size_t> staged;
    for (auto const& [offset, bytes] : saved) {
      MRSTACK_CUDA_TRY(cudaMemcpyAsync(static_cast<std::byte*>(staging) + at,
                                       reinterpret_cast<void const*>(drv.base + offset), bytes,
                                       cudaMemcpyDeviceToHost, stream));
      staged.emplace(offset, at);
      at += bytes;
    }
    MRSTACK_CUDA_TRY(cudaStreamSynchronize(stream));
    cleanup();
    drv.staging = staging;
    drv.staged = std::move(staged);
  } catch (...) {
    cleanup();
    (void)cudaFreeHost(staging);
    throw;
  }
}

void vmm_memory_resource::restore_contents(stretches const& restored) {
  driver& drv = *driver_;
  if (restored.empty()) { return; }
  scoped_context const ctx{drv.context};
  cudaStream_t stream = nullptr;
  MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    for (auto const& [offset, bytes] : restored) {
      auto it = drv.staged.upper_bound(offset);
      if (it == drv.staged.begin()) { throw logic_error("vmm: wake restores offset " + std::to_string(offset) + ", which sleep did not save"); }
      --it;
      std::size_t const at = it->second + (offset - it->first);
      MRSTACK_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(drv.base + offset),
                                       static_cast<std::byte const*>(drv.staging) + at, bytes,
                                       cudaMemcpyHostToDevice, stream));
    }
    MRSTACK_CUDA_TRY(cudaStreamSynchronize(stream));
  } catch (...) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  (void)cudaStreamDestroy(stream);
}

void vmm_memory_resource::drop_saved_contents() noexcept {
  driver& drv = *driver_;
  drv.staged.clear();
  if (drv.staging == nullptr) { return; }
  void* const staging = std::exchange(drv.staging, nullptr);
  if (drv.staging_release.joinable()) { drv.staging_release.join(); }
  try {
    drv.staging_release = std::thread{[staging] { (void)cudaFreeHost(staging); }};
  } catch (...) {
    (void)cudaFreeHost(staging);  // no thread to be had: free it here
  }
}

}  // namespace mrstack
