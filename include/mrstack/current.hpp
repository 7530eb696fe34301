#pragma once
/// The per-device current resource: what code that does not take a resource argument
/// allocates from (device_buffer's default, the C ABI's and the Python package's default).
///
/// Each device has one slot. An empty slot reads as a `cuda_memory_resource` created on
/// first use and kept for the life of the process. Reads and writes are thread-safe;
/// `set_*` returns the previous resource so callers can restore it. The registry holds
/// resources by `shared_ptr`, so a resource set here lives at least as long as it stays set.
/// At exit (where static destruction reaches the registry's first use) it lets go of them,
/// so their destructors run; the registry itself stays usable to static destructors after
/// that, but keeps nothing set then (its owners keep it, and it is destroyed with them).
#include <mrstack/resource.hpp>

namespace mrstack {

/// The resource for `device` (a CUDA device ordinal; no CUDA call is made).
resource_ptr get_per_device_resource(int device);
/// Sets the resource for `device`; nullptr restores the default. Returns the previous one.
resource_ptr set_per_device_resource(int device, resource_ptr resource);

/// The resource for the device current on this thread (cudaGetDevice).
resource_ptr get_current_device_resource();
/// Sets the resource for the device current on this thread. Returns the previous one.
resource_ptr set_current_device_resource(resource_ptr resource);

/// The current device ordinal (cudaGetDevice); throws `cuda_error` without a device.
int current_device();

}  // namespace mrstack
