// The C ABI's books and handles where misuse meets them: a stack destroyed while an EMM
// cleanup guard is open, an EMM reset whose stack refuses one free, and handles that were
// never made in this process (another process's, a forged generation).
#include <catch2/catch.hpp>

#include <mrstack/c_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

std::string last_error() { return mrstack_last_error(); }

mrstack_stack* make(char const* spec) {
  mrstack_stack* s = nullptr;
  REQUIRE(mrstack_stack_create(spec, 0, &s) == MRSTACK_SUCCESS);
  return s;
}

mrstack_statistics stats(mrstack_stack* s) {
  mrstack_statistics out{};
  REQUIRE(mrstack_get_statistics(s, &out) == MRSTACK_SUCCESS);
  return out;
}

/// What the process writes on stderr while `run` runs.
template <class F>
std::string stderr_of(F&& run) {
  std::fflush(stderr);
  char path[] = "/tmp/mrstack_c_api_stderr_XXXXXX";
  int const file = ::mkstemp(path);
  REQUIRE(file >= 0);
  int const saved = ::dup(2);
  ::dup2(file, 2);
  run();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  ::lseek(file, 0, SEEK_SET);
  char buffer[512];
  for (ssize_t n = 0; (n = ::read(file, buffer, sizeof buffer)) > 0;) { text.append(buffer, static_cast<std::size_t>(n)); }
  ::close(file);
  ::unlink(path);
  return text;
}

}  // namespace

TEST_CASE("c api: a stack destroyed inside an open EMM cleanup guard frees each block once") {
  mrstack_stack* s = make("tracking > simulated");
  mrstack_memory_pointer m{};
  REQUIRE(mrstack_emm_memalloc(s, 4096, MRSTACK_CLIENT_NUMBA, &m) == MRSTACK_SUCCESS);
  void* plain = nullptr;
  REQUIRE(mrstack_allocate(s, 512, nullptr, MRSTACK_CLIENT_OTHER, &plain) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_defer_begin(s) == MRSTACK_SUCCESS);  // never ended: the stack goes first
  int status = 0;
  // Before: the reset queued the EMM block behind the guard, the tracking sweep freed it,
  // and the adapter's destructor freed it again (tracking refused it, on stderr).
  std::string const said = stderr_of([&] { status = mrstack_stack_destroy(s); });
  CHECK(said.find("failed") == std::string::npos);
  CHECK(status == MRSTACK_ERROR_LOGIC);  // the plain block was left live: the caller hears of it
  CHECK_THAT(last_error(), Catch::Contains("1 allocation (512 bytes)"));
}

TEST_CASE("c api: an EMM block freed as a plain allocation is refused; a reset then frees both blocks") {
  // Before mrstack_deallocate checked frees against its own blocks, this free went through:
  // the reset's free of A was then refused by the pool. Now A stays the adapter's.
  mrstack_stack* s = make("pool > simulated");
  mrstack_memory_pointer a{};
  mrstack_memory_pointer b{};
  REQUIRE(mrstack_emm_memalloc(s, 4096, MRSTACK_CLIENT_NUMBA, &a) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_memalloc(s, 8192, MRSTACK_CLIENT_NUMBA, &b) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, reinterpret_cast<void*>(a.ptr), 4096, nullptr, MRSTACK_CLIENT_NUMBA) ==
        MRSTACK_ERROR_LOGIC);
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(a.ptr));
  CHECK_THAT(last_error(), Catch::Contains(hex) && Catch::Contains("is not a live allocation of this stack"));
  CHECK(stats(s).clients[MRSTACK_CLIENT_NUMBA].live_bytes == 4096 + 8192);
  size_t released = 99;
  CHECK(mrstack_emm_reset(s, &released) == MRSTACK_SUCCESS);
  CHECK(released == 2);
  auto const after = stats(s);
  CHECK(after.emm_outstanding == 0);
  CHECK(after.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 0);
  CHECK(after.clients[MRSTACK_CLIENT_NUMBA].live_count == 0);
  CHECK(after.live_bytes == 0);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: an EMM reset whose stack refuses one free closes the books of the others") {
  // The stack keeps the refused block, so its books stay open; the others' close.
  mrstack_stack* s = make("pool > simulated");
  mrstack_memory_pointer a{};
  mrstack_memory_pointer b{};
  REQUIRE(mrstack_emm_memalloc(s, 4096, MRSTACK_CLIENT_NUMBA, &a) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_memalloc(s, 8192, MRSTACK_CLIENT_NUMBA, &b) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_refuse_next_frees_for_tests(s, 1) == MRSTACK_SUCCESS);
  size_t released = 99;
  CHECK(mrstack_emm_reset(s, &released) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("bytes) was refused as refuse_next_frees_for_tests asked"));
  CHECK(released == 1);  // one went back, one was refused
  auto const after = stats(s);
  CHECK(after.emm_outstanding == 0);  // both left the table: stale finalizers are no-ops
  std::uint64_t const kept = after.clients[MRSTACK_CLIENT_NUMBA].live_bytes;
  CHECK((kept == 4096 || kept == 8192));
  CHECK(after.clients[MRSTACK_CLIENT_NUMBA].live_count == 1);
  CHECK(after.live_bytes == kept);
  CHECK(mrstack_emm_free(s, a.token) == 0);
  CHECK(mrstack_emm_free(s, b.token) == 0);
  CHECK(mrstack_stack_destroy(s) != MRSTACK_SUCCESS);  // the refused block is still the stack's
  CHECK_THAT(last_error(), Catch::Contains("1 allocation (" + std::to_string(kept) + " bytes)"));
}

