#pragma once
/// `limiting_resource_adaptor`: caps the bytes outstanding through it at `limit`. A request
/// that would go past the limit is refused with `out_of_memory` naming the request, the
/// limit and the bytes in use — without reaching the upstream.
///
/// Accounting: each allocation is charged its size rounded up to `granularity` (256 B by
/// default, the alignment every mrstack resource hands out, as RMM's limiting adaptor
/// does), because that is the least the memory below really spends on it. Alignment
/// requests above the granularity are not charged extra: what an over-aligned request
/// costs is the business of the layer that serves it (put `aligned` above `limiting`,
/// `aligned > limiting > …`, and the limit covers the padding too, since `aligned` asks
/// for it; below `limiting` the padding is spent past the limit's sight). `used_bytes()`
/// is the sum of the charges.
///
/// Exact under concurrency, and scaling with threads: the bytes not yet charged
/// (limit − used) are split between a global pool and per-thread shards' *credits* (each
/// shard a cache line with its own uncontended lock). A request charges its shard's
/// credit when that covers it — no shared write; otherwise it takes the global lock and
/// refills from the pool (taking what it needs and half of what is left), and when the
/// pool is short first moves other shards' credit into it, shard by shard, until it is
/// enough, keeping each shard it took locked until it is done (so none gets credit back
/// behind it). Only when every shard was taken, with pool + credit exactly limit − used,
/// is a request refused. A free gives its charge back
/// to its shard's credit. So the charges outstanding never exceed the limit — not even
/// for an instant, since a charge is taken before the upstream is called — and a
/// request is refused only when the serial order of the calls (the order they took the
/// locks) would refuse it. `used_bytes()` takes every lock and is exact. Memory is
/// charged from before it exists until after it has been returned (so the upstream's
/// real usage is always within the counter).
///
/// A free with a larger size than its allocation cannot be caught without tracking every
/// block: over an upstream that checks sizes (pool, arena, tracking, simulated, system) it
/// is refused below and never uncharged; over one that does not (`cuda`), the excess comes
/// back as credit and the limit grows by it (`used_bytes()` then stops at zero; credit
/// saturates at `SIZE_MAX`, so a size of `(size_t)-1` cannot wrap it into less). Put
/// `tracking` below `limiting` there to have such frees refused. The same with a
/// `granularity` below 256 B: pool, arena and simulated compare sizes in 256 B units, so a
/// free whose size differs from its allocation's within one unit passes them and is
/// uncharged by its own size (the limit drifts by the difference); `tracking` compares
/// exact sizes.
///
/// Thread-safe. `name()` is "limiting". `free_bytes_held`/`release` go to the upstream.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <mrstack/detail/shard_spin_lock.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class limiting_resource_adaptor final : public memory_resource {
 public:
  limiting_resource_adaptor(resource_ptr upstream, std::size_t limit, std::size_t granularity = default_alignment);
  ~limiting_resource_adaptor() override;

  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  /// Bytes charged for the allocations outstanding now (sizes rounded up to the
  /// granularity): exact (takes every shard's lock).
  [[nodiscard]] std::size_t used_bytes() const;
  /// Bytes that may still be charged.
  [[nodiscard]] std::size_t available_bytes() const { return limit_ - used_bytes(); }
  /// What an allocation of `bytes` is charged (`SIZE_MAX` when rounding up would wrap:
  /// always refused).
  [[nodiscard]] std::size_t charge_for(std::size_t bytes) const noexcept {
    return bytes > SIZE_MAX - (granularity_ - 1) ? SIZE_MAX : detail::align_up(bytes, granularity_);
  }
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  struct alignas(64) shard {
    detail::shard_spin_lock mutex;
    std::size_t credit = 0;  // bytes this shard may charge without the global lock
  };

  void charge(std::size_t bytes, std::size_t amount);
  void uncharge(std::size_t amount) noexcept;
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  [[noreturn]] void refuse(std::size_t bytes, std::size_t charge, std::size_t used) const;
  std::string do_name() const override { return "limiting"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  std::size_t limit_;
  std::size_t granularity_;
  std::unique_ptr<shard[]> shards_;
  // A cache line of its own (with pool_): the fields above are read by every call of
  // every thread, and a refill's lock and unlock there made each of them fetch it again.
  alignas(64) mutable std::mutex mutex_;  // pool_; taken before any shard lock
  std::size_t pool_;          // limit - used - every shard's credit
};

}  // namespace mrstack
