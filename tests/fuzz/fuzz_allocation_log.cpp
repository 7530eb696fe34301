// libFuzzer target: the allocation-log reader. Any byte string is a log: plain text and
// binary logs (by their magic bytes) go to parse_allocation_log; a gzip stream (by its magic bytes) goes through a memfd to
// read_allocation_log, which detects and inflates it. Every input must either parse into
// a log whose invariants hold or be refused with a log_error; anything else (a crash, a
// sanitizer report, another exception) is a finding.
#include <mrstack/log/allocation_log.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

namespace {

void check(bool ok, char const* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_allocation_log: invariant broken: %s\n", what);
    std::abort();
  }
}

void check_invariants(mrstack::allocation_log const& log) {
  check(log.event_lines.size() == log.events.size(), "one line per event");
  check(log.event_threads.size() == log.events.size(), "one thread per event");
  check(log.allocation_events.size() == log.allocation_count, "one allocate event per allocation");
  check(log.allocation_count <= log.events.size(), "allocations <= events");
  std::size_t per_thread = 0;
  for (auto const& events : log.events_by_thread) { per_thread += events.size(); }
  check(per_thread == log.events.size(), "every event in one thread's list");
  check(log.thread_names.size() == log.events_by_thread.size(), "a name per thread");
  std::size_t live = 0;
  std::size_t peak = 0;
  for (auto const& e : log.events) {
    check(e.allocation < log.allocation_count, "allocation index in range");
    check(e.stream < log.streams.size(), "stream index in range");
    if (e.action == mrstack::log_action::allocate) {
      live += e.bytes;
      peak = live > peak ? live : peak;
    } else {
      live -= e.bytes;
    }
  }
  check(live == log.leaked_bytes, "what is live at the end is what leaked");
  check(peak == log.peak_live_bytes, "peak live bytes");
}

mrstack::allocation_log read_gzip(std::string_view bytes) {
  int const fd = memfd_create("fuzz_log", 0);
  if (fd < 0) { std::abort(); }
  for (std::size_t written = 0; written < bytes.size();) {
    ssize_t const n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) { std::abort(); }
    written += static_cast<std::size_t>(n);
  }
  struct closer {
    int fd;
    ~closer() { close(fd); }
  } const guard{fd};
  return mrstack::read_allocation_log("/proc/self/fd/" + std::to_string(fd));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const bytes{reinterpret_cast<char const*>(data), size};
  bool const gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  try {
    auto const log = gzip ? read_gzip(bytes) : mrstack::parse_allocation_log(bytes, "fuzz");
    check_invariants(log);
  } catch (mrstack::log_error const& e) {
    check(std::string_view{e.what()}.size() < 64 * 1024, "an error message of bounded size");
  }
  return 0;
}
