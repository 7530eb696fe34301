// tests/support/host_allocation_failure.hpp in a program of its own, built by run.cmake
// with clang plainly and under ThreadSanitizer: it must link under both, make host
// allocations fail where it replaces operator new, and say why where it cannot.
#include <host_allocation_failure.hpp>

#include <cstdio>
#include <new>
#include <vector>

int main() {
#if defined(MRSTACK_TEST_HOST_ALLOCATIONS_CAN_FAIL)
  mrstack::test::fail_host_allocations_from = 1;
  try {
    std::vector<int> const v(16);
    mrstack::test::fail_host_allocations_from = 0;
    std::puts("host allocations did not fail although operator new is replaced");
    return 1;
  } catch (std::bad_alloc const&) {
    mrstack::test::fail_host_allocations_from = 0;
  }
  std::puts("host allocations can fail");
#else
  std::printf("host allocations cannot fail: %s\n", MRSTACK_TEST_NO_HOST_ALLOCATION_FAILURES_BECAUSE);
#endif
  return 0;
}
