// The sharded adaptors' refills while other threads call: a refill takes other shards'
// credit one shard at a time. When a pass let each shard's lock go after taking it, a free
// on a shard already passed gave credit back behind it, and deciding on what the pass saw
// refused a request with that much of the limit unused (limiting) or raised the peak past
// any order of the calls (statistics). The interleaving is made exact with the test hook
// `detail::shard_passed_hook`: three threads with shards R < A < D in the pass's order;
// when R's refill has taken A's shard, A frees there and D allocates from its own credit.
// A pass now keeps the shards it took locked, so A's free waits for R's refill and comes
// after it in every order of the calls; the tests accept either order and check that the
// outcome is the one that order gives.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

using namespace mrstack;

namespace {

/// A thread that runs what it is given, one task at a time: `run` waits for the task,
/// `post` does not (`finished` then says whether it is done). Keeps its shard index for
/// its whole life (an exiting thread would give it back).
class worker {
 public:
  worker() : thread_{[this] { loop(); }} { run([this] { shard_ = detail::this_thread_shard(); }); }
  ~worker() {
    run({});
    thread_.join();
  }
  worker(worker const&) = delete;
  worker& operator=(worker const&) = delete;

  void post(std::function<void()> task) {
    std::unique_lock lock{mutex_};
    changed_.wait(lock, [&] { return !pending_; });
    task_ = std::move(task);
    pending_ = true;
    changed_.notify_all();
  }
  /// True once the task posted last is done, waiting at most `patience` for it.
  bool finished(std::chrono::milliseconds patience) {
    std::unique_lock lock{mutex_};
    return changed_.wait_for(lock, patience, [&] { return !pending_; });
  }
  void run(std::function<void()> task) {
    post(std::move(task));
    (void)finished(std::chrono::hours{1});
  }
  [[nodiscard]] std::size_t shard() const { return shard_; }

