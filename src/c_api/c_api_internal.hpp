#pragma once
// Internal to libmrstack_c: the stack object behind the opaque handle, per-client books,
// the per-thread last error and the exception-to-status barrier every entry point uses.
#include <mrstack/c_api.h>
#include <mrstack/emm/adapter.hpp>
#include <mrstack/resource.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

struct mrstack_stack {
  mrstack_stack(mrstack::resource_ptr stack, int device, bool process_wide);

  // Books of one client. Relaxed atomics: each counter is exact; a reader sees each
  // counter at some recent moment (statistics are not a snapshot across counters).
  struct client_books {
    std::atomic<std::uint64_t> live_bytes{0};
    std::atomic<std::uint64_t> peak_bytes{0};
    std::atomic<std::uint64_t> live_count{0};
    std::atomic<std::uint64_t> allocations{0};
  };

  void count_allocation(int client, std::uint64_t bytes) noexcept;
  void count_free(int client, std::uint64_t bytes) noexcept;

  mrstack::resource_ptr top;
  mrstack::emm::adapter emm;
  int device;
  bool process_wide;  // a device stack: lives until the process exits, never destroyed
  std::array<client_books, MRSTACK_CLIENT_COUNT> clients;
  std::atomic<std::uint64_t> live_bytes{0};
  std::atomic<std::uint64_t> peak_bytes{0};
};

namespace mrstack::c_api {

/// Records `message` (a spec column, 0 for none, and the status the failing call returns)
/// as this thread's last error.
void set_last_error(std::string message, std::size_t column = 0,
                    int status = MRSTACK_ERROR_INVALID_ARGUMENT) noexcept;

/// Turns the exception being handled into a status and this thread's last error. Call
/// only inside a catch block.
mrstack_status status_from_current_exception() noexcept;

/// Runs `body` (which returns nothing) and reports any exception as a status.
template <class Body>
mrstack_status guarded(Body&& body) noexcept {
  try {
    body();
    return MRSTACK_SUCCESS;
  } catch (...) {
    return status_from_current_exception();
  }
}

inline bool valid_client(int client) noexcept { return client >= 0 && client < MRSTACK_CLIENT_COUNT; }

/// The built stack of `device`, or nullptr (no lookup beyond one atomic load).
mrstack_stack* built_device_stack(int device) noexcept;
/// The stack of `device`, built from the configured spec on first use. Throws.
mrstack_stack& device_stack(int device);

}  // namespace mrstack::c_api
