// The two functions PyTorch's CUDAPluggableAllocator loads by name. They serve the same
// process-wide device stacks as Numba and CuPy, tagged as client torch.
#include "c_api_internal.hpp"

#include <cstdio>
#include <string>

extern "C" {

void* mrstack_torch_alloc(size_t size, int device, void* stream) {
  try {
    mrstack_stack* stack = mrstack::c_api::built_device_stack(device);
    if (stack == nullptr) { stack = &mrstack::c_api::device_stack(device); }
    stack->emm.check_awake("mrstack_torch_alloc");  // a pool would hand out memory with nothing behind it
    void* const ptr = stack->top->allocate(size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
    if (ptr != nullptr) { stack->count_allocation(MRSTACK_CLIENT_TORCH, size); }
    return ptr;
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    // PyTorch does not check for NULL: say why here, where it can still be seen.
    std::fprintf(stderr, "mrstack: PyTorch's allocation of %zu bytes on device %d failed: %s\n", size, device,
                 mrstack_last_error());
    return nullptr;
  }
}

void mrstack_torch_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) { return; }
  mrstack_stack* const stack = mrstack::c_api::built_device_stack(device);
  if (stack == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_free: device " + std::to_string(device) +
                                   " has no stack, so this pointer did not come from mrstack",
                                   0, MRSTACK_ERROR_LOGIC);
    std::fprintf(stderr, "mrstack: %s\n", mrstack_last_error());
    return;
  }
  try {
    stack->top->deallocate(ptr, size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
    stack->count_free(MRSTACK_CLIENT_TORCH, size);
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    std::fprintf(stderr, "mrstack: PyTorch's free of %zu bytes on device %d failed: %s\n", size, device,
                 mrstack_last_error());
  }
}

}  // extern "C"
