// Which device a stack's CUDA upstreams belong to, checked without a GPU: built for a
// device (build_options::device), each upstream takes it; a spec's `device=` wins; the
// mark ends with the build. No CUDA call is made here (without a device the scopes that
// switch devices do nothing), so this runs on any machine.
#include <catch2/catch.hpp>

#include <mrstack/current.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/managed_memory_resource.hpp>
#include <mrstack/upstream/pinned_host_memory_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>

using namespace mrstack;

namespace {

resource_ptr build_for(int device, std::string const& spec) {
  build_options options;
  options.device = device;
  return build_stack(parse_stack_spec(spec), options);
}

template <class Resource>
int device_of(resource_ptr const& r) {
  auto const* typed = dynamic_cast<Resource const*>(r.get());
  REQUIRE(typed != nullptr);
  return typed->device();
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;  // no runtime: no ordinal can be checked
  }
  return count;
}

bool have_device() {
  int count = 0;
  bool const ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

}  // namespace

TEST_CASE("upstreams built for a device take that device; a spec's device= wins") {
  CHECK(device_of<cuda_memory_resource>(build_for(3, "cuda")) == 3);
  CHECK(device_of<managed_memory_resource>(build_for(5, "managed")) == 5);
  CHECK(device_of<pinned_host_memory_resource>(build_for(2, "pinned_host")) == 2);
  CHECK(device_of<cuda_memory_resource>(build_for(3, "cuda(device=7)")) == 7);
  CHECK(device_of<cuda_memory_resource>(make_stack("cuda(device=4)")) == 4);
}

namespace {
/// The device a `cuda` upstream made inside a layer's constructor takes, when it names none:
/// the device that layer is built for.
int probed_device = -2;

void register_device_probe() {
  if (find_resource("test_device_probe") != nullptr) { return; }
  register_resource({"test_device_probe", "notes the device it is built for", upstream_rule::required, {},
                     [](spec_arguments const&, resource_ptr upstream) -> resource_ptr {
                       probed_device = cuda_memory_resource{}.device();
                       return upstream;
                     }});
}

int device_probed_in(resource_ptr (*build)()) {
  register_device_probe();
  probed_device = -2;
  (void)build();
  return probed_device;
}
}  // namespace

TEST_CASE("layers above an upstream with device= are built on that device") {
  // Built on the current device instead, a pool over cuda(device=1) made its events on
  // device 0, and its event calls on device 1's streams failed into device-wide syncs.
  CHECK(device_probed_in([] { return make_stack("test_device_probe > cuda(device=4)"); }) == 4);
  CHECK(device_probed_in([] { return make_stack("test_device_probe > pool > cuda(device=2)"); }) == 2);
  CHECK(device_probed_in([] { return build_for(3, "test_device_probe > cuda(device=7)"); }) == 7);
  CHECK(device_probed_in([] { return build_for(3, "test_device_probe > cuda"); }) == 3);
  CHECK(device_probed_in([] { return make_stack("test_device_probe > simulated"); }) ==
        cuda_memory_resource{}.device());  // no device named: the current one (-1 without a runtime)
  cuda_memory_resource after;
  CHECK(after.device() == cuda_memory_resource{}.device());  // the mark ended with the build
}

TEST_CASE("the device mark ends with the build") {
  (void)build_for(6, "cuda");
  cuda_memory_resource after;
  if (have_device()) {
    int current = -1;
    REQUIRE(cudaGetDevice(&current) == cudaSuccess);
    CHECK(after.device() == current);
  } else {
    CHECK(after.device() == -1);  // no runtime: each call would use the current device
  }
}

TEST_CASE("memory of one device is not interchangeable with another's") {
  cuda_memory_resource zero{0};
  cuda_memory_resource one{1};
  cuda_memory_resource zero_again{0};
  CHECK_FALSE(zero.is_equal(one));
  CHECK(zero.is_equal(zero_again));
  managed_memory_resource m0{0};
  managed_memory_resource m1{1};
  CHECK_FALSE(m0.is_equal(m1));
}

TEST_CASE("the registry's default for each device is bound to it") {
  for (int device : {0, 1, 9}) {
    if (device_count() >= 0 && device >= device_count()) {
      CHECK_THROWS_WITH(get_per_device_resource(device), Catch::Contains("does not exist"));
    } else {
      CHECK(device_of<cuda_memory_resource>(get_per_device_resource(device)) == device);
    }
  }
}

TEST_CASE("an ordinal that names no device is refused, naming the resource and the ordinal") {
  // Below -1 was read as "the current device"; past 63 the device scopes refused it only at
  // the first allocation; past the machine's count the first CUDA call failed.
  CHECK_THROWS_WITH(cuda_memory_resource{-5}, Catch::Contains("cuda: device -5 is not a device"));
  CHECK_THROWS_WITH(managed_memory_resource{-2}, Catch::Contains("managed: device -2 is not a device"));
  CHECK_THROWS_WITH(pinned_host_memory_resource{-7}, Catch::Contains("pinned_host: device -7"));
  CHECK_THROWS_WITH(cuda_async_memory_resource(0, std::nullopt, -3), Catch::Contains("cuda_async: device -3"));
  CHECK_THROWS_WITH(cuda_memory_resource{64}, Catch::Contains("cuda: device 64 is past the 64 devices"));
  CHECK_THROWS_WITH(vmm_memory_resource(0, vmm_memory_resource::default_map_granules, -4),
                    Catch::Contains("vmm: device -4 is not a device"));  // before any driver call
  CHECK_THROWS_AS(check_stack_spec(parse_stack_spec("cuda(device=64)")), spec_error);
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("cuda(device=63)")));
  int const count = device_count();
  if (count < 0) {
    CHECK(cuda_memory_resource{5}.device() == 5);  // nothing to check it against
  } else {
    CHECK_THROWS_WITH(cuda_memory_resource{count}, Catch::Contains("does not exist: this machine has"));
    try {
      (void)make_stack("pool > cuda(device=" + std::to_string(count) + ")");
      FAIL("built a stack on a device that does not exist");
    } catch (spec_error const& e) {
      CHECK_THAT(std::string{e.what()}, Catch::Contains("does not exist"));
    }
  }
}

TEST_CASE("peer_access without a device says so, naming the layer") {
  if (have_device()) { return; }  // the GPU test covers peer access on a machine with devices
  try {
    (void)make_stack("pool > cuda(peer_access=true)");
    FAIL("no error");
  } catch (spec_error const& e) {
    CHECK_THAT(std::string{e.what()}, Catch::Contains("peer_access"));
  }
}

TEST_CASE("device and peer_access are checked like every parameter") {
  CHECK_THROWS_AS(check_stack_spec(parse_stack_spec("cuda(device=-1)")), spec_error);
  CHECK_THROWS_AS(check_stack_spec(parse_stack_spec("cuda_async(peer_access=maybe)")), spec_error);
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("pool > cuda_async(device=1, peer_access=true)")));
}
