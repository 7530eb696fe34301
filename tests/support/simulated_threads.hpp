#pragma once
// Simulated threads and streams for model tests of stream ordering over the fake event
// seam: the ordering logic asks `simulated_thread_key` which thread is calling, and a
// test sets `current_thread` before each call. Thread keys are odd, like real ones.
#include <mrstack/detail/stream_ordering.hpp>

#include <cstdint>

namespace mrstack::test {

inline std::uintptr_t current_thread = 3;
inline std::uintptr_t simulated_thread_key() noexcept { return current_thread; }

/// The per-thread default stream of simulated thread `thread` (a blocking stream, keyed by thread).
inline constexpr std::uintptr_t ptds_handle_base = 0x100000;
inline detail::stream_ref ptds_of(std::uintptr_t thread) {
  return detail::stream_ref{thread, ptds_handle_base + thread, true};
}
/// A stream the user created (or, for handle 0, the legacy default stream).
inline detail::stream_ref shared_stream(std::uintptr_t handle) { return detail::stream_ref{handle, handle, false}; }

}  // namespace mrstack::test
