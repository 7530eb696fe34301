// mrstack-replay's JSON files: --json (one object per stack) and --timeline, each
// written whole or not at all.
#include "cli.hpp"

#include <mrstack/detail/format.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <sys/stat.h>
#include <unistd.h>

namespace mrstack::replay_cli {

namespace {

/// A JSON string's contents. Bytes that are not UTF-8 (a log path or a spec may hold any)
/// become U+FFFD: copied through, they made the file unreadable as JSON.
std::string json_escape(std::string const& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto const c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      std::size_t const n = utf8_sequence_length(s, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD
      } else {
        out.append(s, i, n);
        i += n - 1;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string json_number(double x) {
  if (!std::isfinite(x)) { return "null"; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

/// JSON, built by appending (one "key": value after another) to stay readable.
class json_object {
 public:
  json_object& raw(char const* key, std::string const& value) {
    text_ += text_.empty() ? "{" : ", ";
    text_ += '"';
    text_ += key;
    text_ += "\": ";
    text_ += value;
    return *this;
  }
  json_object& string(char const* key, std::string const& value) {
    std::string quoted{"\""};
    quoted += json_escape(value);
    quoted += '"';
    return raw(key, quoted);
  }
  json_object& number(char const* key, double value) { return raw(key, json_number(value)); }
  json_object& integer(char const* key, std::size_t value) { return raw(key, std::to_string(value)); }
  json_object& boolean(char const* key, bool value) { return raw(key, value ? "true" : "false"); }
  json_object& null(char const* key) { return raw(key, "null"); }
  [[nodiscard]] std::string str() const { return text_ + "}"; }

 private:
  std::string text_;
};


template <class T, class F>
std::string json_list(std::vector<T> const& items, F&& one, char const* separator = ", ") {
  std::string out{"["};
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) { out += separator; }
    out += one(items[i]);
  }
  return out + "]";
}

std::string optional_number(std::optional<std::size_t> const& v) { return v ? std::to_string(*v) : "null"; }

std::string fragmentation_json(fragmentation_info const& f) {
  json_object o;
  o.string("resource", f.resource).integer("held_bytes", f.held_bytes).integer("live_bytes", f.live_bytes);
  o.integer("free_bytes", f.free_bytes).integer("largest_free_block", f.largest_free_block);
  o.integer("free_blocks", f.free_blocks);
  return o.str();
}

std::string failure_json(replay_failure const& f) {
  json_object o;
  o.integer("line", f.line).integer("event", f.event).integer("bytes", f.bytes).string("message", f.message);
  o.raw("fragmentation", fragmentation_json(f.fragmentation));
  return o.str();
}

std::string activity_json(activity const& a, char const* key) {
  json_object o;
  o.string(key, a.name).integer("allocations", a.allocations).integer("frees", a.frees);
  o.integer("bytes_allocated", a.bytes_allocated);
  return o.str();
}

std::string timeline_stack_json(timeline_stack const& s) {
  json_object o;
  o.string("resource", s.resource);
  o.raw("footprint_bytes", json_list(s.footprint_bytes, optional_number));
  o.raw("free_held_bytes", json_list(s.free_held_bytes, optional_number));
  o.raw("largest_free_block", json_list(s.largest_free_block, optional_number));
  o.raw("failure", s.failure ? failure_json(*s.failure) : "null");
  // What stopped the replay (a stack that could not be built, or broke): its samples are
  // null, and without the text a reader of the timeline alone could not say why.
  if (s.error.empty()) {
    o.null("error");
  } else {
    o.string("error", s.error);
  }
  return o.str();
}

}  // namespace

namespace {

/// Writes `text` into what is already at `path` (a device, a FIFO): a rename would put a
/// regular file in its place (as root, /dev/full or /dev/null replaced by a JSON file),
/// and the data would never reach the reader. A write error (/dev/full's ENOSPC) is reported.
void write_in_place(std::string const& path, std::string const& text) {
  std::ofstream f{path, std::ios::binary};
  if (!f) { throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno)); }
  f << text;
  f.flush();
  if (!f) { throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno)); }
}

}  // namespace

