#pragma once
/// `simulated_memory_resource`: hands out distinct, aligned addresses from a fake address
/// range and touches no memory. It counts what it has handed out (the footprint a real
/// upstream would have), its peak, and the calls, and it checks every free: a pointer it
/// never gave out, a wrong size or a wrong alignment (both compared at least 256, as
/// `system` does) is a `logic_error` naming them, and nothing is freed. An optional capacity makes it
/// refuse like a full device (`out_of_memory`). Use it to test suballocators without a
/// GPU and to replay logs of any size on any machine. Freed address ranges are reused
/// (first fit over an address-ordered free map: the lowest free range that fits), so long
/// replays never run out of range.
/// Thread-safe (one mutex: it is a test and replay tool, not a hot path).
/// Never dereference its pointers.
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>

#include <mrstack/resource.hpp>

namespace mrstack {

class simulated_memory_resource final : public memory_resource {
 public:
  /// The fake range starts at `base` (far from where real heaps and devices map memory).
  static constexpr std::uintptr_t default_base = 0x7e0000000000ULL;
  static constexpr std::size_t default_range = std::size_t{1} << 44;  // 16 TiB of addresses

  explicit simulated_memory_resource(std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                                     std::uintptr_t base = default_base, std::size_t range = default_range);

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t footprint() const;        ///< bytes handed out now
  [[nodiscard]] std::size_t peak_footprint() const;   ///< most bytes handed out at once
  [[nodiscard]] std::size_t allocation_count() const; ///< live allocations now
  [[nodiscard]] std::size_t total_allocations() const;///< successful allocate calls ever
  [[nodiscard]] bool owns(void const* ptr) const;     ///< ptr is the start of a live allocation

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "simulated"; }
  memory_kind do_kind() const noexcept override { return memory_kind::none; }

  void insert_free(std::uintptr_t begin, std::size_t size);

  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::map<std::uintptr_t, std::size_t> free_;   // address -> size, address-ordered, coalesced
  struct live_block {
    std::size_t bytes;      // as asked (the span is rounded up to 256)
    std::size_t alignment;  // as asked, at least 256 (as `system` records it), for checked frees
  };
  std::map<std::uintptr_t, live_block> live_;  // address -> what was asked
  std::size_t footprint_{0};
  std::size_t peak_footprint_{0};
  std::size_t total_allocations_{0};
};

}  // namespace mrstack
