// The torch entry points' live-block books (mrstack_torch_alloc / _free / _record_stream)
// over device stacks of simulated memory, where devices 0 and 1 hand out the same
// addresses: many threads allocating, freeing and recording at once, a free racing a
// record_stream on the same block, and host memory running out while the books grow.
// Without a CUDA driver a record_stream that passes the books' check fails at its first
// CUDA call (MRSTACK_ERROR_CUDA); with one it records on the legacy stream (the frees
// then wait for it). What matters here is that the books stay right. Stand-in events
// (mrstack_torch_set_event_hooks_for_tests) take record_stream past its CUDA calls on any
// host: a block freed and another handed out at its address while the event is recorded,
// and host memory running out for the events a block keeps.
#include <catch2/catch.hpp>

#include <mrstack/c_api.h>

#include "host_allocation_failure.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

void configure_once() {
  static bool const done = [] {
    REQUIRE(mrstack_configure("pool(initial=4MiB) > simulated(capacity=1GiB)") == MRSTACK_SUCCESS);
    return true;
  }();
  (void)done;
}

std::uint64_t torch_live_bytes(int device) {
  mrstack_stack* stack = nullptr;
  REQUIRE(mrstack_device_stack(device, &stack) == MRSTACK_SUCCESS);
  mrstack_statistics out{};
  REQUIRE(mrstack_get_statistics(stack, &out) == MRSTACK_SUCCESS);
  return out.clients[MRSTACK_CLIENT_TORCH].live_bytes;
}

/// What the device stack's pool has handed out and not had back: all PyTorch's (no other
/// client uses these stacks).
std::uint64_t pool_live_bytes(int device) {
  mrstack_stack* stack = nullptr;
  REQUIRE(mrstack_device_stack(device, &stack) == MRSTACK_SUCCESS);
  mrstack_fragmentation out{};
  REQUIRE(mrstack_get_fragmentation(stack, &out, nullptr, 0) == MRSTACK_SUCCESS);
  return out.live_bytes;
}

/// 2 where device 1's stack serves (simulated memory needs no second device, but a machine
/// with one real device refuses to make device 1 current), else 1.
int usable_devices() {
  static int const devices = [] {
    void* p = mrstack_torch_alloc(256, 1, nullptr);
    if (p == nullptr) { return 1; }
    mrstack_torch_free(p, 256, 1, nullptr);
    return 2;
  }();
  return devices;
}

struct block {
  void* ptr;
  std::size_t size;
  int device;
};

char* bytes(void* p) { return static_cast<char*>(p); }

std::string hex(void const* p) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return text;
}

/// Stand-in events for one thread's test case at a time: numbered, and never allocating
/// (a case runs record_stream out of host memory). `during_record` runs where the event is
/// recorded, with no lock held.
class stand_in_events {
 public:
  explicit stand_in_events(std::function<void(void*)> during_record = {}) {
    during_record_ = std::move(during_record);
    made_ = destroyed_ = 0;
    mrstack_torch_set_event_hooks_for_tests(&hooks);
  }
  stand_in_events(stand_in_events const&) = delete;
  stand_in_events& operator=(stand_in_events const&) = delete;
  ~stand_in_events() {
    mrstack_torch_set_event_hooks_for_tests(nullptr);
    during_record_ = {};
  }
  // Static: still readable once the hooks are unset.
  [[nodiscard]] static std::uintptr_t made() { return made_; }
  [[nodiscard]] static std::uintptr_t destroyed() { return destroyed_; }

 private:
  static void* record(void* ptr, void*) {
    if (during_record_) { during_record_(ptr); }
    return reinterpret_cast<void*>(++made_);
  }
  static void destroy(void*) { ++destroyed_; }  // called from noexcept code: no REQUIRE here
  static constexpr mrstack_torch_event_hooks hooks{&record, &destroy};
  static inline std::function<void(void*)> during_record_;
  static inline std::uintptr_t made_ = 0;
  static inline std::uintptr_t destroyed_ = 0;
};

}  // namespace

