// Fragmentation and release through the C ABI: `memory_resource::fragmentation()` copied
// into plain C structs, and `memory_resource::release()`.
#include "c_api_internal.hpp"
#include "../device_scope.hpp"

#include <algorithm>
#include <cstring>
#include <string>

using mrstack::c_api::guarded;
using mrstack::c_api::resolve_stack;
using mrstack::c_api::set_last_error;

namespace {

mrstack_status invalid(std::string message) {
  set_last_error(message);
  return MRSTACK_ERROR_INVALID_ARGUMENT;
}

}  // namespace

extern "C" {

mrstack_status mrstack_get_fragmentation(mrstack_stack* handle, mrstack_fragmentation* out,
                                         mrstack_fragmentation_stream* streams, size_t capacity) {
  if (out == nullptr) { return invalid("mrstack_get_fragmentation: the out-pointer is null"); }
  auto const stack = resolve_stack(handle, "mrstack_get_fragmentation");  // a handle, not an address
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (streams == nullptr && capacity > 0) {
    return invalid("mrstack_get_fragmentation: " + std::to_string(capacity) +
                   " stream entries asked for, but the stream array is null");
  }
  return guarded([&] {
    // One query: every number below comes from the same moment of the suballocator.
    mrstack::fragmentation_info const info = stack->top->fragmentation();
    mrstack_fragmentation f{};
    std::size_t const name_length = std::min(info.resource.size(), sizeof f.resource - 1);
    std::memcpy(f.resource, info.resource.data(), name_length);
    f.resource[name_length] = '\0';
    f.held_bytes = info.held_bytes;
    f.live_bytes = info.live_bytes;
    f.free_bytes = info.free_bytes;
    f.largest_free_block = info.largest_free_block;
    f.free_blocks = info.free_blocks;
    f.stream_count = info.streams.size();
    f.device = stack->device;
    std::size_t const copied = std::min(capacity, info.streams.size());
    for (std::size_t i = 0; i < copied; ++i) {
      auto const& share = info.streams[i];
      streams[i] = mrstack_fragmentation_stream{share.stream, share.free_bytes, share.largest_free_block,
                                                share.free_blocks, share.thread_bound ? 1 : 0, 0};
    }
    *out = f;
  });
}

mrstack_status mrstack_stack_release(mrstack_stack* handle) {
  auto const stack = resolve_stack(handle, "mrstack_stack_release");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] {
    // A pool's release may synchronize the legacy default stream, which is the current device's.
    mrstack::detail::device_scope on_device{stack->device};
    stack->top->release();
  });
}

}  // extern "C"
