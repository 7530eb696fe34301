// vmm IPC's transport without a GPU: the exporter's registry and socket server hand an
// opener the block's description and its runs' file descriptors (SCM_RIGHTS, in batches),
// refuse ended exports with a reason, reject bytes that are no handle and answers that do
// not match the handle, and do not stall behind a silent peer. Pipes stand in
// for the driver's shareable handles.
#include <catch2/catch.hpp>

#include <mrstack/detail/format.hpp>
#include <mrstack/upstream/vmm_ipc.hpp>

#include "../src/upstream/vmm_ipc_registry.hpp"

#include <vmm_ipc_peer.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

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

// A run exporter handing out duplicates of one pipe end (the exporter's "physical memory").
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

TEST_CASE("vmm IPC transport: a physical allocation exported as one handle type is refused as the other, saying so") {
  // The second export reused the run's first shareable handle: asked for fabric after fd,
  // the same block got the fd export's id under a fabric handle (its open: "does not match
  // the handle ... damaged") and another block a fabric handle of zeros; asked for fd after
  // fabric, descriptor -1 (its open: "cannot duplicate the descriptor").
  pipe_pair pipe;
  void const* const block = reinterpret_cast<void const*>(std::uintptr_t{0x7f3a00200000});
  std::vector<virtual_range_resource::mapped_run> fd_runs{{0, 2 * MiB, 41}, {2 * MiB, 2 * MiB, 42}};
  std::vector<virtual_range_resource::mapped_run> fabric_runs{{0, 2 * MiB, 43}};
  std::size_t exported = 0;
  auto const counted = [&](void* out, std::uint64_t run) {
    ++exported;
    std::memset(out, static_cast<int>(run), sizeof(CUmemFabricHandle));
  };
  auto const as_fd = test_registry().add_export_with(fd_runs, 0, 4 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     test::dup_of(pipe.write_end));
  auto const as_fabric = test_registry().add_export_with(fabric_runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_FABRIC, counted);
  exported = 0;

  // The same block, and another one over the second run and a new one: each names the
  // block, both types and what to do instead, and nothing is exported.
  auto const refusal = [&](std::vector<virtual_range_resource::mapped_run> const& runs, std::size_t offset,
                           std::size_t bytes, CUmemAllocationHandleType type) -> std::string {
    try {
      (void)test_registry().add_export_with(runs, offset, bytes, 0, type, counted, block);
    } catch (logic_error const& e) {
      return e.what();
    }
    return "no refusal";
  };
  std::string const named = "export of " + format_hex(block);
  std::vector<virtual_range_resource::mapped_run> straddling{{2 * MiB, 2 * MiB, 42}, {4 * MiB, 2 * MiB, 44}};
  for (auto const& message : {refusal(fd_runs, 0, 4 * MiB, CU_MEM_HANDLE_TYPE_FABRIC),
                              refusal(straddling, MiB, 2 * MiB, CU_MEM_HANDLE_TYPE_FABRIC)}) {
    CHECK_THAT(message, Catch::Contains(named + " as fabric handles (ipc=fabric) refused"));
    CHECK_THAT(message, Catch::Contains("physical allocation 0 of 2 was exported as POSIX file descriptors (ipc=fd)"));
    CHECK_THAT(message, Catch::Contains("allocate the block from a vmm(ipc=fabric)"));
  }
  std::string const reverse = refusal(fabric_runs, 0, MiB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK_THAT(reverse, Catch::Contains(named + " as POSIX file descriptors (ipc=fd) refused"));
  CHECK_THAT(reverse, Catch::Contains("physical allocation 0 of 1 was exported as fabric handles (ipc=fabric)"));
  CHECK_THAT(reverse, Catch::Contains("allocate the block from a vmm(ipc=fd)"));
  // Without an address (the registry's callers in tests) the block is "a block".
  CHECK_THROWS_WITH(test_registry().add_export_with(fd_runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_FABRIC, counted),
                    Catch::Contains("export of a block as fabric handles"));
  CHECK(exported == 0);

  // The first exports are untouched.
  vmm_ipc::fetched_export fds;
  vmm_ipc::fetch_export(as_fd, fds);
  CHECK(fds.fds.size() == 2);
  vmm_ipc::fetched_export fabric;
  vmm_ipc::fetch_export(as_fabric, fabric);
  REQUIRE(fabric.fabric.size() == 1);
  CHECK(fabric.fabric[0].data[0] == 43);
  for (std::uint64_t run : {41, 42, 43, 44}) { test_registry().forget_run(run); }
}

TEST_CASE("vmm IPC transport: the handle type binds a run only until it is unmapped") {
  // Unmapped, a run leaves the registry (forget_run comes before cuMemRelease), and the
  // driver may hand its handle to a new run, of another vmm and another type: that run is
  // exported as its own type, not refused as the old one's.
  pipe_pair pipe;
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 62}};
  auto const as_fd = test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     test::dup_of(pipe.write_end));
  test_registry().forget_run(62);
  auto const as_fabric = test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_FABRIC,
                                                         [](void* out, std::uint64_t) {
                                                           std::memset(out, 62, sizeof(CUmemFabricHandle));
                                                         });
  CHECK(vmm_ipc::describe(as_fabric).handle_type == "fabric");
  vmm_ipc::fetched_export got;
  vmm_ipc::fetch_export(as_fabric, got);
  REQUIRE(got.fabric.size() == 1);
  CHECK(got.fabric[0].data[0] == 62);
  vmm_ipc::fetched_export ended;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(as_fd, ended), Catch::Contains("has ended"));
  test_registry().forget_run(62);
}

