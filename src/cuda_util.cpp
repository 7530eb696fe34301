#include "cuda_util.hpp"

#include <array>
#include <atomic>
#include <mutex>

#include <cuda.h>

#include "device_scope.hpp"

namespace mrstack::detail {

void throw_allocation_failure(cudaError_t status, std::size_t bytes, std::string const& resource, char const* call,
                              char const* file, int line) {
  (void)cudaGetLastError();  // allocation failures are not sticky; do not let one leak into the next call
  if (status != cudaErrorMemoryAllocation) { throw_cuda_error(status, call, file, line); }
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = resource;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  int device = -1;
  // The device the call ran on (its resource made it current): with several, which one is full.
  if (cudaGetDevice(&device) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    info.detail = "device " + std::to_string(device) + " has " + format_bytes(free_bytes) + " free of " +
                  format_bytes(total_bytes);
  } else {
    (void)cudaGetLastError();
  }
  throw out_of_memory(std::move(info));
}

void require_upstream_alignment(std::size_t alignment, std::size_t supported, char const* resource) {
  if (alignment > supported) {
    throw logic_error(std::string{resource} + ": alignment " + std::to_string(alignment) +
                      " is larger than the " + std::to_string(supported) +
                      " bytes it guarantees; put aligned(...) above it in the stack");
  }
}

// ---- device scopes: the driver's context stack, reached through the runtime ------------------
// mrstack links only cudart_static, so the driver's context calls come from
// cudaGetDriverEntryPointByVersion (the ABI of CUDA 12.0; every one kept its signature).
namespace {

struct context_api {
  bool usable = false;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop = nullptr;
};

template <typename Fn>
bool load_entry_point(Fn& fn, char const* symbol) noexcept {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  fn = reinterpret_cast<Fn>(address);
  return true;
}

context_api const& contexts() noexcept {
  static context_api const api = [] {
    context_api a;
    int count = 0;
    // No driver or no device: every scope does nothing (host-only stacks on a CPU).
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      return a;
    }
    a.usable = load_entry_point(a.init, "cuInit") && load_entry_point(a.device_get, "cuDeviceGet") &&
               load_entry_point(a.primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
               load_entry_point(a.ctx_get_current, "cuCtxGetCurrent") &&
               load_entry_point(a.ctx_push, "cuCtxPushCurrent") && load_entry_point(a.ctx_pop, "cuCtxPopCurrent") &&
               a.init(0) == CUDA_SUCCESS;
    return a;
  }();
  return api;
}

constexpr int max_scoped_devices = max_devices;
std::array<std::atomic<CUcontext>, max_scoped_devices> primary_contexts{};
std::mutex primary_contexts_mutex;

[[noreturn]] void throw_context_error(CUresult result, std::string const& call) {
  throw cuda_error(static_cast<cudaError_t>(result), call.c_str(), __FILE__, __LINE__);
}

}  // namespace

void* current_context(bool& usable) noexcept {
  auto const& api = contexts();
  usable = api.usable;
  if (!usable) { return nullptr; }
  CUcontext current = nullptr;
  if (api.ctx_get_current(&current) != CUDA_SUCCESS) { return nullptr; }
  return current;
}

void* primary_context(int device) {
  if (device < 0 || device >= max_scoped_devices) {
    throw logic_error("device ordinal " + std::to_string(device) + " is outside [0, " +
                      std::to_string(max_scoped_devices) + ")");
  }
  auto& slot = primary_contexts[static_cast<std::size_t>(device)];
  if (CUcontext known = slot.load(std::memory_order_acquire)) { return known; }
  std::lock_guard lock{primary_contexts_mutex};
  if (CUcontext known = slot.load(std::memory_order_acquire)) { return known; }
  auto const& api = contexts();
  CUdevice handle = 0;
  if (CUresult const r = api.device_get(&handle, device); r != CUDA_SUCCESS) {
    int count = 0;
    (void)cudaGetDeviceCount(&count);
    throw_context_error(r, "cuDeviceGet(" + std::to_string(device) + "): there are " + std::to_string(count) +
                               " devices");
  }
  CUcontext context = nullptr;
  // Retained for the life of the process and never released: the per-device stacks that
  // use it live as long (the C ABI never destroys them).
  if (CUresult const r = api.primary_ctx_retain(&context, handle); r != CUDA_SUCCESS) {
    throw_context_error(r, "cuDevicePrimaryCtxRetain(device " + std::to_string(device) + ")");
  }
  slot.store(context, std::memory_order_release);
  return context;
}

void push_context(void* context) {
  if (CUresult const r = contexts().ctx_push(static_cast<CUcontext>(context)); r != CUDA_SUCCESS) {
    throw_context_error(r, "cuCtxPushCurrent");
  }
}

void pop_context() noexcept {
  CUcontext popped = nullptr;
  (void)contexts().ctx_pop(&popped);
}

namespace {
thread_local int device_being_built = -1;
}  // namespace

building_for::building_for(int device) noexcept : previous_{device_being_built} {
  if (device >= 0) { device_being_built = device; }
}
building_for::~building_for() { device_being_built = previous_; }

int resolve_device(int device) noexcept {
  if (device >= 0) { return device; }
  if (device_being_built >= 0) { return device_being_built; }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return current;
}

int checked_device(int device, char const* resource) {
  std::string const who = std::string{resource} + ": device " + std::to_string(device);
  if (device < -1) {
    throw logic_error(who + " is not a device: give an ordinal (0 is the first device) or -1 for the current one");
  }
  if (device >= max_devices) {
    throw logic_error(who + " is past the " + std::to_string(max_devices) + " devices mrstack serves (0 to " +
                      std::to_string(max_devices - 1) + ")");
  }
  int const resolved = resolve_device(device);
  if (resolved < 0) { return resolved; }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no runtime: nothing to check (our call's error, not the program's)
  } else if (resolved >= count) {
    throw logic_error(std::string{resource} + ": device " + std::to_string(resolved) +
                      " does not exist: this machine has " + std::to_string(count) + " CUDA device" +
                      (count == 1 ? "" : "s"));
  }
  return resolved;
}

// ---- peer access ------------------------------------------------------------------------------

std::vector<int> peers_of(int device) {
  int count = 0;
  MRSTACK_CUDA_TRY(cudaGetDeviceCount(&count));
  std::vector<int> peers;
  for (int peer = 0; peer < count; ++peer) {
    if (peer == device) { continue; }
    int can = 0;
    MRSTACK_CUDA_TRY(cudaDeviceCanAccessPeer(&can, peer, device));
    if (can != 0) { peers.push_back(peer); }
  }
  return peers;
}

std::vector<int> enable_peer_access_to(int device) {
  std::vector<int> const peers = peers_of(device);
  for (int peer : peers) {
    device_scope on_peer{peer};
    cudaError_t const status = cudaDeviceEnablePeerAccess(device, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (status != cudaSuccess) {
      std::string const call = "cudaDeviceEnablePeerAccess(" + std::to_string(device) + ") on device " +
                               std::to_string(peer);
      throw_cuda_error(status, call.c_str(), __FILE__, __LINE__);
    }
  }
  return peers;
}

}  // namespace mrstack::detail
