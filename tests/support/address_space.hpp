#pragma once
// For tests that run a body under an address-space limit (RLIMIT_AS): in a forked child,
// so that the limit and whatever the body leaves behind stay there.
#include <cstddef>
#include <fstream>
#include <string>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace mrstack::test {

/// The calling process's address-space size in bytes (VmSize), or 0 when unknown.
inline std::size_t address_space_in_use() {
  std::ifstream status{"/proc/self/status"};
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) { return std::stoull(line.substr(7)) * 1024; }
  }
  return 0;
}

/// Runs `body` in a forked child and returns the child's exit status: what `body`
/// returned (0 for success, a distinct code for each check that failed), 10 when the limit
/// could not be set, 99 when it threw; -1 when the child did not exit normally (a crash).
/// `extra_bytes` of address space beyond what the child holds when it starts `body` (read
/// then, so a body's setup made before it in the child is counted).
template <typename Setup, typename Body>
int exit_status_under_address_limit(std::size_t extra_bytes, Setup setup, Body body) {
  pid_t const child = ::fork();
  if (child < 0) { return -1; }
  if (child == 0) {
    int code = 99;
    try {
      auto state = setup();
      std::size_t const in_use = address_space_in_use();
      rlimit const limit{in_use + extra_bytes, in_use + extra_bytes};
      if (in_use == 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) { ::_exit(10); }
      code = body(state);
    } catch (...) {
      code = 99;
    }
    ::_exit(code);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) { return -1; }
  return WEXITSTATUS(status);
}

}  // namespace mrstack::test
