#include <mrstack/adaptor/logging_resource_adaptor.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spdlog/details/os.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ostream_sink.h>

#include <mrstack/detail/mpsc_ring.hpp>

namespace mrstack {

namespace detail {

/// One event, stamped on the calling thread; formatted later (asynchronous mode) or at once.
struct log_record {
  std::size_t thread;
  std::int64_t time_ns;  // system_clock, since the epoch
  std::uintptr_t pointer;
  std::size_t bytes;
  std::uintptr_t stream;
  std::uint8_t action;
};

namespace {

constexpr char const* action_text[] = {"allocate", "allocate failure", "free"};

char* put_decimal(char* out, std::uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) { *out++ = tmp[--n]; }
  return out;
}

char* put_hex(char* out, std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = digits[v & 0xf];
    v >>= 4;
  } while (v != 0);
  while (n > 0) { *out++ = tmp[--n]; }
  return out;
}

/// Local wall-clock "HH:MM:SS", recomputed only when the second changes (localtime_r
/// takes the time-zone lock and costs far more than the rest of a row).
class clock_text {
 public:
  char* put(char* out, std::int64_t time_ns) {
    std::int64_t const seconds = time_ns >= 0 ? time_ns / 1'000'000'000 : (time_ns - 999'999'999) / 1'000'000'000;
    if (seconds != second_) {
      second_ = seconds;
      std::time_t const t = static_cast<std::time_t>(seconds);
      std::tm local{};
      localtime_r(&t, &local);
      two_digits(hms_ + 0, local.tm_hour);
      hms_[2] = ':';
      two_digits(hms_ + 3, local.tm_min);
      hms_[5] = ':';
      two_digits(hms_ + 6, local.tm_sec);
    }
    for (char c : hms_) { *out++ = c; }
    *out++ = '.';
    auto micros = static_cast<std::uint32_t>((time_ns - seconds * 1'000'000'000) / 1000);
    for (int i = 5; i >= 0; --i) {
      out[i] = static_cast<char>('0' + micros % 10);
      micros /= 10;
    }
    return out + 6;
  }

 private:
  static void two_digits(char* out, int v) {
    out[0] = static_cast<char>('0' + v / 10);
    out[1] = static_cast<char>('0' + v % 10);
  }
  std::int64_t second_{std::numeric_limits<std::int64_t>::min()};
  char hms_[8]{};
};

constexpr std::size_t max_row_length = 160;

/// Writes one row, newline included; returns the end.
char* put_row(char* out, log_record const& r, clock_text& clock) {
  out = put_decimal(out, r.thread);
  *out++ = ',';
  out = clock.put(out, r.time_ns);
  *out++ = ',';
  for (char const* a = action_text[r.action]; *a != '\0'; ++a) { *out++ = *a; }
  *out++ = ',';
  if (r.pointer == 0) {
    for (char c : {'(', 'n', 'i', 'l', ')'}) { *out++ = c; }
  } else {
    *out++ = '0';
    *out++ = 'x';
    out = put_hex(out, r.pointer);
  }
  *out++ = ',';
  out = put_decimal(out, r.bytes);
  *out++ = ',';
  if (r.stream == 0) {
    *out++ = '0';
  } else {
    *out++ = '0';
    *out++ = 'x';
    out = put_hex(out, r.stream);
  }
  *out++ = '\n';
  return out;
}

}  // namespace

/// The asynchronous half: a lock-free ring the allocating threads push records into, and
/// one writer thread that formats them in batches and hands each batch to the sinks as
/// one message of whole lines.
class async_log_writer {
 public:
  async_log_writer(std::shared_ptr<spdlog::logger> logger, std::size_t capacity, bool flush_each_batch)
      : ring_{capacity},
        wake_mask_{capacity / 8 - 1},
        logger_{std::move(logger)},
        flush_each_batch_{flush_each_batch},
        thread_{[this] { run(); }} {}

  ~async_log_writer() {
    {
      std::lock_guard lock{mutex_};
      stop_ = true;
    }
    wake_cv_.notify_one();
    thread_.join();
  }

