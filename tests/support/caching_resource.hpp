#pragma once
// A minimal caching layer for the EMM adapter's tests (CPU and GPU): keeps freed blocks
// (exact size) and reports them as held free, a stand-in for a pool, so the adapter's
// memory info and its reset-time release() can be observed.
#include <mrstack/resource.hpp>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

namespace mrstack::test {

class caching_resource final : public memory_resource {
 public:
  explicit caching_resource(resource_ptr up) : up_{std::move(up)} {}
  std::size_t release_calls() const {
    std::lock_guard lock{mutex_};
    return release_calls_;
  }
  std::size_t cached_blocks() const {
    std::lock_guard lock{mutex_};
    return cache_.size();
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view s) override {
    {
      std::lock_guard lock{mutex_};
      if (auto it = cache_.find(bytes); it != cache_.end()) {
        void* p = it->second;
        cache_.erase(it);
        held_ -= bytes;
        return p;
      }
    }
    return up_->allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t, stream_view) override {
    std::lock_guard lock{mutex_};
    cache_.emplace(bytes, p);
    held_ += bytes;
  }
  std::string do_name() const override { return "caching"; }
  memory_resource* do_upstream() const noexcept override { return up_.get(); }
  std::size_t do_free_bytes_held() const noexcept override {
    std::lock_guard lock{mutex_};
    return held_;
  }
  void do_release() override {
    std::multimap<std::size_t, void*> cache;
    {
      std::lock_guard lock{mutex_};
      ++release_calls_;
      cache.swap(cache_);
      held_ = 0;
    }
    for (auto const& [bytes, p] : cache) { up_->deallocate(p, bytes); }
  }

  resource_ptr up_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> cache_;
  std::size_t held_ = 0;
  std::size_t release_calls_ = 0;
};

}  // namespace mrstack::test
