#pragma once
/// The CUDA side of stream-ordered reuse for the suballocators (see
/// detail/stream_ordering.hpp for the rules): the `stream_sync` implementations and the
/// mapping from `stream_view` to the stream identity the ordering logic uses.
///
/// - `make_cuda_stream_sync()`: events (timing disabled) recorded and waited on with
///   cudaEventRecord / cudaStreamWaitEvent; cudaStreamSynchronize / cudaDeviceSynchronize
///   as the fallbacks; cudaStreamQuery tells whether a stream has finished all its work
///   (its frees then need no event at all). Used by default over device, managed and
///   pinned host memory.
/// - `make_host_stream_sync()`: for memory no stream ever touches (the `system` and
///   `simulated` upstreams): every free is complete at once, so every call is a no-op
///   and every stream is idle.
///   Used by default over host and fake memory, which keeps CPU-only programs free of
///   CUDA calls however many streams they name.
///
/// `to_stream_ref` maps the legacy default stream (0 or cudaStreamLegacy) to one key and
/// gives each thread's per-thread default stream (cudaStreamPerThread) a key of its own.
/// Streams are keyed by handle: a stream destroyed while it still owns free memory of a
/// resource should first be synchronized and the resource's `release()` called (or the
/// memory freed on a live stream) — a new stream that CUDA gives the same handle would
/// otherwise inherit that memory without waiting for the old stream's work.
#include <array>
#include <cstdint>
#include <memory>

#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/resource.hpp>
#include <mrstack/stream.hpp>

namespace mrstack {

/// What the suballocators' CUDA stream-ordering calls cost this process so far, all
/// resources and threads together: how many of each kind and the wall time spent inside
/// them. Benchmarks divide by their allocator calls to see where multi-threaded and
/// multi-stream time goes. Counted per thread (no shared cache line on the hot path) and
/// summed when read; the timing adds two clock reads to calls that cost microseconds.
struct stream_sync_profile {
  enum kind : unsigned { create_event, record, wait, synchronize, synchronize_all, query, kinds };
  std::array<std::uint64_t, kinds> calls{};
  std::array<std::uint64_t, kinds> nanoseconds{};
  [[nodiscard]] std::uint64_t total_calls() const noexcept;
  [[nodiscard]] std::uint64_t total_nanoseconds() const noexcept;
  /// The difference since an earlier reading.
  [[nodiscard]] stream_sync_profile since(stream_sync_profile const& earlier) const noexcept;
};
/// The profile of every `make_cuda_stream_sync()` object in the process.
[[nodiscard]] stream_sync_profile cuda_stream_sync_profile() noexcept;

std::shared_ptr<detail::stream_sync> make_cuda_stream_sync();
std::shared_ptr<detail::stream_sync> make_host_stream_sync();
/// CUDA for memory a device may touch (device, managed, pinned host), host otherwise.
std::shared_ptr<detail::stream_sync> default_stream_sync(memory_kind kind);

inline detail::stream_ref to_stream_ref(stream_view s) noexcept {
  std::uintptr_t handle = s.id();
  if (handle == reinterpret_cast<std::uintptr_t>(cudaStreamLegacy)) { handle = 0; }
  if (handle == reinterpret_cast<std::uintptr_t>(cudaStreamPerThread)) {
    return detail::stream_ref{detail::this_thread_key(), handle, true};
  }
  // The stream maps reserve key ~0 as "no stream": a handle of ~0 (no real stream has it,
  // but a sentinel passed by mistake may) is keyed apart from it, as a stream of its own,
  // so its memory is handed over like any stream's, never taken as synchronized.
  std::uintptr_t const key = handle == ~std::uintptr_t{0} ? ~std::uintptr_t{2} : handle;
  return detail::stream_ref{key, handle, false};
}

inline stream_view to_stream_view(detail::stream_ref const& s) noexcept {
  return stream_view{reinterpret_cast<cudaStream_t>(s.handle)};
}

}  // namespace mrstack
