// Stacks on two devices in one process: each stack allocates and frees on its own device
// whatever device the calling thread has current, leaves that device current, and a
// process that only uses device 1 never creates a context on device 0. Peer access lets a
// kernel on device 1 read and write device 0's pool memory.
//
// Needs two devices: on one, every test prints "SKIPPED: ..." and the program exits 77.
// The kernel is PTX text JIT-compiled by the driver (the project compiles no .cu files).
#include <catch2/catch.hpp>

#include <mrstack/current.hpp>
#include <mrstack/spec.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// ---- the driver calls the checks need (through the runtime: the test links cudart only) ----

template <typename Fn>
Fn entry_point(char const* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "multi_device: the driver has no %s\n", symbol);
    std::_Exit(1);
  }
  return reinterpret_cast<Fn>(address);
}

struct driver_calls {
  decltype(&::cuInit) init = entry_point<decltype(&::cuInit)>("cuInit");
  decltype(&::cuDeviceGet) device_get = entry_point<decltype(&::cuDeviceGet)>("cuDeviceGet");
  decltype(&::cuDevicePrimaryCtxGetState) primary_state =
      entry_point<decltype(&::cuDevicePrimaryCtxGetState)>("cuDevicePrimaryCtxGetState");
  decltype(&::cuCtxGetCurrent) ctx_get_current = entry_point<decltype(&::cuCtxGetCurrent)>("cuCtxGetCurrent");
  decltype(&::cuPointerGetAttribute) pointer_attribute =
      entry_point<decltype(&::cuPointerGetAttribute)>("cuPointerGetAttribute");
  decltype(&::cuModuleLoadData) module_load = entry_point<decltype(&::cuModuleLoadData)>("cuModuleLoadData");
  decltype(&::cuModuleGetFunction) module_function =
      entry_point<decltype(&::cuModuleGetFunction)>("cuModuleGetFunction");
  decltype(&::cuLaunchKernel) launch = entry_point<decltype(&::cuLaunchKernel)>("cuLaunchKernel");
};

driver_calls const& driver() {
  static driver_calls const calls = [] {
    driver_calls d;
    if (d.init(0) != CUDA_SUCCESS) { std::_Exit(1); }
    return d;
  }();
  return calls;
}

/// Whether `device`'s primary context exists (asking creates none).
bool has_context(int device) {
  CUdevice handle = 0;
  if (driver().device_get(&handle, device) != CUDA_SUCCESS) { return false; }
  unsigned int flags = 0;
  int active = 0;
  return driver().primary_state(handle, &flags, &active) == CUDA_SUCCESS && active != 0;
}

/// The device a pointer's memory lives on, asked of the driver (creates no context).
int device_of(void* ptr) {
  int ordinal = -1;
  auto const address = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr));
  if (driver().pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) != CUDA_SUCCESS) {
    return -1;
  }
  return ordinal;
}

CUcontext current_context() {
  CUcontext ctx = nullptr;
  (void)driver().ctx_get_current(&ctx);
  return ctx;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void require_two_devices() {
  int const count = device_count();
  if (count < 2) {
    std::printf("SKIPPED: the multi-device tests need two CUDA devices; this machine has %d\n", count);
    std::fflush(stdout);
    std::_Exit(77);
  }
}

resource_ptr stack_on(int device, std::string const& spec) {
  build_options options;
  options.device = device;
  return build_stack(parse_stack_spec(spec), options);
}

std::size_t free_on(int device) {
  int previous = 0;
  MRSTACK_CUDA_TRY(cudaGetDevice(&previous));
  MRSTACK_CUDA_TRY(cudaSetDevice(device));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));
  MRSTACK_CUDA_TRY(cudaSetDevice(previous));
  return free_bytes;
}

// ---- a process that only uses device 1 ------------------------------------------------------
// Runs before main (and so before the test harness makes any CUDA call) when the parent
// test starts this program again with MRSTACK_TEST_DEVICE1_ONLY set. Exit status 0: no
// context on device 0 after building, using and freeing stacks of device 1.

int fail(std::string const& what) {
  std::printf("device-1-only process: FAILED: %s\n", what.c_str());
  return 1;
}