// Run by the test below in a fresh process (not a fork, which shares this process's table).
TEST_CASE("c api child: make three stacks and write their handles", "[.]") {
  char const* path = std::getenv("MRSTACK_TEST_HANDLES_FILE");
  REQUIRE(path != nullptr);
  std::FILE* out = std::fopen(path, "w");
  REQUIRE(out != nullptr);
  for (int i = 0; i < 3; ++i) {
    mrstack_stack* s = make("system");
    std::fprintf(out, "%llu\n", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(s)));
  }
  std::fclose(out);
}

TEST_CASE("c api: a handle made by another process, or never made, is not a handle here") {
  char path[] = "/tmp/mrstack_c_api_handles_XXXXXX";
  int const file = ::mkstemp(path);
  REQUIRE(file >= 0);
  ::close(file);
  std::string const env = std::string{"MRSTACK_TEST_HANDLES_FILE="} + path;
  char name[] = "c api child: make three stacks and write their handles";
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, name, nullptr};
  char* envp[] = {const_cast<char*>(env.c_str()), nullptr};
  pid_t child = 0;
  REQUIRE(::posix_spawn(&child, exe, nullptr, nullptr, argv, envp) == 0);
  int child_status = 0;
  REQUIRE(::waitpid(child, &child_status, 0) == child);
  REQUIRE(WIFEXITED(child_status));
  REQUIRE(WEXITSTATUS(child_status) == 0);
  std::uint64_t theirs[3] = {};
  std::FILE* in = std::fopen(path, "r");
  REQUIRE(in != nullptr);
  for (auto& h : theirs) {
    unsigned long long v = 0;
    REQUIRE(std::fscanf(in, "%llu", &v) == 1);
    h = v;
  }
  std::fclose(in);
  ::unlink(path);
  mrstack_stack* mine = make("system");
  for (std::uint64_t const h : theirs) {
    auto* foreign = reinterpret_cast<mrstack_stack*>(static_cast<std::uintptr_t>(h));
    char text[64];
    size_t length = 0;
    CHECK(mrstack_stack_describe(foreign, text, sizeof text, &length) == MRSTACK_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("is not a stack handle"));
    // Before: generations started at 0 in every process, so the child's first handle was
    // this process's stack of the same slot, and destroying it destroyed ours.
    CHECK(mrstack_stack_destroy(foreign) == MRSTACK_ERROR_INVALID_ARGUMENT);
  }
  char text[64];
  size_t length = 0;
  CHECK(mrstack_stack_describe(mine, text, sizeof text, &length) == MRSTACK_SUCCESS);
  // A later generation of a live slot was never made: not a handle. After the destroy,
  // the handle itself was: destroyed.
  auto const bits = reinterpret_cast<std::uintptr_t>(mine);
  std::uintptr_t const generations = (std::uintptr_t{1} << 28) - 1;  // bits 47..20
  std::uintptr_t const next = (((bits >> 20) & generations) + 1) & generations;
  auto* later = reinterpret_cast<mrstack_stack*>((bits & ~(generations << 20)) | next << 20);
  CHECK(mrstack_stack_describe(later, text, sizeof text, &length) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("is not a stack handle"));
  CHECK(mrstack_stack_destroy(mine) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_describe(mine, text, sizeof text, &length) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("was destroyed"));
}
