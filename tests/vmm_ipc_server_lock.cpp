// vmm IPC's server sends an answer without the registry's lock: an opener that asks and
// then does not read (its socket full, the server waiting up to 2 s a message) does not
// hold up the exporter's exports and unmaps, and a block unmapped while its answer waits
// still reaches the opener as the exporter's own objects — no descriptor closed, reused
// or leaked. Pipes stand in for the driver's shareable handles.
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include "../src/upstream/vmm_ipc_registry.hpp"

#include <vmm_ipc_peer.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// How many answer batches a fresh connection's socket holds before a send waits (the
// kernel's send buffer: its size and accounting vary by host).
std::size_t batches_a_socket_holds() {
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
  test::wire_batch const batch{};
  std::size_t held = 0;
  while (send(pair[0], &batch, sizeof batch, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof batch)) {
    ++held;
  }
  ::close(pair[0]);
  ::close(pair[1]);
  return held;
}

// Receives one batch; returns how many of its descriptors are the file `same`
// (fstat's device and inode), closing each. -1 when the answer ended early.
long receive_batch(int s, struct stat const& same, std::uint32_t& count) {
  test::wire_batch batch{};
  iovec iov{&batch, sizeof batch};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(s, &msg, MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(sizeof batch)) { return -1; }
  count = batch.count;
  long matching = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    std::size_t const n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t k = 0; k < n; ++k) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cm) + k * sizeof fd, sizeof fd);
      struct stat got{};
      matching += fstat(fd, &got) == 0 && got.st_dev == same.st_dev && got.st_ino == same.st_ino;
      ::close(fd);
    }
  }
  return matching;
}

}  // namespace

TEST_CASE("vmm IPC server: an opener that does not read holds up no export or unmap of the exporter") {
  // The server held the registry's lock while it sent: once an opener's socket was full,
  // every export and every unmap of an exported run in this process (a pool's free that
  // gives memory back) waited for the send to time out, 2 s a message.
  std::size_t const runs = (batches_a_socket_holds() + 8) * 64;  // more than the socket holds
  // The registry's descriptors, the answer's duplicates and the ones taking freed numbers.
  rlimit files{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  rlim_t const needed = 3 * runs + 256;
  if (files.rlim_cur < needed && files.rlim_max >= needed) {
    files.rlim_cur = needed;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
  }
  if (files.rlim_cur < needed) {
    WARN("skipped: " << needed << " open files are needed, RLIMIT_NOFILE allows " << files.rlim_max);
    return;
  }
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  struct stat exported_file{};
  REQUIRE(fstat(ends[1], &exported_file) == 0);
  auto* const registry = new vmm_ipc::export_registry{};  // its server thread outlives the test
  auto const dup_of_pipe = test::dup_of(ends[1]);
  // The server started (its listening socket open for good) before the count.
  (void)registry->add_export_with({{0, 2 * MiB, 1}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, dup_of_pipe);
  registry->forget_run(1);
  std::size_t const descriptors_before = test::open_descriptors().size();
  std::vector<virtual_range_resource::mapped_run> block;
  for (std::size_t i = 0; i < runs; ++i) { block.push_back({i * 2 * MiB, 2 * MiB, 1000 + i}); }
  auto const h = registry->add_export_with(block, 0, runs * 2 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           dup_of_pipe);

  int const opener = test::connect_to_exporter(h, 30);
  std::uint64_t export_id = 0;
  std::memcpy(&export_id, h.data() + 16, sizeof export_id);
  REQUIRE(send(opener, &export_id, sizeof export_id, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof export_id));
  pollfd answered{opener, POLLIN, 0};
  REQUIRE(poll(&answered, 1, 20000) == 1);  // the server is answering: the header is here

  // Another block exported, then this one's runs unmapped, while the answer waits.
  auto const started = std::chrono::steady_clock::now();
  (void)registry->add_export_with({{0, 2 * MiB, 99}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                  dup_of_pipe);
  for (auto const& run : block) { registry->forget_run(run.handle); }
  registry->forget_run(99);
  auto const waited = std::chrono::steady_clock::now() - started;
  CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() < 500);

  // The unmapped runs' numbers taken by other files: an answer sending the registry's
  // descriptors by number would now send these, or fail.
  std::vector<int> others;
  for (std::size_t i = 0; i < runs; ++i) { others.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }
  test::wire_header header{};
  REQUIRE(recv(opener, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header));
  CHECK(header.status == 0);
  CHECK(header.runs == runs);
  std::size_t received = 0;
  long exporters = 0;
  while (received < runs) {
    std::uint32_t count = 0;
    long const matching = receive_batch(opener, exported_file, count);
    if (matching < 0 || count == 0) { break; }
    received += count;
    exporters += matching;
  }
  CHECK(received == runs);
  CHECK(exporters == static_cast<long>(runs));  // every descriptor the exporter's pipe
  ::close(opener);
  for (int fd : others) { ::close(fd); }
  // The server's duplicates are closed once it is done with the connection.
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
  while (test::open_descriptors().size() != descriptors_before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  CHECK(test::open_descriptors().size() == descriptors_before);
  ::close(ends[0]);
  ::close(ends[1]);
}
