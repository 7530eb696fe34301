#include "log_thread_buffers.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include <pthread.h>

#include <spdlog/logger.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <mrstack/error.hpp>
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

std::atomic<std::uint64_t> next_instance_id{1};

using buffer = log_thread_buffers::buffer;

/// The calling thread's most recently used buffers, by instance id: trivially
/// destructible, so reading it needs no thread_local guard.
struct cache_slot {
  std::uint64_t owner;
  buffer* b;
};
constexpr std::size_t cache_slots = 4;
thread_local cache_slot hot_cache[cache_slots];
thread_local bool thread_exiting = false;

/// Every buffer the calling thread owns; at its exit they are orphaned (for another
/// thread to adopt) and later calls of this thread write alone.
struct owned_buffers {
  struct held {
    std::uint64_t owner;
    buffer* raw;                // valid while its instance lives: only its calls read it
    std::weak_ptr<buffer> keep; // for the exit, which may come after the instance died
  };
  std::vector<held> list;

  ~owned_buffers() {
    thread_exiting = true;
    std::fill(std::begin(hot_cache), std::end(hot_cache), cache_slot{0, nullptr});
    for (auto& h : list) {
      if (auto b = h.keep.lock()) {
        // Out first: a row this thread writes alone later must follow these in the file.
        drain(*b);
        b->orphaned.store(true, std::memory_order_release);
      }
    }
  }
};

owned_buffers& this_thread_owned() {
  thread_local owned_buffers owned;
  return owned;
}

constexpr auto thread_kind = std::uint64_t{3} << binary_log::kind_shift;

/// An allocate, allocate-failure or free record.
binary_log::record event_record(log_record const& r, std::uint64_t stamp) noexcept {
  return {(stamp & binary_log::stamp_mask) | std::uint64_t{r.action} << binary_log::kind_shift, r.pointer, r.bytes,
          r.stream};
}

bool is_thread_record(char const* at) noexcept {
  std::uint64_t word = 0;
  std::memcpy(&word, at, sizeof word);
  return (word >> binary_log::kind_shift) == 3;
}

std::uint64_t read_ticks() noexcept {
#if defined(__x86_64__)
  unsigned core = 0;
  return __builtin_ia32_rdtscp(&core);  // after every earlier load, as the monotonic clock's read
#else
  return 0;
#endif
}

/// The counter and the monotonic clock read together: the ticks halfway between two
/// counter reads around the clock's. The reader draws its tick-to-ns line through these
/// points, so one read across a preemption or an interrupt (its ns milliseconds off its
/// ticks) bent the line: the stamps of a whole stretch were pressed into a few ns, where an
/// allocation and the free of its block on another thread tied and the reader, putting
/// frees first at a tie, refused the log. So a read whose two counter reads lie more than
/// `tight_point_ticks` apart (a few µs; a read takes some 100-300 ticks) is made again,
/// and of `point_attempts` the tightest is kept.
struct clock_point {
  std::uint64_t ticks;
  std::int64_t ns;
};
constexpr std::uint64_t tight_point_ticks = 4096;
constexpr int point_attempts = 4;

clock_point read_together() noexcept {
  clock_point best{};
  std::uint64_t best_spread = ~std::uint64_t{0};
  for (int attempt = 0; attempt < point_attempts && best_spread > tight_point_ticks; ++attempt) {
    std::uint64_t const before = read_ticks();
    std::int64_t const ns = steady_ns();
    if (auto const hook = tick_point_hook.load(std::memory_order_relaxed)) { hook(); }
    std::uint64_t const spread = read_ticks() - before;
    if (spread < best_spread) {
      best_spread = spread;
      best = {before + spread / 2, ns};
    }
  }
  return best;
}

