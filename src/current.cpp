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

  bool released = false;  // clear() ran: the process is exiting, nothing is kept any more

  /// Lets go of every resource (their destructors run outside the lock), for good.
  void clear() {
    std::unordered_map<int, resource_ptr> set_ones;
    std::unordered_map<int, resource_ptr> default_ones;
    std::lock_guard lock{mutex};
    released = true;
    set_ones.swap(per_device);
    default_ones.swap(defaults);
  }

  resource_ptr default_of(int device) {
    auto& slot = defaults[device];
    if (!slot) { slot = std::make_shared<cuda_memory_resource>(device); }  // no CUDA call
    return slot;
  }
};
registry& the_registry() {
  // The registry itself is never destroyed: a static destructor or a detached thread may
  // set or read a device's resource after static destruction began (it crashed in the
  // destroyed map). What it holds is let go when static destruction reaches the point
  // of its first use, as a static registry's destructor did: the resources' destructors
  // still run at exit (asynchronous logs written out, leak reports printed).
  static auto* const r = new registry;
  static struct release_at_exit {
    ~release_at_exit() { r->clear(); }
  } const release;
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
  if (r.released) {
    // Set back by a static destructor after the registry let go at exit: kept now, it
    // would never be destroyed (an asynchronous log lost its rows). Its owners keep it.
    return previous;
  }
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
