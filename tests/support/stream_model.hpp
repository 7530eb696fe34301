#pragma once
// Pieces the stream-ordering model tests share (over the fake seam, fake_stream_sync.hpp).
#include <cstddef>
#include <cstdint>

#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::test {

/// A created (not per-thread, not legacy) stream named by `handle`.
inline detail::stream_ref created(std::uintptr_t handle) { return detail::stream_ref{handle, handle, false}; }

/// A thread between its prerecord and its free: the block, the last use's clock, what it
/// did before the lock (found the stream idle, or recorded an event).
struct pending_free {
  std::uintptr_t address;
  std::uint64_t clock;
  detail::prepark before;
};

/// A block the model holds live: its size and the handle of the stream it was taken on.
struct live_block {
  std::size_t size;
  std::uintptr_t stream;
};

}  // namespace mrstack::test
