// Each CUDA upstream on a real device: allocate, write and read back on a stream, free,
// and the error paths.
#include <catch2/catch.hpp>

#include <mrstack/current.hpp>
#include <mrstack/device_buffer.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/managed_memory_resource.hpp>
#include <mrstack/upstream/pinned_host_memory_resource.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace mrstack;

namespace {

/// Writes a byte pattern into `ptr` on `s` with cudaMemsetAsync, copies it back, checks it.
void check_write_read(memory_resource& mr, std::size_t bytes, stream_view s) {
  REQUIRE(bytes >= 2);  // two halves with different patterns
  auto* ptr = static_cast<unsigned char*>(mr.allocate(bytes, s));
  REQUIRE(ptr != nullptr);
  CHECK(detail::is_aligned(ptr, 256));
  std::size_t const half = bytes / 2;
  MRSTACK_CUDA_TRY(cudaMemsetAsync(ptr, 0x5a, half, s.value()));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(ptr + half, 0xc3, bytes - half, s.value()));
  std::vector<unsigned char> host(bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), ptr, bytes, cudaMemcpyDefault, s.value()));
  s.synchronize();
  CHECK(host.front() == 0x5a);
  CHECK(host[half - 1] == 0x5a);
  CHECK(host[half] == 0xc3);
  CHECK(host.back() == 0xc3);
  mr.deallocate(ptr, bytes, s);
}

void check_impossible_size(memory_resource& mr) {
  std::size_t const huge = std::size_t{1} << 50;  // 1 PiB: no device has it
  try {
    (void)mr.allocate(huge);
    FAIL(mr.name() << " allocated 1 PiB");
  } catch (out_of_memory const& e) {
    CHECK(e.info().requested_bytes == huge);
    CHECK_THAT(e.what(), Catch::Contains(mr.name()) && Catch::Contains("1125899906842624 B"));
    if (mr.kind() == memory_kind::device) {  // which device is full, for a program that uses several
      int device = -1;
      MRSTACK_CUDA_TRY(cudaGetDevice(&device));
      CHECK_THAT(e.what(), Catch::Contains("device " + std::to_string(device) + " has "));
    }
  }
  // The failure must not stick: the next allocation works.
  void* p = mr.allocate(1024);
  CHECK(p != nullptr);
  mr.deallocate(p, 1024);
}

}  // namespace

TEST_CASE("cuda_memory_resource") {
  cuda_memory_resource mr;
  stream s;
  for (std::size_t bytes : {std::size_t{2}, std::size_t{1000}, std::size_t{1} << 20, std::size_t{64} << 20}) {
    check_write_read(mr, bytes, s);
  }
  check_impossible_size(mr);
  CHECK_THROWS_WITH(mr.allocate(100, {}, 4096), Catch::Contains("aligned(...)"));
  CHECK(mr.kind() == memory_kind::device);
}

TEST_CASE("cuda_async_memory_resource") {
  cuda_async_memory_resource mr{32 << 20};
  CHECK(mr.pool_handle() != nullptr);
  CHECK(mr.reserved_bytes() >= (32u << 20));  // initial size kept (release threshold = keep all)
  stream a;
  stream b;
  check_write_read(mr, 4096, a);
  check_write_read(mr, 3 << 20, b);
  check_write_read(mr, 2, stream_view::per_thread());
  CHECK(mr.free_bytes_held() > 0);
  check_impossible_size(mr);
  mr.release();
  CHECK(mr.reserved_bytes() == 0);
}

TEST_CASE("managed_memory_resource: host and device both see the data") {
  managed_memory_resource mr;
  stream s;
  check_write_read(mr, 1 << 20, s);
  auto* p = static_cast<unsigned char*>(mr.allocate(4096, s));
  std::memset(p, 7, 4096);  // host writes
  MRSTACK_CUDA_TRY(cudaMemsetAsync(p + 2048, 9, 2048, s.value()));  // device writes
  s.synchronize();
  CHECK(p[0] == 7);
  CHECK(p[4095] == 9);
  mr.deallocate(p, 4096, s);
  CHECK(mr.kind() == memory_kind::managed);
}

TEST_CASE("pinned_host_memory_resource: host-writable, device-copyable") {
  pinned_host_memory_resource mr;
  stream s;
  check_write_read(mr, 1 << 20, s);
  auto* p = static_cast<unsigned char*>(mr.allocate(8192, s, 4096));
  CHECK(detail::is_aligned(p, 4096));
  std::memset(p, 0x11, 8192);
  void* d = nullptr;
  MRSTACK_CUDA_TRY(cudaMalloc(&d, 8192));
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(d, p, 8192, cudaMemcpyHostToDevice, s.value()));
  MRSTACK_CUDA_TRY(cudaMemsetAsync(p, 0, 8192, s.value()));
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(p, d, 8192, cudaMemcpyDeviceToHost, s.value()));
  s.synchronize();
  CHECK(p[8191] == 0x11);
  MRSTACK_CUDA_TRY(cudaFree(d));
  mr.deallocate(p, 8192, s, 4096);
  CHECK(mr.kind() == memory_kind::pinned_host);
}

TEST_CASE("the current device resource defaults to cuda and serves device_buffer") {
  auto current = get_current_device_resource();
  CHECK(current->name() == "cuda");
  stream s;
  device_buffer buf{1 << 20, s};
  MRSTACK_CUDA_TRY(cudaMemsetAsync(buf.data(), 1, buf.size(), s.value()));
  unsigned char last = 0;
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(&last, static_cast<unsigned char*>(buf.data()) + buf.size() - 1, 1,
                                   cudaMemcpyDeviceToHost, s.value()));
  s.synchronize();
  CHECK(last == 1);

  auto async = std::make_shared<cuda_async_memory_resource>();
  auto previous = set_current_device_resource(async);
  CHECK(get_current_device_resource() == async);
  { device_buffer b2{4096, s}; CHECK(async->used_bytes() >= 4096); }
  set_current_device_resource(previous);
}

TEST_CASE("an ordinal past this machine's devices is refused when the upstream is made") {
  int count = 0;
  MRSTACK_CUDA_TRY(cudaGetDeviceCount(&count));
  CHECK_THROWS_WITH(cuda_memory_resource{count}, Catch::Contains("cuda: device " + std::to_string(count) +
                                                                 " does not exist: this machine has"));
  CHECK_THROWS_WITH(managed_memory_resource{count}, Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(pinned_host_memory_resource{count}, Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(cuda_async_memory_resource(0, std::nullopt, count), Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(make_stack("pool > cuda(device=" + std::to_string(count) + ")"), Catch::Contains("does not exist"));
  CHECK(cuda_memory_resource{count - 1}.device() == count - 1);
}
