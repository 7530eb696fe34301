#pragma once
/// Call stacks for the tracking adaptor: cheap capture in the allocation path, symbolizing
/// only when a report is asked for. CUDA-free.
///
/// Built on glibc alone (backtrace(), dladdr1()) plus a small reader of the ELF symbol
/// table of each loaded module, so binaries gain no runtime library dependency (no libdw,
/// libbfd or libunwind), yet functions of the executable itself get names — dladdr alone
/// sees only exported symbols. Each frame reads like
///     mrstack::foo(int)+0x1c (libfoo.so+0x3a1c)
/// and the module+offset part can be fed to `addr2line -Cfe <module> <offset>` for file:line.
#include <cstddef>
#include <string>

namespace mrstack::detail {

/// Writes up to `max_frames` return addresses of the calling thread into `frames`,
/// skipping the `skip` innermost ones (this function's frame is always skipped).
/// Returns how many were written.
std::size_t capture_stack(void** frames, std::size_t max_frames, std::size_t skip) noexcept;

/// A readable description of one return address (see above). Thread-safe; caches each
/// module's symbol table after first use.
std::string describe_frame(void const* return_address);

}  // namespace mrstack::detail
