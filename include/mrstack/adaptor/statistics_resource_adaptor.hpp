#pragma once
/// `statistics_resource_adaptor`: counts what goes through it — bytes and allocations,
/// each as current (outstanding now), peak (most outstanding at once) and total (ever
/// allocated) — with push/pop scopes to measure a region of a program.
///
/// Scopes: `push_counters()` opens a region whose counters start at zero; until the
/// matching `pop_counters()` the adaptor's `bytes_counter()`/`allocations_counter()` are
/// the region's. A region's current value can go negative (it freed memory allocated
/// before it began). `pop_counters()` returns the region's counters and folds them into
/// the enclosing one: its total grows by the region's total, its current by the
/// region's current, and its peak becomes max(its peak, its current at the push + the
/// region's peak) — exactly the peak the enclosing region would have seen without the
/// push. Scopes nest to any depth; they belong to the adaptor, not to a thread.
///
/// When an allocation counts: from the moment the upstream returned it until its
/// deallocation starts (the decrement happens before the free is forwarded, so memory
/// handed back to the upstream and reused at once by another thread is never counted
/// twice: the peak never exceeds what the upstream really had out).
///
/// Exactness under threads: when `value` and `peak` are updated as separate steps (as in
/// RMM's adaptor), two threads can interleave between one's `value +=` and its
/// `peak = max(peak, value)`, and a stale maximum can overwrite a newer one (an ABA on the
/// pair), leaving a peak that never happened or missing one that did. Here one small mutex covers the whole update
/// of the top frame (value, peak and total move together), so every counter is the exact
/// result of the calls in the order they took the lock, and a push or pop is atomic with
/// respect to allocations. The critical section is a handful of additions; its cost is
/// measured in benchmarks/adaptors.cpp.
///
/// Thread-safe. `name()` is "statistics". `free_bytes_held`/`release` go to the upstream.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include <mrstack/resource.hpp>

namespace mrstack {

class statistics_resource_adaptor final : public memory_resource {
 public:
  /// One counted quantity.
  struct counter {
    std::int64_t value = 0;  ///< outstanding now (may be negative within a scope)
    std::int64_t peak = 0;   ///< most outstanding at once
    std::int64_t total = 0;  ///< ever allocated

    friend bool operator==(counter const&, counter const&) = default;
  };
  /// A frame: bytes and allocation counts together.
  struct counters {
    counter bytes;
    counter allocations;

    friend bool operator==(counters const&, counters const&) = default;
  };

  explicit statistics_resource_adaptor(resource_ptr upstream) : upstream_{std::move(upstream)} {
    if (upstream_ == nullptr) { throw logic_error("statistics: upstream resource is null"); }
    frames_.reserve(8);
    frames_.emplace_back();
  }

  /// The current region's byte counter (the whole lifetime's when no scope is open).
  [[nodiscard]] counter bytes_counter() const {
    std::lock_guard lock{mutex_};
    return frames_.back().bytes;
  }
  /// The current region's allocation-count counter.
  [[nodiscard]] counter allocations_counter() const {
    std::lock_guard lock{mutex_};
    return frames_.back().allocations;
  }
  /// Both, read together.
  [[nodiscard]] counters current_counters() const {
    std::lock_guard lock{mutex_};
    return frames_.back();
  }
  /// Open scopes (0 when only the lifetime frame exists).
  [[nodiscard]] std::size_t scope_depth() const {
    std::lock_guard lock{mutex_};
    return frames_.size() - 1;
  }

  /// Opens a region with zeroed counters. Returns the enclosing region's counters as
  /// they stood at the push.
  counters push_counters() {
    std::lock_guard lock{mutex_};
    counters const outer = frames_.back();
    frames_.emplace_back();
    return outer;
  }

  /// Closes the innermost region, folds it into the enclosing one and returns it. A pop
  /// without a matching push is a `logic_error`.
  counters pop_counters() {
    std::lock_guard lock{mutex_};
    if (frames_.size() < 2) { throw logic_error("statistics: pop_counters without a matching push_counters"); }
    counters const inner = frames_.back();
    frames_.pop_back();
    fold(frames_.back().bytes, inner.bytes);
    fold(frames_.back().allocations, inner.allocations);
    return inner;
  }

  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  static void fold(counter& outer, counter const& inner) noexcept {
    outer.peak = std::max(outer.peak, outer.value + inner.peak);
    outer.value += inner.value;
    outer.total += inner.total;
  }

  static void add(counter& c, std::int64_t n) noexcept {
    c.value += n;
    c.total += n;
    c.peak = std::max(c.peak, c.value);
  }

  void count_allocation(std::size_t bytes) noexcept {
    std::lock_guard lock{mutex_};
    add(frames_.back().bytes, static_cast<std::int64_t>(bytes));
    add(frames_.back().allocations, 1);
  }

  void count_deallocation(std::size_t bytes) noexcept {
    std::lock_guard lock{mutex_};
    frames_.back().bytes.value -= static_cast<std::int64_t>(bytes);
    frames_.back().allocations.value -= 1;
  }

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override {
    void* ptr = upstream_->allocate(bytes, stream, alignment);
    count_allocation(bytes);
    return ptr;
  }

  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override {
    count_deallocation(bytes);
    try {
      upstream_->deallocate(ptr, bytes, stream, alignment);
    } catch (...) {
      // The upstream refused the free (a checking layer below found it bad): the memory
      // is still out, so it counts again — as outstanding, not as a new allocation.
      std::lock_guard lock{mutex_};
      auto& top = frames_.back();
      top.bytes.value += static_cast<std::int64_t>(bytes);
      top.bytes.peak = std::max(top.bytes.peak, top.bytes.value);
      top.allocations.value += 1;
      top.allocations.peak = std::max(top.allocations.peak, top.allocations.value);
      throw;
    }
  }

  std::string do_name() const override { return "statistics"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  resource_ptr upstream_;
  mutable std::mutex mutex_;
  std::vector<counters> frames_;  // frames_[0]: the lifetime; back(): the innermost open scope
};

}  // namespace mrstack
