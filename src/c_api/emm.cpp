// Numba's EMM plugin interface through the C ABI: each stack carries an emm::adapter; the
// client tag of an EMM allocation rides in the adapter's slot so its free closes the right
// books.
#include "c_api_internal.hpp"
#include "../device_scope.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

using mrstack::c_api::guarded;
using mrstack::c_api::resolve_stack;
using mrstack::c_api::set_last_error;
using mrstack::c_api::valid_client;

namespace {

std::uint64_t as_u64(void const* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

}  // namespace

extern "C" {

int mrstack_emm_interface_version(void) { return mrstack::emm::adapter::interface_version(); }

mrstack_status mrstack_emm_initialize(mrstack_stack* handle) {
  auto const stack = resolve_stack(handle, "mrstack_emm_initialize");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  stack->emm.initialize();
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_emm_memalloc(mrstack_stack* handle, size_t bytes, int client, mrstack_memory_pointer* out) {
  auto const stack = resolve_stack(handle, "mrstack_emm_memalloc");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (out == nullptr) {
    set_last_error("mrstack_emm_memalloc: the out-pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  if (!valid_client(client)) {
    set_last_error("mrstack_emm_memalloc: unknown client " + std::to_string(client));
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  return guarded([&] {
    auto const m = stack->emm.memalloc(bytes, static_cast<std::uint32_t>(client));  // counts it (emm_options)
    *out = mrstack_memory_pointer{as_u64(m.ptr), m.size, m.token, m.device, client};
  });
}

uint64_t mrstack_emm_memalloc_token(mrstack_stack* handle, size_t bytes, int client, uint64_t* ptr) {
  // The hot path for Python: one call, two results, no struct for the caller to build.
  if (ptr == nullptr) {
    set_last_error("mrstack_emm_memalloc_token: the out-pointer is null");
    return 0;
  }
  if (!valid_client(client)) {
    set_last_error("mrstack_emm_memalloc_token: unknown client " + std::to_string(client));
    return 0;
  }
  auto const stack = resolve_stack(handle, "mrstack_emm_memalloc_token");
  if (!stack) { return 0; }
  try {
    auto const m = stack->emm.memalloc(bytes, static_cast<std::uint32_t>(client));  // counts it (emm_options)
    *ptr = as_u64(m.ptr);
    return m.token;
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    return 0;
  }
}

mrstack_emm_allocation mrstack_emm_memalloc_pair(mrstack_stack* handle, size_t bytes, int client) {
  std::uint64_t ptr = 0;
  std::uint64_t const token = mrstack_emm_memalloc_token(handle, bytes, client, &ptr);
  return mrstack_emm_allocation{ptr, token};
}

int mrstack_emm_free(mrstack_stack* handle, uint64_t token) {
  auto const stack = resolve_stack(handle, "mrstack_emm_free");
  if (!stack) { return -1; }
  try {
    auto const freed = stack->emm.free(token);
    if (!freed) {
      if (stack->emm.issued(token)) { return 0; }  // freed before, or made stale by a reset: a no-op
      // Another stack's token, or one never handed out: the caller frees into the wrong stack.
      char hex[24];
      std::snprintf(hex, sizeof hex, "0x%" PRIx64, token);
      set_last_error(std::string{"mrstack_emm_free: token "} + hex +
                         " was never issued by this stack (a token of another stack, or no token); nothing was freed",
                     0, MRSTACK_ERROR_LOGIC);
      return -1;
    }
    stack->count_free(static_cast<int>(freed->tag), freed->size);
    return 1;
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    return -1;
  }
}

mrstack_status mrstack_emm_get_memory_info(mrstack_stack* handle, size_t* free_bytes, size_t* total_bytes) {
  auto const stack = resolve_stack(handle, "mrstack_emm_get_memory_info");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] {
    auto const info = stack->emm.get_memory_info();
    if (free_bytes != nullptr) { *free_bytes = info.free; }
    if (total_bytes != nullptr) { *total_bytes = info.total; }
  });
}

mrstack_status mrstack_emm_get_ipc_handle(mrstack_stack* handle, const void* ptr, mrstack_ipc_handle* out) {
  auto const stack = resolve_stack(handle, "mrstack_emm_get_ipc_handle");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (out == nullptr) {
    set_last_error("mrstack_emm_get_ipc_handle: the out-pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  static_assert(sizeof(cudaIpcMemHandle_t) == MRSTACK_IPC_HANDLE_BYTES);
  return guarded([&] {
    auto const h = stack->emm.get_ipc_handle(ptr);
    mrstack_ipc_handle result{};
    std::memcpy(result.handle, &h.handle, sizeof h.handle);
    result.base = as_u64(h.base);
    result.base_size = h.base_size;
    result.offset = h.offset;
    result.device = h.device;
    *out = result;
  });
}

mrstack_status mrstack_emm_reset(mrstack_stack* handle, size_t* released) {
  auto const stack = resolve_stack(handle, "mrstack_emm_reset");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (released != nullptr) { *released = 0; }
  return guarded([&] {
    mrstack::detail::device_scope on_device{stack->device};  // the frees run as mrstack_deallocate's do
    // A refused free still took its allocation out of the table, and the others went back
    // to the stack: every one's books close before the refusal is reported.
    std::exception_ptr refused;
    auto const freed = stack->emm.reset(refused);
    for (auto const& m : freed) { stack->count_free(static_cast<int>(m.tag), m.size); }
    if (released != nullptr) { *released = freed.size(); }
    if (refused) { std::rethrow_exception(refused); }
  });
}

mrstack_status mrstack_emm_refuse_next_frees_for_tests(mrstack_stack* handle, size_t count) {
  auto const stack = resolve_stack(handle, "mrstack_emm_refuse_next_frees_for_tests");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  stack->emm.refuse_next_frees_for_tests(count);
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_emm_defer_begin(mrstack_stack* handle) {
  auto const stack = resolve_stack(handle, "mrstack_emm_defer_begin");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  stack->emm.begin_deferral();
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_emm_defer_end(mrstack_stack* handle) {
  auto const stack = resolve_stack(handle, "mrstack_emm_defer_end");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] { stack->emm.end_deferral(); });
}

}  // extern "C"
