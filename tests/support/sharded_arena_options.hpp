#pragma once
// The arena options the thread-shard tests share: small superblocks (so that threads churn
// through the depot), sharded from a second thread on a stream, on a fake event seam.
#include <thread_stream_seam.hpp>

#include <mrstack/suballoc/arena_memory_resource.hpp>

#include <memory>

namespace mrstack::test {

inline arena_options sharded_arena_options(std::shared_ptr<thread_stream_seam> const& seam, bool thread_shards = true) {
  constexpr std::size_t KiB = 1024;
  arena_options o;
  o.superblock_size = 64 * KiB;
  o.max_small_size = 32 * KiB;
  o.empty_superblocks_kept = 1;
  o.minimum_growth = 4 * 1024 * KiB;
  o.thread_shards = thread_shards;
  o.shard_after_contentions = 0;  // a second thread on a stream shards it
  o.stream_sync = seam;
  return o;
}

}  // namespace mrstack::test