  async_log_writer(async_log_writer const&) = delete;
  async_log_writer& operator=(async_log_writer const&) = delete;

  void push(log_record const& record) noexcept {
    std::size_t const ticket = ring_.push(record, [this] { wake(); });
    // The writer naps when it finds the ring empty; waking it costs a system call, so a
    // producer does it only every capacity/8 records, and only when the writer is napping.
    // A missed wake-up (the flag read stale) costs latency, not records: the nap is short.
    if ((ticket & wake_mask_) == 0 && sleeping_.load(std::memory_order_relaxed)) { wake(); }
  }

  void flush() {
    std::size_t const target = ring_.claimed();
    std::unique_lock lock{mutex_};
    ++flush_waiters_;
    while (written_.load(std::memory_order_acquire) < target) {
      sleeping_.store(false, std::memory_order_relaxed);
      wake_cv_.notify_one();
      written_cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    --flush_waiters_;
    lock.unlock();
    logger_->flush();
  }

 private:
  static constexpr std::size_t batch_rows = 1024;
  static constexpr auto nap = std::chrono::milliseconds(5);

  void wake() noexcept {
    if (sleeping_.exchange(false)) {
      std::lock_guard lock{mutex_};
      wake_cv_.notify_one();
    }
  }

  void run() {
    std::string batch;
    batch.resize(batch_rows * max_row_length);
    clock_text clock;
    for (;;) {
      char* out = batch.data();
      std::size_t rows = 0;
      log_record record{};
      while (rows < batch_rows && ring_.try_pop(record)) {
        out = put_row(out, record, clock);
        ++rows;
      }
      if (rows > 0) {
        // One message of whole lines (the sink appends the last newline): a sink shared
        // with other writers can interleave batches, never parts of a line.
        logger_->log(spdlog::level::info, spdlog::string_view_t{batch.data(), static_cast<std::size_t>(out - batch.data() - 1)});
        if (flush_each_batch_) { logger_->flush(); }
        written_.store(ring_.popped(), std::memory_order_release);
        if (flush_waiters_.load(std::memory_order_relaxed) > 0) {
          std::lock_guard lock{mutex_};
          written_cv_.notify_all();
        }
        continue;
      }
      std::unique_lock lock{mutex_};
      if (stop_) {
        // The owner is being destroyed: no producer is left. Anything claimed is published.
        if (ring_.popped() == ring_.claimed()) { break; }
        continue;
      }
      sleeping_.store(true);
      if (ring_.has_next()) {
        sleeping_.store(false);
        continue;
      }
      wake_cv_.wait_for(lock, nap, [this] { return !sleeping_.load() || stop_; });
      sleeping_.store(false);
    }
    logger_->flush();
  }

  mpsc_ring<log_record> ring_;
  std::size_t wake_mask_;
  std::shared_ptr<spdlog::logger> logger_;
  bool flush_each_batch_;
  std::mutex mutex_;
  std::condition_variable wake_cv_;
  std::condition_variable written_cv_;
  std::atomic<bool> sleeping_{false};
  std::atomic<std::size_t> written_{0};
  std::atomic<int> flush_waiters_{0};
  bool stop_{false};  // guarded by mutex_
  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace detail

namespace {

std::string resolve_path(std::string const& path) {
  if (!path.empty()) { return path; }
  char const* from_env = std::getenv(logging_resource_adaptor::log_file_variable);
  if (from_env == nullptr || *from_env == '\0') {
    throw logic_error(std::string{"logging: no log file given and "} + logging_resource_adaptor::log_file_variable +
                      " is unset");
  }
  return from_env;
}

spdlog::sink_ptr open_file_sink(std::string const& path) {
  try {
    return std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/true);
  } catch (spdlog::spdlog_ex const& e) {
    throw std::runtime_error("logging: cannot open log file '" + path + "' for writing (" + e.what() + ")");
  }
}

resource_ptr checked_upstream(resource_ptr upstream) {
  if (upstream == nullptr) { throw logic_error("logging: upstream resource is null"); }
  return upstream;
}

}  // namespace

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::string const& path, bool auto_flush,
                                                   bool async, std::size_t queue_capacity)
    : logging_resource_adaptor(checked_upstream(std::move(upstream)), std::vector<spdlog::sink_ptr>{},
                               resolve_path(path), auto_flush, async, queue_capacity, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::ostream& stream, bool auto_flush,
                                                   bool async, std::size_t queue_capacity)
    : logging_resource_adaptor(std::move(upstream),
                               std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::ostream_sink_mt>(stream)},
                               std::string{}, auto_flush, async, queue_capacity, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks,
                                                   bool auto_flush, bool async, std::size_t queue_capacity)
    : logging_resource_adaptor(std::move(upstream), std::move(sinks), std::string{}, auto_flush, async,
                               queue_capacity, 0) {}

logging_resource_adaptor::logging_resource_adaptor(resource_ptr upstream, std::vector<spdlog::sink_ptr> sinks,
                                                   std::string path, bool auto_flush, bool async,
                                                   std::size_t queue_capacity, int)
    : upstream_{checked_upstream(std::move(upstream))}, path_{std::move(path)} {
  if (!path_.empty()) { sinks.push_back(open_file_sink(path_)); }
  if (sinks.empty()) { throw logic_error("logging: no sink to write to"); }
  for (auto const& sink : sinks) {
    if (sink == nullptr) { throw logic_error("logging: a sink is null"); }
  }
  if (async && (!detail::is_pow2(queue_capacity) || queue_capacity < 16)) {
    throw logic_error("logging: queue capacity " + std::to_string(queue_capacity) +
                      " must be a power of two >= 16");
  }
  logger_ = std::make_shared<spdlog::logger>("mrstack.logging", sinks.begin(), sinks.end());
  logger_->set_level(spdlog::level::info);
  logger_->set_pattern("%v");  // rows are formatted by us; the sinks add only the newline
  if (auto_flush && !async) { logger_->flush_on(spdlog::level::info); }
  logger_->log(spdlog::level::info, header());
  if (auto_flush) { logger_->flush(); }
  if (async) { writer_ = std::make_unique<detail::async_log_writer>(logger_, queue_capacity, auto_flush); }
}

logging_resource_adaptor::~logging_resource_adaptor() {
  writer_.reset();  // drains and joins the writer before the logger goes
  logger_->flush();
}

std::string logging_resource_adaptor::header() { return "Thread,Time,Action,Pointer,Size,Stream"; }

std::size_t logging_resource_adaptor::current_thread_id() noexcept { return spdlog::details::os::thread_id(); }

void logging_resource_adaptor::flush() {
  if (writer_) {
    writer_->flush();
  } else {
    logger_->flush();
  }
}

void logging_resource_adaptor::log_event(action what, void const* ptr, std::size_t bytes, stream_view stream) noexcept {
  auto const now = std::chrono::system_clock::now();
  detail::log_record const record{
      current_thread_id(),
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
      reinterpret_cast<std::uintptr_t>(ptr),
      bytes,
      stream.id(),
      static_cast<std::uint8_t>(what)};
  if (writer_) {
    writer_->push(record);
    return;
  }
  thread_local detail::clock_text clock;
  char row[detail::max_row_length];
  char* const end = detail::put_row(row, record, clock);
  // spdlog catches and reports sink errors itself (its error handler), so this never throws.
  logger_->log(now, spdlog::source_loc{}, spdlog::level::info,
               spdlog::string_view_t{row, static_cast<std::size_t>(end - row - 1)});
}

void* logging_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  void* ptr = nullptr;
  try {
    ptr = upstream_->allocate(bytes, stream, alignment);
  } catch (...) {
    log_event(action::allocate_failure, nullptr, bytes, stream);
    throw;
  }
  log_event(action::allocate, ptr, bytes, stream);
  return ptr;
}

void logging_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  log_event(action::free, ptr, bytes, stream);  // before the memory can be reused: file order stays a valid history
  upstream_->deallocate(ptr, bytes, stream, alignment);
}

}  // namespace mrstack
