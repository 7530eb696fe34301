// The C ABI on the CPU, through libmrstack_c.so itself (or its sources where the shared
// library is not built): every failure comes back as a status with a per-thread message,
// spec errors carry the parser's message and column, the per-client books add up, the EMM
// operations behave as emm::adapter's, and the process-wide configuration rules hold.
#include <catch2/catch.hpp>

#include <mrstack/c_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

std::string last_error() { return mrstack_last_error(); }

mrstack_stack* make(char const* spec) {
  mrstack_stack* s = nullptr;
  REQUIRE(mrstack_stack_create(spec, 0, &s) == MRSTACK_SUCCESS);
  REQUIRE(s != nullptr);
  return s;
}

mrstack_statistics stats(mrstack_stack* s) {
  mrstack_statistics out{};
  REQUIRE(mrstack_get_statistics(s, &out) == MRSTACK_SUCCESS);
  return out;
}

}  // namespace

TEST_CASE("c api: versions and names") {
  CHECK(mrstack_c_api_version() == MRSTACK_C_API_VERSION);
  CHECK(mrstack_emm_interface_version() == 1);
  CHECK(std::string{mrstack_status_name(MRSTACK_ERROR_SPEC)} == "MRSTACK_ERROR_SPEC");
  CHECK(std::string{mrstack_status_name(99)} == "unknown status");
  CHECK(std::string{mrstack_client_name(MRSTACK_CLIENT_TORCH)} == "torch");
  CHECK(mrstack_client_name(MRSTACK_CLIENT_COUNT) == nullptr);
}

