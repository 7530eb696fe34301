#pragma once
/// `device_buffer`: an owning, untyped allocation — bytes, the stream it belongs to, and the
/// resource it came from (kept alive by `shared_ptr`). Freed on its stream when destroyed.
/// Movable, not copyable (copying device memory is an explicit act).
#include <cstddef>
#include <cstdio>
#include <exception>
#include <utility>

#include <mrstack/current.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(std::size_t bytes, stream_view stream, resource_ptr resource = get_current_device_resource())
      : resource_{std::move(resource)}, stream_{stream}, size_{bytes} {
    if (!resource_) { throw logic_error("device_buffer: no resource given (null resource_ptr)"); }
    data_ = resource_->allocate(size_, stream_);
  }
  ~device_buffer() { reset(); }

  device_buffer(device_buffer&& other) noexcept
      : resource_{std::move(other.resource_)},
        stream_{other.stream_},
        data_{std::exchange(other.data_, nullptr)},
        size_{std::exchange(other.size_, 0)} {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      resource_ = std::move(other.resource_);
      stream_ = other.stream_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;

  [[nodiscard]] void* data() noexcept { return data_; }
  [[nodiscard]] void const* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] stream_view stream() const noexcept { return stream_; }
  [[nodiscard]] resource_ptr const& resource() const noexcept { return resource_; }

  /// Frees the memory now (on the buffer's stream) and leaves the buffer empty.
  void reset() noexcept {
    if (data_ != nullptr) {
      try {
        resource_->deallocate(data_, size_, stream_);
      } catch (std::exception const& e) {  // a checking resource objected; never throw from a destructor
        std::fprintf(stderr, "mrstack: device_buffer could not free %zu bytes at %p: %s\n", size_, data_, e.what());
      }
    }
    data_ = nullptr;
    size_ = 0;
  }

 private:
  resource_ptr resource_;
  stream_view stream_{};
  void* data_{nullptr};
  std::size_t size_{0};
};

}  // namespace mrstack
