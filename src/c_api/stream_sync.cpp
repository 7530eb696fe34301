// The process's CUDA stream-ordering calls through the C ABI: mrstack::cuda_stream_sync_profile
// copied into a plain C struct.
#include "c_api_internal.hpp"

#include <mrstack/suballoc/stream_sync.hpp>

extern "C" mrstack_status mrstack_stream_sync_profile(mrstack_stream_sync_counts* out) {
  if (out == nullptr) {
    mrstack::c_api::set_last_error("mrstack_stream_sync_profile: the out-pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  using kind = mrstack::stream_sync_profile;
  mrstack::stream_sync_profile const p = mrstack::cuda_stream_sync_profile();
  out->event_creates = p.calls[kind::create_event];
  out->records = p.calls[kind::record];
  out->waits = p.calls[kind::wait];
  out->stream_synchronizations = p.calls[kind::synchronize];
  out->device_synchronizations = p.calls[kind::synchronize_all];
  out->nanoseconds = p.total_nanoseconds();
  out->idle_queries = p.calls[kind::query];
  return MRSTACK_SUCCESS;
}