TEST_CASE("c api: a bad spec is MRSTACK_ERROR_SPEC with the parser's message and column") {
  mrstack_stack* s = reinterpret_cast<mrstack_stack*>(0x1);
  CHECK(mrstack_stack_create("no_such_resource_xyz > system", 0, &s) == MRSTACK_ERROR_SPEC);
  CHECK(s == nullptr);
  CHECK_THAT(last_error(), Catch::Contains("no_such_resource_xyz"));
  CHECK(mrstack_last_error_column() >= 1);
  // A later error of another kind resets the column.
  CHECK(mrstack_stack_create(nullptr, 0, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_last_error_column() == 0);
}

TEST_CASE("c api: null and out-of-range arguments are refused with a message naming the call") {
  mrstack_stack* s = nullptr;
  CHECK(mrstack_stack_create("system", 0, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_stack_create"));
  CHECK(mrstack_stack_create("system", -1, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("-1"));
  void* p = nullptr;
  CHECK(mrstack_allocate(nullptr, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_allocate"));
  CHECK(mrstack_emm_memalloc(nullptr, 16, 0, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_emm_free(nullptr, 1) == -1);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_emm_free"));
  CHECK(mrstack_device_stack(-3, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_device_stack(1000, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("1000"));
  CHECK(mrstack_device_stack_if_built(1000) == nullptr);
  CHECK(mrstack_stack_destroy(nullptr) == MRSTACK_SUCCESS);

  auto* sys = make("system");
  CHECK(mrstack_allocate(sys, 16, nullptr, 17, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("client 17"));
  mrstack_memory_pointer m{};
  CHECK(mrstack_emm_memalloc(sys, 16, -1, &m) == MRSTACK_ERROR_INVALID_ARGUMENT);
  std::uint64_t ptr = 0;
  CHECK(mrstack_emm_memalloc_token(sys, 16, 9, &ptr) == 0);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: exceptions inside become statuses: out of memory, a broken contract") {
  // A limit makes the refusal (a 4 EiB request would also do, but sanitizers abort on it).
  auto* sys = make("limiting(limit=1MiB) > system");
  void* p = reinterpret_cast<void*>(0x1);
  CHECK(mrstack_allocate(sys, 2 << 20, nullptr, MRSTACK_CLIENT_OTHER, &p) == MRSTACK_ERROR_OUT_OF_MEMORY);
  CHECK(p == nullptr);
  CHECK_THAT(last_error(), Catch::Contains("limiting"));
  CHECK(stats(sys).live_bytes == 0);  // a refusal is not counted
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);

  auto* sim = make("simulated");
  int foreign = 0;
  CHECK(mrstack_deallocate(sim, &foreign, 256, nullptr, MRSTACK_CLIENT_OTHER) == MRSTACK_ERROR_LOGIC);
  CHECK_FALSE(last_error().empty());
  CHECK(mrstack_stack_destroy(sim) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: the last error belongs to the thread that failed") {
  mrstack_stack* s = nullptr;
  CHECK(mrstack_stack_create("system", -7, &s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  std::string mine = last_error();
  std::string other_before;
  std::string other_after;
  std::thread t([&] {
    other_before = mrstack_last_error();
    mrstack_stack* s2 = nullptr;
    (void)mrstack_stack_create("system", -9, &s2);
    other_after = mrstack_last_error();
  });
  t.join();
  CHECK(other_before.empty());
  CHECK_THAT(other_after, Catch::Contains("-9"));
  CHECK(last_error() == mine);
  CHECK_THAT(mine, Catch::Contains("-7"));
}

TEST_CASE("c api: per-client live and peak bytes") {
  auto* sys = make("system");
  char text[64];
  std::size_t length = 0;
  REQUIRE(mrstack_stack_describe(sys, text, sizeof text, &length) == MRSTACK_SUCCESS);
  CHECK(std::string{text} == "system");
  CHECK(length == 6);
  char tiny[4];
  REQUIRE(mrstack_stack_describe(sys, tiny, sizeof tiny, &length) == MRSTACK_SUCCESS);
  CHECK(std::string{tiny} == "sys");  // truncated, NUL-terminated
  CHECK(length == 6);

  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  REQUIRE(mrstack_allocate(sys, 1000, nullptr, MRSTACK_CLIENT_CUPY, &a) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(sys, 3000, nullptr, MRSTACK_CLIENT_CUPY, &b) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(sys, 500, nullptr, MRSTACK_CLIENT_OTHER, &c) == MRSTACK_SUCCESS);
  std::memset(a, 1, 1000);
  mrstack_memory_pointer m{};
  REQUIRE(mrstack_emm_memalloc(sys, 7000, MRSTACK_CLIENT_NUMBA, &m) == MRSTACK_SUCCESS);
  CHECK(m.client == MRSTACK_CLIENT_NUMBA);
  CHECK(m.size == 7000);
  CHECK(m.token != 0);

  auto s = stats(sys);
  CHECK(s.live_bytes == 11500);
  CHECK(s.peak_bytes == 11500);
  CHECK(s.emm_outstanding == 1);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].live_bytes == 4000);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].live_count == 2);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 7000);
  CHECK(s.clients[MRSTACK_CLIENT_OTHER].live_bytes == 500);
  CHECK(s.clients[MRSTACK_CLIENT_TORCH].live_bytes == 0);

  REQUIRE(mrstack_deallocate(sys, b, 3000, nullptr, MRSTACK_CLIENT_CUPY) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_free(sys, m.token) == 1);
  CHECK(mrstack_emm_free(sys, m.token) == 0);  // exactly once
  s = stats(sys);
  CHECK(s.live_bytes == 1500);
  CHECK(s.peak_bytes == 11500);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].live_bytes == 1000);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].peak_bytes == 4000);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].allocations == 2);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 0);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].peak_bytes == 7000);
  CHECK(s.emm_outstanding == 0);

  REQUIRE(mrstack_reset_peaks(sys) == MRSTACK_SUCCESS);
  s = stats(sys);
  CHECK(s.peak_bytes == 1500);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].peak_bytes == 0);
  CHECK(s.clients[MRSTACK_CLIENT_CUPY].peak_bytes == 1000);

  REQUIRE(mrstack_deallocate(sys, a, 1000, nullptr, MRSTACK_CLIENT_CUPY) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_deallocate(sys, c, 500, nullptr, MRSTACK_CLIENT_OTHER) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(sys, nullptr, 0, nullptr, MRSTACK_CLIENT_OTHER) == MRSTACK_SUCCESS);
  CHECK(stats(sys).live_bytes == 0);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: the EMM operations") {
  auto* sim = make("simulated");
  REQUIRE(mrstack_emm_initialize(sim) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_initialize(sim) == MRSTACK_SUCCESS);

  std::uint64_t ptr = 0;
  std::uint64_t const t1 = mrstack_emm_memalloc_token(sim, 4096, MRSTACK_CLIENT_NUMBA, &ptr);
  REQUIRE(t1 != 0);
  CHECK(ptr != 0);
  std::uint64_t ptr2 = 0;
  std::uint64_t const t2 = mrstack_emm_memalloc_token(sim, 256, MRSTACK_CLIENT_NUMBA, &ptr2);
  REQUIRE(t2 != 0);
  CHECK(t2 != t1);

  // Deferred cleanup: freed, but held until the outermost end.
  REQUIRE(mrstack_emm_defer_begin(sim) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_defer_begin(sim) == MRSTACK_SUCCESS);
  CHECK(stats(sim).deferral_depth == 2);
  CHECK(mrstack_emm_free(sim, t2) == 1);
  REQUIRE(mrstack_emm_defer_end(sim) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_defer_end(sim) == MRSTACK_SUCCESS);
  CHECK(mrstack_emm_defer_end(sim) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("never begun"));

  // Reset: everything outstanding goes, the books close, the token goes stale.
  std::size_t released = 99;
  REQUIRE(mrstack_emm_reset(sim, &released) == MRSTACK_SUCCESS);
  CHECK(released == 1);
  CHECK(mrstack_emm_free(sim, t1) == 0);
  auto s = stats(sim);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 0);
  CHECK(s.clients[MRSTACK_CLIENT_NUMBA].live_count == 0);
  CHECK(s.emm_outstanding == 0);

  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  REQUIRE(mrstack_emm_get_memory_info(sim, &free_bytes, &total_bytes) == MRSTACK_SUCCESS);
  CHECK(total_bytes > 0);
  CHECK(free_bytes <= total_bytes);

  mrstack_ipc_handle h{};
  CHECK(mrstack_emm_get_ipc_handle(sim, reinterpret_cast<void*>(ptr), &h) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("CUDA IPC"));
  CHECK(mrstack_emm_get_ipc_handle(sim, reinterpret_cast<void*>(ptr), nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_stack_destroy(sim) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: destroying a private stack frees what its EMM side still holds") {
  auto* sys = make("system");
  std::uint64_t ptr = 0;
  REQUIRE(mrstack_emm_memalloc_token(sys, 1 << 20, MRSTACK_CLIENT_NUMBA, &ptr) != 0);
  std::memset(reinterpret_cast<void*>(ptr), 0, 1 << 20);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);  // leak checkers (asan preset) would see it otherwise
}

