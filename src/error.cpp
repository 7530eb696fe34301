#include <mrstack/error.hpp>

#include <sstream>

namespace mrstack {

namespace {
std::string describe(allocation_failure const& f) {
  std::ostringstream os;
  os << "out of memory: " << (f.resource.empty() ? std::string{"resource"} : f.resource)
     << " could not allocate " << format_bytes(f.requested_bytes);
  if (f.limit_bytes) { os << "; limit " << format_bytes(*f.limit_bytes); }
  if (f.footprint_bytes) { os << "; footprint " << format_bytes(*f.footprint_bytes); }
  if (f.free_bytes) { os << "; free " << format_bytes(*f.free_bytes); }
  if (f.largest_free_block) { os << "; largest free block " << format_bytes(*f.largest_free_block); }
  if (!f.detail.empty()) { os << "; " << f.detail; }
  return os.str();
}
}  // namespace

out_of_memory::out_of_memory(allocation_failure info) : info_{std::move(info)}, message_{describe(info_)} {}

namespace {
std::string cuda_message(cudaError_t code, char const* call, char const* file, int line) {
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(code) << " (" << static_cast<int>(code) << "): "
     << cudaGetErrorString(code) << " in " << call << " at " << file << ':' << line;
  return os.str();
}
}  // namespace

cuda_error::cuda_error(cudaError_t code, char const* call, char const* file, int line)
    : std::runtime_error{cuda_message(code, call, file, line)}, code_{code} {}

namespace detail {
void throw_cuda_error(cudaError_t code, char const* call, char const* file, int line) {
  throw cuda_error(code, call, file, line);
}
void report_cuda_failure(cudaError_t code, char const* call, char const* file, int line) noexcept {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "mrstack: %s\n", cuda_message(code, call, file, line).c_str());
  }
}
}  // namespace detail

}  // namespace mrstack
