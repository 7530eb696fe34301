// vmm IPC's transport without a GPU: the exporter's registry and socket server hand an
// opener the block's description and its runs' file descriptors (SCM_RIGHTS, in batches),
// refuse ended exports with a reason, and reject bytes that are no handle. Pipes stand in
// for the driver's shareable handles.
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include "../src/upstream/vmm_ipc_registry.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// One registry for the whole test program (its server thread lives as long as the process).
vmm_ipc::export_registry& test_registry() {
  static auto* const instance = new vmm_ipc::export_registry{};
  return *instance;
}

struct pipe_pair {
  int read_end = -1;
  int write_end = -1;
  pipe_pair() {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~pipe_pair() {
    ::close(read_end);
    ::close(write_end);
  }
};

}  // namespace

TEST_CASE("vmm IPC transport: an opener receives the runs' descriptors, which reach the exporter's objects") {
  pipe_pair pipe;
  std::size_t const run_count = GENERATE(std::size_t{1}, std::size_t{3}, std::size_t{150});  // 150: three batches
  std::uint64_t const first_handle = 1000 * run_count;
  std::vector<virtual_range_resource::mapped_run> runs;
  for (std::size_t i = 0; i < run_count; ++i) { runs.push_back({i * 32 * MiB, 32 * MiB, first_handle + i}); }
  std::size_t exported = 0;
  auto const h = test_registry().add_export_with(
      runs, 3 * MiB + 256, run_count * 32 * MiB - 4 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      [&](void* out, std::uint64_t) {
        *static_cast<int*>(out) = fcntl(pipe.write_end, F_DUPFD_CLOEXEC, 0);
        ++exported;
      });
  CHECK(exported == run_count);
  REQUIRE(vmm_ipc::is_handle(h.data(), h.size()));
  auto const info = vmm_ipc::describe(h);
  CHECK(info.exporter_pid == static_cast<std::uint32_t>(getpid()));
  CHECK(info.runs == run_count);
  CHECK(info.handle_type == "fd");
  CHECK(info.block_bytes == run_count * 32 * MiB - 4 * MiB);

  // The same block exported again: the same handle, no new descriptors.
  auto const again = test_registry().add_export_with(runs, 3 * MiB + 256, run_count * 32 * MiB - 4 * MiB, 0,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     [&](void*, std::uint64_t) { ++exported; });
  CHECK(again == h);
  CHECK(exported == run_count);

  {
    vmm_ipc::fetched_export got;
    vmm_ipc::fetch_export(h, got);
    CHECK(got.type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK(got.block_offset == 3 * MiB + 256);
    CHECK(got.block_bytes == run_count * 32 * MiB - 4 * MiB);
    REQUIRE(got.bytes.size() == run_count);
    REQUIRE(got.fds.size() == run_count);
    for (auto b : got.bytes) { CHECK(b == 32 * MiB); }
    // Each received descriptor is the exporter's pipe: what goes in comes out of its read end.
    char const message[] = "through a passed descriptor";
    REQUIRE(write(got.fds.back(), message, sizeof message) == static_cast<ssize_t>(sizeof message));
    char buffer[sizeof message] = {};
    REQUIRE(read(pipe.read_end, buffer, sizeof buffer) == static_cast<ssize_t>(sizeof buffer));
    CHECK(std::strcmp(buffer, message) == 0);
  }

  // Unmapping any run ends the export, with a reason the opener sees.
  test_registry().forget_run(first_handle + run_count - 1);
  vmm_ipc::fetched_export late;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(h, late), Catch::Contains("has ended"));
  for (std::size_t i = 0; i + 1 < run_count; ++i) { test_registry().forget_run(first_handle + i); }
}

TEST_CASE("vmm IPC transport: fabric handles travel as bytes") {
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 77}, {2 * MiB, 2 * MiB, 78}};
  auto const h = test_registry().add_export_with(runs, 0, 4 * MiB, 1, CU_MEM_HANDLE_TYPE_FABRIC,
                                                 [](void* out, std::uint64_t run) {
                                                   auto* fabric = static_cast<CUmemFabricHandle*>(out);
                                                   std::memset(fabric->data, static_cast<int>(run), sizeof fabric->data);
                                                 });
  CHECK(vmm_ipc::describe(h).handle_type == "fabric");
  vmm_ipc::fetched_export got;
  vmm_ipc::fetch_export(h, got);
  CHECK(got.fds.empty());
  CHECK(got.device == 1);
  REQUIRE(got.fabric.size() == 2);
  CHECK(got.fabric[0].data[0] == 77);
  CHECK(got.fabric[1].data[63] == 78);
  test_registry().forget_run(77);
  test_registry().forget_run(78);
}

TEST_CASE("vmm IPC transport: bytes that are no handle, or a handle of a gone process, are refused clearly") {
  vmm_ipc::handle junk{};
  CHECK_FALSE(vmm_ipc::is_handle(junk.data(), junk.size()));
  vmm_ipc::fetched_export got;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(junk, got), Catch::Contains("not an mrstack vmm IPC handle"));
  CHECK_THROWS_WITH(vmm_ipc::open(junk, 0), Catch::Contains("not an mrstack vmm IPC handle"));
  // A real handle whose exporter's pid has no socket (pid 1's nonce never matches).
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 5}};
  pipe_pair pipe;
  auto h = test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           [&](void* out, std::uint64_t) {
                                             *static_cast<int*>(out) = fcntl(pipe.write_end, F_DUPFD_CLOEXEC, 0);
                                           });
  std::uint32_t const pid_one = 1;
  std::memcpy(h.data() + 8, &pid_one, sizeof pid_one);
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(h, got), Catch::Contains("cannot reach the exporting process 1"));
  test_registry().forget_run(5);
}
