// The C ABI's refusals of bad arguments name the call and what is wrong with which
// argument, each on its own: a message that lists two possible causes, or that leaves
// out the call, does not tell the caller what to fix.
#include <catch2/catch.hpp>

#include <mrstack/c_api.h>

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace {

std::string last_error() { return mrstack_last_error(); }

}  // namespace

TEST_CASE("c api messages: a device ordinal past the table names the call and the bound") {
  mrstack_stack* s = reinterpret_cast<mrstack_stack*>(0x1);
  CHECK(mrstack_device_stack(64, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(s == nullptr);
  CHECK_THAT(last_error(), Catch::StartsWith("mrstack_device_stack: device ordinal 64") && Catch::Contains("[0, 64)"));
}

TEST_CASE("c api messages: a private stack for a device the machine does not have is refused") {
  // Any ordinal >= 0 was taken: over host or simulated memory on a CPU, a stack "of device
  // 5000" was built and reported that device; on a GPU the first call failed as a CUDA error.
  for (int const device : {64, 5000}) {
    mrstack_stack* s = reinterpret_cast<mrstack_stack*>(0x1);
    CHECK(mrstack_stack_create("simulated", device, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
    CHECK(s == nullptr);
    CHECK(last_error() == "mrstack_stack_create: device ordinal " + std::to_string(device) +
                              " is outside [0, 64), the devices that can have a stack");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return;  // no device to count: an ordinal below the bound only labels the stack
  }
  for (auto const& create : {+[](int d, mrstack_stack** s) { return mrstack_stack_create("simulated", d, s); },
                             +[](int d, mrstack_stack** s) { return mrstack_device_stack(d, s); }}) {
    mrstack_stack* s = reinterpret_cast<mrstack_stack*>(0x1);
    CHECK(create(count, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
    CHECK(s == nullptr);
    CHECK_THAT(last_error(), Catch::Contains("device ordinal " + std::to_string(count) +
                                             " does not exist: this machine has " + std::to_string(count) +
                                             " CUDA device"));
  }
}

TEST_CASE("c api messages: the token-returning memalloc says which argument it refuses") {
  mrstack_stack* s = nullptr;
  REQUIRE(mrstack_stack_create("system", 0, &s) == MRSTACK_SUCCESS);
  std::uint64_t ptr = 7;
  CHECK(mrstack_emm_memalloc_token(s, 16, 9, &ptr) == 0);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "mrstack_emm_memalloc_token: unknown client 9");
  CHECK(mrstack_emm_memalloc_token(s, 16, MRSTACK_CLIENT_NUMBA, nullptr) == 0);
  CHECK(last_error() == "mrstack_emm_memalloc_token: the out-pointer is null");
  CHECK(mrstack_emm_memalloc_pair(s, 16, -1).token == 0);
  CHECK(last_error() == "mrstack_emm_memalloc_token: unknown client -1");
  mrstack_statistics books{};
  REQUIRE(mrstack_get_statistics(s, &books) == MRSTACK_SUCCESS);
  CHECK(books.emm_outstanding == 0);  // nothing was allocated by the refused calls
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}

TEST_CASE("c api messages: PyTorch's statistics say whether the device or the out-pointer is wrong") {
  mrstack_torch_stats out{};
  CHECK(mrstack_torch_statistics(64, &out) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "mrstack_torch_statistics: device 64 is outside [0, 64)");
  CHECK(mrstack_torch_statistics(0, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "mrstack_torch_statistics: the out-pointer is null");
}

TEST_CASE("c api messages: a null buffer with a capacity is refused by the calls that copy text out") {
  // The caller said it has room and gave none: its text was silently not copied.
  std::size_t length = 7;
  CHECK(mrstack_configured_spec(nullptr, 16, &length) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "mrstack_configured_spec: a capacity of 16 bytes, but the buffer is null");
  CHECK(length == 7);  // nothing written
  mrstack_stack* s = nullptr;
  REQUIRE(mrstack_stack_create("system", 0, &s) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_describe(s, nullptr, 64, &length) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "mrstack_stack_describe: a capacity of 64 bytes, but the buffer is null");
  // Asking for the length alone stays the way to size a buffer.
  CHECK(mrstack_stack_describe(s, nullptr, 0, &length) == MRSTACK_SUCCESS);
  CHECK(length == 6);
  CHECK(mrstack_configured_spec(nullptr, 0, &length) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}
