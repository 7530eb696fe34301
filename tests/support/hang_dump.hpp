#pragma once
// A watchdog for test programs: with MRSTACK_TEST_HANG_SECONDS=N set, a test still running
// after N seconds writes every thread's call stack to stderr, then goes on (the runner's
// timeout ends it). A GPU host has no debugger, and a hang that comes once in ten runs
// cannot wait for one; the frames are "binary(+offset)" for a stripped binary, which
// `addr2line -f -C -e BINARY OFFSET` resolves against the same build with its symbols.
//
// How: SIGALRM reaches the process; its handler signals every other thread of the process
// (tgkill), and each writes its own stack from its handler. backtrace() is not formally
// async-signal-safe; it is called once up front so its library is loaded before any
// handler runs, which is what makes it safe enough in practice for a last-resort dump.
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace mrstack::test {

inline void write_stack_of_this_thread() noexcept {
  void* frames[64];
  int const n = backtrace(frames, 64);
  char header[64];
  long const tid = syscall(SYS_gettid);
  int len = 0;
  char digits[24];
  long v = tid;
  do {
    digits[len++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && len < 20);
  int h = 0;
  for (char const* s = "\n--- thread "; *s != '\0'; ++s) { header[h++] = *s; }
  while (len > 0) { header[h++] = digits[--len]; }
  header[h++] = '\n';
  (void)!write(STDERR_FILENO, header, static_cast<std::size_t>(h));
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

inline void on_stack_request(int) { write_stack_of_this_thread(); }

inline void on_hang_alarm(int) {
  write_stack_of_this_thread();
  pid_t const self = static_cast<pid_t>(syscall(SYS_gettid));
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (dirent const* e = readdir(tasks)) {
      pid_t const tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (tid > 0 && tid != self) { syscall(SYS_tgkill, getpid(), tid, SIGUSR2); }
    }
    closedir(tasks);
  }
}

/// Arms the watchdog when MRSTACK_TEST_HANG_SECONDS names a positive number of seconds.
inline void arm_hang_dump() {
  char const* v = std::getenv("MRSTACK_TEST_HANG_SECONDS");
  unsigned const seconds = v != nullptr ? static_cast<unsigned>(std::strtoul(v, nullptr, 10)) : 0;
  if (seconds == 0) { return; }
  void* warm[1];
  (void)backtrace(warm, 1);  // loads the unwinder now, not inside a signal handler
  struct sigaction request{};
  request.sa_handler = on_stack_request;
  request.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &request, nullptr);
  struct sigaction alarm_action{};
  alarm_action.sa_handler = on_hang_alarm;
  alarm_action.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &alarm_action, nullptr);
  alarm(seconds);
}

}  // namespace mrstack::test