std::shared_ptr<log_thread_buffers::sink> make_sink(std::shared_ptr<spdlog::logger> logger, bool binary,
                                                    bool ticks) {
  auto s = std::make_shared<log_thread_buffers::sink>();
  s->logger = std::move(logger);
  s->binary = binary;
  s->ticks = binary && ticks;
  s->forks = watch_forks();
  // The origin of both stamps, read together (the reader's first point).
  clock_point const origin = read_together();
  s->start_ticks = origin.ticks;
  s->start_ns = origin.ns;
  return s;
}

/// A thread record; with tick stamps, it carries a (ticks, ns) point read now.
binary_log::record thread_record(log_thread_buffers::sink const& out, std::size_t thread) noexcept {
  if (!out.ticks) { return {thread_kind, thread, 0, 0}; }
  clock_point const now = read_together();
  return {thread_kind, thread, now.ticks - out.start_ticks, static_cast<std::uint64_t>(now.ns - out.start_ns)};
}

}  // namespace

std::uint32_t watch_forks() noexcept {
  static int const registered = ::pthread_atfork(nullptr, nullptr, [] {
    process_forks.fetch_add(1, std::memory_order_relaxed);
  });
  static_cast<void>(registered);  // fails only without memory: forks then go unnoticed, as before
  return process_forks.load(std::memory_order_relaxed);
}

bool binary_stamps_in_ticks() {
  // A value the adaptor does not know (a misspelt "steady", "monotonic") was taken as unset:
  // the stamps were counter ticks while the variable seemed to ask otherwise.
  char const* asked = std::getenv(log_clock_variable);
  if (asked != nullptr && *asked != '\0' && std::string_view{asked} != "steady") {
    throw logic_error(std::string{"logging: "} + log_clock_variable + "='" + asked +
                      "' is not a clock this logger knows: set it to 'steady' (the monotonic clock) or leave it unset "
                      "(counter ticks where the kernel keeps time by the counter)");
  }
  if (asked != nullptr && *asked != '\0') { return false; }
#if defined(__x86_64__)
  // A hypervisor may hide rdtscp while the guest kernel still keeps time by the counter:
  // the instruction would then end the program (SIGILL) at the first stamp. (CPUID
  // 0x80000001 EDX bit 27 is RDTSCP.)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 27)) == 0) { return false; }
  std::ifstream source{"/sys/devices/system/clocksource/clocksource0/current_clocksource"};
  std::string name;
  source >> name;
  return name == "tsc";
#else
  return false;
#endif
}

log_thread_buffers::log_thread_buffers(std::shared_ptr<spdlog::logger> logger, std::size_t buffer_bytes,
                                       bool write_each_row, bool binary, bool ticks)
    : sink_{make_sink(std::move(logger), binary, ticks)},
      ticks_{sink_->ticks},
      start_ticks_{sink_->start_ticks},
      buffer_bytes_{std::max(buffer_bytes, 2 * max_row_length)},
      write_each_row_{write_each_row},
      binary_{binary},
      id_{next_instance_id.fetch_add(1, std::memory_order_relaxed)},
      start_ns_{sink_->start_ns},
      wall_offset_ns_{wall_ns() - start_ns_} {
  if (binary_) {
    binary_log::file_header header{};
    std::memcpy(header.magic, binary_log::file_magic, sizeof header.magic);
    header.version = binary_log::format_version;
    header.record_size = binary_log::record_bytes;
    header.start_wall_ns = start_ns_ + wall_offset_ns_;
    header.clock = sink_->ticks ? binary_log::clock_ticks : binary_log::clock_ns;
    sink_->logger->log(spdlog::level::info,
                       spdlog::string_view_t{reinterpret_cast<char const*>(&header), sizeof header});
  }
}

log_thread_buffers::~log_thread_buffers() {
  for (auto const& b : buffers_) {
    std::lock_guard lock{b->consumer};
    write_out(*b, b->committed.load(std::memory_order_acquire));
  }
}

std::uint64_t log_thread_buffers::stamp_now() const noexcept {
  if (ticks_) { return read_ticks() - start_ticks_; }
  return static_cast<std::uint64_t>(steady_ns() - start_ns_);
}

