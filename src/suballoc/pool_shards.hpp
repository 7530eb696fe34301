#pragma once
// The thread shards of pool_memory_resource (design: docs/suballocators.md, "Threads").
//
// A shard is a stream-ordered pool of its own — its own lock, its own block metadata —
// whose chunks are *slabs*: 2 MiB-aligned blocks the shard took from the pool's global
// blocks. A thread allocates from the shard its index picks; a free finds the shard of
// its block through `page_owner_map` (any thread may free any block). So threads that
// work apart touch neither a common lock nor common cache lines, which is what a single
// lock cannot give however short its critical section: the block metadata itself would
// move between cores on every call.
#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/page_owner_map.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/detail/stream_ordering.hpp>
#include <mrstack/resource.hpp>

namespace mrstack::detail {

struct alignas(64) pool_shard {
  pool_shard(std::shared_ptr<stream_sync> sync, bool record_on_demand, park_policy parks)
      : core{std::move(sync), &this_thread_key, record_on_demand, parks} {}
  lean_mutex mutex;
  // Set by a thread that wanted this shard's wholly free slabs back but found the shard
  // busy: the shard's next call gives back what it can.
  std::atomic<bool> asked_to_give_back{false};
  // Streams whose call may hand back a wholly free slab no other call could (its free
  // memory is a created stream's, which only a call naming it may name, or a stream's
  // being captured); under `mutex`. Only such a call looks again: one that names another
  // stream would find the same slab and fail again, and a shard whose thread had moved
  // on to another stream walked its slabs at every call (16 threads on 4 created streams
  // over `simulated`: 2.0 M calls/s on the 2-core CPU VM).
  std::vector<std::uintptr_t> awaited_streams;
  // core.holder_changes() when the shard last looked (under `mutex`). An awaited slab's
  // free memory may since have moved to another stream (the shard's call on it took the
  // awaited stream's memory over, or synchronized everything): that stream's call could
  // hand it back, and it is not awaited, so the first call after such a move looks again.
  std::size_t holder_changes_at_walk = 0;
  /// True when this call, on `s`, should give back the shard's free slabs (shard locked).
  [[nodiscard]] bool should_give_back(stream_ref const& s) const noexcept {
    return asked_to_give_back.load(std::memory_order_relaxed) ||
           (!awaited_streams.empty() &&
            (core.holder_changes() != holder_changes_at_walk ||
             std::find(awaited_streams.begin(), awaited_streams.end(), s.key) != awaited_streams.end()));
  }
  stream_ordered_pool core;
};

/// A slab on its way back to the pool's global blocks.
struct slab_return {
  std::uintptr_t base;
  std::size_t size;
  stream_ref stream;
  bool freed_in_capture = false;  // a capture may hold its free memory: the global blocks keep the mark
  chunk_id chunk = block_pool::npos;  // its chunk in the shard it leaves; npos: in none
};

/// Adds the free memory of `core`, stream by stream, to `info` (the pool's global
/// blocks and each shard alike). `largest_request`: the largest request `core` serves (a
/// shard: the shard block limit); its largest free blocks count only up to it.
void add_stream_fragmentation(stream_ordered_pool const& core, fragmentation_info& info,
                              std::size_t largest_request = ~std::size_t{0});

class pool_shard_set {
 public:
  static constexpr std::size_t max_shards = counter_shards;

  pool_shard_set(std::size_t count, std::shared_ptr<stream_sync> sync, bool record_on_demand, park_policy parks)
      : count_{count}, sync_{std::move(sync)}, record_on_demand_{record_on_demand}, parks_{parks} {}

  /// The shard index of the calling thread: up to `count` threads that run at once each
  /// get their own (live threads hold distinct indices, see this_thread_shard).
  [[nodiscard]] std::uint16_t index_of_this_thread() const noexcept {
    return static_cast<std::uint16_t>(this_thread_shard() % count_);
  }
  /// Shard `i`, made on first use.
  pool_shard& get(std::uint16_t i) {
    if (pool_shard* s = shards_[i].load(std::memory_order_acquire)) { return *s; }
    std::lock_guard lock{create_mutex_};
    if (!owned_[i]) {
      owned_[i] = std::make_unique<pool_shard>(sync_, record_on_demand_, parks_);
      shards_[i].store(owned_[i].get(), std::memory_order_release);
    }
    return *owned_[i];
  }
  /// Shard `i` when it exists, else null.
  [[nodiscard]] pool_shard* existing(std::size_t i) const noexcept { return shards_[i].load(std::memory_order_acquire); }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }

  /// Which shard (index + 1) holds the slab an address lies in; 0: none.
  page_owner_map slabs;

 private:
  std::size_t count_;
  std::shared_ptr<stream_sync> sync_;
  bool record_on_demand_;
  park_policy parks_;
  std::array<std::atomic<pool_shard*>, max_shards> shards_{};
  std::array<std::unique_ptr<pool_shard>, max_shards> owned_{};
  std::mutex create_mutex_;
};

}  // namespace mrstack::detail
