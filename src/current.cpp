#include <mrstack/current.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#include <mutex>
#include <unordered_map>

namespace mrstack {

namespace {
struct registry {
  std::mutex mutex;
  std::unordered_map<int, resource_ptr> per_device;
  resource_ptr default_resource = std::make_shared<cuda_memory_resource>();  // the same for every device:
                                                                             // it allocates on the current one
};
registry& the_registry() {
  static registry r;
  return r;
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
  return it != r.per_device.end() ? it->second : r.default_resource;
}

resource_ptr set_per_device_resource(int device, resource_ptr resource) {
  check_device(device);
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  auto& slot = r.per_device[device];
  resource_ptr previous = slot ? slot : r.default_resource;
  slot = std::move(resource);
  if (!slot) { r.per_device.erase(device); }
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
