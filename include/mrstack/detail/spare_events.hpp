#pragma once
/// `spare_events` and `prerecorded_event`: events a resource records *before* it takes
/// its lock, so the CUDA call (about a microsecond, an ioctl in the driver) is not made
/// while every other thread waits for that lock. CUDA-free: events go through
/// `stream_sync`.
///
/// Used by the pool for a free that will park its stream for certain (see
/// stream_owners::park): the free records on its own stream first — legal, the call
/// names that stream — then, under the lock, the pool adopts the event when no other
/// thread has named the stream, and hands back the slot's previous event, which goes to
/// the spares for a later free. An event not adopted (another thread used the stream;
/// the free was refused) goes back unused: a record no one waits on is harmless.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

/// Events no stream slot holds, for prerecording. Thread-safe (its own small lock).
class spare_events {
 public:
  explicit spare_events(std::shared_ptr<stream_sync> sync) : sync_{std::move(sync)} {}
  ~spare_events() {
    for (stream_sync::handle e : spares_) { sync_->destroy_event(e); }
  }
  spare_events(spare_events const&) = delete;
  spare_events& operator=(spare_events const&) = delete;

  /// An event recorded on `stream` now, or 0 when none could be made or recorded (the
  /// caller then records under its lock as before).
  stream_sync::handle record_on(stream_sync::handle stream) noexcept {
    stream_sync::handle e = take();
    if (e == 0) { return 0; }
    try {
      if (sync_->record(e, stream)) {
        records_.fetch_add(1, std::memory_order_relaxed);
        return e;
      }
    } catch (...) {
    }
    give(e);
    return 0;
  }
  /// Takes back an event nobody waits on any more (0: nothing).
  void give(stream_sync::handle e) noexcept {
    if (e == 0) { return; }
    try {
      std::lock_guard lock{mutex_};
      spares_.push_back(e);
    } catch (...) {
      sync_->destroy_event(e);
    }
  }
  /// Whether `stream` has finished all its work (stream_sync::idle), asked before a lock,
  /// with the back-off stream_owners::park_if_idle uses under it (`idle_back_off`). Each
  /// thread keeps it for the last few streams it freed on in each resource (one thread
  /// often drives two or three).
  bool idle(stream_sync::handle stream) noexcept {
    struct recent_stream {
      std::uint64_t owner = 0;  // streams of different resources are counted apart
      stream_sync::handle stream = 0;
      idle_back_off asks{};
    };
    thread_local std::array<recent_stream, 4> recent{};
    thread_local unsigned next_victim = 0;
    recent_stream* r = nullptr;
    for (auto& x : recent) {
      if (x.owner == id_ && x.stream == stream) { r = &x; }
    }
    if (r == nullptr) {
      r = &recent[next_victim++ % recent.size()];
      *r = recent_stream{id_, stream, {}};
    }
    if (r->asks.skip()) { return false; }
    bool answer = false;
    try {
      answer = sync_->idle(stream);
    } catch (...) {
    }
    queries_.fetch_add(1, std::memory_order_relaxed);
    r->asks.answered(answer);
    return answer;
  }
  /// Whether `stream` is being captured (stream_sync::capturing); an error says yes, the
  /// safe answer (nothing is recorded then).
  bool capturing(stream_sync::handle stream) noexcept {
    try {
      return sync_->capturing(stream);
    } catch (...) {
      return true;
    }
  }
  /// Records made here so far, and idle queries.
  [[nodiscard]] std::size_t records() const noexcept { return records_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t queries() const noexcept { return queries_.load(std::memory_order_relaxed); }

 private:
  stream_sync::handle take() noexcept {
    {
      std::lock_guard lock{mutex_};
      if (!spares_.empty()) {
        stream_sync::handle const e = spares_.back();
        spares_.pop_back();
        return e;
      }
    }
    try {
      return sync_->create_event();
    } catch (...) {
      return 0;
    }
  }

  std::shared_ptr<stream_sync> sync_;
  lean_mutex mutex_;
  std::vector<stream_sync::handle> spares_;
  std::atomic<std::size_t> records_{0};
  std::atomic<std::size_t> queries_{0};
  // Names this resource in the threads' recent streams. Not its address: a resource made
  // where a destroyed one was found the other's back-off there, skipped its first asks
  // and took an idle stream for busy (tests/pool_idle_streams.cpp, in a shuffled order).
  std::uint64_t const id_ = [] {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }();
};

/// One call's work before its lock (`prepark`): the stream found idle, or an event
/// recorded on it. Whatever event it holds at the end of the scope (its own, unused, or
/// the one a park swapped in) goes back to the spares.
class prerecorded_event {
 public:
  explicit prerecorded_event(spare_events& spares) noexcept : spares_{spares} {}
  ~prerecorded_event() { spares_.give(before_.event); }
  prerecorded_event(prerecorded_event const&) = delete;
  prerecorded_event& operator=(prerecorded_event const&) = delete;

  /// Before a free that will park `stream`: when the stream has finished all its work,
  /// nothing needs recording (stream_owners::park_if_idle); else an event.
  void prepare(stream_sync::handle stream) noexcept {
    before_.idle = spares_.idle(stream);
    if (!before_.idle && !spares_.capturing(stream)) { before_.event = spares_.record_on(stream); }
  }
  /// What `stream_ordered_pool::deallocate` takes (null when nothing was done).
  [[nodiscard]] prepark* get() noexcept { return before_.event != 0 || before_.idle ? &before_ : nullptr; }

 private:
  spare_events& spares_;
  prepark before_;
};

}  // namespace mrstack::detail
