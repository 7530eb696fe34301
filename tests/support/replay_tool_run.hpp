#pragma once
// mrstack-replay run in-process (run_replay_tool) with its stdout and stderr captured.
#include <catch2/catch.hpp>

#include <mrstack/replay/replay.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace test_support {

struct captured {
  int status;
  std::string out;
  std::string err;
};

/// All of `f` from its start.
inline std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buf[4096];
  for (std::size_t n = 0; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) { text.append(buf, n); }
  return text;
}

inline captured run_tool(std::vector<std::string> const& args) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out != nullptr);
  REQUIRE(err != nullptr);
  int const status = mrstack::run_replay_tool(args, out, err);
  captured c{status, read_all(out), read_all(err)};
  std::fclose(out);
  std::fclose(err);
  return c;
}

}  // namespace test_support
