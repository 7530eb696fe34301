#pragma once
// The fake stream seam, but creating an event fails while `fail_creates` is set (as a
// cudaEventCreate that runs out of resources throws). For tests of what a resource does
// when a record it would make cannot be made.
#include <fake_stream_sync.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <stdexcept>

namespace mrstack::test {

class failing_create_sync final : public detail::stream_sync {
 public:
  std::shared_ptr<fake_stream_sync> inner = std::make_shared<fake_stream_sync>();
  std::atomic<bool> fail_creates{false};
  std::atomic<std::size_t> failed_creates{0};

  handle create_event() override {
    if (fail_creates.load()) {
      ++failed_creates;
      throw std::runtime_error("no events left");
    }
    return inner->create_event();
  }
  void destroy_event(handle e) noexcept override { inner->destroy_event(e); }
  bool record(handle e, handle s) override { return inner->record(e, s); }
  void wait(handle s, handle e) override { inner->wait(s, e); }
  void synchronize(handle s) override { inner->synchronize(s); }
  void synchronize_all() override { inner->synchronize_all(); }
  bool idle(handle s) override { return inner->idle(s); }
  bool capturing(handle s) override { return inner->capturing(s); }
};

}  // namespace mrstack::test
