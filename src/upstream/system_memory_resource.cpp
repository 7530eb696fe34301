#include <mrstack/upstream/system_memory_resource.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <new>

namespace mrstack {

namespace {
// Never destroyed: resources (and their frees) may outlive static destruction.
template <typename Shard, std::size_t N>
std::array<Shard, N>& all_shards() {
  static auto* shards = new std::array<Shard, N>();
  return *shards;
}
}  // namespace

system_memory_resource::shard& system_memory_resource::shard_of(void const* ptr) noexcept {
  static_assert(shard_count == 16, "the shard index takes the hash's top 4 bits");
  // Blocks are at least 256-byte aligned: mix the bits above those into a shard index.
  auto const a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) >> 8;
  return all_shards<shard, shard_count>()[(a * 0x9E3779B97F4A7C15ULL) >> 60];
}

void* system_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  std::size_t const align = std::max(alignment, default_alignment);
  auto refuse = [&](char const* why) -> void* {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "system";
    info.detail = why;
    throw out_of_memory(std::move(info));
  };
  // The runtime rounds the size up to the alignment; near SIZE_MAX that wraps to a tiny
  // block. No host has this much memory, so such a request is simply refused.
  if (bytes > max_bytes || align > max_bytes) { return refuse("the size exceeds what any host heap can serve"); }
  // The nothrow form: AddressSanitizer aborts on a failing throwing new even with
  // allocator_may_return_null=1, but lets the nothrow form return null.
  void* ptr = ::operator new(bytes, std::align_val_t{align}, std::nothrow);
  if (ptr == nullptr) { return refuse("the host's operator new refused"); }
  shard& s = shard_of(ptr);
  try {
    std::lock_guard lock{s.mutex};
    auto const key = reinterpret_cast<std::uintptr_t>(ptr);
    if (!s.live.insert(key, block{bytes, align})) {
      // The heap handed out an address still booked here: it was freed behind this
      // resource's back. The new block is what lives there now.
      s.live.erase(key);
      s.live.insert(key, block{bytes, align});
    }
  } catch (...) {
    ::operator delete(ptr, std::align_val_t{align});
    return refuse("no memory left to record the block");
  }
  return ptr;
}

void system_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view) {
  std::size_t const align = std::max(alignment, default_alignment);
  shard& s = shard_of(ptr);
  {
    std::lock_guard lock{s.mutex};
    block const* const it = s.live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == nullptr) {
      throw logic_error("system: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                        " B: not a block it handed out, or already freed (nothing was freed)");
    }
    if (it->bytes != bytes || it->alignment != align) {
      throw logic_error("system: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                        " B and alignment " + std::to_string(align) + ", but it was allocated with " +
                        std::to_string(it->bytes) + " B and alignment " + std::to_string(it->alignment) +
                        " (nothing was freed)");
    }
    s.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  ::operator delete(ptr, std::align_val_t{align});
}

std::size_t system_memory_resource::live_blocks() {
  std::size_t n = 0;
  for (auto& s : all_shards<shard, shard_count>()) {
    std::lock_guard lock{s.mutex};
    n += s.live.size();
  }
  return n;
}

}  // namespace mrstack
