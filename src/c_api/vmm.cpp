// The C ABI of what vmm stacks add: IPC of vmm memory (handles that name a block, opened
// in another process) and sleep/wake of a stack's physical memory.
#include "c_api_internal.hpp"

#include <cstring>
#include <string>

#include <mrstack/upstream/virtual_range.hpp>
#include <mrstack/upstream/vmm_ipc.hpp>

using mrstack::c_api::guarded;
using mrstack::c_api::set_last_error;

namespace {

mrstack_status null_argument(char const* function, char const* what) {
  set_last_error(std::string{function} + ": " + what + " is null");
  return MRSTACK_ERROR_INVALID_ARGUMENT;
}

}  // namespace

extern "C" {

mrstack_status mrstack_emm_get_ipc_handle_sized(mrstack_stack* handle, const void* ptr, size_t bytes,
                                                mrstack_ipc_handle* out) {
  if (out == nullptr) { return null_argument("mrstack_emm_get_ipc_handle_sized", "the out-pointer"); }
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_emm_get_ipc_handle_sized");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] {
    auto const h = stack->emm.get_ipc_handle(ptr, bytes);
    mrstack_ipc_handle result{};
    std::memcpy(result.handle, &h.handle, sizeof result.handle);
    result.base = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(h.base));
    result.base_size = h.base_size;
    result.offset = h.offset;
    result.device = h.device;
    result.reserved = h.vmm ? MRSTACK_IPC_HANDLE_VMM : 0;
    *out = result;
  });
}

int mrstack_ipc_is_vmm_handle(const unsigned char* handle) {
  return mrstack::vmm_ipc::is_handle(handle, MRSTACK_IPC_HANDLE_BYTES) ? 1 : 0;
}

mrstack_status mrstack_ipc_open(const unsigned char* handle, int device, void** out) {
  if (handle == nullptr) { return null_argument("mrstack_ipc_open", "the handle"); }
  if (out == nullptr) { return null_argument("mrstack_ipc_open", "the out-pointer"); }
  return guarded([&] {
    mrstack::vmm_ipc::handle h{};
    std::memcpy(h.data(), handle, h.size());
    *out = mrstack::vmm_ipc::open(h, device);
  });
}

mrstack_status mrstack_ipc_close(void* ptr) {
  return guarded([&] { mrstack::vmm_ipc::close(ptr); });
}

mrstack_status mrstack_stack_sleep(mrstack_stack* handle, int keep_contents) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_stack_sleep");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] { mrstack::sleep_stack(*stack->top, keep_contents != 0); });
}

mrstack_status mrstack_stack_wake(mrstack_stack* handle) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_stack_wake");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] { mrstack::wake_stack(*stack->top); });
}

int mrstack_stack_is_asleep(mrstack_stack* handle) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_stack_is_asleep");
  return stack && mrstack::stack_asleep(*stack->top) ? 1 : 0;
}

}  // extern "C"
