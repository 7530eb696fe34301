// The limiting adaptor's sharded charges (design: adaptor/limiting_resource_adaptor.hpp).
#include <mrstack/adaptor/limiting_resource_adaptor.hpp>

namespace mrstack {

limiting_resource_adaptor::limiting_resource_adaptor(resource_ptr upstream, std::size_t limit, std::size_t granularity)
    : upstream_{std::move(upstream)},
      limit_{limit},
      granularity_{granularity},
      shards_{std::make_unique<shard[]>(detail::counter_shards)},
      pool_{limit} {
  if (upstream_ == nullptr) { throw logic_error("limiting: upstream resource is null"); }
  if (!detail::is_pow2(granularity_)) {
    throw logic_error("limiting: granularity " + std::to_string(granularity_) + " is not a power of two");
  }
}

limiting_resource_adaptor::~limiting_resource_adaptor() = default;

std::size_t limiting_resource_adaptor::used_bytes() const {
  std::lock_guard global{mutex_};
  detail::all_shards_lock all{shards_.get()};  // one consistent state of every shard
  std::size_t unused = pool_;
  for (std::size_t i = 0; i < detail::counter_shards; ++i) {
    unused = detail::saturating_add_size(unused, shards_[i].credit);
  }
  // Pool + credits stay within the limit, except after a free with a larger size than its
  // allocation over an upstream that does not check sizes (cudaFree takes a pointer alone):
  // then the excess came back as credit. Without tracking every block that cannot be
  // caught; the count stops at zero rather than wrap to ~2^64.
  return unused >= limit_ ? 0 : limit_ - unused;
}

void limiting_resource_adaptor::charge(std::size_t bytes, std::size_t amount) {
  shard& s = shards_[detail::this_thread_shard()];
  {
    std::lock_guard lock{s.mutex};
    if (s.credit >= amount) {
      s.credit -= amount;
      return;
    }
  }
  std::lock_guard global{mutex_};
  std::lock_guard lock{s.mutex};
  std::size_t const want = amount - std::min(amount, s.credit);
  // Other shards' credit into the pool, shard by shard, until it is enough (emptying all of
  // them would send each of their threads here next).
  detail::shard_pass pass{shards_.get(), s};
  pass.take_until(
      [&](shard& t) {
        pool_ = detail::saturating_add_size(pool_, t.credit);
        t.credit = 0;
      },
      [&] { return pool_ >= want; });
  // Still short, every other shard taken and still held: pool + this credit is exactly
  // limit - used, and the request is refused.
  if (pool_ < want) { refuse(bytes, amount, limit_ - pool_ - s.credit); }
  std::size_t const move = want + (pool_ - want) / 2;  // and half of what is left, for the next calls
  pool_ -= move;
  s.credit = detail::saturating_add_size(s.credit, move) - amount;
}

void limiting_resource_adaptor::uncharge(std::size_t amount) noexcept {
  shard& s = shards_[detail::this_thread_shard()];
  std::lock_guard lock{s.mutex};
  // Saturating: a free with a size near SIZE_MAX over a size-blind upstream (the caller's
  // -1 as a size) is an over-free whose excess comes back as credit (see used_bytes); a
  // wrapping add turned it into a credit smaller than before, so the limit shrank and
  // used_bytes() read bytes that were never charged.
  s.credit = detail::saturating_add_size(s.credit, amount);
}

void* limiting_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  std::size_t const amount = charge_for(bytes);
  if (amount > limit_) { refuse(bytes, amount, used_bytes()); }
  charge(bytes, amount);
  try {
    return upstream_->allocate(bytes, stream, alignment);
  } catch (...) {
    uncharge(amount);
    throw;
  }
}

void limiting_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  upstream_->deallocate(ptr, bytes, stream, alignment);
  // Uncharged only once the upstream has it back, so usage below never exceeds the counter.
  uncharge(charge_for(bytes));
}

void limiting_resource_adaptor::refuse(std::size_t bytes, std::size_t charge, std::size_t used) const {
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "limiting";
  info.limit_bytes = limit_;
  info.detail = "in use " + format_bytes(used) + ", the request is charged " + format_bytes(charge) +
                ", which would pass the limit";
  throw out_of_memory(std::move(info));
}

}  // namespace mrstack
