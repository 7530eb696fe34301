#pragma once
/// Errors mrstack throws. Each one explains itself: what was asked, of which resource,
/// and what state the resource was in when it refused.
///
/// - `out_of_memory` (a `std::bad_alloc`): a request could not be satisfied. It names the
///   bytes asked, the resource that refused, and (where the resource knows them) its
///   footprint, the free bytes it holds and its largest free block, so fragmentation is
///   visible at the failure.
/// - `cuda_error` (a `std::runtime_error`): a CUDA runtime call failed; carries the error
///   code, its name and message, the call and file:line.
/// - `logic_error` (a `std::logic_error`): the caller broke a contract (a foreign pointer,
///   a wrong size, a bad alignment, a bad spec).
#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include <mrstack/detail/format.hpp>

namespace mrstack {

/// What a resource knew about itself when it refused a request.
struct allocation_failure {
  std::size_t requested_bytes = 0;
  std::string resource;                           ///< name of the layer that refused
  std::optional<std::size_t> footprint_bytes;     ///< bytes it held from its upstream
  std::optional<std::size_t> free_bytes;          ///< of those, bytes free to hand out
  std::optional<std::size_t> largest_free_block;  ///< the largest single free block
  std::optional<std::size_t> limit_bytes;         ///< a configured limit, where one applies
  std::string detail;                             ///< anything else worth saying
};

class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(allocation_failure info);
  [[nodiscard]] char const* what() const noexcept override { return message_.c_str(); }
  [[nodiscard]] allocation_failure const& info() const noexcept { return info_; }

 private:
  allocation_failure info_;
  std::string message_;
};

class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, char const* call, char const* file, int line);
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

class logic_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t code, char const* call, char const* file, int line);
}  // namespace detail

}  // namespace mrstack

/// Calls a CUDA runtime function and throws `mrstack::cuda_error` naming the call and
/// file:line when it does not return cudaSuccess.
#define MRSTACK_CUDA_TRY(call)                                                      \
  do {                                                                             \
    cudaError_t const mrstack_status_ = (call);                                    \
    if (mrstack_status_ != cudaSuccess) {                                          \
      ::mrstack::detail::throw_cuda_error(mrstack_status_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

/// For destructors and noexcept paths: a failure is reported on stderr, never thrown.
#define MRSTACK_CUDA_ASSERT_NOEXCEPT(call) ::mrstack::detail::report_cuda_failure((call), #call, __FILE__, __LINE__)

namespace mrstack::detail {
void report_cuda_failure(cudaError_t code, char const* call, char const* file, int line) noexcept;
}
