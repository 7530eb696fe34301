#pragma once
// Files the CPU tests write and read back: one scratch folder per test program and process
// (under the system's temporary folder), so parallel ctest runs never share a file.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace test_support {

/// The folder `<tmp>/<prefix><pid>`, created when missing.
inline std::filesystem::path scratch_dir(std::string const& prefix) {
  auto dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

/// Writes `text` to `dir/name`; returns the path.
inline std::string write_file(std::filesystem::path const& dir, std::string const& name, std::string const& text) {
  auto const path = dir / name;
  std::ofstream{path} << text;
  return path.string();
}

/// The whole file at `path` ("" when it cannot be read).
inline std::string slurp(std::string const& path) {
  std::ifstream f{path};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace test_support
