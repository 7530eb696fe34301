// vmm IPC's exporting side when the heap or the descriptor table runs out: a run's
// shareable descriptor, once made, is either the registry's (closed when its run is
// unmapped) or closed at once — never left open for the process's life — and the server's
// answer is either sent whole or refused with a reason, its duplicates closed either way.
#include <catch2/catch.hpp>

#include <mrstack/upstream/vmm_ipc.hpp>

#include "../src/upstream/vmm_ipc_registry.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <host_allocation_failure.hpp>
#include <vmm_ipc_peer.hpp>

using namespace mrstack;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// One registry for the whole test program (its server's socket is named by the process).
vmm_ipc::export_registry& test_registry() {
  static auto* const instance = new vmm_ipc::export_registry{};  // its server thread outlives the tests
  return *instance;
}

// The open descriptors once they are `expected`, or after 10 s: the server thread
// closes its answer's duplicates after the last send, which the opener may outrun (by
// far more than a second on a loaded machine that leaves the server thread waiting).
std::vector<int> settled_descriptors(std::vector<int> const& expected) {
  std::vector<int> now = test::open_descriptors();
  for (int wait = 0; wait < 1000 && now != expected; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = test::open_descriptors();
  }
  return now;
}

// What thread `tid` of this process is doing, from /proc: its state letter (R, S, ...)
// and, while it is in a system call, that call's number (-1 otherwise). False once the
// thread is gone, or where /proc does not say.
bool thread_in_syscall(long tid, char& state, long& call) {
  std::string const task = "/proc/self/task/" + std::to_string(tid);
  std::ifstream stat{task + "/stat"};
  std::string line;
  if (!std::getline(stat, line) || line.rfind(')') == std::string::npos || line.rfind(')') + 2 >= line.size()) {
    return false;
  }
  state = line[line.rfind(')') + 2];
  std::ifstream syscall_file{task + "/syscall"};
  std::string first;
  if (!(syscall_file >> first)) { return false; }
  call = first == "running" ? -1 : std::atol(first.c_str());
  return true;
}

// The id of this process's thread that waits in accept4 (the registry's server: the only
// caller), once one does, or 0 after 10 s or where /proc does not say. A waiting accept4
// holds the number it will accept into (Linux takes it before blocking): from then on the
// server takes its next opener whatever the descriptor limit. After an answer the server
// closes the connection and only then waits again, which the opener may outrun.
long server_waiting_in_accept() {
  for (int wait = 0; wait < 1000; ++wait) {
    if (DIR* dir = opendir("/proc/self/task")) {
      long found = 0;
      while (dirent const* entry = readdir(dir)) {
        char state = 0;
        long call = -1;
        long const tid = std::atol(entry->d_name);
        if (tid > 0 && thread_in_syscall(tid, state, call) && state == 'S' && call == SYS_accept4) { found = tid; }
      }
      closedir(dir);
      if (found != 0) { return found; }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// What an opener receives from the server (the wire of src/upstream/vmm_ipc_wire.hpp).
struct served {
  bool answered = false;
  std::uint32_t status = 0;
  std::string message;
  std::size_t descriptors = 0;  // received with the batches (each closed at once)
};

// Serves one request for export `h` on this thread (where the host allocation settings
// apply), `fail_in` its host allocation to fail (-1: none); `used_failure` says whether
// that allocation came.
served ask(vmm_ipc::handle const& h, long fail_in, bool& used_failure) {
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
  REQUIRE(send(pair[0], h.data() + 16, 8, MSG_NOSIGNAL) == 8);  // the request: the export id
  test::fail_host_allocation_in = fail_in;
  test_registry().serve(pair[1]);
  used_failure = fail_in >= 0 && test::fail_host_allocation_in < 0;
  test::fail_host_allocation_in = -1;
  ::close(pair[1]);
  served out;
  test::wire_header header{};
  out.answered = recv(pair[0], &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  out.status = header.status;
  header.message[sizeof header.message - 1] = '\0';
  out.message = header.message;
  for (;;) {  // the batches, until the server hung up
    char batch[8 + 64 * 8 + 64 * 64];
    iovec iov{batch, sizeof batch};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (recvmsg(pair[0], &msg, MSG_CMSG_CLOEXEC) <= 0) { break; }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      std::size_t const n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t k = 0; k < n; ++k) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(cm) + k * sizeof fd, sizeof fd);
        ::close(fd);
        ++out.descriptors;
      }
    }
  }
  ::close(pair[0]);
  return out;
}

}  // namespace

