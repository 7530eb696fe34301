#include <mrstack/resource.hpp>
#include <mrstack/stream.hpp>

#include "relaxed_capture_scope.hpp"

#include <string>

namespace mrstack {

char const* to_string(memory_kind kind) noexcept {
  switch (kind) {
    case memory_kind::device: return "device";
    case memory_kind::managed: return "managed";
    case memory_kind::pinned_host: return "pinned_host";
    case memory_kind::host: return "host";
    case memory_kind::none: return "none";
  }
  return "unknown";
}

void memory_resource::throw_bad_alignment(std::size_t alignment) {
  throw logic_error("allocate: alignment " + std::to_string(alignment) + " is not a power of two");
}

void memory_resource::throw_null_allocation(std::size_t bytes) const {
  throw logic_error(name() + ": allocate of " + std::to_string(bytes) +
                    " B returned a null pointer (a resource refuses by throwing; null answers 0 bytes only)");
}

std::string describe_stack(memory_resource const& top) {
  std::string out = top.name();
  for (auto const* layer = top.upstream(); layer != nullptr; layer = layer->upstream()) {
    out += " > ";
    out += layer->name();
  }
  return out;
}

memory_resource& bottom_of_stack(memory_resource& top) noexcept {
  memory_resource* layer = &top;
  while (layer->upstream() != nullptr) { layer = layer->upstream(); }
  return *layer;
}

void stream_view::synchronize() const { MRSTACK_CUDA_TRY(cudaStreamSynchronize(handle_)); }

stream::stream(unsigned int flags) { MRSTACK_CUDA_TRY(cudaStreamCreateWithFlags(&handle_, flags)); }

namespace {
// Waits for the stream's work before destroying it: resources know a stream by its
// handle, and CUDA may hand this one to the next stream created, which would then be
// given the memory this one freed at once — while its work on it might still be running.
// A stream being captured is not waited for (a synchronization would end its capture);
// another thread's capture is left alone by waiting in relaxed mode. A failed wait leaves
// its error for the program to read: the stream is destroyed anyway.
void finish_and_destroy(cudaStream_t handle) noexcept {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(handle, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone) {
    detail::relaxed_capture_scope const capture_safe;
    (void)cudaStreamSynchronize(handle);
  }
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaStreamDestroy(handle));
}
}  // namespace

stream::~stream() {
  if (handle_ != nullptr) { finish_and_destroy(handle_); }
}

stream& stream::operator=(stream&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) { finish_and_destroy(handle_); }
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

}  // namespace mrstack