TEST_CASE("torch books: threads allocating, freeing and recording at once keep them right") {
  configure_once();
  int const devices = usable_devices();
  constexpr int threads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([t, devices, &failures] {
      std::mt19937_64 rng{static_cast<std::uint64_t>(t) + 1};
      std::vector<block> mine;
      auto fail = [&] { failures.fetch_add(1); };
      for (int step = 0; step < 6000; ++step) {
        auto const op = rng() % 8;
        if (op < 3 || mine.empty()) {
          std::size_t const size = std::size_t{256} << (rng() % 8);
          int const device = static_cast<int>(rng() % static_cast<unsigned>(devices));
          void* p = mrstack_torch_alloc(size, device, nullptr);
          if (p == nullptr) { fail(); continue; }
          mine.push_back(block{p, size, device});
        } else if (op < 6) {
          std::size_t const i = rng() % mine.size();
          block const b = mine[i];
          mine[i] = mine.back();
          mine.pop_back();
          mrstack_torch_free(b.ptr, b.size, b.device, nullptr);
        } else if (op == 6) {
          // One of mine: the check passes (CUDA then fails without a driver), unless the
          // other device's stack has a live block at the same address too.
          block const& b = mine[rng() % mine.size()];
          int const status = mrstack_torch_record_stream(b.ptr, nullptr);
          bool const shared = status == MRSTACK_ERROR_INVALID_ARGUMENT &&
                              std::string{mrstack_last_error()}.find("devices' stacks at once") != std::string::npos;
          if (!(status == MRSTACK_SUCCESS || status == MRSTACK_ERROR_CUDA || shared)) { fail(); }
          // Into one of mine: refused, unless the other device has a block starting there.
          if (b.size > 256) {
            int const into = mrstack_torch_record_stream(bytes(b.ptr) + 256, nullptr);
            if (into != MRSTACK_ERROR_INVALID_ARGUMENT && into != MRSTACK_ERROR_CUDA && into != MRSTACK_SUCCESS) {
              fail();
            }
          }
        } else if (step % 64 == 7) {
          // Refused frees, which must change nothing: a device that holds nothing (no stack, or
          // one PyTorch never used), into a block.
          block const& b = mine[rng() % mine.size()];
          mrstack_torch_free(b.ptr, b.size, 2, nullptr);
          if (b.size > 256) { mrstack_torch_free(bytes(b.ptr) + 256, b.size - 256, b.device, nullptr); }
        }
      }
      for (block const& b : mine) { mrstack_torch_free(b.ptr, b.size, b.device, nullptr); }
    });
  }
  for (auto& w : workers) { w.join(); }
  CHECK(failures.load() == 0);
  for (int device = 0; device < devices; ++device) {
    CHECK(torch_live_bytes(device) == 0);
    CHECK(pool_live_bytes(device) == 0);
  }
  // Nothing is live: every pointer handed out is refused now.
  void* p = mrstack_torch_alloc(4096, 0, nullptr);
  REQUIRE(p != nullptr);
  mrstack_torch_free(p, 4096, 0, nullptr);
  CHECK(mrstack_torch_record_stream(p, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("torch books: a free racing a record_stream on the same block") {
  configure_once();
  constexpr int rounds = 3000;
  std::atomic<void*> published{nullptr};
  std::atomic<int> round{0};
  std::atomic<int> bad{0};
  std::thread recorder{[&] {
    for (int r = 0; r < rounds; ++r) {
      void* p = nullptr;
      while ((p = published.load(std::memory_order_acquire)) == nullptr && round.load() == r) {}
      for (int i = 0; i < 4 && p != nullptr; ++i) {
        int const status = mrstack_torch_record_stream(p, nullptr);
        if (status != MRSTACK_SUCCESS && status != MRSTACK_ERROR_CUDA && status != MRSTACK_ERROR_INVALID_ARGUMENT) {
          bad.fetch_add(1);
        }
      }
      while (round.load() == r) {}
    }
  }};
  for (int r = 0; r < rounds; ++r) {
    void* p = mrstack_torch_alloc(1024, 0, nullptr);
    REQUIRE(p != nullptr);
    published.store(p, std::memory_order_release);
    mrstack_torch_free(p, 1024, 0, nullptr);
    published.store(nullptr, std::memory_order_release);
    round.fetch_add(1);
  }
  recorder.join();
  CHECK(bad.load() == 0);
  CHECK(torch_live_bytes(0) == 0);
}

TEST_CASE("torch books: no host memory to grow them fails the allocation and gives the block back") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  configure_once();
  std::uint64_t const live_before = torch_live_bytes(0);
  // Enough blocks that every shard's table grows; each allocation is run out of host memory
  // at each of its host allocations in turn (the pool's bookkeeping, the table's growth)
  // before it is let through.
  std::vector<void*> held;
  int refusals = 0;
  int refused_by_books = 0;
  for (int i = 0; i < 64 * 48; ++i) {
    void* p = nullptr;
    for (long n = 0; p == nullptr; ++n) {
      mrstack::test::fail_host_allocation_in = n;
      p = mrstack_torch_alloc(256, 0, nullptr);
      bool const failed_inside = mrstack::test::fail_host_allocation_in < 0;
      mrstack::test::fail_host_allocation_in = -1;
      if (p != nullptr) { break; }
      REQUIRE(failed_inside);
      ++refusals;
      std::string const why = mrstack_last_error();
      INFO(why);
      REQUIRE(mrstack_last_error_status() == MRSTACK_ERROR_OUT_OF_MEMORY);
      // The message says where host memory ran out: the pool's bookkeeping, or the books.
      bool const books = why == "mrstack_torch_alloc: out of host memory for the live-block books of device 0, "
                                "which could not grow to hold a block of 256 bytes; the block went back to the stack";
      REQUIRE((books || why.find("pool") != std::string::npos));
      refused_by_books += books ? 1 : 0;
      // Nothing of the refused allocation stays: the pool has back what PyTorch does not hold.
      REQUIRE(torch_live_bytes(0) == live_before + held.size() * 256);
      REQUIRE(pool_live_bytes(0) == torch_live_bytes(0));
    }
    held.push_back(p);
  }
  CHECK(refusals > 0);
  CHECK(refused_by_books > 0);  // some allocation met a table that had to grow
  for (void* p : held) { mrstack_torch_free(p, 256, 0, nullptr); }
  CHECK(torch_live_bytes(0) == live_before);
  CHECK(pool_live_bytes(0) == live_before);
}

TEST_CASE("torch books: a recorded event is kept for its block and destroyed by the block's free") {
  configure_once();
  stand_in_events events;
  void* p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  CHECK(mrstack_torch_record_stream(p, nullptr) == MRSTACK_SUCCESS);
  CHECK(mrstack_torch_record_stream(p, nullptr) == MRSTACK_SUCCESS);
  CHECK(events.made() == 2);
  CHECK(events.destroyed() == 0);
  mrstack_torch_free(p, 1024, 0, nullptr);
  CHECK(events.destroyed() == 2);
}

TEST_CASE("torch books: record_stream keeps no event for a block handed out at its address while recording") {
  configure_once();
  std::uint64_t const live_before = torch_live_bytes(0);
  void* const p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  // Another thread (misuse, but a real race) frees the block while its event is recorded,
  // and an allocation gets the same address: that new block's free must not wait for the
  // event, which belongs to work on the old one.
  void* again = nullptr;
  std::vector<void*> others;
  stand_in_events events{[&](void* ptr) {
    mrstack_torch_free(ptr, 1024, 0, nullptr);
    for (int i = 0; i < 64 && again != ptr; ++i) {
      void* q = mrstack_torch_alloc(1024, 0, nullptr);
      if (q == ptr) {
        again = q;
      } else if (q != nullptr) {
        others.push_back(q);
      }
    }
  }};
  int const status = mrstack_torch_record_stream(p, nullptr);
  std::string const why = mrstack_last_error();
  for (void* q : others) { mrstack_torch_free(q, 1024, 0, nullptr); }
  REQUIRE(again == p);
  INFO(why);
  CHECK(status == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(why == "mrstack_torch_record_stream: " + hex(p) +
                   " was freed while its event was recorded; no event was kept");
  CHECK(events.made() == 1);
  CHECK(events.destroyed() == 1);  // refused, and destroyed at once
  mrstack_torch_free(again, 1024, 0, nullptr);
  CHECK(events.destroyed() == 1);  // the new block kept nothing
  CHECK(torch_live_bytes(0) == live_before);
}

TEST_CASE("torch books: no host memory for a block's recorded uses keeps no event and says so") {
  MRSTACK_TEST_NEEDS_HOST_ALLOCATION_FAILURES();
  configure_once();
  stand_in_events events;
  void* const p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  // The block's first event (its vector, a node of the map, maybe the map's buckets), then
  // a second (the vector grows): each host allocation fails in turn before one goes through.
  int refusals = 0;
  for (std::uintptr_t kept = 0; kept < 2; ++kept) {
    for (long n = 0;; ++n) {
      mrstack::test::fail_host_allocation_in = n;
      int const status = mrstack_torch_record_stream(p, nullptr);
      bool const failed_inside = mrstack::test::fail_host_allocation_in < 0;
      mrstack::test::fail_host_allocation_in = -1;
      if (status == MRSTACK_SUCCESS) { break; }
      REQUIRE(failed_inside);
      ++refusals;
      REQUIRE(status == MRSTACK_ERROR_OUT_OF_MEMORY);
      REQUIRE(std::string{mrstack_last_error()} == "mrstack_torch_record_stream: out of host memory for the recorded "
                                                   "uses of block " + hex(p) + " of device 0; no event was kept");
      REQUIRE(events.destroyed() == events.made() - kept);  // the refused one is gone already
    }
  }
  CHECK(refusals >= 2);
  CHECK(events.made() == events.destroyed() + 2);
  mrstack_torch_free(p, 1024, 0, nullptr);  // waits for the two kept, and for nothing else
  CHECK(events.destroyed() == events.made());
}

TEST_CASE("torch books: a free refused while the event is recorded leaves the block and keeps the event") {
  configure_once();
  void* const p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  // Refused frees take the block out of the books and put it back: the same block, so the
  // event recorded for it meanwhile is kept for it.
  stand_in_events events{[](void* ptr) {
    mrstack_torch_free(ptr, std::size_t{1} << 50, 0, nullptr);  // another size than the block's
    mrstack_torch_free(ptr, 1024, 2, nullptr);                  // a device that holds nothing
  }};
  CHECK(mrstack_torch_record_stream(p, nullptr) == MRSTACK_SUCCESS);
  CHECK(events.made() == 1);
  CHECK(events.destroyed() == 0);
  mrstack_torch_free(p, 1024, 0, nullptr);
  CHECK(events.destroyed() == 1);
}

TEST_CASE("torch books: two record_streams and a free racing keep each event for its own block") {
  configure_once();
  std::uint64_t const live_before = torch_live_bytes(0);
  void* const p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  // While the first record_stream records, a second one records for the same block, then
  // the block is freed and one at its address handed out: the second's event is the old
  // block's, consumed by its free; the first finds another block and keeps nothing.
  int inner = -1;
  void* again = nullptr;
  std::vector<void*> others;
  stand_in_events events{[&](void* ptr) {
    if (inner != -1) { return; }  // the second record_stream's own recording
    inner = MRSTACK_ERROR_UNKNOWN;
    inner = mrstack_torch_record_stream(ptr, nullptr);
    mrstack_torch_free(ptr, 1024, 0, nullptr);
    for (int i = 0; i < 64 && again != ptr; ++i) {
      void* q = mrstack_torch_alloc(1024, 0, nullptr);
      if (q == ptr) {
        again = q;
      } else if (q != nullptr) {
        others.push_back(q);
      }
    }
  }};
  int const outer = mrstack_torch_record_stream(p, nullptr);
  for (void* q : others) { mrstack_torch_free(q, 1024, 0, nullptr); }
  REQUIRE(again == p);
  CHECK(inner == MRSTACK_SUCCESS);
  CHECK(outer == MRSTACK_ERROR_INVALID_ARGUMENT);
  CHECK(events.made() == 2);
  CHECK(events.destroyed() == 2);  // the inner one by the old block's free, the outer one refused
  mrstack_torch_free(again, 1024, 0, nullptr);
  CHECK(events.destroyed() == 2);
  CHECK(torch_live_bytes(0) == live_before);
}

TEST_CASE("torch books: an event made through the hooks goes to their destroy after they are unset") {
  configure_once();
  void* const p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  {
    stand_in_events events;
    REQUIRE(mrstack_torch_record_stream(p, nullptr) == MRSTACK_SUCCESS);
  }
  // The free comes after the hooks are unset (a test that ends early leaves its blocks to a
  // later free): cudaStreamWaitEvent and cudaEventDestroy on a stand-in, no event at all,
  // had been called on a GPU host.
  mrstack_torch_free(p, 1024, 0, nullptr);
  CHECK(stand_in_events::made() == 1);
  CHECK(stand_in_events::destroyed() == 1);
}

TEST_CASE("torch books: a free of another size than the block's is refused, and the right one then frees it") {
  configure_once();
  // The pool takes 1000 and 1024 bytes back as one block and the torch client holds
  // more than 1000 bytes, so only the books' size can tell this free is wrong.
  std::uint64_t const before = torch_live_bytes(0);
  void* p = mrstack_torch_alloc(1024, 0, nullptr);
  REQUIRE(p != nullptr);
  mrstack_torch_free(p, 1000, 0, nullptr);
  std::string const message = mrstack_last_error();
  CHECK(message.find("was allocated with 1024 bytes, not the 1000") != std::string::npos);
  CHECK(torch_live_bytes(0) == before + 1024);
  mrstack_torch_free(p, 1024, 0, nullptr);
  CHECK(torch_live_bytes(0) == before);
  CHECK(mrstack_torch_record_stream(p, nullptr) == MRSTACK_ERROR_INVALID_ARGUMENT);  // gone from the books
}
