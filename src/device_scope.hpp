#pragma once
// Internal (not installed): makes a device's primary context current for a scope when it
// is not already, and puts back exactly what the thread had at the end.
#include <mrstack/error.hpp>

namespace mrstack::detail {

/// The driver context current on this thread (cuCtxGetCurrent) as an opaque handle, or
/// nullptr when none is. `usable` is false without a CUDA driver or device (then
/// nothing here does anything, so host-only stacks work on a CPU). Creates no context.
void* current_context(bool& usable) noexcept;
/// `device`'s primary context, retained once for the life of the process (this creates
/// the context on `device`, and only there). Throws `cuda_error` for a device that does
/// not exist.
void* primary_context(int device);
void push_context(void* context);
void pop_context() noexcept;

/// Makes `device` current for the scope. It pushes the device's primary context on the
/// thread's driver context stack and pops it at the end, rather than cudaSetDevice there
/// and back: setting back a device whose context does not exist yet (device 0 in a
/// process that only uses device 1) would create that context and take its memory.
/// When `device`'s context is already current (the common case) it costs one
/// cuCtxGetCurrent and a comparison. `device` -1: does nothing.
class device_scope {
 public:
  explicit device_scope(int device) {
    if (device < 0) { return; }
    bool usable = false;
    void* const current = current_context(usable);
    if (!usable) { return; }
    void* const wanted = primary_context(device);
    if (current == wanted) { return; }
    push_context(wanted);
    pushed_ = true;
  }
  ~device_scope() {
    if (pushed_) { pop_context(); }
  }
  device_scope(device_scope const&) = delete;
  device_scope& operator=(device_scope const&) = delete;
  device_scope(device_scope&&) = delete;
  device_scope& operator=(device_scope&&) = delete;

 private:
  bool pushed_ = false;
};

/// `device` when it is an ordinal (>= 0); for -1 the device a stack is being built for on
/// this thread (see building_for), else the device current on this thread (cudaGetDevice,
/// which creates no context), or -1 without a usable CUDA runtime.
int resolve_device(int device) noexcept;

/// The devices mrstack serves: ordinals 0 to 63 (the spec's `device=` has the same bound).
inline constexpr int max_devices = 64;

/// `resolve_device(device)` for `resource`'s constructor, refusing what names no device:
/// an ordinal below -1 (read as "current" before, silently), one at or past `max_devices`,
/// or, where the CUDA runtime answers, one at or past this machine's device count. Each a
/// `logic_error` that starts with `resource`'s name. Without a runtime any ordinal below
/// the bound passes (nothing can be checked, and nothing is allocated there).
int checked_device(int device, char const* resource);

/// Marks the scope of building a stack for `device` on this thread (nests; -1 marks
/// nothing), so resources made there without a device of their own take this one.
class building_for {
 public:
  explicit building_for(int device) noexcept;
  ~building_for();
  building_for(building_for const&) = delete;
  building_for& operator=(building_for const&) = delete;
  building_for(building_for&&) = delete;
  building_for& operator=(building_for&&) = delete;

 private:
  int previous_;
};

}  // namespace mrstack::detail
