#include "log_thread_buffers.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include <spdlog/logger.h>

#include <mrstack/log/binary_log.hpp>

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
                                       bool write_each_row, bool binary)
    : logger_{std::move(logger)},
      buffer_bytes_{std::max(buffer_bytes, 2 * max_row_length)},
      write_each_row_{write_each_row},
      binary_{binary},
      start_ns_{steady_ns()},
      wall_offset_ns_{wall_ns() - start_ns_} {
  if (binary_) {
    binary_log::file_header header{};
    std::memcpy(header.magic, binary_log::file_magic, sizeof header.magic);
    header.version = binary_log::format_version;
    header.record_size = binary_log::record_bytes;
    header.start_wall_ns = start_ns_ + wall_offset_ns_;
    logger_->log(spdlog::level::info,
                 spdlog::string_view_t{reinterpret_cast<char const*>(&header), sizeof header});
  }
}

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
  put_row(*b, record);
  if (write_each_row_) {  // auto_flush: in the file before the call returns
    write_out(*b);
    logger_->flush();
  }
}

void log_thread_buffers::put_row(buffer& b, log_record& record) noexcept {
  if (binary_) {
    put_binary(b, record);
    return;
  }
  if (b.text.size() - b.used < max_row_length + 24) { write_out(b); }
  // Stamped under the buffer's lock, so one buffer's rows are in stamp order even when
  // threads share it. A free is stamped before it is forwarded and the allocation that
  // reuses its memory after the upstream returned it: sorted by stamp (frees first at a
  // tie), the file is a valid serial history.
  std::int64_t const stamp = steady_ns();
  record.time_ns = stamp + wall_offset_ns_;
  thread_local row_writer writer;
  char* const out = writer.put_stamped(b.text.data() + b.used, record, static_cast<std::uint64_t>(stamp - start_ns_));
  b.used = static_cast<std::size_t>(out - b.text.data());
}

void log_thread_buffers::put_binary(buffer& b, log_record const& record) noexcept {
  constexpr std::size_t most = binary_log::block_header_bytes + 2 * binary_log::record_bytes;
  if (b.text.size() - b.used < most) { write_out(b); }
  auto append = [&b](binary_log::record const& r) {
    std::memcpy(b.text.data() + b.used, &r, sizeof r);
    b.used += sizeof r;
    ++b.records;
  };
  if (b.used == 0) { b.used = binary_log::block_header_bytes; }  // filled in by write_out
  if (b.records == 0 || b.thread != record.thread) {
    // A block starts by naming its thread, and names the next when threads share the buffer.
    append({std::uint64_t{3} << binary_log::kind_shift, record.thread, 0, 0});
    b.thread = record.thread;
  }
  // Stamped under the buffer's lock, as the text rows are (see put_row).
  auto const stamp = static_cast<std::uint64_t>(steady_ns() - start_ns_) & binary_log::stamp_mask;
  append({stamp | std::uint64_t{record.action} << binary_log::kind_shift, record.pointer, record.bytes, record.stream});
}

void log_thread_buffers::write_out(buffer& b) noexcept {
  if (b.used == 0) { return; }
  if (binary_) {
    std::memcpy(b.text.data(), &binary_log::block_magic, 4);
    std::memcpy(b.text.data() + 4, &b.records, 4);
    logger_->log(spdlog::level::info, spdlog::string_view_t{b.text.data(), b.used});  // no newline added
    b.used = 0;
    b.records = 0;
    return;
  }
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