TEST_CASE("vmm IPC transport: an export that fails partway records nothing: a retry as either type works") {
  // The first run's descriptor was made and recorded, the second run's export failed: the
  // first run stayed recorded as fd, so the retry as fabric was refused as mixing types,
  // and its descriptor stayed open until the run was unmapped.
  pipe_pair pipe;
  std::vector<virtual_range_resource::mapped_run> const runs{{0, 2 * MiB, 71}, {2 * MiB, 2 * MiB, 72}};
  int made = -1;
  auto const second_fails = [&](void* out, std::uint64_t run) {
    if (run == 72) { throw std::runtime_error("cuMemExportToShareableHandle: refused"); }
    made = fcntl(pipe.write_end, F_DUPFD_CLOEXEC, 0);
    *static_cast<int*>(out) = made;
  };
  CHECK_THROWS_WITH(test_registry().add_export_with(runs, 0, 4 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                    second_fails),
                    "cuMemExportToShareableHandle: refused");
  REQUIRE(made >= 0);
  CHECK(fcntl(made, F_GETFD) == -1);  // closed with the failed export, not kept for the run
  auto const fabric_of_run = [](void* out, std::uint64_t run) {
    std::memset(out, static_cast<int>(run), sizeof(CUmemFabricHandle));
  };
  auto const as_fabric =
      test_registry().add_export_with(runs, 0, 4 * MiB, 0, CU_MEM_HANDLE_TYPE_FABRIC, fabric_of_run);
  CHECK(vmm_ipc::describe(as_fabric).handle_type == "fabric");
  vmm_ipc::fetched_export got;
  vmm_ipc::fetch_export(as_fabric, got);
  REQUIRE(got.fabric.size() == 2);
  CHECK(got.fabric[0].data[0] == 71);
  CHECK(got.fabric[1].data[0] == 72);
  test_registry().forget_run(71);
  test_registry().forget_run(72);
  // Unmapped, both are gone: an fd export whose driver fails partway again leaves the runs
  // free for a retry as fd.
  CHECK_THROWS(test_registry().add_export_with(runs, 0, 4 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                               second_fails));
  auto const as_fd = test_registry().add_export_with(runs, 0, 4 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     test::dup_of(pipe.write_end));
  CHECK(vmm_ipc::describe(as_fd).handle_type == "fd");
  test_registry().forget_run(71);
  test_registry().forget_run(72);
}

TEST_CASE("vmm IPC transport: two threads exporting one run as both types: one wins, the other exports nothing") {
  // The check and the export are under one lock: neither type slips in between.
  pipe_pair pipe;
  for (std::uint64_t run = 2000; run < 2100; ++run) {
    std::vector<virtual_range_resource::mapped_run> const runs{{0, 2 * MiB, run}};
    std::atomic<int> exported_as_fabric{0};
    auto const as = [&](CUmemAllocationHandleType type) {
      return std::async(std::launch::async, [&, type] {
        try {
          if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
            (void)test_registry().add_export_with(runs, 0, MiB, 0, type, [&](void*, std::uint64_t) {
              ++exported_as_fabric;
            });
          } else {
            (void)test_registry().add_export_with(runs, 0, MiB, 0, type, test::dup_of(pipe.write_end));
          }
          return std::string{"exported"};
        } catch (logic_error const& e) {
          return std::string{e.what()};
        }
      });
    };
    auto fd = as(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    auto fabric = as(CU_MEM_HANDLE_TYPE_FABRIC);
    std::string const fd_said = fd.get();
    std::string const fabric_said = fabric.get();
    INFO("run " << run << ": fd: " << fd_said << "; fabric: " << fabric_said);
    REQUIRE((fd_said == "exported") != (fabric_said == "exported"));
    std::string const& refused = fd_said == "exported" ? fabric_said : fd_said;
    REQUIRE_THAT(refused, Catch::Contains("a physical allocation is shared with one handle type only"));
    REQUIRE(exported_as_fabric == (fabric_said == "exported" ? 1 : 0));
    test_registry().forget_run(run);
  }
}

