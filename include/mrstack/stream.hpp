#pragma once
/// Streams. `stream_view` is a non-owning, copyable handle to a CUDA stream: the default
/// (legacy) stream, the per-thread default stream, or any `cudaStream_t`. `stream` owns one
/// and destroys it (RAII). Resources take a `stream_view` on every call; stream-ordered
/// resources use it to decide when memory may be reused.
#include <cstdint>
#include <functional>
#include <utility>

#include <cuda_runtime_api.h>

namespace mrstack {

class stream_view {
 public:
  constexpr stream_view() noexcept = default;  ///< the default (legacy) stream, handle 0
  constexpr stream_view(cudaStream_t s) noexcept : handle_{s} {}  // NOLINT: implicit on purpose

  static stream_view per_thread() noexcept { return stream_view{cudaStreamPerThread}; }
  static stream_view legacy() noexcept { return stream_view{cudaStreamLegacy}; }

  [[nodiscard]] constexpr cudaStream_t value() const noexcept { return handle_; }
  constexpr operator cudaStream_t() const noexcept { return handle_; }  // NOLINT
  [[nodiscard]] bool is_default() const noexcept {
    return handle_ == nullptr || handle_ == cudaStreamLegacy;
  }
  [[nodiscard]] bool is_per_thread_default() const noexcept { return handle_ == cudaStreamPerThread; }
  /// The handle as an integer, for logs and keys.
  [[nodiscard]] std::uintptr_t id() const noexcept { return reinterpret_cast<std::uintptr_t>(handle_); }

  /// Waits until all work on the stream has finished; throws `cuda_error`.
  void synchronize() const;

  friend constexpr bool operator==(stream_view a, stream_view b) noexcept { return a.handle_ == b.handle_; }

 private:
  cudaStream_t handle_{nullptr};
};

/// An owning CUDA stream (created non-blocking by default); destroyed with its owner,
/// after its work has finished. Resources know streams by their handle and CUDA reuses
/// handles: a stream destroyed with work still queued on memory it freed could see that
/// memory handed to the next stream given its handle, with no wait
/// (docs/suballocators.md). Streams created by hand need the same care.
class stream {
 public:
  explicit stream(unsigned int flags = cudaStreamNonBlocking);
  ~stream();
  stream(stream&& other) noexcept : handle_{std::exchange(other.handle_, nullptr)} {}
  stream& operator=(stream&& other) noexcept;
  stream(stream const&) = delete;
  stream& operator=(stream const&) = delete;

  [[nodiscard]] stream_view view() const noexcept { return stream_view{handle_}; }
  operator stream_view() const noexcept { return view(); }  // NOLINT
  [[nodiscard]] cudaStream_t value() const noexcept { return handle_; }
  void synchronize() const { view().synchronize(); }

 private:
  cudaStream_t handle_{nullptr};
};

}  // namespace mrstack

template <>
struct std::hash<mrstack::stream_view> {
  std::size_t operator()(mrstack::stream_view s) const noexcept { return std::hash<std::uintptr_t>{}(s.id()); }
};