TEST_CASE("c api: process-wide device stacks, configuration, and PyTorch's entry points") {
  // One test case: the configuration is process-wide state.
  char spec[64];
  REQUIRE(mrstack_configured_spec(spec, sizeof spec, nullptr) == MRSTACK_SUCCESS);
  CHECK(std::string{spec}.size() > 0);
  // A bad spec is refused at once, with the parser's message, and changes nothing.
  CHECK(mrstack_configure("pool(initial=12 parsecs) > cuda") == MRSTACK_ERROR_SPEC);
  CHECK_THAT(last_error(), Catch::Contains("parsecs"));
  CHECK(mrstack_last_error_column() > 1);
  CHECK(mrstack_configure("no_such_resource_xyz") == MRSTACK_ERROR_SPEC);
  REQUIRE(mrstack_configured_spec(spec, sizeof spec, nullptr) == MRSTACK_SUCCESS);
  CHECK(std::string{spec}.find("no_such") == std::string::npos);

  // A stack that fails to build (here: an upstream that needs a GPU this test may not
  // have, or a limit too small) leaves the slot empty and says why; PyTorch's entry point
  // reports it on stderr and returns null.
  REQUIRE(mrstack_configure("pool(initial=1MiB) > limiting(limit=64KiB) > system") == MRSTACK_SUCCESS);
  mrstack_stack* dev = nullptr;
  CHECK(mrstack_device_stack(0, &dev) == MRSTACK_ERROR_OUT_OF_MEMORY);
  CHECK(dev == nullptr);
  CHECK(mrstack_device_stack_if_built(0) == nullptr);
  CHECK(mrstack_torch_alloc(256, 0, nullptr) == nullptr);  // says why on stderr, no exception
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_OUT_OF_MEMORY);

  REQUIRE(mrstack_configure("system") == MRSTACK_SUCCESS);
  REQUIRE(mrstack_configured_spec(spec, sizeof spec, nullptr) == MRSTACK_SUCCESS);
  CHECK(std::string{spec} == "system");
  REQUIRE(mrstack_device_stack(0, &dev) == MRSTACK_SUCCESS);
  REQUIRE(dev != nullptr);
  CHECK(mrstack_device_stack_if_built(0) == dev);
  mrstack_stack* again = nullptr;
  REQUIRE(mrstack_device_stack(0, &again) == MRSTACK_SUCCESS);
  CHECK(again == dev);

  // Too late to change it; saying the same again is fine.
  CHECK(mrstack_configure("simulated") == MRSTACK_ERROR_STATE);
  CHECK_THAT(last_error(), Catch::Contains("already built") && Catch::Contains("system"));
  CHECK(mrstack_configure("system") == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(dev) == MRSTACK_ERROR_STATE);

  // PyTorch's pair serves the same stack, on the torch client's books.
  void* p = mrstack_torch_alloc(5000, 0, nullptr);
  REQUIRE(p != nullptr);
  std::memset(p, 0x3c, 5000);
  void* q = mrstack_torch_alloc(0, 0, nullptr);
  CHECK(q == nullptr);
  auto s = stats(dev);
  CHECK(s.clients[MRSTACK_CLIENT_TORCH].live_bytes == 5000);
  CHECK(s.clients[MRSTACK_CLIENT_TORCH].live_count == 1);
  mrstack_torch_free(p, 5000, 0, nullptr);
  mrstack_torch_free(nullptr, 0, 0, nullptr);
  s = stats(dev);
  CHECK(s.clients[MRSTACK_CLIENT_TORCH].live_bytes == 0);
  CHECK(s.clients[MRSTACK_CLIENT_TORCH].peak_bytes == 5000);

  // A free on a device that never had a stack cannot be ours: reported, not thrown.
  int x = 0;
  mrstack_torch_free(&x, 4, 5, nullptr);
  CHECK_THAT(last_error(), Catch::Contains("device 5"));
}

