#pragma once
/// `virtual_range`: the capability of an upstream that owns one reserved virtual address
/// range and backs parts of it with physical memory on request, in granules. `vmm` (the
/// CUDA driver's virtual memory management) and `simulated_vmm` (its CPU twin) have it.
///
/// Why a capability and not just allocate/deallocate: a pool over an ordinary upstream
/// takes memory in separate chunks, and free bytes on either side of a chunk boundary never
/// merge. A pool over a virtual range instead *claims* the range and grows in place:
/// `commit` puts physical memory behind the addresses right after what it already has, so
/// the new bytes extend its last free block, and `decommit` gives back whole free granules
/// anywhere, so its footprint follows its live bytes. A pool finds the capability with
/// `dynamic_cast<virtual_range*>(upstream)` (see detail/in_place_growth.hpp).
///
/// CUDA-free and in detail/ so that the growth core (detail/in_place_growth.hpp) depends on
/// nothing outside detail/; the resources that have it: upstream/virtual_range_resource.hpp.
///
/// Contract:
/// - `range_base()`/`range_bytes()`: the reserved range, fixed for the resource's lifetime,
///   aligned to `granularity()`.
/// - `claim(who)`: makes the caller the range's only user through commit/decommit. At most
///   one claim at a time, and only while no `allocate` of the resource is outstanding;
///   while claimed, the resource's own `allocate` refuses. `unclaim()` ends it, after the
///   claimant decommitted what it committed (what is still committed is decommitted then).
/// - `commit(ptr, bytes)`: every granule that [ptr, ptr + bytes) touches is backed and
///   accessible on return. Idempotent. All or nothing: on `out_of_memory` nothing new stays
///   mapped. Returns the bytes newly committed.
/// - `decommit(ptr, bytes)`: gives back every committed granule lying wholly inside
///   [ptr, ptr + bytes); granules only partly inside are untouched. The caller must not
///   touch those bytes again until it commits them. On a device this waits for in-flight
///   work first (unmapping does not). Returns the bytes decommitted.
/// - `committed_bytes()`: granules committed now, times the granularity;
///   `mapped_bytes()`: the physical memory actually held, which is larger only when the
///   resource maps several granules per physical allocation (see granule_map.hpp).
/// - `owns(ptr)`: ptr lies in the reserved range. Memory from a virtual range cannot be
///   exported with cudaIpcGetMemHandle; `find_virtual_range` lets an IPC path say so.
/// Thread-safe.
#include <cstddef>
#include <string_view>

namespace mrstack {

class virtual_range {
 public:
  virtual ~virtual_range() = default;

  [[nodiscard]] virtual std::byte* range_base() const noexcept = 0;
  [[nodiscard]] virtual std::size_t range_bytes() const noexcept = 0;
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;

  virtual void claim(std::string_view claimant) = 0;
  virtual void unclaim() noexcept = 0;

  virtual std::size_t commit(void* ptr, std::size_t bytes) = 0;
  virtual std::size_t decommit(void* ptr, std::size_t bytes) = 0;

  [[nodiscard]] virtual std::size_t committed_bytes() const noexcept = 0;
  [[nodiscard]] virtual std::size_t mapped_bytes() const noexcept = 0;
  [[nodiscard]] virtual bool owns(void const* ptr) const noexcept = 0;

 protected:
  virtual_range() = default;
  virtual_range(virtual_range const&) = default;
  virtual_range& operator=(virtual_range const&) = default;
};

}  // namespace mrstack
