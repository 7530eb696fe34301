// The sharded adaptors' refills when other threads call during the pass: a refill takes
// other shards' credit one shard at a time, so a shard it passed may have credit back
// before the pass ends (a free there). Deciding on what the pass saw then refused a
// request with that much of the limit unused (limiting) or raised the peak past any
// order of the calls (statistics). The interleaving is made exact with the test hook
// `detail::shard_passed_hook`: three threads with shards R < A < D in the pass's order;
// while R's refill stands between A's shard and D's, A frees and D allocates from its
// own credit.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

using namespace mrstack;

namespace {

/// A thread that runs what it is given, one task at a time; `run` waits for the task.
/// Keeps its shard index for its whole life (an exiting thread would give it back).
class worker {
 public:
  worker() : thread_{[this] { loop(); }} { run([this] { shard_ = detail::this_thread_shard(); }); }
  ~worker() {
    run({});
    thread_.join();
  }
  worker(worker const&) = delete;
  worker& operator=(worker const&) = delete;

  void run(std::function<void()> task) {
    std::unique_lock lock{mutex_};
    task_ = std::move(task);
    pending_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return !pending_; });
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

}  // namespace

TEST_CASE("limiting: a refill whose pass missed a free refuses nothing while the limit has room") {
  three_threads t;
  REQUIRE(t.r.shard() < t.a.shard());
  REQUIRE(t.a.shard() < t.d.shard());
  limiting_resource_adaptor limit{std::make_shared<system_memory_resource>(), 1024};
  void* pa = nullptr;
  void* pd = nullptr;
  void* pd2 = nullptr;
  t.d.run([&] { limit.deallocate(limit.allocate(1024), 1024); });  // d's credit: 1024
  t.a.run([&] { pa = limit.allocate(256); });                      // a takes d's credit
  t.d.run([&] { limit.deallocate(limit.allocate(512), 512); });    // d takes a's credit back
  REQUIRE(limit.used_bytes() == 256);
  // r asks for 512 of the 768 left. Its pass takes a's shard (empty: a spent its credit);
  // then a frees 256 there and d allocates 512 from its own credit, so 512 stay unused: the
  // pool's and a's. The pass then finds only d's remainder; it must not refuse.
  void* pr = nullptr;
  std::string refusal;  // assertions stay on this thread: a failing one throws
  {
    pass_hook hook{t.a.shard(), [&] {
                     t.a.run([&] { limit.deallocate(pa, 256); });
                     t.d.run([&] { pd = limit.allocate(512); });
                   }};
    t.r.run([&] {
      try {
        pr = limit.allocate(512);
      } catch (out_of_memory const& e) {
        refusal = e.what();
      }
    });
  }
  REQUIRE(pd != nullptr);
  INFO("refused with 512 of 1024 unused: " << refusal);
  CHECK(pr != nullptr);
  CHECK(limit.used_bytes() == 1024);
  // And the limit still holds exactly: nothing more fits.
  bool refused_past_limit = false;
  t.d.run([&] {
    try {
      pd2 = limit.allocate(256);
    } catch (out_of_memory const&) {
      refused_past_limit = true;
    }
  });
  CHECK(refused_past_limit);
  CHECK(pd2 == nullptr);
  t.r.run([&] {
    if (pr != nullptr) { limit.deallocate(pr, 512); }
  });
  t.d.run([&] { limit.deallocate(pd, 512); });
  CHECK(limit.used_bytes() == 0);
}

TEST_CASE("statistics: a refill whose pass missed a free raises the peak to what the calls reach, no more") {
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
  {
    // r allocates 1024. Its pass takes a's shard; then a frees its 256 there and d
    // allocates 512 from its own credit. Taken one at a time in the order they took the
    // locks, the calls are: a's free (0 out), d's 512, r's 1024: peak 1536.
    pass_hook hook{t.a.shard(), [&] {
                     t.a.run([&] { stats.deallocate(pa, 256); });
                     t.d.run([&] { pd = stats.allocate(512); });
                   }};
    t.r.run([&] { pr = stats.allocate(1024); });
  }
  REQUIRE(pd != nullptr);
  auto const bytes = stats.bytes_counter();
  CHECK(bytes.value == 1536);
  CHECK(bytes.peak == 1536);
  CHECK(stats.allocations_counter().peak == 2);
  t.r.run([&] { stats.deallocate(pr, 1024); });
  t.d.run([&] { stats.deallocate(pd, 512); });
  CHECK(stats.bytes_counter().value == 0);
  CHECK(stats.bytes_counter().peak == 1536);
}
