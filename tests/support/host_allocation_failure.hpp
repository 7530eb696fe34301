#pragma once
// Makes host allocations fail on purpose, so a test can run a resource's books (tables,
// stacks, caches) out of host memory at a chosen point. It replaces the global operator
// new and delete (and, on demand, calloc): include it in exactly ONE source file of a test
// program.
//
// `test::fail_host_allocations_from = n` makes every host allocation of n bytes or more
// on the thread that set it throw std::bad_alloc (0: none fail). Set it back to 0 before
// any check that allocates (Catch2's own messages do). `test::fail_host_allocation_in = n`
// makes the n-th host allocation from now on that thread throw (0: the next; -1: none), so
// a test can fail each allocation of an operation in turn.
//
// AddressSanitizer keeps an operator new of its own (it reports memory from it freed here
// as a mismatch), and clang links the runtimes of ThreadSanitizer, MemorySanitizer and
// LeakSanitizer whole into the program, their operator new and delete with them (a
// second definition here fails the link): under them nothing is replaced,
// MRSTACK_TEST_HOST_ALLOCATIONS_CAN_FAIL stays undefined, and the cases that need
// failures skip themselves, saying why.
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace mrstack::test {

inline thread_local std::size_t fail_host_allocations_from = 0;
/// `host_allocations_left = n` (n >= 0): the next n host allocations on the thread that
/// set it succeed, and every one after them fails (-1: off). A test sweeps n to run a
/// call out of host memory at each of its allocations in turn.
inline thread_local long host_allocations_left = -1;
/// `fail_host_allocation_in = n` (n >= 0): the n-th host allocation from now on this
/// thread fails (0: the next), and only that one (-1: off): a test fails each allocation
/// of an operation in turn while the rest of it goes on.
inline thread_local long fail_host_allocation_in = -1;

/// `callocs_can_fail = true`: std::calloc (the levels of a page map) is a host allocation
/// under the settings above too, on the thread that set it. Off by default: the settings
/// above were written for operator new alone, and calloc serves the C library as well.
/// Without effect under a sanitizer with an allocator of its own (below): a test that
/// needs it opens with MRSTACK_TEST_NEEDS_CALLOC_FAILURES().
inline thread_local bool callocs_can_fail = false;

/// True when this host allocation must fail (the settings above).
inline bool host_allocation_fails(std::size_t n) noexcept {
  if (fail_host_allocation_in >= 0 && fail_host_allocation_in-- == 0) { return true; }
  if (fail_host_allocations_from != 0 && n >= fail_host_allocations_from) { return true; }
  if (host_allocations_left == 0) { return true; }
  if (host_allocations_left > 0) { --host_allocations_left; }
  return false;
}

inline void* host_allocate(std::size_t n) {
  if (host_allocation_fails(n)) { throw std::bad_alloc{}; }
  if (void* p = std::malloc(n == 0 ? 1 : n)) { return p; }
  throw std::bad_alloc{};
}

/// For types aligned past the default (alignas(64) queues and slots).
inline void* host_allocate_aligned(std::size_t n, std::align_val_t alignment) {
  if (host_allocation_fails(n)) { throw std::bad_alloc{}; }
  auto const a = static_cast<std::size_t>(alignment);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a + (n == 0 ? a : 0))) { return p; }
  throw std::bad_alloc{};
}

}  // namespace mrstack::test

#if defined(__SANITIZE_ADDRESS__)
#define MRSTACK_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MRSTACK_TEST_UNDER_ASAN 1
#endif
#endif

// ThreadSanitizer (MemorySanitizer, LeakSanitizer) serves malloc and free from an
// allocator of its own, reached through calloc too: a calloc replaced here would hand
// out glibc's memory, whose free() that allocator rejects (tsan: "CHECK failed:
// sanitizer_allocator_secondary.h"), in every program including this header. Under them
// calloc is left alone (operator new, built on malloc, is safe) and callocs_can_fail
// does nothing.
#if defined(__SANITIZE_THREAD__)
#define MRSTACK_TEST_UNDER_ALLOCATING_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(leak_sanitizer)
#define MRSTACK_TEST_UNDER_ALLOCATING_SANITIZER 1
#endif
#endif

// gcc's ThreadSanitizer runtime is a shared library: the operator new below replaces its
// own the usual way, so only clang's are left alone.
#if defined(__clang__) && defined(MRSTACK_TEST_UNDER_ALLOCATING_SANITIZER)
#define MRSTACK_TEST_SANITIZER_DEFINES_NEW 1
#endif

#if defined(MRSTACK_TEST_UNDER_ASAN)
#define MRSTACK_TEST_NO_HOST_ALLOCATION_FAILURES_BECAUSE "AddressSanitizer keeps an operator new of its own"
#elif defined(MRSTACK_TEST_SANITIZER_DEFINES_NEW)
#define MRSTACK_TEST_NO_HOST_ALLOCATION_FAILURES_BECAUSE \
  "clang's ThreadSanitizer (MemorySanitizer, LeakSanitizer) runtime defines operator new and delete"
#else
#define MRSTACK_TEST_HOST_ALLOCATIONS_CAN_FAIL 1
void* operator new(std::size_t n) { return mrstack::test::host_allocate(n); }
void* operator new[](std::size_t n) { return mrstack::test::host_allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void* operator new(std::size_t n, std::align_val_t a) { return mrstack::test::host_allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return mrstack::test::host_allocate_aligned(n, a); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#if !defined(MRSTACK_TEST_UNDER_ALLOCATING_SANITIZER)
#define MRSTACK_TEST_CALLOCS_CAN_FAIL 1
// glibc's own calloc under another name: the one below only decides whether to fail.
extern "C" void* __libc_calloc(std::size_t count, std::size_t size);
extern "C" void* calloc(std::size_t count, std::size_t size) noexcept {
  if (mrstack::test::callocs_can_fail && mrstack::test::host_allocation_fails(count * size)) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_calloc(count, size);
}
#endif
#endif

// Opens a test case that needs host allocations to fail: skips it (with a warning) where
// they cannot be made to.
#if defined(MRSTACK_TEST_HOST_ALLOCATIONS_CAN_FAIL)
#define MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES() (void)0
#else
#define MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES()                                                    \
  do {                                                                                                   \
    WARN("skipped: host allocations cannot be made to fail here: " MRSTACK_TEST_NO_HOST_ALLOCATION_FAILURES_BECAUSE); \
    return;                                                                                              \
  } while (false)
#endif

// Opens a test case that needs callocs to fail (callocs_can_fail): skips it where they
// cannot be made to (above).
#if defined(MRSTACK_TEST_CALLOCS_CAN_FAIL)
#define MRSTACK_TEST_NEEDS_CALLOC_FAILURES() (void)0
#else
#define MRSTACK_TEST_NEEDS_CALLOC_FAILURES()                                                    \
  do {                                                                                         \
    WARN("skipped: under this sanitizer (or AddressSanitizer) callocs cannot be made to fail"); \
    return;                                                                                    \
  } while (false)
#endif