TEST_CASE("c api: many threads allocate and free through one stack; the books balance") {
  auto* sys = make("system");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([sys, t] {
      int const client = t % MRSTACK_CLIENT_COUNT;
      for (int i = 0; i < 2000; ++i) {
        if (i % 2 == 0) {
          std::uint64_t ptr = 0;
          std::uint64_t token = mrstack_emm_memalloc_token(sys, 64 + static_cast<std::size_t>(i), client, &ptr);
          if (token != 0) { (void)mrstack_emm_free(sys, token); }
        } else {
          void* p = nullptr;
          if (mrstack_allocate(sys, 128, nullptr, client, &p) == MRSTACK_SUCCESS) {
            (void)mrstack_deallocate(sys, p, 128, nullptr, client);
          }
        }
      }
    });
  }
  for (auto& th : threads) { th.join(); }
  auto s = stats(sys);
  CHECK(s.live_bytes == 0);
  std::uint64_t total_allocations = 0;
  for (auto const& c : s.clients) {
    CHECK(c.live_bytes == 0);
    CHECK(c.live_count == 0);
    total_allocations += c.allocations;
  }
  CHECK(total_allocations == 8 * 2000);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: the last failure's status is kept for calls that return a token or a pointer") {
  auto* sys = make("limiting(limit=1MiB) > system");
  std::uint64_t ptr = 0;
  CHECK(mrstack_emm_memalloc_token(sys, 2 << 20, MRSTACK_CLIENT_NUMBA, &ptr) == 0);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_OUT_OF_MEMORY);
  CHECK(mrstack_emm_memalloc_token(sys, 16, 42, &ptr) == 0);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: memalloc_pair returns pointer and token together, token 0 on failure") {
  auto* sys = make("system");
  auto a = mrstack_emm_memalloc_pair(sys, 1024, MRSTACK_CLIENT_NUMBA);
  CHECK(a.token != 0);
  CHECK(a.ptr != 0);
  std::memset(reinterpret_cast<void*>(a.ptr), 0, 1024);
  CHECK(stats(sys).clients[MRSTACK_CLIENT_NUMBA].live_bytes == 1024);
  CHECK(mrstack_emm_free(sys, a.token) == 1);
  auto* limited = make("limiting(limit=1MiB) > system");
  auto bad = mrstack_emm_memalloc_pair(limited, 2 << 20, MRSTACK_CLIENT_NUMBA);
  CHECK(bad.token == 0);
  CHECK(bad.ptr == 0);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_OUT_OF_MEMORY);
  CHECK(mrstack_stack_destroy(limited) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(sys) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: {pid} in a spec's values becomes the process id; errors point into the spec as given") {
  std::string const pid = std::to_string(static_cast<long>(getpid()));
  std::string const file = "/tmp/mrstack-c-api-test-{pid}.csv";
  std::string const expanded = "/tmp/mrstack-c-api-test-" + pid + ".csv";
  std::string const spec = "logging(file=\"" + file + "\") > system";
  mrstack_stack* s = nullptr;
  REQUIRE(mrstack_stack_create(spec.c_str(), 0, &s) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
  CHECK(::access(expanded.c_str(), F_OK) == 0);
  (void)::unlink(expanded.c_str());
  // The column is the caller's: counted in the expanded text it moved by the pid's length
  // less 5 for each {pid} before the error.
  std::string const bad = "logging(file=\"/dev/null{pid}\") > bogus";
  CHECK(mrstack_stack_create(bad.c_str(), 0, &s) == MRSTACK_ERROR_SPEC);
  CHECK(mrstack_last_error_column() == bad.find("bogus") + 1);
  CHECK_THAT(last_error(), Catch::Contains("bogus"));
}

// ---- handles --------------------------------------------------------------------------

TEST_CASE("c api: a destroyed handle is refused by every call, with a message, never dereferenced") {
  mrstack_stack* s = make("pool(initial=1MiB) > system");
  void* p = nullptr;
  REQUIRE(mrstack_allocate(s, 1024, nullptr, 0, &p) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_deallocate(s, p, 1024, nullptr, 0) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
  CHECK(mrstack_allocate(s, 1024, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(p == nullptr);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_allocate: stack handle 0x") &&
                               Catch::Contains("was destroyed (mrstack_stack_destroy); it cannot be used again"));
  CHECK(mrstack_deallocate(s, reinterpret_cast<void*>(0x1000), 16, nullptr, 0) == MRSTACK_ERROR_INVALID_ARGUMENT);
  mrstack_statistics st{};
  CHECK(mrstack_get_statistics(s, &st) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_reset_peaks(s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_stack_describe(s, nullptr, 0, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_emm_initialize(s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  std::uint64_t ptr = 0;
  CHECK(mrstack_emm_memalloc_token(s, 64, 0, &ptr) == 0);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_emm_memalloc_pair(s, 64, 0).token == 0);
  CHECK(mrstack_emm_free(s, 1) == -1);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_emm_free: stack handle"));
  CHECK(mrstack_emm_reset(s, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_emm_defer_begin(s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  // Destroying twice is refused too, and says so.
  CHECK(mrstack_stack_destroy(s) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_stack_destroy: stack handle") && Catch::Contains("was destroyed"));
  // A new stack may reuse the slot: the old handle stays dead, the new one works.
  mrstack_stack* t = make("system");
  CHECK(t != s);
  CHECK(mrstack_allocate(s, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  REQUIRE(mrstack_allocate(t, 16, nullptr, 0, &p) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(t, p, 16, nullptr, 0) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(t) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: a value that is no handle (a stray pointer, a forged handle) is refused") {
  int object = 0;
  auto* stray = reinterpret_cast<mrstack_stack*>(&object);
  void* p = nullptr;
  CHECK(mrstack_allocate(stray, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("is not a stack handle (not one mrstack_stack_create or mrstack_device_stack returned)"));
  CHECK(mrstack_stack_destroy(stray) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(object == 0);
  // The right tag, a slot never handed out.
  auto* forged = reinterpret_cast<mrstack_stack*>(std::uintptr_t{0x6d73} << 48 | 0xfffff);
  CHECK(mrstack_allocate(forged, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("is not a stack handle"));
  // A live stack's handle with another generation.
  mrstack_stack* s = make("system");
  auto* other_generation = reinterpret_cast<mrstack_stack*>(reinterpret_cast<std::uintptr_t>(s) ^ (std::uintptr_t{1} << 25));
  CHECK(mrstack_allocate(other_generation, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_stack_destroy(other_generation) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
  CHECK(mrstack_allocate(nullptr, 16, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_allocate: the stack is null"));
}

TEST_CASE("c api: a null pointer is freed as a no-op only with 0 bytes") {
  mrstack_stack* s = make("tracking > system");
  void* p = reinterpret_cast<void*>(0x1);
  REQUIRE(mrstack_allocate(s, 0, nullptr, 0, &p) == MRSTACK_SUCCESS);
  CHECK(p == nullptr);
  CHECK(mrstack_deallocate(s, nullptr, 0, nullptr, 0) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, nullptr, 4096, nullptr, 0) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_deallocate: a null pointer with a size of 4096 bytes"));
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: destroying a stack with live allocations reports their count and bytes, and frees what it can") {
  SECTION("a tracking layer on top finds them: freed") {
    mrstack_stack* s = make("tracking > limiting(1MiB) > system");
    void* a = nullptr;
    void* b = nullptr;
    REQUIRE(mrstack_allocate(s, 1000, nullptr, MRSTACK_CLIENT_CUPY, &a) == MRSTACK_SUCCESS);
    REQUIRE(mrstack_allocate(s, 3000, nullptr, MRSTACK_CLIENT_OTHER, &b) == MRSTACK_SUCCESS);
    mrstack_memory_pointer emm{};
    REQUIRE(mrstack_emm_memalloc(s, 500, MRSTACK_CLIENT_NUMBA, &emm) == MRSTACK_SUCCESS);  // EMM: freed, not reported
    CHECK(mrstack_stack_destroy(s) == MRSTACK_ERROR_LOGIC);
    CHECK_THAT(last_error(), Catch::Contains("mrstack_stack_destroy: 2 allocations (4000 bytes) made with "
                                             "mrstack_allocate were still live: freed through the stack's tracking layer"));
    CHECK(mrstack_allocate(s, 16, nullptr, 0, &a) == MRSTACK_ERROR_INVALID_ARGUMENT);  // destroyed all the same
  }
  SECTION("a pool returns its chunks, live blocks with them") {
    mrstack_stack* s = make("pool(initial=1MiB) > system");
    void* a = nullptr;
    REQUIRE(mrstack_allocate(s, 4096, nullptr, 0, &a) == MRSTACK_SUCCESS);
    CHECK(mrstack_stack_destroy(s) == MRSTACK_ERROR_LOGIC);
    CHECK_THAT(last_error(), Catch::Contains("1 allocation (4096 bytes) made with mrstack_allocate was still live: their "
                                             "memory goes back with the pool layer's chunks"));
  }
  SECTION("nothing live: success") {
    mrstack_stack* s = make("tracking > system");
    mrstack_memory_pointer emm{};
    REQUIRE(mrstack_emm_memalloc(s, 500, MRSTACK_CLIENT_NUMBA, &emm) == MRSTACK_SUCCESS);
    CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
  }
}

TEST_CASE("c api: a destroy waits for calls in flight on other threads; later calls are refused") {
  for (int round = 0; round < 20; ++round) {
    mrstack_stack* s = make("pool(initial=1MiB) > system");
    std::atomic<bool> started{false};
    std::atomic<int> refused{0};
    std::thread worker([&] {
      for (int i = 0; i < 100000; ++i) {
        void* p = nullptr;
        if (mrstack_allocate(s, 256, nullptr, 0, &p) != MRSTACK_SUCCESS) {
          refused.fetch_add(1);
          break;
        }
        started.store(true);
        if (mrstack_deallocate(s, p, 256, nullptr, 0) != MRSTACK_SUCCESS) {
          refused.fetch_add(1);  // destroyed between the two: the block went back with the pool
          break;
        }
      }
    });
    while (!started.load()) { std::this_thread::yield(); }
    auto const status = mrstack_stack_destroy(s);
    CHECK((status == MRSTACK_SUCCESS || status == MRSTACK_ERROR_LOGIC));
    worker.join();
    void* p = nullptr;
    CHECK(mrstack_allocate(s, 256, nullptr, 0, &p) == MRSTACK_ERROR_INVALID_ARGUMENT);
  }
}

TEST_CASE("c api: a free under another client or with another size is refused; the books never wrap") {
  // fixed_size takes any size up to its block size back, so only the books can tell.
  mrstack_stack* s = make("fixed_size > simulated");
  void* p = nullptr;
  REQUIRE(mrstack_allocate(s, 256, nullptr, MRSTACK_CLIENT_NUMBA, &p) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, p, 256, nullptr, MRSTACK_CLIENT_CUPY) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_deallocate: a free of 256 bytes as client cupy of 0x") &&
                               Catch::Contains("which was allocated with 256 bytes as client numba") &&
                               Catch::Contains("nothing was freed"));
  CHECK(mrstack_deallocate(s, p, 512, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("a free of 512 bytes as client numba of 0x") &&
                               Catch::Contains("which was allocated with 256 bytes as client numba"));
  auto st = stats(s);
  CHECK(st.live_bytes == 256);
  CHECK(st.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 256);
  CHECK(st.clients[MRSTACK_CLIENT_NUMBA].live_count == 1);
  CHECK(st.clients[MRSTACK_CLIENT_CUPY].live_bytes == 0);
  CHECK(st.clients[MRSTACK_CLIENT_CUPY].live_count == 0);
  // Still allocated: the right free works, once; a refused free leaves the books as they were.
  CHECK(mrstack_deallocate(s, p, 256, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(s, 64, nullptr, MRSTACK_CLIENT_NUMBA, &p) == MRSTACK_SUCCESS);
  int foreign = 0;
  CHECK(mrstack_deallocate(s, &foreign, 64, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_ERROR_LOGIC);
  CHECK(stats(s).clients[MRSTACK_CLIENT_NUMBA].live_bytes == 64);
  CHECK(mrstack_deallocate(s, p, 64, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_SUCCESS);
  st = stats(s);
  CHECK(st.live_bytes == 0);
  for (auto const& c : st.clients) {
    CHECK(c.live_bytes == 0);
    CHECK(c.live_count == 0);
  }
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: a free the stack's rounding would accept with another size or client is refused") {
  // The pool rounds 1000 and 1024 bytes to one 1024-byte block, so only the C ABI can tell
  // them apart. Such a free used to go through and leave the books 24 bytes short, and the
  // other block's right free was then refused (the books no longer covered it) and leaked.
  mrstack_stack* s = make("pool > simulated");
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  REQUIRE(mrstack_allocate(s, 1000, nullptr, MRSTACK_CLIENT_NUMBA, &a) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(s, 1000, nullptr, MRSTACK_CLIENT_NUMBA, &b) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(s, 1000, nullptr, MRSTACK_CLIENT_CUPY, &c) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, a, 1024, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_deallocate: a free of 1024 bytes as client numba of 0x") &&
                               Catch::Contains("which was allocated with 1000 bytes as client numba") &&
                               Catch::Contains("nothing was freed"));
  // Under the other client, which holds as much: the books would move bytes between them.
  CHECK(mrstack_deallocate(s, a, 1000, nullptr, MRSTACK_CLIENT_CUPY) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("which was allocated with 1000 bytes as client numba"));
  auto st = stats(s);
  CHECK(st.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 2000);
  CHECK(st.clients[MRSTACK_CLIENT_CUPY].live_bytes == 1000);
  CHECK(mrstack_deallocate(s, a, 1000, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, b, 1000, nullptr, MRSTACK_CLIENT_NUMBA) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(s, c, 1000, nullptr, MRSTACK_CLIENT_CUPY) == MRSTACK_SUCCESS);
  CHECK(stats(s).live_bytes == 0);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: a block of one stack freed through another is refused, also where they share a heap") {
  // Every system layer checks frees against one process-wide table (one heap), so g's
  // layer took h's block: g's books lost g's own block and h's kept a freed one.
  mrstack_stack* h = make("system");
  mrstack_stack* g = make("system");
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(mrstack_allocate(h, 1024, nullptr, 0, &a) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_allocate(g, 1024, nullptr, 0, &b) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(g, a, 1024, nullptr, 0) == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("is not a live allocation of this stack") &&
                               Catch::Contains("nothing was freed"));
  CHECK(mrstack_deallocate(h, a, 1024, nullptr, 0) == MRSTACK_SUCCESS);
  CHECK(mrstack_deallocate(h, a, 1024, nullptr, 0) == MRSTACK_ERROR_LOGIC);  // twice
  CHECK(mrstack_deallocate(g, b, 1024, nullptr, 0) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(h) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(g) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: an EMM token of another stack, or one never issued, frees nothing and is an error") {
  mrstack_stack* a = make("pool(initial=1MiB) > system");
  mrstack_stack* b = make("pool(initial=1MiB) > system");
  mrstack_memory_pointer ma{};
  mrstack_memory_pointer mb{};
  REQUIRE(mrstack_emm_memalloc(a, 100, MRSTACK_CLIENT_NUMBA, &ma) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_memalloc(b, 200, MRSTACK_CLIENT_NUMBA, &mb) == MRSTACK_SUCCESS);
  CHECK(ma.token != mb.token);  // unique across stacks, not only within one
  // A's finalizer run against B used to free B's first allocation (the same slot and generation).
  CHECK(mrstack_emm_free(b, ma.token) == -1);
  CHECK(mrstack_last_error_status() == MRSTACK_ERROR_LOGIC);
  CHECK_THAT(last_error(), Catch::Contains("mrstack_emm_free: token 0x") &&
                               Catch::Contains("was never issued by this stack") &&
                               Catch::Contains("nothing was freed"));
  CHECK(stats(b).emm_outstanding == 1);
  CHECK(stats(b).clients[MRSTACK_CLIENT_NUMBA].live_bytes == 200);
  for (std::uint64_t never : {std::uint64_t{0}, std::uint64_t{0xdeadbeef}, ~std::uint64_t{0}}) {
    CHECK(mrstack_emm_free(a, never) == -1);
  }
  CHECK(mrstack_emm_free(b, mb.token) == 1);
  CHECK(mrstack_emm_free(b, mb.token) == 0);  // a second call of its own finalizer stays a no-op
  CHECK(mrstack_emm_free(a, ma.token) == 1);
  size_t released = 1;
  REQUIRE(mrstack_emm_memalloc(a, 100, MRSTACK_CLIENT_NUMBA, &ma) == MRSTACK_SUCCESS);
  REQUIRE(mrstack_emm_reset(a, &released) == MRSTACK_SUCCESS);
  CHECK(mrstack_emm_free(a, ma.token) == 0);  // made stale by the reset: a no-op, not an error
  CHECK(mrstack_stack_destroy(a) == MRSTACK_SUCCESS);
  CHECK(mrstack_stack_destroy(b) == MRSTACK_SUCCESS);
}

TEST_CASE("c api: an EMM reset racing EMM allocations never takes the books below what they hold") {
  // One thread allocates and frees through the EMM side, one resets it over and over, one
  // allocates and frees 64 B of the same client with mrstack_allocate. A reset that freed an
  // EMM allocation before its count was added (it was counted after memalloc returned)
  // took the client's books below zero for a moment: they read as ~2^64 bytes, and the
  // third thread's correct free was refused (and its block leaked).
  mrstack_stack* s = make("pool > simulated");
  std::atomic<bool> stop{false};
  std::thread emm([&] {
    while (!stop.load()) {
      std::uint64_t p = 0;
      std::uint64_t const t = mrstack_emm_memalloc_token(s, 4096, MRSTACK_CLIENT_NUMBA, &p);
      if (t != 0) { (void)mrstack_emm_free(s, t); }
    }
  });
  std::thread resetter([&] {
    while (!stop.load()) {
      std::size_t n = 0;
      (void)mrstack_emm_reset(s, &n);
    }
  });
  int refused = 0;
  int wrapped = 0;
  int failed = 0;
  std::string first_refusal;
  // Half a second of it: on this 2-core VM the old counting wrapped thousands of reads.
  auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds{500};
  while (std::chrono::steady_clock::now() < until) {
    void* p = nullptr;
    if (mrstack_allocate(s, 64, nullptr, MRSTACK_CLIENT_NUMBA, &p) != MRSTACK_SUCCESS) {
      ++failed;
      continue;
    }
    mrstack_statistics st{};
    if (mrstack_get_statistics(s, &st) == MRSTACK_SUCCESS && st.clients[MRSTACK_CLIENT_NUMBA].live_bytes > (1ULL << 62)) {
      ++wrapped;
    }
    if (mrstack_deallocate(s, p, 64, nullptr, MRSTACK_CLIENT_NUMBA) != MRSTACK_SUCCESS && refused++ == 0) {
      first_refusal = last_error();
    }
  }
  stop.store(true);
  emm.join();
  resetter.join();
  CHECK(failed == 0);
  CHECK(first_refusal.empty());
  CHECK(refused == 0);
  CHECK(wrapped == 0);
  std::size_t n = 0;
  CHECK(mrstack_emm_reset(s, &n) == MRSTACK_SUCCESS);
  auto const st = stats(s);
  CHECK(st.clients[MRSTACK_CLIENT_NUMBA].live_bytes == 0);
  CHECK(st.clients[MRSTACK_CLIENT_NUMBA].live_count == 0);
  CHECK(mrstack_stack_destroy(s) == MRSTACK_SUCCESS);
}