TEST_CASE("vmm IPC transport: an export as a handle type neither fd nor fabric is refused and nothing is exported") {
  // The registry took any type: the run was exported into its descriptor slot and recorded
  // under that type, the handle made, and the refusal of a later fd export over it said the
  // run "was exported as POSIX file descriptors (ipc=?)" — the type asked for, not the one it had.
  void const* const block = reinterpret_cast<void const*>(std::uintptr_t{0x7f3a00400000});
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 61}};
  std::size_t exported = 0;
  auto const counted = [&](void* out, std::uint64_t) {
    ++exported;
    *static_cast<int*>(out) = -1;
  };
  CHECK_THROWS_WITH(test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_NONE, counted, block),
                    Catch::Contains("vmm IPC: export of " + format_hex(block) + " as handle type 0 refused") &&
                        Catch::Contains("only POSIX file descriptors (ipc=fd) and fabric handles (ipc=fabric)"));
  CHECK(exported == 0);
  // Nothing was recorded: the run exports as fd.
  pipe_pair pipe;
  auto const h = test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                 test::dup_of(pipe.write_end), block);
  CHECK(vmm_ipc::describe(h).handle_type == "fd");
  test_registry().forget_run(61);
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

TEST_CASE("vmm IPC transport: a peer that connects and never asks does not stall the openers after it") {
  // The server answered one connection at a time and waited for its request without a
  // limit: any process of the user that connected and stayed silent (hung, or stopped in
  // a debugger) made every later open of every export of this process hang forever.
  pipe_pair pipe;
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 9}};
  auto const h =
      test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, test::dup_of(pipe.write_end));
  int const silent = test::connect_to_exporter(h);  // accepted first, then says nothing
  std::promise<std::size_t> answer;
  auto received = answer.get_future();
  std::thread opener{[&] {
    try {
      vmm_ipc::fetched_export got;
      vmm_ipc::fetch_export(h, got);
      answer.set_value(got.fds.size());
    } catch (...) {
      answer.set_exception(std::current_exception());
    }
  }};
  bool const served = received.wait_for(std::chrono::seconds{20}) == std::future_status::ready;
  ::close(silent);  // unblocks a server still waiting on it, so the opener ends either way
  opener.join();
  CHECK(served);
  CHECK(received.get() == 1);
  test_registry().forget_run(9);
}

TEST_CASE("vmm IPC transport: an answer that does not match the handle, or lies outside its runs, is refused") {
  pipe_pair pipe;
  std::vector<virtual_range_resource::mapped_run> one{{0, 2 * MiB, 21}};
  std::vector<virtual_range_resource::mapped_run> two{{0, 2 * MiB, 22}, {2 * MiB, 2 * MiB, 23}};
  auto const small = test_registry().add_export_with(one, 256, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     test::dup_of(pipe.write_end));
  auto const large = test_registry().add_export_with(two, 0, 3 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     test::dup_of(pipe.write_end));
  // A handle whose export id was damaged into another export's: the opener would map
  // another block (of another size) and hand it out as this one.
  auto damaged = small;
  std::memcpy(damaged.data() + 16, large.data() + 16, sizeof(std::uint64_t));
  vmm_ipc::fetched_export got;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(damaged, got), Catch::Contains("does not match the handle"));
  // An export id this process never made was reported as an export that "has ended".
  std::uint64_t const never = std::uint64_t{1} << 60;
  std::memcpy(damaged.data() + 16, &never, sizeof never);
  vmm_ipc::fetched_export none;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(damaged, none), Catch::Contains("no export 1152921504606846976"));
  // A block described past the end of its runs: open() would return a pointer outside
  // the mapping it makes.
  std::vector<virtual_range_resource::mapped_run> three{{0, 2 * MiB, 24}};
  auto const outside = test_registry().add_export_with(three, 3 * MiB, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                       test::dup_of(pipe.write_end));
  vmm_ipc::fetched_export got_outside;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(outside, got_outside), Catch::Contains("outside the"));
  vmm_ipc::fetched_export fine;
  CHECK_NOTHROW(vmm_ipc::fetch_export(large, fine));
  for (std::uint64_t run : {21, 22, 23, 24}) { test_registry().forget_run(run); }
}

