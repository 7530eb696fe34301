// The pool synchronizes the device before it reports out-of-memory (the global blocks
// under the global lock, a thread's own shard under that shard's lock: lock order shard,
// then global). Other threads' calls that need those locks meanwhile wait for the
// synchronization, and nothing more: no lock is taken in the other order, and a thread
// that holds a shard only tries other shards' locks. Modelled with a slow synchronization
// during which other threads free into the synchronizing thread's shard, read statistics
// and release. (Work the synchronization itself waits for must not call into the pool: a
// CUDA host function may not, and here it would wait for the lock its synchronizer holds,
// in the unsharded pool as in a shard.)
#include <catch2/catch.hpp>

#include <fake_stream_sync.hpp>

#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t block = 64 * KiB;  // every block the scenario allocates

// The fake seam, serialized, whose synchronizations first run `slow_sync` (outside the
// seam's lock): the time the device takes to finish its work.
class slow_sync_seam final : public detail::stream_sync {
 public:
  std::function<void()> slow_sync;  // set before the pool is shared
  template <typename F>
  auto locked(F&& f) {
    std::lock_guard lock{mutex_};
    return f();
  }
  handle create_event() override { return locked([&] { return fake_.create_event(); }); }
  void destroy_event(handle event) noexcept override {
    std::lock_guard lock{mutex_};
    fake_.destroy_event(event);
  }
  bool record(handle event, handle stream) override { return locked([&] { return fake_.record(event, stream); }); }
  void wait(handle stream, handle event) override { locked([&] { fake_.wait(stream, event); }); }
  void synchronize(handle stream) override {
    if (slow_sync) { slow_sync(); }
    locked([&] { fake_.synchronize(stream); });
  }
  void synchronize_all() override {
    if (slow_sync) { slow_sync(); }
    locked([&] { fake_.synchronize_all(); });
  }
  bool capturing(handle stream) override { return locked([&] { return fake_.capturing(stream); }); }

 private:
  std::mutex mutex_;
  test::fake_stream_sync fake_;
};

/// Runs `scenario`; a scenario still running after 20 s is a deadlock: reported, and the
/// process ends (its threads cannot be joined).
void within_deadline(char const* what, std::function<void()> const& scenario) {
  auto done = std::async(std::launch::async, scenario);
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "DEADLOCK: %s\n", what);
    std::fflush(stderr);
    std::_Exit(1);
  }
  done.get();
}

}  // namespace

TEST_CASE("pool sync under lock: calls that need the synchronizing thread's locks wait for its synchronization, no longer") {
  // A thread fills its slabs, hands most blocks to another thread that frees them on a
  // stream it created, and then needs more than the maximum leaves: the pool synchronizes
  // (in grow_and_allocate, then the thread's own shard). During each of the first
  // synchronizations other threads free the block the thread kept (in its shard), read
  // statistics and release the pool; they finish once the synchronization does.
  for (std::size_t shards : {std::size_t{64}, std::size_t{0}}) {
    auto seam = std::make_shared<slow_sync_seam>();
    pool_options o;
    o.stream_sync = seam;
    o.shard_after_contentions = 0;
    o.thread_shards = shards;
    o.minimum_growth = 4 * MiB;
    o.growth_divisor = 1000;  // slabs of 4 MiB
    pool_memory_resource mr{std::make_shared<simulated_memory_resource>(), 0, 12 * MiB, o};
    stream_view const created{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x7000})};
    std::atomic<void*> kept{nullptr};
    std::atomic<int> slow{0};
    std::mutex callers_mutex;
    std::vector<std::thread> callers;  // started during a synchronization, joined after
    seam->slow_sync = [&] {
      if (slow.fetch_add(1) >= 3) { return; }
      std::lock_guard lock{callers_mutex};
      if (void* const p = kept.exchange(nullptr)) {
        callers.emplace_back([&mr, p] { mr.deallocate(p, block, stream_view::per_thread()); });
      }
      callers.emplace_back([&mr] { (void)mr.fragmentation(); });
      callers.emplace_back([&mr] { (void)mr.free_bytes(); });
      callers.emplace_back([&mr] { mr.release(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    };
    mr.deallocate(mr.allocate(256), 256);  // the first thread: the others shard
    int refusals = 0;
    INFO("thread_shards " << shards);
    within_deadline(shards != 0 ? "sharded" : "unsharded", [&] {
      std::thread{[&] {
        std::vector<void*> first;
        for (int i = 0; i < 60; ++i) { first.push_back(mr.allocate(block, stream_view::per_thread())); }
        kept = first.back();
        first.pop_back();
        std::thread{[&] {
          for (void* p : first) { mr.deallocate(p, block, created); }
        }}.join();
        std::vector<void*> more;
        for (int i = 0; i < 160; ++i) {  // 10 MiB live in all: within the 12 MiB
          try {
            more.push_back(mr.allocate(block, stream_view::per_thread()));
          } catch (out_of_memory const&) {
            ++refusals;
          }
        }
        for (void* p : more) { mr.deallocate(p, block, stream_view::per_thread()); }
      }}.join();
      for (;;) {  // a caller may start more (release() synchronizes): joined without the lock
        std::vector<std::thread> started;
        {
          std::lock_guard lock{callers_mutex};
          started.swap(callers);
        }
        if (started.empty()) { break; }
        for (auto& t : started) { t.join(); }
      }
    });
    // The global blocks' synchronization is certain. A later one (the shard's own, a
    // refusal, release() finding chunks other streams hold) depends on when the callers
    // run, which a loaded machine delays; a shard's slab no longer synchronizes at all.
    CHECK(slow.load() >= 1);
    CHECK(refusals == 0);
    CHECK(kept.load() == nullptr);
    CHECK(mr.check_invariants() == "");
    CHECK(mr.stats().used_bytes == 0);
    // The pool's destructor synchronizes too, after this scope's locals are gone; the
    // seam outlives them (the pool shares it), so it must stop referring to them.
    seam->slow_sync = nullptr;
  }
}
