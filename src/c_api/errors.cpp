// The per-thread last error, and the barrier that turns every C++ exception into a status.
#include "c_api_internal.hpp"

#include <mrstack/emm/adapter.hpp>
#include <mrstack/error.hpp>
#include <mrstack/spec.hpp>

#include <exception>
#include <new>
#include <stdexcept>

namespace mrstack::c_api {

namespace {
struct last_error {
  std::string message;
  std::size_t column = 0;
  int status = MRSTACK_SUCCESS;
};
thread_local last_error tls_last_error;
}  // namespace

void set_last_error(std::string_view message, std::size_t column, int status) noexcept {
  tls_last_error.status = status;
  try {
    tls_last_error.message.assign(message);
  } catch (...) {
    tls_last_error.message.clear();  // out of memory while reporting: keep what can be kept
  }
  tls_last_error.column = column;
}

mrstack_status status_from_current_exception() noexcept {
  try {
    throw;
  } catch (spec_error const& e) {
    set_last_error(e.what(), e.column(), MRSTACK_ERROR_SPEC);
    return MRSTACK_ERROR_SPEC;
  } catch (out_of_memory const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_OUT_OF_MEMORY);
    return MRSTACK_ERROR_OUT_OF_MEMORY;
  } catch (books_out_of_host_memory const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_OUT_OF_MEMORY);
    return MRSTACK_ERROR_OUT_OF_MEMORY;
  } catch (std::bad_alloc const& e) {
    try {
      set_last_error(std::string{"out of host memory: "} + e.what(), 0, MRSTACK_ERROR_OUT_OF_MEMORY);
    } catch (...) {  // none for the message either: the words that need no copy
      set_last_error("out of host memory", 0, MRSTACK_ERROR_OUT_OF_MEMORY);
    }
    return MRSTACK_ERROR_OUT_OF_MEMORY;
  } catch (cuda_error const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_CUDA);
    return MRSTACK_ERROR_CUDA;
  } catch (emm::driver_error const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_CUDA);
    return MRSTACK_ERROR_CUDA;
  } catch (std::invalid_argument const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_INVALID_ARGUMENT);
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  } catch (std::logic_error const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_LOGIC);
    return MRSTACK_ERROR_LOGIC;
  } catch (std::exception const& e) {
    set_last_error(e.what(), 0, MRSTACK_ERROR_UNKNOWN);
    return MRSTACK_ERROR_UNKNOWN;
  } catch (...) {
    set_last_error("an exception that is not a std::exception", 0, MRSTACK_ERROR_UNKNOWN);
    return MRSTACK_ERROR_UNKNOWN;
  }
}

}  // namespace mrstack::c_api

extern "C" {

int mrstack_c_api_version(void) { return MRSTACK_C_API_VERSION; }

const char* mrstack_last_error(void) { return mrstack::c_api::tls_last_error.message.c_str(); }

size_t mrstack_last_error_column(void) { return mrstack::c_api::tls_last_error.column; }

int mrstack_last_error_status(void) { return mrstack::c_api::tls_last_error.status; }

const char* mrstack_status_name(int status) {
  switch (status) {
    case MRSTACK_SUCCESS: return "MRSTACK_SUCCESS";
    case MRSTACK_ERROR_INVALID_ARGUMENT: return "MRSTACK_ERROR_INVALID_ARGUMENT";
    case MRSTACK_ERROR_SPEC: return "MRSTACK_ERROR_SPEC";
    case MRSTACK_ERROR_OUT_OF_MEMORY: return "MRSTACK_ERROR_OUT_OF_MEMORY";
    case MRSTACK_ERROR_CUDA: return "MRSTACK_ERROR_CUDA";
    case MRSTACK_ERROR_LOGIC: return "MRSTACK_ERROR_LOGIC";
    case MRSTACK_ERROR_STATE: return "MRSTACK_ERROR_STATE";
    case MRSTACK_ERROR_UNKNOWN: return "MRSTACK_ERROR_UNKNOWN";
    default: return "unknown status";
  }
}

const char* mrstack_client_name(int client) {
  switch (client) {
    case MRSTACK_CLIENT_OTHER: return "other";
    case MRSTACK_CLIENT_NUMBA: return "numba";
    case MRSTACK_CLIENT_CUPY: return "cupy";
    case MRSTACK_CLIENT_TORCH: return "torch";
    default: return nullptr;
  }
}

}  // extern "C"
