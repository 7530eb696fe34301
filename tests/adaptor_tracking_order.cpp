// The tracking adaptor's sequence numbers (coarse-clock stamps raised past their shard's
// last): unique, in each thread's order — also for a thread's allocation from a
// destructor at its exit, made after its shard index went back (it borrows another
// shard, whose stamps may lag this thread's), also past 64 threads (threads share
// shards) — and in time order across threads once the calls are a clock tick apart.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <latch>
#include <map>
#include <set>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

std::map<void*, std::uint64_t> sequences_of(tracking_resource_adaptor const& track) {
  std::map<void*, std::uint64_t> out;
  for (auto const& a : track.outstanding()) { out.emplace(a.pointer, a.sequence); }
  return out;
}

tracking_resource_adaptor* exit_tracker = nullptr;
std::latch* index_given_back = nullptr;
std::latch* index_taken_again = nullptr;
void* late_block = nullptr;

/// Built before its thread's shard index is taken, so destroyed after the index went back:
/// once another thread holds that index, its allocation borrows another shard.
struct allocates_at_exit {
  ~allocates_at_exit() {
    index_given_back->count_down();
    index_taken_again->wait();
    late_block = exit_tracker->allocate(256);
  }
};

}  // namespace

TEST_CASE("tracking: a thread's allocation from a destructor at its exit comes after its earlier ones") {
  (void)detail::this_thread_shard();
  auto sim = std::make_shared<simulated_memory_resource>();
  // A few rounds: each has its calls within one tick of the coarse clock unless a tick
  // happens to fall between them (then even the borrowed shard's stamps are ahead).
  for (int round = 0; round < 5; ++round) {
    tracking_resource_adaptor track{sim};
    std::latch given_back{1}, taken{1}, done{1};
    exit_tracker = &track;
    index_given_back = &given_back;
    index_taken_again = &taken;
    late_block = nullptr;
    std::vector<void*> early;
    std::thread a{[&] {
      thread_local allocates_at_exit late;
      (void)&late;
      for (int i = 0; i < 3; ++i) { early.push_back(track.allocate(256)); }  // stamps raised past each other
    }};
    given_back.wait();
    std::thread b{[&] {
      (void)detail::this_thread_shard();  // a's index, given back
      taken.count_down();
      done.wait();
    }};
    a.join();
    REQUIRE(late_block != nullptr);
    auto const seq = sequences_of(track);
    REQUIRE(seq.size() == 4);
    INFO("round " << round << ": early " << seq.at(early[0]) << ", " << seq.at(early[1]) << ", " << seq.at(early[2])
                  << "; at exit " << seq.at(late_block));
    CHECK(seq.at(early[0]) < seq.at(early[1]));
    CHECK(seq.at(early[1]) < seq.at(early[2]));
    CHECK(seq.at(early[2]) < seq.at(late_block));
    auto const oldest = track.outstanding();
    CHECK(oldest.back().pointer == late_block);  // the report lists it last
    done.count_down();
    b.join();
    for (void* p : early) { track.deallocate(p, 256); }
    track.deallocate(late_block, 256);
  }
  exit_tracker = nullptr;
}

TEST_CASE("tracking: 80 threads share shards: sequences unique and each thread's in its order") {
  constexpr int threads = 80;  // past detail::counter_shards: some threads share a shard
  constexpr int per_thread = 100;
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  std::vector<std::vector<void*>> made(threads);
  std::barrier start{threads};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      (void)detail::this_thread_shard();
      start.arrive_and_wait();  // all 80 live at once
      for (int i = 0; i < per_thread; ++i) { made[t].push_back(track.allocate(64)); }
    });
  }
  for (auto& th : pool) { th.join(); }
  auto const seq = sequences_of(track);
  REQUIRE(seq.size() == static_cast<std::size_t>(threads * per_thread));
  std::set<std::uint64_t> distinct;
  int out_of_order = 0;
  for (auto const& mine : made) {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      distinct.insert(seq.at(mine[i]));
      if (i > 0 && seq.at(mine[i - 1]) >= seq.at(mine[i])) { ++out_of_order; }
    }
  }
  CHECK(distinct.size() == seq.size());
  CHECK(out_of_order == 0);
  for (auto const& mine : made) {
    for (void* p : mine) { track.deallocate(p, 64); }
  }
}

TEST_CASE("tracking: allocations a clock tick apart are in time order across threads") {
  (void)detail::this_thread_shard();
  auto sim = std::make_shared<simulated_memory_resource>();
  tracking_resource_adaptor track{sim};
  // Bursts of 20, each from this thread or a new one in turn (shards on both sides of
  // this thread's), each 25 ms after the one before: more than a tick of the coarse clock
  // (1-10 ms). Within a burst the stamps are raised past each other.
  std::vector<void*> made;
  auto burst = [&] {
    for (int i = 0; i < 20; ++i) { made.push_back(track.allocate(64)); }
  };
  for (int b = 0; b < 6; ++b) {
    if (b > 0) { std::this_thread::sleep_for(std::chrono::milliseconds{25}); }
    if (b % 2 == 0) {
      std::thread{burst}.join();
    } else {
      burst();
    }
  }
  auto const seq = sequences_of(track);
  REQUIRE(seq.size() == made.size());
  int out_of_order = 0;
  for (std::size_t i = 1; i < made.size(); ++i) { out_of_order += seq.at(made[i - 1]) < seq.at(made[i]) ? 0 : 1; }
  CHECK(out_of_order == 0);
  auto const all = track.outstanding();  // oldest first: the order they were made
  REQUIRE(all.size() == made.size());
  int misplaced = 0;
  for (std::size_t i = 0; i < made.size(); ++i) { misplaced += all[i].pointer == made[i] ? 0 : 1; }
  CHECK(misplaced == 0);
  for (void* p : made) { track.deallocate(p, 64); }
}