int use_only_device_1() {
  if (has_context(0) || has_context(1)) { return fail("a context existed before anything ran"); }
  if (current_context() != nullptr) { return fail("a context was current before anything ran"); }
  int failures = 0;
  for (char const* spec : {"pool(initial=64MiB) > cuda", "cuda_async(initial=32MiB)", "binning > pool > cuda_async",
                           "cuda", "pinned_host", "pool > vmm"}) {  // vmm: with access granted to its peers
    auto stack = stack_on(1, spec);
    std::vector<void*> blocks;
    // This thread never picked a device: the runtime would call it device 0.
    blocks.push_back(stack->allocate(std::size_t{1} << 30));
    std::thread other{[&] { blocks.push_back(stack->allocate(3 * mib)); }};
    other.join();
    if (current_context() != nullptr) { failures += fail(std::string{spec} + ": a context stayed current"); }
    if (std::string{spec} != "pinned_host") {
      for (void* p : blocks) {
        if (device_of(p) != 1) {
          failures += fail(std::string{spec} + ": a block is on device " + std::to_string(device_of(p)));
        }
      }
    }
    std::thread freeing{[&] {
      for (void* p : blocks) { stack->deallocate(p, p == blocks.front() ? std::size_t{1} << 30 : 3 * mib); }
    }};
    freeing.join();
    stack->release();
    stack.reset();
    if (has_context(0)) { failures += fail(std::string{spec} + ": device 0 got a context"); }
    std::printf("device-1-only process: %s: blocks on device 1, no context on device 0\n", spec);
  }
  // The registry's default of device 1 is bound to device 1 too.
  auto fallback = get_per_device_resource(1);
  void* p = fallback->allocate(mib);
  if (device_of(p) != 1) { failures += fail("get_per_device_resource(1) allocated off device 1"); }
  fallback->deallocate(p, mib);
  if (has_context(0)) { failures += fail("get_per_device_resource(1) created a context on device 0"); }
  if (!has_context(1)) { failures += fail("device 1 has no context, so nothing ran there"); }
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

[[maybe_unused]] int const device1_only_child = [] {
  if (std::getenv("MRSTACK_TEST_DEVICE1_ONLY") == nullptr) { return 0; }
  int status = 1;
  try {
    status = use_only_device_1();
  } catch (std::exception const& e) {
    std::printf("device-1-only process: FAILED: %s\n", e.what());
  }
  std::fflush(stdout);
  std::_Exit(status);
}();

// ---- a kernel for peer access: dst[i] = src[i] + 1, JIT-compiled from PTX ------------------

char const add_one_ptx[] = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry add_one(.param .u64 dst, .param .u64 src, .param .u64 n)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    cvt.u64.u32 %rd4, %r3;
    mad.wide.u32 %rd5, %r1, %r2, %rd4;
    setp.ge.u64 %p, %rd5, %rd3;
    @%p bra DONE;
    shl.b64 %rd6, %rd5, 2;
    add.s64 %rd7, %rd2, %rd6;
    ld.global.u32 %r4, [%rd7];
    add.u32 %r5, %r4, 1;
    add.s64 %rd8, %rd1, %rd6;
    st.global.u32 [%rd8], %r5;
DONE:
    ret;
}
)";

/// Runs add_one on `device` (its context current) over `n` words and waits for it.
void add_one_on(int device, void* dst, void const* src, std::size_t n) {
  MRSTACK_CUDA_TRY(cudaSetDevice(device));
  MRSTACK_CUDA_TRY(cudaFree(nullptr));  // the runtime's context is current for the driver calls
  CUmodule module = nullptr;
  REQUIRE(driver().module_load(&module, add_one_ptx) == CUDA_SUCCESS);
  CUfunction kernel = nullptr;
  REQUIRE(driver().module_function(&kernel, module, "add_one") == CUDA_SUCCESS);
  auto d = reinterpret_cast<CUdeviceptr>(dst);
  auto s = reinterpret_cast<CUdeviceptr>(src);
  std::uint64_t count = n;
  void* params[] = {&d, &s, &count};
  unsigned const block = 256;
  auto const grid = static_cast<unsigned>((n + block - 1) / block);
  REQUIRE(driver().launch(kernel, grid, 1, 1, block, 1, 1, 0, nullptr, params, nullptr) == CUDA_SUCCESS);
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
}

std::vector<std::uint32_t> counting(std::size_t n, std::uint32_t from) {
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) { v[i] = from + static_cast<std::uint32_t>(i); }
  return v;
}

}  // namespace

TEST_CASE("a process that only uses device 1 creates no context on device 0") {
  require_two_devices();
  std::string const command = "MRSTACK_TEST_DEVICE1_ONLY=1 /proc/self/exe";
  int const status = std::system(command.c_str());
  INFO("the child's report is above; exit status " << status);
  REQUIRE(status == 0);
}