TEST_CASE("vmm IPC export: out of host memory, a run's shareable descriptor is closed, not leaked") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto* const registry = &test_registry();
  int made = -1;
  auto const exporter = [&](void* out, std::uint64_t) {
    made = fcntl(ends[1], F_DUPFD_CLOEXEC, 0);
    *static_cast<int*>(out) = made;
  };
  // The server started (its socket and thread), so what follows allocates only the books.
  (void)registry->add_export_with({{0, MiB, 1}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, exporter);
  bool ran_through = false;
  for (long n = 0; n < 64 && !ran_through; ++n) {
    INFO("host allocation " << n << " fails");
    std::uint64_t const run = 100 + static_cast<std::uint64_t>(n);
    std::vector<virtual_range_resource::mapped_run> const runs{{0, MiB, run}};
    made = -1;
    bool threw = false;
    test::fail_host_allocation_in = n;
    try {
      (void)registry->add_export_with(runs, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, exporter);
    } catch (std::bad_alloc const&) {
      threw = true;
    }
    bool const failure_used = test::fail_host_allocation_in < 0;
    test::fail_host_allocation_in = -1;
    ran_through = !threw && !failure_used;
    if (made < 0) { continue; }  // failed before the descriptor was made
    // The registry's, if it kept the run: unmapping the run closes it.
    registry->forget_run(run);
    CHECK(fcntl(made, F_GETFD) == -1);
  }
  CHECK(ran_through);
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC server: out of host memory, an answer is refused with a reason, no descriptor left open") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto const h = test_registry().add_export_with(
      {{0, MiB, 201}, {MiB, MiB, 202}, {2 * MiB, MiB, 203}}, 0, 3 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      test::dup_of(ends[1]));
  std::size_t const descriptors = test::open_descriptors().size();
  bool ran_through = false;
  for (long n = 0; n < 64 && !ran_through; ++n) {
    INFO("host allocation " << n << " fails");
    bool failed = false;
    served const got = ask(h, n, failed);
    ran_through = !failed;
    if (got.answered && got.status == 0) {
      CHECK(got.descriptors == 3);
    } else if (got.answered) {
      CHECK(got.message.find("out of host memory") != std::string::npos);
      CHECK(got.descriptors == 0);
    }
    CHECK(test::open_descriptors().size() == descriptors);  // the answer's duplicates closed
  }
  CHECK(ran_through);
  for (std::uint64_t run : {201, 202, 203}) { test_registry().forget_run(run); }
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC server: a descriptor it cannot duplicate refuses the answer and closes the ones made") {
  // The answer is sent without the registry's lock, so it carries duplicates: with the
  // process's descriptor table full but for `spare` numbers once the request's socket pair
  // is made, the duplicate of run `spare` is the first that cannot be made. But the server
  // thread's accept4 takes a number while it waits (Linux reserves it before blocking),
  // unseen in /proc/self/fd and only once that thread first runs, which on a loaded machine
  // may be now: so the spare count that refuses the second run (one duplicate made, then
  // closed) is searched for, every count tried, rather than assumed.
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto const h = test_registry().add_export_with(
      {{0, MiB, 301}, {MiB, MiB, 302}}, 0, 2 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      test::dup_of(ends[1]));
  std::vector<int> const before = test::open_descriptors();
  rlimit const saved = [] {
    rlimit r{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &r) == 0);
    return r;
  }();
  rlimit lowered = saved;  // a small table: filling it takes a few descriptors, not thousands
  lowered.rlim_cur = static_cast<rlim_t>(*std::max_element(before.begin(), before.end())) + 8;
  bool second_refused = false;
  for (int spare = 0; spare <= 4; ++spare) {
    std::vector<int> fillers;
    fillers.reserve(64);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lowered) == 0);
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) { fillers.push_back(fd); }
    for (int k = 0; k < spare + 2 && !fillers.empty(); ++k) {  // the request's socket pair takes two
      ::close(fillers.back());
      fillers.pop_back();
    }
    bool failed = false;
    served const got = ask(h, -1, failed);
    for (int fd : fillers) { ::close(fd); }
    REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
    INFO("spare descriptors: " << spare << "; answer: " << got.status << " \"" << got.message << "\"");
    CHECK(got.answered);
    if (got.status == 0) {  // room for both duplicates
      CHECK(got.descriptors == 2);
      continue;
    }
    CHECK(got.message.find("cannot duplicate the descriptor of physical allocation ") != std::string::npos);
    CHECK(got.descriptors == 0);
    CHECK(settled_descriptors(before) == before);  // a duplicate made before the refusal closed
    second_refused = second_refused || got.message.find("physical allocation 1 of 2") != std::string::npos;
  }
  CHECK(second_refused);
  for (std::uint64_t run : {301, 302}) { test_registry().forget_run(run); }
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC opener: out of host memory for the descriptors received, it closes them, not leaks them") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  // Before, receive() appended a batch's descriptors to the opener's list, and when that
  // growth failed the descriptors the message carried stayed open for the process's life.
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  std::vector<virtual_range_resource::mapped_run> runs;
  for (std::uint64_t i = 0; i < 100; ++i) { runs.push_back({i * MiB, MiB, 500 + i}); }  // two batches
  auto const h = test_registry().add_export_with(
      runs, 0, 100 * MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      test::dup_of(ends[1]));
  std::vector<int> const before = test::open_descriptors();
  bool ran_through = false;
  for (long n = 0; n < 256 && !ran_through; ++n) {
    INFO("host allocation " << n << " of the opener fails");
    bool out_of_memory = false;
    {
      vmm_ipc::fetched_export got;
      test::fail_host_allocation_in = n;
      try {
        vmm_ipc::fetch_export(h, got);
      } catch (std::bad_alloc const&) {
        out_of_memory = true;
      }
      test::fail_host_allocation_in = -1;
      if (!out_of_memory) { CHECK(got.fds.size() == 100); }
    }  // got closes what it holds
    ran_through = !out_of_memory;
    CHECK(settled_descriptors(before) == before);
  }
  CHECK(ran_through);
  for (auto const& run : runs) { test_registry().forget_run(run.handle); }
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC server: a cut-short request that carries descriptors has them closed") {
  // A request carries no descriptor; the server closed what one carried only when the
  // request was whole, so a peer could leave descriptors open in the exporter.
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
  std::vector<int> const before = test::open_descriptors();
  char const four[4] = {};
  REQUIRE(test::send_with_fd(pair[0], four, sizeof four, ends[0]));
  test_registry().serve(pair[1]);  // a request of 4 bytes, not 8: no answer
  CHECK(test::open_descriptors() == before);
  ::close(pair[0]);
  ::close(pair[1]);
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC server: a peer that stays silent past the timeout has no descriptor of this process closed") {
  // recvmsg that fails (the peer's timeout, a reset) leaves the message's control buffer as
  // it was: uninitialized stack, where an earlier request's descriptors left their numbers.
  // Read as received descriptors, they were closed again — numbers the process had reused.
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto const h = test_registry().add_export_with(
      {{0, MiB, 601}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      test::dup_of(ends[1]));
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    int pair[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    // A peer's request that carries three descriptors (the server closes them) ...
    alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
    int const carried[3] = {ends[0], ends[0], ends[0]};
    iovec iov{const_cast<unsigned char*>(h.data() + 16), 8};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof carried);
    std::memcpy(CMSG_DATA(cm), carried, sizeof carried);
    REQUIRE(sendmsg(pair[0], &msg, MSG_NOSIGNAL) == 8);
    std::vector<int> const before = test::open_descriptors();
    test_registry().serve(pair[1]);
    CHECK(test::open_descriptors() == before);
    ::close(pair[0]);
    ::close(pair[1]);
    // ... then a silent one's connection, and descriptors in the numbers those had.
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    std::vector<int> reused;
    for (int k = 0; k < 8; ++k) { reused.push_back(fcntl(ends[0], F_DUPFD_CLOEXEC, 0)); }
    timeval const brief{0, 20000};
    REQUIRE(setsockopt(pair[1], SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof brief) == 0);
    test_registry().serve(pair[1]);  // no request comes: recvmsg times out
    for (int fd : reused) {
      CHECK(fcntl(fd, F_GETFD) != -1);
      ::close(fd);
    }
    ::close(pair[0]);
    ::close(pair[1]);
  }
  test_registry().forget_run(601);
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("vmm IPC server: no descriptor free when it accepts the next opener does not stop it") {
  // accept4 failing with EMFILE (this process out of descriptors for a moment) ended the
  // server thread: every later opener waited out its timeout and was told the exporter did
  // not answer, for the rest of the process's life.
  int ends[2];
  REQUIRE(pipe2(ends, O_CLOEXEC) == 0);
  auto const h = test_registry().add_export_with(  // the server runs from the first export on
      {{0, MiB, 701}}, 0, MiB, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      test::dup_of(ends[1]));
  sockaddr_un addr{};
  socklen_t const addr_len = test::exporter_address(h, addr);
  // Asks for export 0, which no handle names (refused in the header alone): whether the
  // refusal came within 5 s. `connected` runs before the request is sent, `answered` after
  // the answer came.
  auto const refused = [&](auto connected, auto answered) {
    int const s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(s >= 0);
    timeval const patience{5, 0};
    REQUIRE(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience) == 0);
    REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0);
    connected();
    std::uint64_t const none = 0;
    REQUIRE(send(s, &none, sizeof none, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof none));
    test::wire_header header{};
    bool const got = recv(s, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
    answered();
    ::close(s);
    header.message[sizeof header.message - 1] = '\0';
    return got && std::string{header.message}.find("there is no export 0") != std::string::npos;
  };
  rlimit const saved = [] {
    rlimit r{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &r) == 0);
    return r;
  }();
  // No number free when the server, having answered, waits for the next opener. The limit
  // is lowered only once the server waits in accept4, its number for this opener taken:
  // a server thread not started yet, or still closing an earlier connection (both take
  // long on a loaded machine), found no number for this opener either, and the opener
  // timed out while the limit it would restore after the answer stayed at 0.
  long const server = server_waiting_in_accept();
  if (server == 0) {
    WARN("skipped: /proc/self/task does not show the server thread waiting in accept4");
    test_registry().forget_run(701);
    ::close(ends[0]);
    ::close(ends[1]);
    return;
  }
  rlimit none = saved;
  none.rlim_cur = 0;
  CHECK(refused([&] { REQUIRE(setrlimit(RLIMIT_NOFILE, &none) == 0); },
                [&] {
                  // The limit stays at 0 until the server's accept4 failed: then it sleeps
                  // before trying again, or (the old server) it has returned. A fixed
                  // 200 ms missed that on a loaded machine and checked nothing.
                  char state = 0;
                  long call = -1;
                  for (int wait = 0; wait < 1000; ++wait) {
                    if (!thread_in_syscall(server, state, call) ||
                        (state == 'S' && (call == SYS_clock_nanosleep || call == SYS_nanosleep))) {
                      break;
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                  }
                  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
                }));
  CHECK(refused([] {}, [] {}));  // the server still answers
  // Back in accept4, the last connection closed: a later test's count of the open
  // descriptors does not see it close.
  CHECK(server_waiting_in_accept() == server);
  test_registry().forget_run(701);
  ::close(ends[0]);
  ::close(ends[1]);
}
