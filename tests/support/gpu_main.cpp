// Entry point of every GPU test: without a usable CUDA device the test says so and exits
// with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE) — never a silent pass.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <cuda_runtime_api.h>

#include <hang_dump.hpp>

int main(int argc, char* argv[]) {
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                status == cudaSuccess ? "ok" : cudaGetErrorName(status), count);
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("device 0: %s, %.1f GiB\n", prop.name, static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  }
  mrstack::test::arm_hang_dump();  // MRSTACK_TEST_HANG_SECONDS: stacks of a hung test
  return Catch::Session().run(argc, argv);
}
