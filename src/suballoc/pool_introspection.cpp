// pool_memory_resource: what the pool reports about itself (sizes, statistics,
// fragmentation, invariants, the out-of-memory error), summed over its shards. Each
// shard is locked in turn, never two at once; every per-shard query is O(1) or
// O(streams), so no lock is held longer than an allocation holds it.
#include <mrstack/error.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>

#include <algorithm>

#include <mrstack/suballoc/in_place_pool_growth.hpp>

namespace mrstack {

std::size_t pool_memory_resource::footprint() const noexcept {
  if (growth_) {  // one shard; the caller holds its lock
    auto const& b = shard_at(0)->core.blocks();
    return b.total_bytes() - b.withdrawn_bytes();
  }
  return held_bytes_.load(std::memory_order_relaxed);
}

std::size_t pool_memory_resource::pool_size() const { return stats().pool_size; }
std::size_t pool_memory_resource::free_bytes() const { return stats().free_bytes; }
std::size_t pool_memory_resource::used_bytes() const { return stats().used_bytes; }
std::size_t pool_memory_resource::largest_free_block() const { return stats().largest_free_block; }
std::size_t pool_memory_resource::chunk_count() const { return stats().chunks; }

pool_memory_resource::statistics pool_memory_resource::stats() const {
  statistics st;
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    auto const& b = sh.core.blocks();
    if (growth_) { st.pool_size = footprint(); }
    st.free_bytes += b.free_bytes();
    st.used_bytes += b.live_bytes();
    st.largest_free_block = std::max(st.largest_free_block, b.largest_free_block());
    st.chunks += b.chunk_count();
    st.live_blocks += b.live_blocks();
    st.free_blocks += b.free_block_count();
    st.events_recorded += sh.core.owners().records();
    st.stream_waits += sh.core.owners().waits();
    ++st.shards;
  });
  if (!growth_) { st.pool_size = footprint(); }
  st.peak_pool_size = peak_pool_size_.load(std::memory_order_relaxed);
  st.upstream_allocations = upstream_allocations_.load(std::memory_order_relaxed);
  return st;
}

fragmentation_info pool_memory_resource::do_fragmentation() const {
  fragmentation_info info;
  info.resource = "pool";
  auto share_of = [&](detail::stream_ref const& r) -> fragmentation_info::stream_share& {
    std::uintptr_t const id = r.thread_bound ? r.key : r.handle;
    for (auto& share : info.streams) {
      if (share.stream == id && share.thread_bound == r.thread_bound) { return share; }
    }
    info.streams.push_back({id, r.thread_bound, 0, 0, 0});
    return info.streams.back();
  };
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    auto const& b = sh.core.blocks();
    if (growth_) { info.held_bytes = footprint(); }
    info.live_bytes += b.live_bytes();
    info.free_bytes += b.free_bytes();
    info.largest_free_block = std::max(info.largest_free_block, b.largest_free_block());
    info.free_blocks += b.free_block_count();
    // Owner 0 is memory every stream may use; the others are streams.
    auto const owners = std::min(b.owner_limit(), sh.core.owners().limit());
    for (std::size_t o = 1; o < owners; ++o) {
      auto const id = static_cast<detail::owner_id>(o);
      if (b.free_blocks(id) == 0) { continue; }
      auto& share = share_of(sh.core.owners().ref(id));
      share.free_bytes += b.free_bytes(id);
      share.free_blocks += b.free_blocks(id);
      share.largest_free_block = std::max(share.largest_free_block, b.largest_free_block(id));
    }
  });
  if (!growth_) { info.held_bytes = footprint(); }
  return info;
}

std::string pool_memory_resource::check_invariants() const {
  std::string problems;
  std::size_t chunk_bytes = 0;
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    problems += sh.core.blocks().check_invariants();
    chunk_bytes += sh.core.blocks().total_bytes();
  });
  if (!growth_ && chunk_bytes != footprint()) {
    problems += "pool: shards hold " + std::to_string(chunk_bytes) + " B of chunks, but the pool counts " +
                std::to_string(footprint()) + " B held\n";
  }
  return problems;
}

std::size_t pool_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  for_each_shard([&](shard& sh) {
    std::lock_guard lock{sh.mutex};
    held += sh.core.blocks().free_bytes();
  });
  return held + upstream_->free_bytes_held();
}

void pool_memory_resource::throw_out_of_memory(std::size_t bytes, std::string why) const {
  statistics const st = stats();
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "pool";
  info.footprint_bytes = st.pool_size;
  info.free_bytes = st.free_bytes;
  info.largest_free_block = st.largest_free_block;
  info.limit_bytes = maximum_size_;
  info.detail = std::move(why);
  throw out_of_memory(std::move(info));
}

}  // namespace mrstack
