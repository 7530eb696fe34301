// The retry (failure-callback) adaptor: on out_of_memory the callback runs with the bytes
// and its argument, the request is retried while it says so, the last error is rethrown
// when it stops; the default mode releases the stack below before each retry.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/failure_callback_resource_adaptor.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

/// Counts release() calls and forwards everything else to a simulated upstream; after
/// `frees_on_release` is set, a release() frees those blocks (like a pool giving chunks back).
class releasing_resource final : public memory_resource {
 public:
  explicit releasing_resource(std::shared_ptr<simulated_memory_resource> below) : below_{std::move(below)} {}
  int releases = 0;
  int allocate_calls = 0;
  std::vector<std::pair<void*, std::size_t>> freed_on_release;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    ++allocate_calls;
    return below_->allocate(bytes, stream, alignment);
  }
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    below_->deallocate(ptr, bytes, stream, alignment);
  }
  void do_release() override {
    ++releases;
    for (auto [p, n] : freed_on_release) { below_->deallocate(p, n); }
    freed_on_release.clear();
  }
  std::string do_name() const override { return "releasing"; }
  memory_resource* do_upstream() const noexcept override { return below_.get(); }
  std::shared_ptr<simulated_memory_resource> below_;
};

}  // namespace

TEST_CASE("retry: the callback gets the bytes and its argument; retries while it returns true") {
  auto sim = std::make_shared<simulated_memory_resource>(1 << 20);
  auto counting = std::make_shared<releasing_resource>(sim);
  struct state {
    int calls = 0;
    std::size_t last_bytes = 0;
  } st;
  failure_callback_resource_adaptor retry{counting,
                                          [](std::size_t bytes, void* arg) {
                                            auto* s = static_cast<state*>(arg);
                                            s->last_bytes = bytes;
                                            return ++s->calls < 4;  // three retries, then give up
                                          },
                                          &st};
  CHECK(retry.name() == "retry");
  CHECK(retry.upstream() == counting.get());
  CHECK(retry.max_retries() == 0);
  CHECK_THROWS_AS(retry.allocate(2 << 20), out_of_memory);
  CHECK(st.calls == 4);
  CHECK(st.last_bytes == (2u << 20));
  CHECK(counting->allocate_calls == 4);  // the first try and three retries
  // Success needs no callback.
  void* p = retry.allocate(1000);
  CHECK(st.calls == 4);
  retry.deallocate(p, 1000);
}

TEST_CASE("retry: a callback that frees memory turns a refusal into a success") {
  auto sim = std::make_shared<simulated_memory_resource>(1 << 20);
  std::vector<std::pair<void*, std::size_t>> cache;  // memory the program could let go of
  for (int i = 0; i < 4; ++i) { cache.emplace_back(sim->allocate(256 << 10), 256 << 10); }
  failure_callback_resource_adaptor retry{sim,
                                          [&cache, &sim](std::size_t, void*) {
                                            if (cache.empty()) { return false; }
                                            sim->deallocate(cache.back().first, cache.back().second);
                                            cache.pop_back();
                                            return true;
                                          }};
  void* p = retry.allocate(512 << 10);  // needs two cached blocks to go
  CHECK(cache.size() == 2);
  retry.deallocate(p, 512 << 10);
  for (auto [q, n] : cache) { sim->deallocate(q, n); }
}

TEST_CASE("retry: without a callback, release the stack below and retry up to max_retries") {
  auto sim = std::make_shared<simulated_memory_resource>(1 << 20);
  auto below = std::make_shared<releasing_resource>(sim);
  failure_callback_resource_adaptor retry{below, 2};
  CHECK(retry.max_retries() == 2);
  CHECK_THROWS_AS(retry.allocate(2 << 20), out_of_memory);
  CHECK(below->releases == 2);
  CHECK(below->allocate_calls == 3);

  // A release that frees enough: the first retry succeeds.
  below->freed_on_release.emplace_back(sim->allocate(1 << 20), 1 << 20);
  below->releases = 0;
  void* p = retry.allocate(512 << 10);
  CHECK(below->releases == 1);
  retry.deallocate(p, 512 << 10);

  failure_callback_resource_adaptor never{below, 0};
  below->releases = 0;
  CHECK_THROWS_AS(never.allocate(2 << 20), out_of_memory);
  CHECK(below->releases == 0);
}

TEST_CASE("retry: other errors pass through untouched; bad construction is a logic_error") {
  auto sim = std::make_shared<simulated_memory_resource>();
  int calls = 0;
  failure_callback_resource_adaptor retry{sim, [&calls](std::size_t, void*) {
                                            ++calls;
                                            return true;
                                          }};
  void* p = retry.allocate(100);
  CHECK_THROWS_AS(retry.deallocate(static_cast<char*>(p) + 256, 100), logic_error);  // simulated's check
  retry.deallocate(p, 100);
  CHECK(calls == 0);
  CHECK_THROWS_WITH(failure_callback_resource_adaptor(sim, failure_callback_resource_adaptor::failure_callback{}),
                    Catch::Contains("empty"));
  CHECK_THROWS_WITH(failure_callback_resource_adaptor(nullptr, 1), Catch::Contains("upstream"));
}

TEST_CASE("retry: callbacks run concurrently from 8 threads and each caller gets its memory") {
  auto sim = std::make_shared<simulated_memory_resource>(4 << 10);  // room for 4 blocks of 1 KiB, 8 threads
  std::atomic<int> callbacks{0};
  failure_callback_resource_adaptor retry{sim, [&callbacks](std::size_t, void*) {
                                            callbacks.fetch_add(1);
                                            std::this_thread::yield();  // let a holder free its block
                                            return true;
                                          }};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&] {
      // One block at a time: a holder never waits, so every waiter eventually gets one.
      for (int i = 0; i < 2000; ++i) {
        void* p = retry.allocate(1024);
        std::this_thread::yield();
        retry.deallocate(p, 1024);
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  INFO("callbacks: " << callbacks.load());
  CHECK(sim->total_allocations() == 8 * 2000);
  CHECK(sim->allocation_count() == 0);
  CHECK(sim->peak_footprint() <= (4u << 10));
}