 private:
  void loop() {
    for (;;) {
      std::unique_lock lock{mutex_};
      changed_.wait(lock, [&] { return pending_; });
      std::function<void()> task = std::move(task_);
      lock.unlock();
      if (task) { task(); }
      lock.lock();
      pending_ = false;
      changed_.notify_all();
      if (!task) { return; }
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> task_;
  bool pending_ = false;
  std::size_t shard_ = 0;
  std::thread thread_;
};

/// Runs `between` once, the first time a refill's pass has gone by shard `index`.
std::function<void(std::size_t)> on_shard_passed;
void call_on_shard_passed(std::size_t index) {
  if (on_shard_passed) { on_shard_passed(index); }
}

struct pass_hook {
  pass_hook(std::size_t index, std::function<void()> between) {
    on_shard_passed = [index, between = std::move(between), done = false](std::size_t i) mutable {
      if (i == index && !done) {
        done = true;
        between();
      }
    };
    detail::shard_passed_hook.store(&call_on_shard_passed);
  }
  ~pass_hook() {
    detail::shard_passed_hook.store(nullptr);
    on_shard_passed = {};
  }
  pass_hook(pass_hook const&) = delete;
  pass_hook& operator=(pass_hook const&) = delete;
};

struct three_threads {
  worker r, a, d;  // made in this order: shards r < a < d, the order a pass takes them
};

/// While r's refill stands at a's shard: a frees (given 200 ms: a pass that holds a's
/// shard makes it wait), then d allocates from its own credit. True when a's free was
/// done by then, i.e. came before r's refill decided.
bool free_and_allocate_in_the_pass(three_threads& t, std::function<void()> const& a_frees,
                                   std::function<void()> const& d_allocates, std::function<void()> const& r_refills) {
  bool free_came_first = false;
  {
    pass_hook hook{t.a.shard(), [&] {
                     t.a.post(a_frees);
                     free_came_first = t.a.finished(std::chrono::milliseconds{200});
                     t.d.run(d_allocates);
                   }};
    t.r.run(r_refills);
  }
  (void)t.a.finished(std::chrono::hours{1});
  return free_came_first;
}

}  // namespace

TEST_CASE("limiting: a refill and a free behind its pass: refused only when the limit has no room") {
  three_threads t;
  REQUIRE(t.r.shard() < t.a.shard());
  REQUIRE(t.a.shard() < t.d.shard());
  limiting_resource_adaptor limit{std::make_shared<system_memory_resource>(), 1024};
  void* pa = nullptr;
  void* pd = nullptr;
  t.d.run([&] { limit.deallocate(limit.allocate(1024), 1024); });  // d's credit: 1024
  t.a.run([&] { pa = limit.allocate(256); });                      // a takes d's credit
  t.d.run([&] { limit.deallocate(limit.allocate(512), 512); });    // d takes a's credit back
  REQUIRE(limit.used_bytes() == 256);
  // r asks for 512 while a frees its 256 and d allocates 512 (from its own credit). With
  // a's free first, 512 are unused when r decides: it must be served. With r first, 768 are
  // in use: it must be refused.
  void* pr = nullptr;
  std::string refusal;  // assertions stay on this thread: a failing one throws
  bool const free_came_first = free_and_allocate_in_the_pass(
      t, [&] { limit.deallocate(pa, 256); }, [&] { pd = limit.allocate(512); },
      [&] {
        try {
          pr = limit.allocate(512);
        } catch (out_of_memory const& e) {
          refusal = e.what();
        }
      });
  REQUIRE(pd != nullptr);
  INFO("a's free came first: " << free_came_first << "; refusal: " << refusal);
  CHECK((pr != nullptr) == free_came_first);
  CHECK(limit.used_bytes() == (pr != nullptr ? 1024 : 512));
  t.r.run([&] {
    if (pr != nullptr) { limit.deallocate(pr, 512); }
  });
  t.d.run([&] { limit.deallocate(pd, 512); });
  CHECK(limit.used_bytes() == 0);
}

TEST_CASE("statistics: a refill and a free behind its pass: the peak is the one their order reaches") {
  three_threads t;
  REQUIRE(t.r.shard() < t.a.shard());
  REQUIRE(t.a.shard() < t.d.shard());
  statistics_resource_adaptor stats{std::make_shared<system_memory_resource>()};
  void* pa = nullptr;
  void* pd = nullptr;
  void* pr = nullptr;
  t.d.run([&] { stats.deallocate(stats.allocate(1024), 1024); });  // peak 1024; d's credit 1024
  t.a.run([&] { pa = stats.allocate(256); });                       // a takes d's credit
  // A read merges every shard's credit into the pool, so it comes before d takes its own.
  REQUIRE(stats.bytes_counter().value == 256);
  REQUIRE(stats.bytes_counter().peak == 1024);
  t.d.run([&] { stats.deallocate(stats.allocate(512), 512); });  // d's credit: 514 of the 768 left
  // r allocates 1024 while a frees its 256 and d allocates 512. Taken one at a time: a's
  // free, d's 512, r's 1024 peak at 1536; d's 512, r's 1024, a's free at 1792.
  bool const free_came_first = free_and_allocate_in_the_pass(
      t, [&] { stats.deallocate(pa, 256); }, [&] { pd = stats.allocate(512); }, [&] { pr = stats.allocate(1024); });
  REQUIRE(pd != nullptr);
  INFO("a's free came first: " << free_came_first);
  auto const bytes = stats.bytes_counter();
  CHECK(bytes.value == 1536);
  CHECK(bytes.peak == (free_came_first ? 1536 : 1792));
  CHECK(stats.allocations_counter().peak == (free_came_first ? 2 : 3));
  t.r.run([&] { stats.deallocate(pr, 1024); });
  t.d.run([&] { stats.deallocate(pd, 512); });
  CHECK(stats.bytes_counter().value == 0);
}
