#pragma once
/// `system_memory_resource`: ordinary host memory from the C++ runtime (aligned operator
/// new), used as an upstream so every suballocator and adaptor runs — and is tested under
/// sanitizers — on a machine without a GPU. Any power-of-two alignment (at least 256).
/// Thread-safe. Streams are ignored. Refusals throw `out_of_memory`; so does a size the
/// heap could never serve (beyond `max_bytes`: rounding it up to the alignment would wrap).
///
/// Every free is checked: the live blocks of every system resource of the process
/// (address, size, alignment) sit in one hash sharded by address — all of them are one
/// heap, so memory from one may be freed through another (`is_equal`) — and a pointer it did not hand out or already took back, or a
/// size or alignment other than the one allocated, is a `logic_error` naming the pointer
/// and both sizes — and nothing is freed (the heap would abort or corrupt itself). The
/// table costs a hash insert and erase per call, small beside operator new itself.
#include <cstddef>
#include <mutex>

#include <mrstack/detail/pointer_map.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class system_memory_resource final : public memory_resource {
 public:
  /// The largest request it passes to the heap (larger ones are out_of_memory).
  static constexpr std::size_t max_bytes = std::size_t{1} << 62;

  /// Blocks live now from every system resource of the process (tests, leak checks).
  [[nodiscard]] static std::size_t live_blocks();

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override {
    return dynamic_cast<system_memory_resource const*>(&other) != nullptr;
  }
  std::string do_name() const override { return "system"; }
  memory_kind do_kind() const noexcept override { return memory_kind::host; }

  struct block {
    std::size_t bytes;
    std::size_t alignment;
  };
  /// One lock and table per shard, so threads freeing different blocks rarely meet.
  struct alignas(64) shard {
    std::mutex mutex;
    detail::pointer_map<block> live;  // one array: no host allocation per block, unlike a node map
  };
  static constexpr std::size_t shard_count = 16;
  static shard& shard_of(void const* ptr) noexcept;
};

}  // namespace mrstack
