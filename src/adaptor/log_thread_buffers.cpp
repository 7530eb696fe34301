#include "log_thread_buffers.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

#include <spdlog/logger.h>

namespace mrstack::detail {

namespace {

std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int64_t wall_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

log_thread_buffers::log_thread_buffers(std::shared_ptr<spdlog::logger> logger, std::size_t buffer_bytes,
                                       bool write_each_row)
    : logger_{std::move(logger)},
      buffer_bytes_{std::max(buffer_bytes, 2 * max_row_length)},
      write_each_row_{write_each_row},
      start_ns_{steady_ns()},
      wall_offset_ns_{wall_ns() - start_ns_} {}

log_thread_buffers::~log_thread_buffers() {
  for (auto& slot : buffers_) {
    buffer* b = slot.load(std::memory_order_acquire);
    if (b == nullptr) { continue; }
    {
      std::lock_guard lock{b->mutex};
      write_out(*b);
    }
    delete b;
  }
}

log_thread_buffers::buffer* log_thread_buffers::buffer_for(std::size_t shard) noexcept {
  buffer* b = buffers_[shard].load(std::memory_order_acquire);
  if (b != nullptr) { return b; }
  std::lock_guard lock{create_mutex_};
  b = buffers_[shard].load(std::memory_order_relaxed);
  if (b == nullptr) {
    try {
      b = new buffer(buffer_bytes_);
    } catch (...) {
      return nullptr;
    }
    buffers_[shard].store(b, std::memory_order_release);
  }
  return b;
}

void log_thread_buffers::push(log_record& record) noexcept {
  buffer* b = buffer_for(this_thread_shard());
  if (b == nullptr) { return; }  // no memory for a buffer: the row is lost, the call is not
  std::lock_guard lock{b->mutex};
  if (b->text.size() - b->used < max_row_length + 24) { write_out(*b); }
  // Stamped under the buffer's lock, so one buffer's rows are in stamp order even when
  // threads share it. A free is stamped before it is forwarded and the allocation that
  // reuses its memory after the upstream returned it: sorted by stamp (frees first at a
  // tie), the file is a valid serial history.
  std::int64_t const stamp = steady_ns();
  record.time_ns = stamp + wall_offset_ns_;
  thread_local row_writer writer;
  char* const out = writer.put_stamped(b->text.data() + b->used, record, static_cast<std::uint64_t>(stamp - start_ns_));
  b->used = static_cast<std::size_t>(out - b->text.data());
  if (write_each_row_) {  // auto_flush: in the file before the call returns
    write_out(*b);
    logger_->flush();
  }
}

void log_thread_buffers::write_out(buffer& b) noexcept {
  if (b.used == 0) { return; }
  // One message of whole lines; the sink adds the last newline. spdlog reports sink
  // errors through its error handler, so this does not throw.
  logger_->log(spdlog::level::info, spdlog::string_view_t{b.text.data(), b.used - 1});
  b.used = 0;
}

void log_thread_buffers::flush() {
  for (auto& slot : buffers_) {
    buffer* b = slot.load(std::memory_order_acquire);
    if (b == nullptr) { continue; }
    std::lock_guard lock{b->mutex};
    write_out(*b);
  }
  logger_->flush();
}

}  // namespace mrstack::detail
