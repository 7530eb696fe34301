#pragma once
/// `page_owner_map`: which shard owns the 2 MiB page an address falls in, read by any
/// thread without a lock. CUDA-free.
///
/// Why: a sharded pool (pool_memory_resource with thread shards) hands whole 2 MiB-aligned
/// slabs to its shards, and a free, from whatever thread, must find the shard that holds
/// its block before it can take that shard's lock: a `page_map` of 2 MiB pages answers it
/// in three dependent loads. Entries are written when a slab moves into or out of a shard
/// (rare: a shard takes slabs geometrically).
///
/// Values are shard index + 1; 0 means "no shard: the pool's own global blocks".
#include <cstddef>
#include <cstdint>

#include <mrstack/detail/page_map.hpp>

namespace mrstack::detail {

class page_owner_map : public page_map<std::uint16_t> {
 public:
  static constexpr unsigned page_shift = 21;  // 2 MiB pages
  static constexpr std::size_t page_size = std::size_t{1} << page_shift;

  page_owner_map() : page_map{page_shift} {}
};

}  // namespace mrstack::detail
