#pragma once
/// `simulated_vmm_memory_resource` (spec name `simulated_vmm`): the CPU twin of `vmm`. It
/// reserves a fake address range (far above any real address; never dereference its
/// pointers) and keeps exactly the granule bookkeeping `vmm` keeps — the same code, with
/// the driver calls replaced by accounting. So the in-place growth and release algorithms
/// are tested without a GPU, and the footprint of a workload (`mapped_bytes`,
/// `peak_mapped_bytes`) and its driver traffic (`map_calls`, `unmap_calls`) can be replayed
/// on any machine.
///
/// It checks what a driver would refuse: an unmap must name exactly one earlier map with
/// its handle, and memory must be made accessible after it is mapped (`is_accessible`).
/// `capacity` plays the device's physical memory: a map past it throws `out_of_memory`,
/// like cuMemCreate on a full device.
///
/// Sleep and wake (virtual_range_resource.hpp) keep no bytes (there are none), but check
/// what the device would need: contents are saved only from mapped, accessible memory and
/// restored only into mapped, accessible memory inside what was saved; `saved_bytes()` and
/// `restored_bytes()` count them.
#include <cstddef>
#include <limits>
#include <map>

#include <mrstack/upstream/virtual_range_resource.hpp>

namespace mrstack {

class simulated_vmm_memory_resource final : public virtual_range_resource, private detail::granule_backend {
 public:
  static constexpr std::size_t default_granularity = std::size_t{2} << 20;  // what current GPUs use
  static constexpr std::size_t default_reserve = std::size_t{1} << 40;      // 1 TiB of addresses
  /// As vmm's default, so a replay here counts the driver calls the device would make.
  static constexpr std::size_t default_map_granules = 16;
  /// Granules a range may have: its bookkeeping holds a bit per granule, made up front
  /// (2^31 granules: 256 MiB of bits). 256 TiB at 256 B granules asked 128 GiB.
  static constexpr std::size_t max_granules = std::size_t{1} << 31;

  /// `reserve_bytes` is rounded up to `granularity` (a power of two, at least 256 B).
  explicit simulated_vmm_memory_resource(std::size_t reserve_bytes = default_reserve,
                                         std::size_t granularity = default_granularity,
                                         std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                                         std::size_t map_granules = default_map_granules);
  ~simulated_vmm_memory_resource() override;

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// True when every byte of [ptr, ptr + bytes) is mapped and was made accessible.
  [[nodiscard]] bool is_accessible(void const* ptr, std::size_t bytes) const;
  /// Bytes the last sleep with contents kept saved, and the last wake restored.
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return saved_bytes_; }
  [[nodiscard]] std::size_t restored_bytes() const noexcept { return restored_bytes_; }

 private:
  std::uint64_t map(std::size_t offset, std::size_t bytes) override;
  void enable_access(std::size_t offset, std::size_t bytes) override;
  void before_unmap() override {}
  void unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) override;
  void save_contents(stretches const& saved) override;
  void restore_contents(stretches const& restored) override;
  void drop_saved_contents() noexcept override { saved_.clear(); }
  [[nodiscard]] bool accessible_at(std::size_t offset, std::size_t bytes) const;  // physical_mutex_ held

  memory_kind do_kind() const noexcept override { return memory_kind::none; }

  struct physical {
    std::size_t bytes;
    std::uint64_t handle;
    bool accessible;
  };

  std::size_t capacity_;
  std::size_t held_ = 0;                      // bytes of physical memory "created"
  std::uint64_t next_handle_ = 1;
  std::map<std::size_t, physical> physical_;  // offset -> one simulated physical allocation
  std::map<std::size_t, std::size_t> saved_;  // offset -> bytes saved by the sleep now in force
  std::size_t saved_bytes_ = 0;
  std::size_t restored_bytes_ = 0;
  // Guarded by the base's mutex: backend calls happen with it held; is_accessible takes
  // its own copy under physical_mutex_ so a test may call it at any time.
  mutable std::mutex physical_mutex_;
};

}  // namespace mrstack