TEST_CASE("vmm IPC transport: open refuses what names no device before asking the exporter") {
  // An ordinal below -1 was read as "the current device" once the exporter had answered.
  pipe_pair pipe;
  std::vector<virtual_range_resource::mapped_run> runs{{0, 2 * MiB, 31}};
  auto const h =
      test_registry().add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, test::dup_of(pipe.write_end));
  CHECK_THROWS_AS(vmm_ipc::open(h, -2), logic_error);
  CHECK_THROWS_WITH(vmm_ipc::open(h, -2), Catch::Contains("vmm IPC open: device -2 is not a device"));
  CHECK_THROWS_WITH(vmm_ipc::open(h, 64), Catch::Contains("vmm IPC open: device 64 is past the 64 devices"));
  test_registry().forget_run(31);
}

namespace {

// An exporter that answers one open of export 1 (one run of 2 MiB, a 1 MiB block) as told:
// with `type` in the handle and the answer, and a descriptor with the header if `stray_fd`.
struct fake_exporter {
  static constexpr std::uint64_t nonce = 0x5eedf00dULL;
  vmm_ipc::handle h{};
  int listener = -1;
  pipe_pair stray, run;
  std::thread answering;

  fake_exporter(std::uint32_t type, bool stray_fd) {
    std::uint32_t const pid = static_cast<std::uint32_t>(getpid());
    unsigned char const magic[8] = {'M', 'R', 'S', 'V', 'M', 'M', 1, 0};
    std::uint64_t const id = 1, block_bytes = MiB, run_bytes = 2 * MiB;
    std::uint32_t const one_run = 1;
    std::memcpy(h.data(), magic, sizeof magic);
    std::memcpy(h.data() + 8, &pid, 4);
    std::memcpy(h.data() + 12, &type, 4);
    std::memcpy(h.data() + 16, &id, 8);
    std::memcpy(h.data() + 32, &block_bytes, 8);
    std::memcpy(h.data() + 44, &one_run, 4);
    std::memcpy(h.data() + 48, &run_bytes, 8);
    std::memcpy(h.data() + 56, &nonce, 8);
    sockaddr_un addr{};
    socklen_t const addr_len = test::exporter_address(pid, nonce, addr);
    listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(listener >= 0);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0);
    REQUIRE(listen(listener, 1) == 0);
    answering = std::thread{[this, type, stray_fd, block_bytes, run_bytes] {
      int const c = accept(listener, nullptr, nullptr);
      std::uint64_t request = 0;
      (void)recv(c, &request, sizeof request, 0);
      test::wire_header header{};
      header.runs = 1;
      header.type = type;
      header.block_bytes = block_bytes;
      test::wire_batch batch{};
      batch.count = 1;
      batch.bytes[0] = run_bytes;
      if (stray_fd) {
        (void)test::send_with_fd(c, &header, sizeof header, stray.read_end);
      } else {
        (void)send(c, &header, sizeof header, MSG_NOSIGNAL);
      }
      (void)test::send_with_fd(c, &batch, sizeof batch, run.write_end);
      char end = 0;
      (void)recv(c, &end, 1, 0);  // until the opener hangs up
      ::close(c);
    }};
  }
  ~fake_exporter() {
    answering.join();
    ::close(listener);
  }
};

}  // namespace

TEST_CASE("vmm IPC transport: descriptors sent with the answer's header are refused, not taken for the runs'") {
  // The opener kept them first in line: open() imported the header's descriptor for the
  // first run (another allocation, mapped and handed out as this block).
  fake_exporter exporter{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, true};
  vmm_ipc::fetched_export got;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(exporter.h, got), Catch::Contains("file descriptors with its answer's header"));
  CHECK(got.fds.size() == got.bytes.size());
}

TEST_CASE("vmm IPC transport: an answer of a handle type neither fd nor fabric is refused") {
  // open() took every type but fabric for fd: with none sent, it read the first run's
  // descriptor past the end of an empty vector.
  fake_exporter exporter{CU_MEM_HANDLE_TYPE_NONE, false};
  vmm_ipc::fetched_export got;
  CHECK_THROWS_WITH(vmm_ipc::fetch_export(exporter.h, got), Catch::Contains("handle type 0 is neither fd nor fabric"));
}
