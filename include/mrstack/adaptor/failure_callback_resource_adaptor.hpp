#pragma once
/// `failure_callback_resource_adaptor` (spec name "retry"): when the upstream refuses a
/// request with `out_of_memory`, gives the program a chance to free memory and tries again.
///
/// - With a callback `bool(std::size_t bytes, void* arg)`: on each refusal the callback is
///   called with the bytes asked and the `arg` given at construction; while it returns
///   true the request is retried, and when it returns false the last `out_of_memory` is
///   rethrown. Typical callbacks ask a Python host to collect garbage, or release a
///   pool's free chunks. The callback decides when to give up (count attempts in `arg`
///   or in the callable); it may run on any allocating thread, concurrently.
/// - Without one (`max_retries`): on each refusal, up to `max_retries` times, the adaptor
///   calls `release()` on the stack below (pools give their wholly free chunks back to the
///   system, which may let the next level satisfy the request) and retries.
///
/// Other exceptions pass through untouched. The callback lives in a `std::function`: it
/// runs only on the failure path, so the hot path is one virtual call into the upstream.
///
/// Thread-safe (as far as the callback is). `name()` is "retry".
#include <cstddef>
#include <functional>
#include <utility>

#include <mrstack/resource.hpp>

namespace mrstack {

class failure_callback_resource_adaptor final : public memory_resource {
 public:
  using failure_callback = std::function<bool(std::size_t bytes, void* arg)>;

  failure_callback_resource_adaptor(resource_ptr upstream, failure_callback callback, void* arg = nullptr)
      : upstream_{std::move(upstream)}, callback_{std::move(callback)}, arg_{arg} {
    check_upstream();
    if (!callback_) { throw logic_error("retry: the failure callback is empty"); }
  }

  /// Retries up to `max_retries` times, releasing the stack below before each retry.
  explicit failure_callback_resource_adaptor(resource_ptr upstream, std::size_t max_retries = 1)
      : upstream_{std::move(upstream)}, max_retries_{max_retries} {
    check_upstream();
  }

  /// Retries without a callback, or 0 with one.
  [[nodiscard]] std::size_t max_retries() const noexcept { return callback_ ? 0 : max_retries_; }
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  void check_upstream() const {
    if (upstream_ == nullptr) { throw logic_error("retry: upstream resource is null"); }
  }

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    for (std::size_t attempt = 0;; ++attempt) {
      try {
        return upstream_->allocate(bytes, stream, alignment);
      } catch (out_of_memory const&) {
        if (!should_retry(bytes, attempt)) { throw; }
      }
    }
  }

  bool should_retry(std::size_t bytes, std::size_t attempt) {
    if (callback_) { return callback_(bytes, arg_); }
    if (attempt >= max_retries_) { return false; }
    upstream_->release();
    return true;
  }

  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    upstream_->deallocate(ptr, bytes, stream, alignment);
  }
  std::string do_name() const override { return "retry"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  failure_callback callback_;
  void* arg_{nullptr};
  std::size_t max_retries_{0};
};

/// The spec's name for it.
using retry_resource_adaptor = failure_callback_resource_adaptor;

}  // namespace mrstack
