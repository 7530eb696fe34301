// Reading a log file: plain or gzip (one or more streams), CSV or binary, bounded, NUL-free.
#include <mrstack/log/allocation_log.hpp>
#include <mrstack/log/binary_log.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <zlib.h>

namespace mrstack {

namespace {

[[noreturn]] void fail_file(std::string const& path, std::string const& what) {
  throw log_error(path + ": " + what, path, 0, 0);
}

std::string too_big(std::size_t limit) {
  return "the log's text is larger than " + std::to_string(limit) +
         " bytes, the reader's limit (raise it with --max-log-bytes)";
}

std::string read_raw(std::string const& path, std::size_t limit) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file{std::fopen(path.c_str(), "rb"), &std::fclose};
  if (!file) { fail_file(path, std::string{"cannot open the log: "} + std::strerror(errno)); }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    std::size_t const n = std::fread(buffer, 1, sizeof buffer, file.get());
    if (n == 0) { break; }
    // The compressed form is never larger than what it expands to by more than gzip's
    // small overhead, so the same limit bounds it (plus a margin for headers).
    if (bytes.size() + n > limit + 4096) { fail_file(path, too_big(limit)); }
    bytes.append(buffer, n);
  }
  if (std::ferror(file.get()) != 0) { fail_file(path, std::string{"cannot read the log: "} + std::strerror(errno)); }
  return bytes;
}

bool gzip_magic(std::string const& bytes, std::size_t at) {
  return bytes.size() >= at + 2 && static_cast<unsigned char>(bytes[at]) == 0x1f &&
         static_cast<unsigned char>(bytes[at + 1]) == 0x8b;
}

/// Inflates every gzip stream in `bytes`, one after another, as gzip(1) does; anything
/// after the last stream that is not another stream is an error (zlib's gzread ignores it,
/// which would hide a damaged or concatenated-with-junk file).
std::string gunzip(std::string const& path, std::string const& bytes, std::size_t limit) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) { fail_file(path, "cannot start zlib"); }
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard{&z, &inflateEnd};
  std::string text;
  char out[1 << 16];
  auto const* const base = reinterpret_cast<Bytef const*>(bytes.data());
  std::size_t at = 0;  // bytes of the file consumed
  auto feed = [&] {
    z.next_in = const_cast<Bytef*>(base + at);
    z.avail_in = static_cast<uInt>(std::min<std::size_t>(bytes.size() - at, 1U << 30));
  };
  while (true) {  // one gzip stream
    feed();
    int status = Z_OK;
    while (status != Z_STREAM_END) {
      z.next_out = reinterpret_cast<Bytef*>(out);
      z.avail_out = sizeof out;
      status = inflate(&z, Z_NO_FLUSH);
      std::size_t const produced = sizeof out - z.avail_out;
      if (text.size() + produced > limit) { fail_file(path, too_big(limit)); }
      text.append(out, produced);
      at = static_cast<std::size_t>(z.next_in - base);
      if (status == Z_OK || status == Z_STREAM_END) { continue; }
      if (status == Z_BUF_ERROR && z.avail_in == 0) {
        if (at >= bytes.size()) { fail_file(path, "the compressed log is damaged or cut short (unexpected end of file)"); }
        feed();
        continue;
      }
      fail_file(path, std::string{"the compressed log is damaged ("} + (z.msg != nullptr ? z.msg : "zlib error") + ")");
    }
    if (at == bytes.size()) { return text; }
    if (!gzip_magic(bytes, at)) {
      fail_file(path, std::to_string(bytes.size() - at) + " bytes of trailing garbage after the gzip stream, at byte offset " +
                          std::to_string(at) + " of the file");
    }
    inflateReset(&z);
  }
}

}  // namespace

std::string read_log_text(std::string const& path, log_limits const& limits) {
  std::string bytes = read_raw(path, limits.max_text_bytes);
  if (gzip_magic(bytes, 0)) { bytes = gunzip(path, bytes, limits.max_text_bytes); }
  if (is_binary_log(bytes)) { return binary_log_to_csv(bytes, path, limits); }
  if (bytes.size() > limits.max_text_bytes) { fail_file(path, too_big(limits.max_text_bytes)); }
  return bytes;
}

allocation_log read_allocation_log(std::string const& path, log_limits const& limits) {
  std::string const text = read_log_text(path, limits);
  return parse_allocation_log(text, path, limits);
}

}  // namespace mrstack
