#pragma once
// Reads an allocation log (RMM's CSV: Thread,Time,Action,Pointer,Size,Stream; gzip or
// plain, through zlib) into a list of events that refer to allocations by index, so a
// replay needs no map lookups. For tests and benchmarks that replay data/*.csv.gz.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace mrstack::test {

struct log_event {
  bool allocate;
  std::size_t id;     ///< index of the allocation (0, 1, 2, ... in order of appearance)
  std::size_t bytes;  ///< bytes asked (for frees, those of the allocation freed)
};

struct alloc_log {
  std::vector<log_event> events;
  std::size_t allocation_count = 0;
  std::size_t peak_live_bytes = 0;  ///< most requested bytes live at once
};

/// The repository's data/ folder (MRSTACK_DATA_DIR overrides), found from this file's path.
inline std::filesystem::path data_dir() {
  if (char const* dir = std::getenv("MRSTACK_DATA_DIR")) { return dir; }
  return std::filesystem::path{__FILE__}.parent_path().parent_path().parent_path() / "data";
}

inline alloc_log read_alloc_log(std::filesystem::path const& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) { throw std::runtime_error("cannot open allocation log " + path.string()); }
  alloc_log log;
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::size_t>> live;  // pointer -> (id, bytes)
  std::size_t live_bytes = 0;
  char line[512];
  std::size_t number = 0;
  auto bad = [&](char const* why) {
    gzclose(file);
    throw std::runtime_error(path.string() + ":" + std::to_string(number) + ": " + why);
  };
  while (gzgets(file, line, sizeof line) != nullptr) {
    ++number;
    if (number == 1) { continue; }  // header
    // Thread,Time,Action,Pointer,Size,Stream
    char* field[6] = {};
    int n = 0;
    field[n++] = line;
    for (char* c = line; *c != '\0' && n < 6; ++c) {
      if (*c == ',') {
        *c = '\0';
        field[n++] = c + 1;
      }
    }
    if (n < 6) { bad("expected 6 comma-separated fields"); }
    std::string const action = field[2];
    std::uint64_t const pointer = std::strtoull(field[3], nullptr, 16);
    std::size_t const bytes = std::strtoull(field[4], nullptr, 10);
    if (action == "allocate") {
      std::size_t const id = log.allocation_count++;
      if (!live.emplace(pointer, std::make_pair(id, bytes)).second) { bad("pointer allocated twice"); }
      log.events.push_back({true, id, bytes});
      live_bytes += bytes;
      log.peak_live_bytes = std::max(log.peak_live_bytes, live_bytes);
    } else if (action == "free") {
      auto it = live.find(pointer);
      if (it == live.end()) { bad("free of a pointer not live"); }
      log.events.push_back({false, it->second.first, it->second.second});
      live_bytes -= it->second.second;
      live.erase(it);
    } else if (action != "allocate failure") {
      bad("unknown action");
    }
  }
  gzclose(file);
  return log;
}

}  // namespace mrstack::test