void write_atomically(std::string const& path, std::string const& text) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    write_in_place(path, text);
    return;
  }
  std::string const tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f{tmp, std::ios::binary | std::ios::trunc};
    if (!f) { throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno)); }
    f << text;
    f.flush();
    if (!f) {
      int const saved = errno;
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot write " + path + ": " + std::strerror(saved));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int const saved = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(saved));
  }
}

std::string result_json(replay_result const& r, std::string const& log_path, bool warmup) {
  json_object o;
  o.string("resource", r.resource).string("built_as", r.built_as).string("log", log_path);
  o.boolean("simulated", r.simulated).boolean("warmup", warmup).string("order", to_string(r.order));
  o.integer("workers", r.workers).integer("events", r.events).integer("failures", r.failures);
  if (r.failures > 0) {
    o.integer("first_failure_line", r.first_failure_line).integer("first_failure_bytes", r.first_failure_bytes);
    o.string("first_failure_message", r.first_failure_message);
    o.raw("first_failure_fragmentation", fragmentation_json(r.first_failure_fragmentation));
  } else {
    o.null("first_failure_line").null("first_failure_bytes").null("first_failure_message");
    o.null("first_failure_fragmentation");
  }
  o.integer("expected_failures", r.expected_failures).integer("expected_failures_served", r.expected_failures_served);
  o.number("seconds", r.median_seconds).raw("seconds_per_run", json_list(r.seconds, json_number));
  // null with no events, as the table's '-': a time per event of no events is 0/0.
  double const no_time = std::numeric_limits<double>::quiet_NaN();
  o.number("ns_per_event", r.events == 0 ? no_time : r.ns_per_event);
  o.number("ns_per_call", r.events == 0 ? no_time : r.ns_per_call);
  o.integer("peak_live_bytes", r.peak_live_bytes).integer("peak_footprint_bytes", r.peak_footprint_bytes);
  o.number("footprint_ratio", r.footprint_ratio()).string("footprint_measured_by", r.footprint_measured_by);
  o.boolean("footprint_lower_bound", r.footprint_lower_bound).integer("upstream_allocations", r.upstream_allocations);
  o.integer("leaks", r.leaks).integer("leaked_bytes", r.leaked_bytes);
  if (r.error.empty()) {
    o.null("error");
  } else {
    o.string("error", r.error);
  }
  return o.str();
}

std::string results_json(std::vector<replay_result> const& results, std::string const& log_path, bool warmup) {
  std::string out = "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    out += "  " + result_json(results[i], log_path, warmup) + (i + 1 < results.size() ? ",\n" : "\n");
  }
  return out + "]\n";
}

std::string timeline_json(timeline const& t, std::vector<replay_result> const& results, std::string const& log_path,
                          bool warmup) {
  json_object o;
  o.string("format", "mrstack-timeline/1").string("log", log_path).integer("events", t.events);
  o.boolean("simulated", t.simulated).raw("capacity_bytes", optional_number(t.capacity_bytes));
  o.raw("sample_event", json_list(t.sample_event, [](std::uint32_t e) { return std::to_string(e); }));
  o.raw("live_bytes", json_list(t.live_bytes, [](std::size_t b) { return std::to_string(b); }));
  o.raw("stacks", json_list(t.stacks, timeline_stack_json, ",\n  "));
  o.raw("size_histogram", json_list(t.size_histogram, [](size_bucket const& b) {
          json_object h;
          h.integer("min_bytes", b.min_bytes).integer("max_bytes", b.max_bytes).integer("allocations", b.allocations);
          return h.str();
        }));
  o.raw("threads", json_list(t.threads, [](activity const& a) { return activity_json(a, "thread"); }));
  o.raw("streams", json_list(t.streams, [](activity const& a) { return activity_json(a, "stream"); }));
  o.raw("results", json_list(results, [&](replay_result const& r) { return result_json(r, log_path, warmup); }, ",\n  "));
  return o.str() + "\n";
}

}  // namespace mrstack::replay_cli
