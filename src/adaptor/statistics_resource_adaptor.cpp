// The statistics adaptor's sharded counting (design: adaptor/statistics_resource_adaptor.hpp).
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>

#include <algorithm>
#include <limits>

namespace mrstack {

using detail::saturating_add;

using detail::all_shards_lock;

statistics_resource_adaptor::statistics_resource_adaptor(resource_ptr upstream)
    : upstream_{std::move(upstream)}, shards_{std::make_unique<shard[]>(detail::counter_shards)} {
  if (upstream_ == nullptr) { throw logic_error("statistics: upstream resource is null"); }
  frames_.reserve(8);
  frames_.emplace_back();
}

statistics_resource_adaptor::~statistics_resource_adaptor() = default;

void statistics_resource_adaptor::count_up(std::int64_t n, std::int64_t k) {
  shard& s = shards_[detail::this_thread_shard()];
  {
    std::lock_guard lock{s.mutex};
    if (s.credit[bytes_q] >= n && s.credit[allocs_q] >= k) {
      // Within the headroom this shard holds: current stays at or below the peak.
      s.credit[bytes_q] -= n;
      s.credit[allocs_q] -= k;
      s.delta[bytes_q] = saturating_add(s.delta[bytes_q], n);
      s.delta[allocs_q] = saturating_add(s.delta[allocs_q], k);
      s.total[bytes_q] = saturating_add(s.total[bytes_q], n);
      s.total[allocs_q] = saturating_add(s.total[allocs_q], k);
      return;
    }
  }
  count_up_slow(s, n, k);
}

void statistics_resource_adaptor::count_up_slow(shard& s, std::int64_t n, std::int64_t k) {
  std::lock_guard global{mutex_};
  std::lock_guard lock{s.mutex};
  ++refills_;
  std::int64_t const need[2] = {n, k};
  counter* const top[2] = {&frames_.back().bytes, &frames_.back().allocations};
  // Other shards' credit into the pool, shard by shard, each kept locked until this refill
  // is done (detail::shard_pass), until it is enough. Taking only what is needed matters:
  // emptying every shard would send each of their threads here on its next allocation.
  // Even so, a shard that gives its credit leaves its thread short at its next allocation,
  // to take another's in turn: near a tight peak the shortage passes from thread to thread
  // (`refills()` counts it), and exactness forbids raising the peak while credit is left
  // anywhere. Taking other shards' spare credit first (beyond their thread's last
  // allocation) did not help at 16 threads on an H200 host: every shard held just its own need.
  // Nor did borrowing what it lacks from one other shard with no global lock: the peak
  // then rose only when no single shard could lend, so fewer blocks' credit went round
  // (a counted peak of 7-9 blocks, 0.15-0.23 borrows a pair), and it ran at 0.13-0.21x
  // the bare pool against this pass's 0.40-0.50x (docs/benchmarks.md, machine DQ).
  detail::shard_pass pass{shards_.get(), s};
  for (int q = 0; q < 2; ++q) {
    if (s.credit[q] >= need[q]) { continue; }
    std::int64_t const want = need[q] - s.credit[q];
    pass.take_until(
        [&](shard& t) {
          for (int r = 0; r < 2; ++r) {
            pool_[r] = saturating_add(pool_[r], t.credit[r]);
            t.credit[r] = 0;
          }
        },
        [&] { return pool_[q] >= want; });
    if (pool_[q] < want) {
      // Every other shard taken and still held: pool + this credit is exactly peak -
      // current, and this allocation makes a new peak, by exactly the excess.
      top[q]->peak = saturating_add(top[q]->peak, want - pool_[q]);
      pool_[q] = want;
    }
    // And a little of what is left, for the next calls: a share per shard, so that one
    // thread does not take the headroom the others need when it is tight.
    std::int64_t const move = want + (pool_[q] - want) / static_cast<std::int64_t>(2 * detail::counter_shards);
    pool_[q] -= move;
    s.credit[q] = saturating_add(s.credit[q], move);
  }
  for (int q = 0; q < 2; ++q) {
    s.credit[q] -= need[q];
    s.delta[q] = saturating_add(s.delta[q], need[q]);
    s.total[q] = saturating_add(s.total[q], need[q]);
  }
}

statistics_resource_adaptor::shard* statistics_resource_adaptor::count_down(std::int64_t n, std::int64_t k,
                                                                             std::uint64_t& frame) noexcept {
  shard& s = shards_[detail::this_thread_shard()];
  std::lock_guard lock{s.mutex};
  constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
  std::int64_t const need[2] = {n, k};
  for (int q = 0; q < 2; ++q) {
    if (s.credit[q] > most - need[q] || s.in_flight[q] > most - need[q] || s.delta[q] < -most + need[q]) {
      return nullptr;
    }
  }
  frame = top_frame_id_;
  s.delta[bytes_q] = saturating_add(s.delta[bytes_q], -n);
  s.delta[allocs_q] = saturating_add(s.delta[allocs_q], -k);
  s.credit[bytes_q] = saturating_add(s.credit[bytes_q], n);
  s.credit[allocs_q] = saturating_add(s.credit[allocs_q], k);
  s.in_flight[bytes_q] = saturating_add(s.in_flight[bytes_q], n);
  s.in_flight[allocs_q] = saturating_add(s.in_flight[allocs_q], k);
  return &s;
}

void statistics_resource_adaptor::count_down_accepted(std::int64_t n, std::int64_t k) noexcept {
  shard& s = shards_[detail::this_thread_shard()];
  std::lock_guard lock{s.mutex};
  std::int64_t const need[2] = {n, k};
  for (int q = 0; q < 2; ++q) {
    s.delta[q] = saturating_add(s.delta[q], -need[q]);
    s.credit[q] = saturating_add(s.credit[q], need[q]);
  }
}

void statistics_resource_adaptor::settle_free(shard& s, std::int64_t n, std::int64_t k) noexcept {
  std::lock_guard lock{s.mutex};
  s.in_flight[bytes_q] = saturating_add(s.in_flight[bytes_q], -n);
  s.in_flight[allocs_q] = saturating_add(s.in_flight[allocs_q], -k);
}

void statistics_resource_adaptor::count_back_refused(shard& s, std::int64_t n, std::int64_t k, std::uint64_t frame) {
  std::lock_guard global{mutex_};
  all_shards_lock all{shards_.get()};
  merge_locked(true);  // pool_ is now the innermost frame's peak - current
  std::size_t at = frames_.size() - 1;
  while (at > 0 && frame_ids_[at] > frame) { --at; }
  std::int64_t const back[2] = {n, k};
  counter* const c[2] = {&frames_[at].bytes, &frames_[at].allocations};
  for (int q = 0; q < 2; ++q) {
    c[q]->value = saturating_add(c[q]->value, back[q]);
    if (at + 1 == frames_.size()) {
      pool_[q] -= back[q];
      if (pool_[q] < 0) {  // the memory out again passes the peak: a peak it really reached
        c[q]->peak = saturating_add(c[q]->peak, -pool_[q]);
        pool_[q] = 0;
      }
    } else {
      c[q]->peak = std::max(c[q]->peak, c[q]->value);
    }
    s.in_flight[q] = saturating_add(s.in_flight[q], -back[q]);
  }
}

void statistics_resource_adaptor::merge_locked(bool take_credits) const {
  counter* const top[2] = {&frames_.back().bytes, &frames_.back().allocations};
  for (std::size_t i = 0; i < detail::counter_shards; ++i) {
    shard& t = shards_[i];
    for (int q = 0; q < 2; ++q) {
      top[q]->value = saturating_add(top[q]->value, t.delta[q]);
      top[q]->total = saturating_add(top[q]->total, t.total[q]);
      t.delta[q] = 0;
      t.total[q] = 0;
      if (take_credits) {
        pool_[q] = saturating_add(pool_[q], t.credit[q]);
        t.credit[q] = 0;
      }
    }
  }
}

void statistics_resource_adaptor::clamp_lifetime_locked() const {
  if (frames_.size() != 1) { return; }  // inside a scope, a negative current is legitimate
  counter* const top[2] = {&frames_.back().bytes, &frames_.back().allocations};
  for (int q = 0; q < 2; ++q) {
    // Frees the upstream has not answered yet may be refused and counted back: only what
    // lies below minus them is over-freed for certain.
    std::int64_t pending = 0;
    for (std::size_t i = 0; i < detail::counter_shards; ++i) {
      pending = saturating_add(pending, shards_[i].in_flight[q]);
    }
    std::int64_t const floor = -std::max<std::int64_t>(pending, 0);
    if (top[q]->value >= floor) { continue; }
    // Saturating: two frees of a size near SIZE_MAX over a size-blind upstream take current
    // to INT64_MIN, and floor - INT64_MIN overflows (overfreed_bytes() had read negative).
    std::int64_t const excess = detail::saturating_sub(floor, top[q]->value);
    overfreed_[q] = saturating_add(overfreed_[q], excess);
    top[q]->value = floor;
    // With the credits merged the pool is the whole headroom, peak - current: set from the
    // new current rather than lowered by the excess, which is off when a sum saturated.
    pool_[q] = detail::saturating_sub(top[q]->peak, top[q]->value);
  }
}

statistics_resource_adaptor::counters statistics_resource_adaptor::current_counters() const {
  std::lock_guard global{mutex_};
  all_shards_lock all{shards_.get()};
  merge_locked(true);
  clamp_lifetime_locked();
  return reported_locked();
}

statistics_resource_adaptor::counters statistics_resource_adaptor::reported_locked() const {
  counters out = frames_.back();
  if (frames_.size() == 1) {
    // What lies below zero after the clamp is frees still in the upstream's hands: shown as
    // 0, kept in the state until the upstream accepts (or refuses) them.
    out.bytes.value = std::max<std::int64_t>(out.bytes.value, 0);
    out.allocations.value = std::max<std::int64_t>(out.allocations.value, 0);
  }
  return out;
}

std::uint64_t statistics_resource_adaptor::refills() const {
  std::lock_guard global{mutex_};
  return refills_;
}

std::size_t statistics_resource_adaptor::scope_depth() const {
  std::lock_guard global{mutex_};
  return frames_.size() - 1;
}

std::int64_t statistics_resource_adaptor::overfreed_bytes() const {
  (void)current_counters();  // merges and clamps
  std::lock_guard global{mutex_};
  return overfreed_[bytes_q];
}

std::int64_t statistics_resource_adaptor::overfreed_allocations() const {
  (void)current_counters();
  std::lock_guard global{mutex_};
  return overfreed_[allocs_q];
}

statistics_resource_adaptor::counters statistics_resource_adaptor::push_counters() {
  std::lock_guard global{mutex_};
  all_shards_lock all{shards_.get()};
  merge_locked(true);
  clamp_lifetime_locked();
  counters const outer = reported_locked();
  frames_.emplace_back();
  try {
    frame_ids_.push_back(next_frame_id_ + 1);
  } catch (...) {
    // Out of host memory: no scope opened. A frame left without its id made the depth read
    // one more and a pop take the lifetime's id.
    frames_.pop_back();
    throw;
  }
  ++next_frame_id_;
  top_frame_id_ = next_frame_id_;
  pool_[bytes_q] = pool_[allocs_q] = 0;  // the new region: peak 0 - current 0
  return outer;
}

statistics_resource_adaptor::counters statistics_resource_adaptor::pop_counters() {
  std::lock_guard global{mutex_};
  all_shards_lock all{shards_.get()};
  if (frames_.size() < 2) { throw logic_error("statistics: pop_counters without a matching push_counters"); }
  merge_locked(true);
  counters const inner = frames_.back();
  frames_.pop_back();
  frame_ids_.pop_back();
  top_frame_id_ = frame_ids_.back();
  counter* const outer[2] = {&frames_.back().bytes, &frames_.back().allocations};
  counter const* const in[2] = {&inner.bytes, &inner.allocations};
  for (int q = 0; q < 2; ++q) {
    outer[q]->peak = std::max(outer[q]->peak, saturating_add(outer[q]->value, in[q]->peak));
    outer[q]->value = saturating_add(outer[q]->value, in[q]->value);
    outer[q]->total = saturating_add(outer[q]->total, in[q]->total);
    // The enclosing region's headroom; saturating, as a current that saturated downwards
    // (frees of sizes near SIZE_MAX) would overflow it.
    pool_[q] = detail::saturating_sub(outer[q]->peak, outer[q]->value);
  }
  clamp_lifetime_locked();
  return inner;
}

void* statistics_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  void* ptr = upstream_->allocate(bytes, stream, alignment);
  count_up(detail::to_count(bytes), 1);
  return ptr;
}

void statistics_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment,
                                                stream_view stream) {
  auto const n = detail::to_count(bytes);
  std::uint64_t frame = 0;
  shard* const s = count_down(n, 1, frame);
  if (s == nullptr) {
    // A size no block has (2^62 B or so): counted only once the upstream accepted it.
    upstream_->deallocate(ptr, bytes, stream, alignment);
    count_down_accepted(n, 1);
    return;
  }
  try {
    upstream_->deallocate(ptr, bytes, stream, alignment);
  } catch (...) {
    // The upstream refused the free (a checking layer below found it bad).
    count_back_refused(*s, n, 1, frame);
    throw;
  }
  settle_free(*s, n, 1);
}

}  // namespace mrstack