TEST_CASE("each device's stack allocates and frees there from threads with the other device current") {
  require_two_devices();
  for (char const* spec : {"cuda", "pool > cuda", "cuda_async", "binning > pool > cuda_async"}) {
    INFO("spec: " << spec);
    std::vector<resource_ptr> stacks{stack_on(0, spec), stack_on(1, spec)};
    std::size_t const bytes = 512 * mib;
    for (int device : {0, 1}) {
      int const other = 1 - device;
      std::size_t const free_before = free_on(device);
      std::size_t const other_before = free_on(other);
      void* ptr = nullptr;
      std::thread allocating{[&] {
        MRSTACK_CUDA_TRY(cudaSetDevice(other));
        ptr = stacks[static_cast<std::size_t>(device)]->allocate(bytes);
        int current = -1;
        MRSTACK_CUDA_TRY(cudaGetDevice(&current));
        CHECK(current == other);  // the caller's device is left current
      }};
      allocating.join();
      CHECK(device_of(ptr) == device);
      cudaPointerAttributes attributes{};
      MRSTACK_CUDA_TRY(cudaPointerGetAttributes(&attributes, ptr));
      CHECK(attributes.device == device);
      CHECK(attributes.type == cudaMemoryTypeDevice);
      CHECK(free_before - free_on(device) >= bytes);
      // Nothing of it on the other device (a little slack for the driver's own bookkeeping).
      std::size_t const other_after = free_on(other);
      CHECK(other_before - std::min(other_before, other_after) < 32 * mib);
      std::thread freeing{[&] {
        MRSTACK_CUDA_TRY(cudaSetDevice(other));
        stacks[static_cast<std::size_t>(device)]->deallocate(ptr, bytes);
        int current = -1;
        MRSTACK_CUDA_TRY(cudaGetDevice(&current));
        CHECK(current == other);
      }};
      freeing.join();
      stacks[static_cast<std::size_t>(device)]->release();
      MRSTACK_CUDA_TRY(cudaSetDevice(device));
      MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
      CHECK(free_on(device) + 32 * mib >= free_before);  // given back
    }
  }
  MRSTACK_CUDA_TRY(cudaSetDevice(0));
}

TEST_CASE("the per-device registry's defaults allocate on their own device") {
  require_two_devices();
  MRSTACK_CUDA_TRY(cudaSetDevice(0));
  for (int device : {0, 1}) {
    void* p = get_per_device_resource(device)->allocate(mib);
    CHECK(device_of(p) == device);
    int current = -1;
    MRSTACK_CUDA_TRY(cudaGetDevice(&current));
    CHECK(current == 0);
    get_per_device_resource(device)->deallocate(p, mib);
  }
}

TEST_CASE("cross-device copies between the two devices' stacks") {
  require_two_devices();
  std::size_t const n = 1 << 20;
  std::size_t const bytes = n * sizeof(std::uint32_t);
  auto s0 = stack_on(0, "pool > cuda");
  auto s1 = stack_on(1, "pool > cuda_async");
  void* a = s0->allocate(bytes);
  void* b = s1->allocate(bytes);
  auto const source = counting(n, 7);
  MRSTACK_CUDA_TRY(cudaMemcpy(a, source.data(), bytes, cudaMemcpyHostToDevice));
  MRSTACK_CUDA_TRY(cudaMemcpyPeer(b, 1, a, 0, bytes));
  // Memory from device 1's cudaMallocAsync pool is accessible from device 1 only (no
  // cudaMemPoolSetAccess for device 0 here): read it back with device 1 current. (With
  // device 0 current, cudaMemcpy refuses it as an invalid argument.)
  std::vector<std::uint32_t> back(n);
  MRSTACK_CUDA_TRY(cudaSetDevice(1));
  MRSTACK_CUDA_TRY(cudaMemcpy(back.data(), b, bytes, cudaMemcpyDeviceToHost));
  MRSTACK_CUDA_TRY(cudaSetDevice(0));
  CHECK(back == source);
  // And back, on a stream of device 1, with the runtime finding both devices by address.
  MRSTACK_CUDA_TRY(cudaMemset(a, 0, bytes));
  MRSTACK_CUDA_TRY(cudaSetDevice(1));
  cudaStream_t stream = nullptr;
  MRSTACK_CUDA_TRY(cudaStreamCreate(&stream));
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(a, b, bytes, cudaMemcpyDefault, stream));
  MRSTACK_CUDA_TRY(cudaStreamSynchronize(stream));
  MRSTACK_CUDA_TRY(cudaStreamDestroy(stream));
  MRSTACK_CUDA_TRY(cudaSetDevice(0));
  std::vector<std::uint32_t> again(n);
  MRSTACK_CUDA_TRY(cudaMemcpy(again.data(), a, bytes, cudaMemcpyDeviceToHost));
  CHECK(again == source);
  s0->deallocate(a, bytes);
  s1->deallocate(b, bytes);
}

