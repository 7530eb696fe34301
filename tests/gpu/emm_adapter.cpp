// emm::adapter on a real device: memory from a cuda stack is usable, memory info is the
// device's plus what the stack holds free, IPC handles name the base allocation and the
// offset and really open in another process, and memory CUDA IPC cannot share (stream-
// ordered pools, managed memory) is refused with a clear message.
#include <catch2/catch.hpp>

#include <mrstack/emm/adapter.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/managed_memory_resource.hpp>
#include <mrstack/upstream/vmm_ipc.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <caching_resource.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

using namespace mrstack;
using emm::adapter;
using mrstack::test::caching_resource;

namespace {

adapter::options on_current_device() {
  adapter::options opts;
  MRSTACK_CUDA_TRY(cudaGetDevice(&opts.device));
  return opts;
}

std::string to_hex(void const* data, std::size_t n) {
  std::string out;
  char buf[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char const*>(data)[i]);
    out += buf;
  }
  return out;
}

void from_hex(std::string const& hex, void* data, std::size_t n) {
  REQUIRE(hex.size() == 2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
}

// Runs this test program again with `args` and extra environment entries; returns its exit status.
int run_self(std::vector<std::string> args, std::vector<std::string> const& extra_env) {
  std::vector<std::string> env_strings = extra_env;
  for (char** e = environ; *e != nullptr; ++e) { env_strings.emplace_back(*e); }
  std::vector<char*> envp;
  for (auto& s : env_strings) { envp.push_back(s.data()); }
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::vector<char*> argv{self.data()};
  for (auto& a : args) { argv.push_back(a.data()); }
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) { return -1; }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) { return -1; }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("emm adapter on a device: memory from a cuda stack is writable and returned exactly once") {
  adapter a{std::make_shared<cuda_memory_resource>(), on_current_device()};
  a.initialize();
  auto m = a.memalloc(1 << 20);
  REQUIRE(m.ptr != nullptr);
  MRSTACK_CUDA_TRY(cudaMemset(m.ptr, 0x7b, 1 << 20));
  unsigned char last = 0;
  MRSTACK_CUDA_TRY(cudaMemcpy(&last, static_cast<char*>(m.ptr) + (1 << 20) - 1, 1, cudaMemcpyDeviceToHost));
  CHECK(last == 0x7b);
  CHECK(a.free(m.token).has_value());
  CHECK_FALSE(a.free(m.token).has_value());
}

TEST_CASE("emm adapter on a device: memory info is the device's, plus what the stack holds free") {
  auto cache = std::make_shared<caching_resource>(std::make_shared<cuda_memory_resource>());
  adapter a{cache, on_current_device()};
  std::size_t device_free = 0;
  std::size_t device_total = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&device_free, &device_total));
  auto before = a.get_memory_info();
  CHECK(before.total == device_total);
  CHECK(before.free <= before.total);

  std::size_t const big = std::size_t{256} << 20;
  auto m = a.memalloc(big);
  auto during = a.get_memory_info();
  REQUIRE(a.free(m.token).has_value());  // the cache holds it: the driver still counts it used
  auto after = a.get_memory_info();
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&device_free, &device_total));
  CHECK(device_free + big <= device_total);
  // The adapter reports it free again (other processes may move the device's numbers a little).
  CHECK(after.free >= during.free + big - (std::size_t{64} << 20));
  cache->release();
}

TEST_CASE("emm adapter on a device: the IPC handle names the base allocation and the offset into it") {
  // A cuda stack hands out whole cudaMalloc allocations: ask for a pointer inside one to
  // see the offset a suballocator's pointers have.
  adapter a{std::make_shared<cuda_memory_resource>(), on_current_device()};
  auto m = a.memalloc(1 << 16);
  auto* inside = static_cast<char*>(m.ptr) + 4096;
  auto h = a.get_ipc_handle(inside);
  CHECK(h.base == m.ptr);
  CHECK(h.offset == 4096);
  CHECK(h.base_size >= (std::size_t{1} << 16));
  CHECK(h.device == a.device());
  cudaIpcMemHandle_t direct{};
  MRSTACK_CUDA_TRY(cudaIpcGetMemHandle(&direct, m.ptr));
  CHECK(std::memcmp(&direct, &h.handle, sizeof direct) == 0);
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter on a device: an IPC handle opens in another process and shows the data at the offset") {
  adapter a{std::make_shared<cuda_memory_resource>(), on_current_device()};
  std::size_t const size = 1 << 16;
  auto m = a.memalloc(size);
  MRSTACK_CUDA_TRY(cudaMemset(m.ptr, 0x11, size));
  MRSTACK_CUDA_TRY(cudaMemset(static_cast<char*>(m.ptr) + 8192, 0x5c, 256));
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  auto h = a.get_ipc_handle(static_cast<char*>(m.ptr) + 8192);
  REQUIRE(h.offset == 8192);
  int const status = run_self({"[ipc_child]"}, {"MRSTACK_TEST_IPC_HANDLE=" + to_hex(&h.handle, sizeof h.handle),
                                                "MRSTACK_TEST_IPC_OFFSET=" + std::to_string(h.offset)});
  CHECK(status == 0);
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("ipc child: opens the handle from the environment and checks 256 bytes at the offset", "[.ipc_child]") {
  char const* hex = std::getenv("MRSTACK_TEST_IPC_HANDLE");
  char const* offset_text = std::getenv("MRSTACK_TEST_IPC_OFFSET");
  REQUIRE(hex != nullptr);
  REQUIRE(offset_text != nullptr);
  cudaIpcMemHandle_t handle{};
  from_hex(hex, &handle, sizeof handle);
  void* base = nullptr;
  MRSTACK_CUDA_TRY(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
  std::vector<unsigned char> host(258);
  auto const offset = std::stoul(offset_text);
  MRSTACK_CUDA_TRY(cudaMemcpy(host.data(), static_cast<char*>(base) + offset - 1, host.size(), cudaMemcpyDeviceToHost));
  CHECK(host.front() == 0x11);
  for (std::size_t i = 1; i <= 256; ++i) { CHECK(host[i] == 0x5c); }
  CHECK(host.back() == 0x11);
  MRSTACK_CUDA_TRY(cudaIpcCloseMemHandle(base));
}

TEST_CASE("emm adapter on a device: memory from a stream-ordered pool is refused for IPC, saying why") {
  adapter a{std::make_shared<cuda_async_memory_resource>(), on_current_device()};
  auto m = a.memalloc(4096);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr), Catch::Contains("cannot share") && Catch::Contains("cuda_async") &&
                                                 Catch::Contains("cuda upstream"));
  CHECK(a.free(m.token).has_value());
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
}