log_thread_buffers::buffer* log_thread_buffers::this_thread_buffer() noexcept {
  for (auto const& slot : hot_cache) {
    if (slot.owner == id_) { return slot.b; }
  }
  if (thread_exiting) { return nullptr; }
  owned_buffers& owned = this_thread_owned();
  buffer* b = nullptr;
  for (auto const& h : owned.list) {
    if (h.owner == id_) { b = h.raw; }
  }
  if (b == nullptr) {
    b = adopt_or_make();
    if (b == nullptr) { return nullptr; }
  }
  std::move_backward(hot_cache, hot_cache + cache_slots - 1, hot_cache + cache_slots);
  hot_cache[0] = {id_, b};
  return b;
}

log_thread_buffers::buffer* log_thread_buffers::adopt_or_make() noexcept {
  owned_buffers& owned = this_thread_owned();
  std::erase_if(owned.list, [](owned_buffers::held const& h) { return h.keep.expired(); });
  try {
    std::lock_guard lock{buffers_mutex_};
    std::shared_ptr<buffer> b;
    for (auto const& candidate : buffers_) {
      // Acquire: the exited owner's appends (and its `used`) are seen here.
      if (candidate->orphaned.load(std::memory_order_acquire)) {
        candidate->orphaned.store(false, std::memory_order_relaxed);
        b = candidate;
        break;
      }
    }
    if (!b) {
      // Past the first 64 (threads logging at once), small buffers: memory stays bounded
      // by the threads' count at 16 KiB each, not at the full size.
      std::size_t const bytes = buffers_.size() < full_size_buffers ? buffer_bytes_ : small_buffer_bytes;
      b = buffers_.emplace_back(std::make_shared<buffer>(bytes, sink_));
    }
    owned.list.push_back({id_, b.get(), b});
    return b.get();
  } catch (...) {
    return nullptr;  // no memory for a buffer: the caller writes its row alone
  }
}

void log_thread_buffers::push(log_record& record) noexcept {
  buffer* b = this_thread_buffer();
  if (b == nullptr) [[unlikely]] {
    write_alone(record);
    return;
  }
  append_row(*b, record);
  b->committed.store(b->used, std::memory_order_release);
  if (write_each_row_) {  // auto_flush: in the file before the call returns
    drain(*b);
    sink_->logger->flush();
  }
}

void log_thread_buffers::append_row(buffer& b, log_record& record) noexcept {
  if (binary_) {
    append_binary(b, record);
    return;
  }
  if (b.text.size() - b.used < max_row_length + 24) { drain(b); }
  // A free is stamped before it is forwarded and the allocation that reuses its memory
  // after the upstream returned it: sorted by stamp (frees first at a tie), the file is a
  // valid serial history. One owner at a time, so a buffer's stamps rise.
  std::uint64_t const stamp = stamp_now();
  record.time_ns = start_ns_ + wall_offset_ns_ + static_cast<std::int64_t>(stamp);
  thread_local row_writer writer;
  char* const out = writer.put_stamped(b.text.data() + b.used, record, stamp);
  b.used = static_cast<std::size_t>(out - b.text.data());
}

void log_thread_buffers::append_binary(buffer& b, log_record const& record) noexcept {
  if (b.text.size() - b.used < 2 * binary_log::record_bytes) { drain(b); }
  auto append = [&b](binary_log::record const& r) {
    std::memcpy(b.text.data() + b.used, &r, sizeof r);
    b.used += sizeof r;
  };
  if (!b.thread_named) {
    // A new buffer's first record: every block a write-out makes names its first record's
    // thread, so none is appended. Nothing is committed yet, so no consumer reads
    // `written_thread` now, and the commit publishes it.
    b.thread = b.written_thread = record.thread;
    b.thread_named = true;
  } else if (b.thread != record.thread) {  // an adopted buffer changes thread
    append(thread_record(*b.out, record.thread));
    b.thread = record.thread;
  }
  append(event_record(record, stamp_now()));
}

