#include <mrstack/current.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <mutex>
#include <unordered_map>

namespace mrstack {

namespace {
struct registry {
  std::mutex mutex;
  std::unordered_map<int, resource_ptr> per_device;
  // The default of each device, made on first read: a cuda_memory_resource bound to that
  // device, so device 1's default allocates on device 1 whatever the caller has current.
  std::unordered_map<int, resource_ptr> defaults;

  resource_ptr default_of(int device) {
    auto& slot = defaults[device];
    if (!slot) { slot = std::make_shared<cuda_memory_resource>(device); }  // no CUDA call
    return slot;
  }
};
registry& the_registry() {
  // Never destroyed: a static destructor or a detached thread may set or read a device's
  // resource after static destruction began (the resources registered then live to the end).
  static auto* const r = new registry;
  return *r;
}
void check_device(int device) {
  if (device < 0) { throw logic_error("per-device resource: device ordinal " + std::to_string(device) + " is negative"); }
}
}  // namespace

resource_ptr get_per_device_resource(int device) {
  check_device(device);
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  auto it = r.per_device.find(device);
  return it != r.per_device.end() ? it->second : r.default_of(device);
}

resource_ptr set_per_device_resource(int device, resource_ptr resource) {
  check_device(device);
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  auto it = r.per_device.find(device);
  resource_ptr previous = it != r.per_device.end() ? it->second : r.default_of(device);
  if (resource) {
    r.per_device[device] = std::move(resource);
  } else {
    r.per_device.erase(device);
  }
  return previous;
}

int current_device() {
  int device = 0;
  MRSTACK_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

resource_ptr get_current_device_resource() { return get_per_device_resource(current_device()); }
resource_ptr set_current_device_resource(resource_ptr resource) {
  return set_per_device_resource(current_device(), std::move(resource));
}

}  // namespace mrstack
