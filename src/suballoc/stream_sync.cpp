#include <mrstack/suballoc/stream_sync.hpp>

#include <atomic>

#include <cuda_runtime_api.h>

#include "device_scope.hpp"

namespace mrstack {

namespace {

cudaStream_t as_stream(detail::stream_sync::handle h) noexcept { return reinterpret_cast<cudaStream_t>(h); }
cudaEvent_t as_event(detail::stream_sync::handle h) noexcept { return reinterpret_cast<cudaEvent_t>(h); }

// Events and device-wide synchronization belong to the device current when the suballocator
// was built (a stack is built with its device current), not to whatever device the thread
// that frees happens to have current.
class cuda_stream_sync final : public detail::stream_sync {
 public:
  handle create_event() override {
    detail::device_scope on_device{device_};
    cudaEvent_t event = nullptr;
    MRSTACK_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return reinterpret_cast<handle>(event);
  }
  void destroy_event(handle event) noexcept override { MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaEventDestroy(as_event(event))); }
  bool record(handle event, handle stream) override {
    if (cudaEventRecord(as_event(event), as_stream(stream)) != cudaSuccess) {
      (void)cudaGetLastError();  // a stream that is gone: the caller synchronizes the device instead
      return false;
    }
    return true;
  }
  void wait(handle stream, handle event) override {
    MRSTACK_CUDA_TRY(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
  }
  void synchronize(handle stream) override { MRSTACK_CUDA_TRY(cudaStreamSynchronize(as_stream(stream))); }
  void synchronize_all() override {
    detail::device_scope on_device{device_};
    MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
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

 private:
  std::atomic<handle> events_{0};
};

}  // namespace

std::shared_ptr<detail::stream_sync> make_cuda_stream_sync() { return std::make_shared<cuda_stream_sync>(); }
std::shared_ptr<detail::stream_sync> make_host_stream_sync() { return std::make_shared<host_stream_sync>(); }

std::shared_ptr<detail::stream_sync> default_stream_sync(memory_kind kind) {
  return kind == memory_kind::host || kind == memory_kind::none ? make_host_stream_sync() : make_cuda_stream_sync();
}

}  // namespace mrstack
