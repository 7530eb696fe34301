#include <mrstack/suballoc/stream_sync.hpp>

#include <atomic>
#include <chrono>

#include <mrstack/detail/sharded_counters.hpp>

#include <cuda_runtime_api.h>

#include "device_scope.hpp"
#include "relaxed_capture_scope.hpp"

namespace mrstack {

namespace {

// The profile's per-thread slots: each thread adds to its own cache line.
struct alignas(64) profile_slot {
  std::array<std::atomic<std::uint64_t>, stream_sync_profile::kinds> calls{};
  std::array<std::atomic<std::uint64_t>, stream_sync_profile::kinds> nanoseconds{};
};
std::array<profile_slot, detail::counter_shards> profile_slots;

/// Times one CUDA call into the calling thread's slot.
class profiled_call {
 public:
  explicit profiled_call(stream_sync_profile::kind k) noexcept : kind_{k}, start_{std::chrono::steady_clock::now()} {}
  ~profiled_call() {
    auto const ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    profile_slot& slot = profile_slots[detail::this_thread_shard()];
    slot.calls[kind_].fetch_add(1, std::memory_order_relaxed);
    slot.nanoseconds[kind_].fetch_add(static_cast<std::uint64_t>(ns.count()), std::memory_order_relaxed);
  }
  profiled_call(profiled_call const&) = delete;
  profiled_call& operator=(profiled_call const&) = delete;

 private:
  stream_sync_profile::kind kind_;
  std::chrono::steady_clock::time_point start_;
};

// Handle 0 is the legacy default stream (to_stream_ref maps it there), named as such: a
// bare 0 would mean the calling thread's own stream in a build with per-thread default
// streams, and then a "barrier" recorded there would order nothing after other threads.
cudaStream_t as_stream(detail::stream_sync::handle h) noexcept {
  return h == 0 ? cudaStreamLegacy : reinterpret_cast<cudaStream_t>(h);
}
cudaEvent_t as_event(detail::stream_sync::handle h) noexcept { return reinterpret_cast<cudaEvent_t>(h); }

// Events and device-wide synchronization belong to the device current when the suballocator
// was built (a stack is built with its device current), not to whatever device the thread
// that frees happens to have current.
class cuda_stream_sync final : public detail::stream_sync {
 public:
  handle create_event() override {
    profiled_call timed{stream_sync_profile::create_event};
    detail::device_scope on_device{device_};
    cudaEvent_t event = nullptr;
    MRSTACK_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return reinterpret_cast<handle>(event);
  }
  void destroy_event(handle event) noexcept override { MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaEventDestroy(as_event(event))); }
  bool record(handle event, handle stream) override {
    profiled_call timed{stream_sync_profile::record};
    if (cudaEventRecord(as_event(event), as_stream(stream)) != cudaSuccess) {
      (void)cudaGetLastError();  // a stream that is gone: the caller synchronizes the device instead
      return false;
    }
    return true;
  }
  void wait(handle stream, handle event) override {
    profiled_call timed{stream_sync_profile::wait};
    MRSTACK_CUDA_TRY(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
  }
  void synchronize(handle stream) override {
    profiled_call timed{stream_sync_profile::synchronize};
    // The callers check that `stream` is not being captured (a capture cannot be
    // synchronized, relaxed or not); another stream's capture must not be ended by it.
    detail::relaxed_capture_scope const capture_safe;
    MRSTACK_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)));
  }
  void synchronize_all() override {
    profiled_call timed{stream_sync_profile::synchronize_all};
    detail::device_scope on_device{device_};
    MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  }
  bool capturing(handle stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(as_stream(stream), &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // cannot tell: record nothing (the safe answer)
    }
    return status != cudaStreamCaptureStatusNone;
  }
  bool idle(handle stream) override {
    profiled_call timed{stream_sync_profile::query};
    // Never a stream being captured, and that is asked first: on a capturing stream a
    // query, and even cudaStreamGetFlags, fails and invalidates the capture (seen on an
    // H200 with CUDA 13: gpu_test_pool_idle_parks). Then only non-blocking streams: a
    // blocking stream's later work also waits for earlier work on the legacy default
    // stream, which its query does not report (and querying the legacy stream is an
    // implicit synchronization that a graph capture in global mode forbids).
    // The last error is cleared only after a call of ours failed: an error the program
    // left pending is the program's to read.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(as_stream(stream), &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (capture != cudaStreamCaptureStatusNone) { return false; }
    unsigned int flags = 0;
    if (cudaStreamGetFlags(as_stream(stream), &flags) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if ((flags & cudaStreamNonBlocking) == 0) { return false; }
    // A query is an "unsafe" call to CUDA while any capture in global mode (PyTorch's
    // default) or one of this thread's in thread-local mode is under way, even on a stream
    // not being captured: it would invalidate that capture. Relaxed for this one call.
    cudaError_t status = cudaSuccess;
    {
      detail::relaxed_capture_scope const capture_safe;
      status = cudaStreamQuery(as_stream(stream));
    }
    if (status == cudaSuccess) { return true; }
    if (status != cudaErrorNotReady) { (void)cudaGetLastError(); }  // an error is "busy": the safe answer
    return false;
  }

 private:
  int device_ = detail::resolve_device(-1);
};

class host_stream_sync final : public detail::stream_sync {
 public:
  handle create_event() override { return events_.fetch_add(1, std::memory_order_relaxed) + 1; }
  void destroy_event(handle) noexcept override {}
  bool record(handle, handle) override { return true; }
  void wait(handle, handle) override {}
  void synchronize(handle) override {}
  void synchronize_all() override {}
  bool idle(handle) override { return true; }

 private:
  std::atomic<handle> events_{0};
};

}  // namespace

std::uint64_t stream_sync_profile::total_calls() const noexcept {
  std::uint64_t n = 0;
  for (auto c : calls) { n += c; }
  return n;
}

std::uint64_t stream_sync_profile::total_nanoseconds() const noexcept {
  std::uint64_t n = 0;
  for (auto c : nanoseconds) { n += c; }
  return n;
}

stream_sync_profile stream_sync_profile::since(stream_sync_profile const& earlier) const noexcept {
  stream_sync_profile d;
  for (unsigned k = 0; k < kinds; ++k) {
    d.calls[k] = calls[k] - earlier.calls[k];
    d.nanoseconds[k] = nanoseconds[k] - earlier.nanoseconds[k];
  }
  return d;
}

stream_sync_profile cuda_stream_sync_profile() noexcept {
  stream_sync_profile p;
  for (auto const& slot : profile_slots) {
    for (unsigned k = 0; k < stream_sync_profile::kinds; ++k) {
      p.calls[k] += slot.calls[k].load(std::memory_order_relaxed);
      p.nanoseconds[k] += slot.nanoseconds[k].load(std::memory_order_relaxed);
    }
  }
  return p;
}

std::shared_ptr<detail::stream_sync> make_cuda_stream_sync() { return std::make_shared<cuda_stream_sync>(); }
std::shared_ptr<detail::stream_sync> make_host_stream_sync() { return std::make_shared<host_stream_sync>(); }

std::shared_ptr<detail::stream_sync> default_stream_sync(memory_kind kind) {
  return kind == memory_kind::host || kind == memory_kind::none ? make_host_stream_sync() : make_cuda_stream_sync();
}

}  // namespace mrstack
