#pragma once
/// `thread_safe_resource_adaptor`: makes a resource that is not thread-safe safe to share
/// between threads by holding one mutex around every call into it (allocate, deallocate,
/// free_bytes_held, release, fragmentation). Use it above a layer whose doc comment says it is
/// single-threaded; the layers mrstack ships are thread-safe already, so over them it
/// only adds the cost of the lock.
///
/// The mutex is recursive: a call that re-enters the stack from below on the same thread
/// — a `retry` layer's callback that calls `release()` on the stack's top, or frees
/// through it — goes through instead of deadlocking on the lock its own call holds.
///
/// Thread-safe. `name()` is "thread_safe".
#include <mutex>
#include <utility>

#include <mrstack/resource.hpp>

namespace mrstack {

class thread_safe_resource_adaptor final : public memory_resource {
 public:
  explicit thread_safe_resource_adaptor(resource_ptr upstream) : upstream_{std::move(upstream)} {
    if (upstream_ == nullptr) { throw logic_error("thread_safe: upstream resource is null"); }
  }

  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    std::lock_guard lock{mutex_};
    return upstream_->allocate(bytes, stream, alignment);
  }
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    std::lock_guard lock{mutex_};
    upstream_->deallocate(ptr, bytes, stream, alignment);
  }
  std::size_t do_free_bytes_held() const noexcept override {
    std::lock_guard lock{mutex_};
    return upstream_->free_bytes_held();
  }
  fragmentation_info do_fragmentation() const override {
    std::lock_guard lock{mutex_};
    return upstream_->fragmentation();
  }
  void do_release() override {
    std::lock_guard lock{mutex_};
    upstream_->release();
  }
  std::string do_name() const override { return "thread_safe"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  mutable std::recursive_mutex mutex_;
};

}  // namespace mrstack
