// The interface's own rules, errors and the per-device registry, over host-only upstreams.
#include <catch2/catch.hpp>

#include <mrstack/current.hpp>
#include <mrstack/device_buffer.hpp>
#include <mrstack/error.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstring>
#include <thread>
#include <vector>

using namespace mrstack;

TEST_CASE("zero-byte requests return nullptr and never reach the resource") {
  simulated_memory_resource sim;
  CHECK(sim.allocate(0) == nullptr);
  CHECK(sim.total_allocations() == 0);
  sim.deallocate(nullptr, 0);  // no-op, no logic_error from the simulated checks
  CHECK(sim.footprint() == 0);
}

TEST_CASE("an alignment that is not a power of two is a logic_error naming it") {
  system_memory_resource sys;
  for (std::size_t bad : {std::size_t{0}, std::size_t{3}, std::size_t{384}}) {
    try {
      (void)sys.allocate(64, {}, bad);
      FAIL("no error for alignment " << bad);
    } catch (logic_error const& e) {
      CHECK_THAT(e.what(), Catch::Contains("alignment " + std::to_string(bad)));
    }
  }
}

TEST_CASE("system memory is aligned as asked, at least 256, and writable") {
  system_memory_resource sys;
  for (std::size_t align : {1, 64, 256, 1024, 65536}) {
    auto* p = static_cast<unsigned char*>(sys.allocate(1000, {}, align));
    REQUIRE(p != nullptr);
    CHECK(detail::is_aligned(p, std::max<std::size_t>(align, 256)));
    std::memset(p, 0xab, 1000);
    CHECK(p[999] == 0xab);
    sys.deallocate(p, 1000, {}, align);
  }
  CHECK(sys.kind() == memory_kind::host);
  CHECK(sys.name() == "system");
}

TEST_CASE("system refuses an impossible size with out_of_memory naming it") {
  system_memory_resource sys;
  std::size_t const huge = std::size_t{1} << 62;
  try {
    (void)sys.allocate(huge);
    FAIL("allocated 4 EiB");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == huge);
    CHECK_THAT(e.what(), Catch::Contains("system") && Catch::Contains("4.00 EiB"));
  }
}

TEST_CASE("out_of_memory names resource, size, footprint, free bytes and largest free block") {
  allocation_failure info;
  info.requested_bytes = 3 << 20;
  info.resource = "pool";
  info.footprint_bytes = std::size_t{1} << 30;
  info.free_bytes = 5 << 20;
  info.largest_free_block = 2 << 20;
  out_of_memory const e{info};
  std::string const msg = e.what();
  CHECK_THAT(msg, Catch::StartsWith("out of memory: pool could not allocate 3.00 MiB (3145728 B)"));
  CHECK_THAT(msg, Catch::Contains("footprint 1.00 GiB") && Catch::Contains("free 5.00 MiB") &&
                      Catch::Contains("largest free block 2.00 MiB"));
  std::bad_alloc const& base = e;  // catchable as std::bad_alloc
  CHECK(std::string{base.what()} == msg);
}

TEST_CASE("cuda_error carries the code, its name, the call and file:line") {
  cuda_error const e{cudaErrorInvalidValue, "cudaMalloc(&p, n)", "file.cpp", 42};
  CHECK(e.code() == cudaErrorInvalidValue);
  CHECK_THAT(e.what(), Catch::Contains("cudaErrorInvalidValue") && Catch::Contains("cudaMalloc(&p, n)") &&
                           Catch::Contains("file.cpp:42"));
  CHECK_THROWS_AS([] { MRSTACK_CUDA_TRY(cudaErrorInvalidValue); }(), cuda_error);
}

TEST_CASE("format_bytes") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.50 KiB (1536 B)");
  CHECK(format_bytes(std::size_t{8} << 30) == "8.00 GiB (8589934592 B)");
}

TEST_CASE("per-device registry: set, get, restore, per device, thread-safe") {
  auto const original0 = get_per_device_resource(0);
  REQUIRE(original0 != nullptr);
  CHECK(original0->name() == "cuda");  // the default, created without touching CUDA

  // Each device's default is bound to that device (it allocates there whatever is current).
  auto const default3 = get_per_device_resource(3);
  REQUIRE(std::dynamic_pointer_cast<cuda_memory_resource>(default3) != nullptr);
  CHECK(std::dynamic_pointer_cast<cuda_memory_resource>(default3)->device() == 3);
  CHECK(std::dynamic_pointer_cast<cuda_memory_resource>(original0)->device() == 0);
  CHECK(default3 != original0);
  CHECK_FALSE(default3->is_equal(*original0));  // memory of one device is not the other's

  auto sim = std::make_shared<simulated_memory_resource>();
  auto previous = set_per_device_resource(3, sim);
  CHECK(previous == default3);
  CHECK(get_per_device_resource(3) == sim);
  CHECK(get_per_device_resource(0) == original0);  // other devices untouched

  // Many threads reading while one writes: every read sees one of the two values.
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  auto sys = std::make_shared<system_memory_resource>();
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto r = get_per_device_resource(3);
        if (r != sim && r != sys) { ++bad; }
      }
    });
  }
  for (int i = 0; i < 500; ++i) { set_per_device_resource(3, (i % 2) ? resource_ptr{sim} : resource_ptr{sys}); }
  for (auto& t : readers) { t.join(); }
  CHECK(bad == 0);

  set_per_device_resource(3, nullptr);  // back to the default
  CHECK(get_per_device_resource(3) == default3);
  CHECK_THROWS_AS(get_per_device_resource(-1), logic_error);
}

TEST_CASE("device_buffer owns its memory and frees it exactly once, also when moved") {
  auto sim = std::make_shared<simulated_memory_resource>();
  {
    device_buffer a{1000, {}, sim};
    CHECK(a.size() == 1000);
    CHECK(sim->owns(a.data()));
    device_buffer b = std::move(a);
    CHECK(a.data() == nullptr);
    CHECK(a.empty());
    CHECK(sim->allocation_count() == 1);
    device_buffer c{10, {}, sim};
    c = std::move(b);  // c's own 10 bytes are freed here
    CHECK(sim->allocation_count() == 1);
  }
  CHECK(sim->allocation_count() == 0);
  CHECK(sim->footprint() == 0);
  CHECK_THROWS_AS(device_buffer(10, {}, nullptr), logic_error);
}
