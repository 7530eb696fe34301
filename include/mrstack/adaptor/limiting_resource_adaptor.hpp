#pragma once
/// `limiting_resource_adaptor`: caps the bytes outstanding through it at `limit`. A request
/// that would go past the limit is refused with `out_of_memory` naming the request, the
/// limit and the bytes in use — without reaching the upstream.
///
/// Accounting: each allocation is charged its size rounded up to `granularity` (256 B by
/// default, the alignment every mrstack resource hands out, as RMM's limiting adaptor
/// does), because that is the least the memory below really spends on it. Alignment
/// requests above the granularity are not charged extra: what an over-aligned request
/// costs is the business of the layer that serves it (put `aligned` below `limiting` and
/// the limit covers the padding too). `used_bytes()` is the sum of the charges.
///
/// Exact under concurrency: a request reserves its charge with one compare-and-swap on
/// the counter *before* calling the upstream, so threads can never jointly pass the limit,
/// and gives it back if the upstream fails. The counter therefore never exceeds the limit,
/// and memory is charged from before it exists until after it has been returned (so the
/// upstream's real usage is always within the counter). Lock-free.
///
/// Thread-safe. `name()` is "limiting". `free_bytes_held`/`release` go to the upstream.
#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include <mrstack/resource.hpp>

namespace mrstack {

class limiting_resource_adaptor final : public memory_resource {
 public:
  limiting_resource_adaptor(resource_ptr upstream, std::size_t limit, std::size_t granularity = default_alignment)
      : upstream_{std::move(upstream)}, limit_{limit}, granularity_{granularity} {
    if (upstream_ == nullptr) { throw logic_error("limiting: upstream resource is null"); }
    if (!detail::is_pow2(granularity_)) {
      throw logic_error("limiting: granularity " + std::to_string(granularity_) + " is not a power of two");
    }
  }

  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  /// Bytes charged for the allocations outstanding now (sizes rounded up to the granularity).
  [[nodiscard]] std::size_t used_bytes() const noexcept { return used_.load(std::memory_order_relaxed); }
  /// Bytes that may still be charged.
  [[nodiscard]] std::size_t available_bytes() const noexcept { return limit_ - used_bytes(); }
  /// What an allocation of `bytes` is charged.
  [[nodiscard]] std::size_t charge_for(std::size_t bytes) const noexcept { return detail::align_up(bytes, granularity_); }
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    std::size_t const charge = charge_for(bytes);
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (charge > limit_ - used) { refuse(bytes, charge, used); }
    } while (!used_.compare_exchange_weak(used, used + charge, std::memory_order_relaxed));
    try {
      return upstream_->allocate(bytes, stream, alignment);
    } catch (...) {
      used_.fetch_sub(charge, std::memory_order_relaxed);
      throw;
    }
  }

  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    upstream_->deallocate(ptr, bytes, stream, alignment);
    // Uncharged only once the upstream has it back, so usage below never exceeds the counter.
    used_.fetch_sub(charge_for(bytes), std::memory_order_relaxed);
  }

  [[noreturn]] void refuse(std::size_t bytes, std::size_t charge, std::size_t used) const {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "limiting";
    info.limit_bytes = limit_;
    info.detail = "in use " + format_bytes(used) + ", the request is charged " + format_bytes(charge) +
                  ", which would pass the limit";
    throw out_of_memory(std::move(info));
  }

  std::string do_name() const override { return "limiting"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  std::size_t limit_;
  std::size_t granularity_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace mrstack
