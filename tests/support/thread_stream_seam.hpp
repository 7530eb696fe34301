#pragma once
// The fake event seam (fake_stream_sync.hpp) for tests with real threads that name
// `stream_view::per_thread()`: every thread passes the same handle (cudaStreamPerThread),
// and CUDA takes it to mean the calling thread's own default stream. This seam translates
// it to a handle of the calling thread's own, marks those streams blocking, and answers
// "capturing" for the legacy default stream while any of them is being captured (CUDA's
// cudaStreamIsCapturing reports an error there then, which the CUDA seam answers true).
// Calls are serialized: the fake is not thread-safe.
#include <fake_stream_sync.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>

namespace mrstack::test {

class thread_stream_seam final : public detail::stream_sync {
 public:
  static constexpr handle per_thread = 2;  // cudaStreamPerThread
  std::shared_ptr<fake_stream_sync> fake = std::make_shared<fake_stream_sync>();

  // ---- the test's side (each on the calling thread's own default stream) ----
  /// The handle the calling thread's default stream has in the fake.
  handle mine() {
    thread_local handle h = 0;
    if (h == 0) {
      h = 0x100000 + 0x10 * next_.fetch_add(1);
      std::lock_guard lock{mutex_};
      fake->set_blocking(h);
    }
    return h;
  }
  void begin_capture_here() {
    handle const h = mine();
    std::lock_guard lock{mutex_};
    fake->begin_capture(h);
    captured_.insert(h);
  }
  void end_capture_here() {
    handle const h = mine();
    std::lock_guard lock{mutex_};
    fake->end_capture(h);
    captured_.erase(h);
  }
  std::uint64_t enqueue_here() {
    handle const h = mine();
    std::lock_guard lock{mutex_};
    return fake->enqueue(h);
  }
  /// Any fake question, asked under the seam's lock.
  template <typename F>
  auto ask(F&& f) {
    std::lock_guard lock{mutex_};
    return f(*fake);
  }

  // ---- the seam ----
 private:
  template <typename F>
  auto locked(F&& f) {
    std::lock_guard lock{mutex_};
    return f();
  }

 public:
  handle create_event() override { return locked([&] { return fake->create_event(); }); }
  void destroy_event(handle event) noexcept override {
    std::lock_guard lock{mutex_};
    fake->destroy_event(event);
  }
  bool record(handle event, handle stream) override {
    stream = translate(stream);
    return locked([&] { return fake->record(event, stream); });
  }
  void wait(handle stream, handle event) override {
    stream = translate(stream);
    locked([&] { fake->wait(stream, event); });
  }
  void synchronize(handle stream) override {
    stream = translate(stream);
    locked([&] { fake->synchronize(stream); });
  }
  void synchronize_all() override {
    locked([&] { fake->synchronize_all(); });
  }
  bool capturing(handle stream) override {
    stream = translate(stream);
    return locked([&] { return fake->capturing(stream) || (stream == 0 && !captured_.empty()); });
  }
  bool idle(handle stream) override {
    stream = translate(stream);
    return locked([&] { return fake->idle(stream); });
  }

 private:
  handle translate(handle stream) { return stream == per_thread ? mine() : stream; }
  std::mutex mutex_;
  std::set<handle> captured_;  // default streams being captured
  std::atomic<handle> next_{1};
};

}  // namespace mrstack::test