TEST_CASE("emm adapter on a device: memory from a vmm upstream gets a vmm IPC handle of exactly the block") {
  adapter a{std::make_shared<pool_memory_resource>(std::make_shared<vmm_memory_resource>()), on_current_device()};
  auto pad = a.memalloc(3000);
  auto m = a.memalloc(4096);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr), Catch::Contains("virtual-memory (vmm)") && Catch::Contains("size is needed"));
  auto h = a.get_ipc_handle(m.ptr, 4096);
  CHECK(h.vmm);
  CHECK(h.base == m.ptr);
  CHECK(h.offset == 0);
  CHECK(h.base_size == 4096);
  CHECK(vmm_ipc::is_handle(&h.handle, sizeof h.handle));
  CHECK(vmm_ipc::describe(*reinterpret_cast<vmm_ipc::handle const*>(&h.handle)).block_bytes == 4096);
  CHECK(a.free(m.token).has_value());
  CHECK(a.free(pad.token).has_value());
}

TEST_CASE("emm adapter on a device: a vmm made with ipc=none is refused for IPC, saying how to enable it") {
  auto vmm = std::make_shared<vmm_memory_resource>(0, vmm_memory_resource::default_map_granules, -1,
                                                   vmm_memory_resource::ipc_mode::none);
  adapter a{std::make_shared<pool_memory_resource>(vmm), on_current_device()};
  auto m = a.memalloc(4096);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr, 4096), Catch::Contains("ipc=none") && Catch::Contains("vmm(ipc=fd)"));
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter on a device: managed memory is refused for IPC") {
  adapter a{std::make_shared<managed_memory_resource>(), on_current_device()};
  auto m = a.memalloc(4096);
  CHECK_THROWS_WITH(a.get_ipc_handle(m.ptr), Catch::Contains("managed memory"));
  CHECK(a.free(m.token).has_value());
}

TEST_CASE("emm adapter on a device: reset returns a cuda stack's memory to the device") {
  adapter a{std::make_shared<cuda_memory_resource>(), on_current_device()};
  std::size_t free_before = 0;
  std::size_t total = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_before, &total));
  std::vector<emm::memory_pointer> ms;
  for (int i = 0; i < 8; ++i) { ms.push_back(a.memalloc(std::size_t{64} << 20)); }
  std::size_t free_during = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_during, &total));
  CHECK(free_during + (std::size_t{448} << 20) <= free_before);
  CHECK(a.reset().size() == 8);
  std::size_t free_after = 0;
  MRSTACK_CUDA_TRY(cudaMemGetInfo(&free_after, &total));
  CHECK(free_after >= free_during + (std::size_t{448} << 20));
  for (auto const& m : ms) { CHECK_FALSE(a.free(m.token).has_value()); }
}

TEST_CASE("emm adapter on a device: a pool block's IPC handle names its chunk and offset, and opens elsewhere") {
  auto pool = std::make_shared<pool_memory_resource>(std::make_shared<cuda_memory_resource>(), std::size_t{8} << 20);
  adapter a{pool, on_current_device()};
  auto first = a.memalloc(3000);  // pushes the next block off the chunk's start
  std::size_t const size = 1 << 16;
  auto m = a.memalloc(size);
  MRSTACK_CUDA_TRY(cudaMemset(m.ptr, 0x11, size));
  MRSTACK_CUDA_TRY(cudaMemset(static_cast<char*>(m.ptr) + 8192, 0x5c, 256));
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  auto h = a.get_ipc_handle(static_cast<char*>(m.ptr) + 8192);
  CHECK(h.offset == static_cast<std::size_t>(static_cast<char*>(m.ptr) - static_cast<char*>(h.base)) + 8192);
  CHECK(h.offset > 8192);
  CHECK(h.base_size >= (std::size_t{8} << 20));
  int const status = run_self({"[ipc_child]"}, {"MRSTACK_TEST_IPC_HANDLE=" + to_hex(&h.handle, sizeof h.handle),
                                                "MRSTACK_TEST_IPC_OFFSET=" + std::to_string(h.offset)});
  CHECK(status == 0);
  CHECK(a.free(m.token).has_value());
  CHECK(a.free(first.token).has_value());
}
