// What PyTorch's CUDAPluggableAllocator loads by name, and the books behind
// mrstack.torch's memory statistics. They serve the same process-wide device stacks as
// Numba and CuPy, tagged as client torch.
//
// Out of memory: mrstack_torch_alloc returns NULL, which PyTorch does not check (the
// tensor gets a null pointer). mrstack_torch_alloc_raising, which mrstack.torch.install()
// hands to PyTorch, instead lets mrstack::out_of_memory (a std::bad_alloc whose message
// names the request, the footprint, the free bytes and the largest free block) unwind into
// PyTorch's C++ caller, which turns it into a Python exception; nothing of the stack
// changed, so the next allocation is served as usual.
//
// Streams: PyTorch gives its pluggable allocator no record_stream hook reachable from
// Python, so mrstack_torch_record_stream is mrstack's own: it records an event on the
// using stream, and the block's free makes its own stream wait for that event before
// the block goes back to the stack, so the block is not handed out while the using
// stream may still touch it.
#include "c_api_internal.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int max_torch_devices = 64;

struct torch_books {
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> peak_reserved{0};  // largest footprint seen at a new live peak
  std::atomic<std::uint64_t> live_peak_seen{0};
};

std::array<torch_books, max_torch_devices>& books() {
  static auto* all = new std::array<torch_books, max_torch_devices>;  // outlives every free at exit
  return *all;
}

// Blocks some other stream still uses: address -> events their free must wait for.
struct pending_uses {
  std::mutex mutex;
  std::unordered_map<void*, std::vector<cudaEvent_t>> events;
  std::atomic<std::size_t> count{0};  // events.size(): the free path skips the lock when 0
};

pending_uses& uses() {
  static auto* all = new pending_uses;
  return *all;
}

torch_books* books_of(int device) noexcept {
  return device >= 0 && device < max_torch_devices ? &books()[static_cast<std::size_t>(device)] : nullptr;
}

void raise_to(std::atomic<std::uint64_t>& peak, std::uint64_t now) noexcept {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
}

// After an allocation: when PyTorch's live bytes reach a new peak, sample the footprint
// (the footprint only grows during allocations, and mostly when live bytes do).
void sample_reserved(mrstack_stack& stack, torch_books& b) noexcept {
  std::uint64_t const live_peak = stack.clients[MRSTACK_CLIENT_TORCH].peak_bytes.load(std::memory_order_relaxed);
  if (live_peak <= b.live_peak_seen.load(std::memory_order_relaxed)) { return; }
  raise_to(b.live_peak_seen, live_peak);
  try {
    mrstack::fragmentation_info const info = stack.top->fragmentation();
    raise_to(b.peak_reserved, info.resource.empty() ? live_peak : info.held_bytes);
  } catch (...) {}  // a statistic: never fail an allocation for it
}

void* allocate_for_torch(std::size_t size, int device, void* stream) {
  mrstack_stack* stack = mrstack::c_api::built_device_stack(device);
  if (stack == nullptr) { stack = &mrstack::c_api::device_stack(device); }
  void* ptr = nullptr;
  try {
    ptr = stack->top->allocate(size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
  } catch (mrstack::out_of_memory const&) {
    if (auto* b = books_of(device)) { b->ooms.fetch_add(1, std::memory_order_relaxed); }
    throw;
  }
  if (ptr != nullptr) {
    stack->count_allocation(MRSTACK_CLIENT_TORCH, size);
    if (auto* b = books_of(device)) { sample_reserved(*stack, *b); }
  }
  return ptr;
}

// Makes `stream` wait for every use of `ptr` recorded on other streams, then forgets them.
void wait_for_recorded_uses(void* ptr, void* stream) {
  auto& pending = uses();
  if (pending.count.load(std::memory_order_acquire) == 0) { return; }
  std::vector<cudaEvent_t> events;
  {
    std::lock_guard lock{pending.mutex};
    auto found = pending.events.find(ptr);
    if (found == pending.events.end()) { return; }
    events = std::move(found->second);
    pending.events.erase(found);
    pending.count.store(pending.events.size(), std::memory_order_release);
  }
  for (cudaEvent_t event : events) {
    (void)cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event, 0);
    (void)cudaEventDestroy(event);  // the wait is enqueued: destroying the event now is allowed
  }
}

}  // namespace

extern "C" {

void* mrstack_torch_alloc(size_t size, int device, void* stream) {
  try {
    return allocate_for_torch(size, device, stream);
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    // PyTorch does not check for NULL: say why here, where it can still be seen.
    std::fprintf(stderr, "mrstack: PyTorch's allocation of %zu bytes on device %d failed: %s\n", size, device,
                 mrstack_last_error());
    return nullptr;
  }
}

void* mrstack_torch_alloc_raising(size_t size, int device, void* stream) {
  try {
    return allocate_for_torch(size, device, stream);
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();  // also this thread's last error
    throw;  // into PyTorch's C++ caller (see the file's comment)
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
    wait_for_recorded_uses(ptr, stream);
    stack->top->deallocate(ptr, size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
    stack->count_free(MRSTACK_CLIENT_TORCH, size);
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    std::fprintf(stderr, "mrstack: PyTorch's free of %zu bytes on device %d failed: %s\n", size, device,
                 mrstack_last_error());
  }
}

mrstack_status mrstack_torch_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_record_stream: the pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  return mrstack::c_api::guarded([&] {
    cudaEvent_t event = nullptr;
    cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status != cudaSuccess) { throw mrstack::cuda_error(status, "cudaEventCreateWithFlags", __FILE__, __LINE__); }
    status = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    if (status != cudaSuccess) {
      (void)cudaEventDestroy(event);
      throw mrstack::cuda_error(status, "cudaEventRecord", __FILE__, __LINE__);
    }
    auto& pending = uses();
    std::lock_guard lock{pending.mutex};
    pending.events[ptr].push_back(event);
    pending.count.store(pending.events.size(), std::memory_order_release);
  });
}

mrstack_status mrstack_torch_statistics(int device, mrstack_torch_stats* out) {
  torch_books* const b = books_of(device);
  if (b == nullptr || out == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_statistics: device " + std::to_string(device) +
                                   " is outside [0, 64) or the out-pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  out->num_ooms = b->ooms.load(std::memory_order_relaxed);
  out->peak_reserved_bytes = b->peak_reserved.load(std::memory_order_relaxed);
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_torch_reset_peak(int device, uint64_t reserved_now) {
  torch_books* const b = books_of(device);
  if (b == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_reset_peak: device " + std::to_string(device) +
                                   " is outside [0, 64)");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  b->peak_reserved.store(reserved_now, std::memory_order_relaxed);
  mrstack_stack* const stack = mrstack::c_api::built_device_stack(device);
  std::uint64_t const live = stack == nullptr ? 0 : stack->clients[MRSTACK_CLIENT_TORCH].live_bytes.load();
  b->live_peak_seen.store(live, std::memory_order_relaxed);
  return MRSTACK_SUCCESS;
}

}  // extern "C"