/// Two devices, and device 1 may access device 0's memory (else it says why, and false).
static bool two_devices_with_peer_access() {
  require_two_devices();
  int can = 0;
  MRSTACK_CUDA_TRY(cudaDeviceCanAccessPeer(&can, 1, 0));
  if (can == 0) {
    WARN("device 1 cannot access device 0's memory (cudaDeviceCanAccessPeer is 0): no peer test on this machine");
  }
  return can != 0;
}

TEST_CASE("peer_access: a kernel on device 1 reads and writes device 0's stack memory") {
  if (!two_devices_with_peer_access()) { return; }
  std::size_t const n = (std::size_t{1} << 20) + 13;  // a partial last block
  std::size_t const bytes = n * sizeof(std::uint32_t);
  for (char const* spec : {"pool > cuda(peer_access=true)", "cuda_async(peer_access=true)",
                           "pool > cuda_async(peer_access=true)", "pool > vmm", "pool > vmm(peer_access=true)"}) {
    INFO("device 0's stack: " << spec);
    auto on0 = stack_on(0, spec);
    auto on1 = stack_on(1, "pool > cuda");
    void* zero = on0->allocate(bytes);
    void* one = on1->allocate(bytes);
    REQUIRE(device_of(zero) == 0);
    REQUIRE(device_of(one) == 1);
    auto const source = counting(n, 100);
    MRSTACK_CUDA_TRY(cudaMemcpy(zero, source.data(), bytes, cudaMemcpyHostToDevice));
    add_one_on(1, one, zero, n);  // device 1 reads device 0's memory
    std::vector<std::uint32_t> read(n);
    MRSTACK_CUDA_TRY(cudaMemcpy(read.data(), one, bytes, cudaMemcpyDeviceToHost));
    CHECK(read == counting(n, 101));
    add_one_on(1, zero, one, n);  // and writes it
    std::vector<std::uint32_t> written(n);
    MRSTACK_CUDA_TRY(cudaMemcpy(written.data(), zero, bytes, cudaMemcpyDeviceToHost));
    CHECK(written == counting(n, 102));
    MRSTACK_CUDA_TRY(cudaSetDevice(0));
    on0->deallocate(zero, bytes);
    on1->deallocate(one, bytes);
  }
}

TEST_CASE("vmm memory is copied from another device's context with peer access, refused without") {
  if (!two_devices_with_peer_access()) { return; }
  std::size_t const n = std::size_t{1} << 20;
  std::size_t const bytes = n * sizeof(std::uint32_t);
  for (bool const peers : {true, false}) {
    INFO("vmm(peer_access=" << peers << ")");
    auto on0 = stack_on(0, peers ? "pool > vmm(peer_access=true)" : "pool > vmm(peer_access=false)");
    auto on1 = stack_on(1, "pool > cuda");
    void* zero = on0->allocate(bytes);
    void* one = on1->allocate(bytes);
    auto const source = counting(n, 7);
    MRSTACK_CUDA_TRY(cudaMemcpy(zero, source.data(), bytes, cudaMemcpyHostToDevice));
    MRSTACK_CUDA_TRY(cudaSetDevice(1));  // as Numba's copy_to_device from device 1's context
    cudaError_t const copied = cudaMemcpy(one, zero, bytes, cudaMemcpyDeviceToDevice);
    (void)cudaGetLastError();
    if (peers) {
      REQUIRE(copied == cudaSuccess);
      std::vector<std::uint32_t> read(n);
      MRSTACK_CUDA_TRY(cudaMemcpy(read.data(), one, bytes, cudaMemcpyDeviceToHost));
      CHECK(read == source);
    } else {
      CHECK(copied != cudaSuccess);  // the control: without access the copy cannot work
    }
    MRSTACK_CUDA_TRY(cudaSetDevice(0));
    on0->deallocate(zero, bytes);
    on1->deallocate(one, bytes);
  }
}

TEST_CASE("a stack for a device that does not exist is refused with the device named") {
  require_two_devices();
  int const count = device_count();
  try {
    (void)stack_on(count, "cuda");
    FAIL("no error for device " << count);
  } catch (std::exception const& e) {
    CHECK_THAT(std::string{e.what()}, Catch::Contains(std::to_string(count)));
  }
}