void drain(log_thread_buffers::buffer& b) noexcept {
  std::lock_guard lock{b.consumer};
  write_out(b, b.used);
  b.used = 0;
  b.written = 0;
  b.committed.store(0, std::memory_order_relaxed);  // consumers read it under `consumer`
}

void write_out(log_thread_buffers::buffer& b, std::size_t upto) noexcept {
  if (upto <= b.written) { return; }
  if (process_forks.load(std::memory_order_relaxed) != b.out->forks) [[unlikely]] {
    // A fork's child (at its thread's exit): these rows are copies of the parent's, which
    // the parent writes itself. Dropped, not written twice.
    b.written = upto;
    return;
  }
  spdlog::logger& logger = *b.out->logger;
  char const* const from = b.text.data() + b.written;
  std::size_t const bytes = upto - b.written;
  b.written = upto;
  // spdlog reports sink errors through its error handler, so nothing here throws.
  if (!b.out->binary) {  // whole lines, one message; the sink adds the last newline
    logger.log(spdlog::level::info, spdlog::string_view_t{from, bytes - 1});
    return;
  }
  // A block: its header, the thread of its first record, the records.
  struct {
    std::uint32_t magic = binary_log::block_magic;
    std::uint32_t count = 0;
    binary_log::record thread{};
  } head;
  head.count = static_cast<std::uint32_t>(bytes / binary_log::record_bytes + 1);
  head.thread = thread_record(*b.out, b.written_thread);  // and, with ticks, the block's point
  for (std::size_t at = 0; at < bytes; at += binary_log::record_bytes) {
    if (is_thread_record(from + at)) { std::memcpy(&b.written_thread, from + at + 8, sizeof b.written_thread); }
  }
  std::lock_guard together{b.out->mutex};  // no other block between its two pieces
  logger.log(spdlog::level::info, spdlog::string_view_t{reinterpret_cast<char const*>(&head), sizeof head});
  logger.log(spdlog::level::info, spdlog::string_view_t{from, bytes});
}

void log_thread_buffers::write_alone(log_record& record) noexcept {
  std::uint64_t const stamp = stamp_now();
  if (!binary_) {
    record.time_ns = start_ns_ + wall_offset_ns_ + static_cast<std::int64_t>(stamp);
    row_writer writer;
    char row[max_row_length];
    char const* const end = writer.put_stamped(row, record, stamp);
    sink_->logger->log(spdlog::level::info, spdlog::string_view_t{row, static_cast<std::size_t>(end - row - 1)});
    if (write_each_row_) { sink_->logger->flush(); }  // auto_flush: in the file before the call returns
    return;
  }
  struct {
    std::uint32_t magic = binary_log::block_magic;
    std::uint32_t count = 2;
    binary_log::record thread{};
    binary_log::record event{};
  } block;
  block.thread = thread_record(*sink_, record.thread);
  block.event = event_record(record, stamp);
  {
    std::lock_guard together{sink_->mutex};
    sink_->logger->log(spdlog::level::info, spdlog::string_view_t{reinterpret_cast<char const*>(&block), sizeof block});
  }
  if (write_each_row_) { sink_->logger->flush(); }
}

std::size_t log_thread_buffers::buffer_count() {
  std::lock_guard lock{buffers_mutex_};
  return buffers_.size();
}

void log_thread_buffers::flush() {
  std::vector<std::shared_ptr<buffer>> all;
  {
    std::lock_guard lock{buffers_mutex_};
    all = buffers_;
  }
  for (auto const& b : all) {
    std::lock_guard lock{b->consumer};
    write_out(*b, b->committed.load(std::memory_order_acquire));
  }
  sink_->logger->flush();
}

}  // namespace mrstack::detail
