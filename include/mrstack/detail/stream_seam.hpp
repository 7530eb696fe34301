#pragma once
/// What the stream-ordering logic (stream_ordering.hpp) is built on, CUDA-free: the seam
/// through which it reaches CUDA (`stream_sync`, implemented in suballoc/stream_sync.hpp
/// and faked in the tests), how it names a stream (`stream_ref`) and the calling thread
/// (`this_thread_key`), and two small records it keeps per stream.
#include <cstddef>
#include <cstdint>

namespace mrstack::detail {

/// The seam between stream-ordering logic and CUDA. Handles are opaque integers: a
/// `cudaStream_t` / `cudaEvent_t` for the CUDA implementation, anything for a fake.
class stream_sync {
 public:
  using handle = std::uintptr_t;
  virtual ~stream_sync() = default;
  virtual handle create_event() = 0;
  virtual void destroy_event(handle event) noexcept = 0;
  /// Records `event` on `stream`. False when the stream cannot take it (destroyed): the
  /// caller then falls back to `synchronize_all`.
  virtual bool record(handle event, handle stream) = 0;
  /// Makes future work on `stream` wait for the last record of `event`.
  virtual void wait(handle stream, handle event) = 0;
  /// Blocks the host until all work on `stream` has finished.
  virtual void synchronize(handle stream) = 0;
  /// Blocks the host until all work on the device has finished.
  virtual void synchronize_all() = 0;
  /// True when every piece of work enqueued on `stream` so far has finished (the stream
  /// waits for nothing either): memory it freed is then usable by every stream with no
  /// event. Asked only of a stream the current call names. Answering false is always
  /// safe (the default: such a seam never reports a stream idle; the CUDA one answers
  /// false for blocking streams and for streams being captured into a graph).
  virtual bool idle(handle /*stream*/) { return false; }
  /// True while `stream` is being captured into a CUDA graph. Its work then runs only
  /// when the graph is launched, so an event recorded on it orders nothing another stream
  /// could wait for (CUDA refuses such a wait): its frees are not parked and no event is
  /// recorded for them while it lasts. Asked only of a stream the current call names.
  virtual bool capturing(handle /*stream*/) { return false; }
};

/// How often a stream that keeps work queued is asked whether it is idle: after k busy
/// answers in a row the next 2^k - 1 asks are skipped (at most 63), so such a stream (a
/// training loop) costs about one query per 64 parks, and one that goes idle is found so
/// within that many.
struct idle_back_off {
  std::uint8_t busy_streak = 0;
  std::uint8_t asks_skipped = 0;
  /// True (and counted) when this ask is to be skipped.
  bool skip() noexcept {
    if (asks_skipped == 0) { return false; }
    --asks_skipped;
    return true;
  }
  void answered(bool idle) noexcept {
    busy_streak = idle ? 0 : static_cast<std::uint8_t>(busy_streak < max_streak ? busy_streak + 1 : max_streak);
    asks_skipped = static_cast<std::uint8_t>((1U << busy_streak) - 1U);
  }
  static constexpr std::uint8_t max_streak = 6;
};

/// What a call did on its stream before its resource took the lock (see
/// stream_owners::park and stream_owners::park_if_idle): an event it recorded there,
/// or that it found the stream idle and recorded nothing.
struct prepark {
  stream_sync::handle event = 0;  ///< recorded on the stream (0: none)
  bool idle = false;              ///< the stream had finished all its work when asked
};

/// A stream as the ordering logic sees it.
struct stream_ref {
  std::uintptr_t key = 0;     ///< identity: equal keys are the same stream
  std::uintptr_t handle = 0;  ///< what `stream_sync` is given
  bool thread_bound = false;  ///< a per-thread default stream: only its thread may record on it
};

/// A key unique to the calling thread, never reused by a later thread (odd, so it cannot
/// equal a stream handle, which is an aligned pointer, or 0).
std::uintptr_t this_thread_key() noexcept;
/// True once the thread with that key has exited (its default stream gets no more work).
bool thread_has_exited(std::uintptr_t key);
/// How many keys the registry behind thread_has_exited keeps: one per live thread that
/// has called this_thread_key (for tests: it must not grow with threads that exited).
std::size_t live_thread_keys();
/// Where the ordering logic asks "which thread is calling?" (tests simulate threads).
using thread_key_fn = std::uintptr_t (*)() noexcept;

}  // namespace mrstack::detail
