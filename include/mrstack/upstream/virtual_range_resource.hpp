#pragma once
/// `virtual_range_resource`: what `vmm` and `simulated_vmm` share — everything but the calls
/// that create and destroy physical memory, which each supplies as a `granule_backend`.
///
/// It is a `memory_resource` and a `virtual_range` (see virtual_range.hpp):
/// - As a plain upstream, `allocate(bytes)` carves a granule-aligned span out of the
///   reserved range (first fit in address order), commits it and returns it; `deallocate`
///   decommits it and gives the addresses back. Every allocation is rounded up to whole
///   granules (2 MiB on current GPUs) and costs driver calls, like cudaMalloc: put a pool
///   above it. Alignments up to the granularity come free; larger ones are honoured.
///   Freeing with a size or alignment other than the ones allocated (alignments compared
///   at least 256, as `system` does), or a pointer it never handed out, is a `logic_error`
///   naming them, and nothing is freed. Running out is `out_of_memory` naming the caller's
///   request, its alignment and the cause (range too small, alignment it cannot meet, no
///   free stretch left, or no physical memory for the mapping).
/// - As a `virtual_range`, a pool claims the whole range and commits/decommits parts of it.
///   While claimed, `allocate` refuses with a `logic_error` saying so.
/// - Sleep and wake: `sleep(keep_contents)` gives back every physical allocation (the
///   contents of committed granules first copied aside when `keep_contents`), keeping the
///   reservation and the record of which granules are committed; `wake()` maps fresh
///   physical memory behind exactly those granules at the same addresses, makes it
///   accessible and copies the contents back. While asleep: `committed_bytes()` and
///   `mapped_bytes()` are 0 and `asleep_bytes()` says what wake() will map; `commit` and
///   `allocate` are `logic_error`s (nothing may be backed before wake); `decommit` and
///   `deallocate` work (bookkeeping only: those granules are not mapped back). Memory of
///   the range must not be touched while asleep (it faults). Sleeping twice, or waking
///   while awake, is a `logic_error`. A failed wake (out of memory) leaves it asleep with
///   the contents still kept, so wake can be retried. A sleep (or a deallocate) whose
///   unmapping fails throws after finishing: every granule is decommitted (asleep: kept for
///   wake) and every other run unmapped; the run left mapped is reused by the next commit.
/// Counters (`map_calls`, `unmap_calls`, `peak_mapped_bytes`) make the cost of a workload
/// visible: each map or unmap is a driver round trip on a device.
/// Thread-safe: one mutex around the slow paths (driver calls cost microseconds anyway).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <mrstack/detail/granule_map.hpp>
#include <mrstack/resource.hpp>
#include <mrstack/upstream/virtual_range.hpp>

namespace mrstack {

class virtual_range_resource : public memory_resource, public virtual_range {
 public:
  ~virtual_range_resource() override;

  // virtual_range
  [[nodiscard]] std::byte* range_base() const noexcept final { return reinterpret_cast<std::byte*>(base_); }
  [[nodiscard]] std::size_t range_bytes() const noexcept final { return range_bytes_; }
  [[nodiscard]] std::size_t granularity() const noexcept final { return granularity_; }
  void claim(std::string_view claimant) final;
  void unclaim() noexcept final;
  std::size_t commit(void* ptr, std::size_t bytes) final;
  std::size_t decommit(void* ptr, std::size_t bytes) final;
  [[nodiscard]] std::size_t committed_bytes() const noexcept final { return committed_bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept final { return mapped_bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool owns(void const* ptr) const noexcept final {
    auto const p = reinterpret_cast<std::uintptr_t>(ptr);
    return p >= base_ && p - base_ < range_bytes_;
  }

  /// Granules per physical allocation (1: every granule is mapped and released alone).
  [[nodiscard]] std::size_t map_granules() const noexcept { return map_granules_; }
  /// Most physical memory held at once since construction or the last `reset_peak_mapped_bytes()`.
  [[nodiscard]] std::size_t peak_mapped_bytes() const noexcept { return peak_mapped_bytes_.load(std::memory_order_relaxed); }
  /// Starts a new peak from what is mapped now (the replay measures a timed run alone).
  void reset_peak_mapped_bytes() noexcept { peak_mapped_bytes_.store(mapped_bytes(), std::memory_order_relaxed); }
  /// Physical allocations created / given back since construction (driver round trips).
  [[nodiscard]] std::size_t map_calls() const noexcept { return map_calls_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t unmap_calls() const noexcept { return unmap_calls_.load(std::memory_order_relaxed); }
  /// True when every granule [ptr, ptr + bytes) touches is committed.
  [[nodiscard]] bool is_committed(void const* ptr, std::size_t bytes) const;
  /// See "Sleep and wake" above. Throws what the backend throws (copying, unmapping).
  void sleep(bool keep_contents);
  void wake();
  [[nodiscard]] bool asleep() const noexcept { return asleep_.load(std::memory_order_acquire); }
  /// While asleep: the committed bytes wake() maps back (0 when awake).
  [[nodiscard]] std::size_t asleep_bytes() const noexcept { return asleep_bytes_.load(std::memory_order_relaxed); }
  /// Whether the contents are being kept across this sleep.
  [[nodiscard]] bool keeps_contents() const noexcept;

  /// Who holds the claim ("" when unclaimed).
  [[nodiscard]] std::string claimant() const;
  /// Throws std::logic_error when the bookkeeping is inconsistent (tests call it).
  void check_invariants() const;

 protected:
  /// `base`: the reserved range's start, or 0 for a fake one chosen here (simulations);
  /// `range_bytes` a multiple of `granularity`; `backend` must outlive this object's use —
  /// derived classes call `release_everything()` first thing in their destructor, while
  /// their backend still works.
  virtual_range_resource(std::string name, std::uintptr_t base, std::size_t range_bytes, std::size_t granularity,
                         std::size_t map_granules, detail::granule_backend& backend);

  /// One physical allocation behind part of the range.
 public:
  struct mapped_run {
    std::size_t offset;     ///< bytes from the range's start
    std::size_t bytes;
    std::uint64_t handle;   ///< the backend's handle
  };
  /// Calls `use` with the runs backing [ptr, ptr + bytes), in address order, while holding
  /// the lock (so none can be unmapped meanwhile). Every granule there must be committed
  /// (`logic_error` otherwise, and while asleep): for IPC of a live block.
  void with_runs_backing(void const* ptr, std::size_t bytes,
                         std::function<void(std::vector<mapped_run> const&)> const& use) const;

 protected:

  /// Gives back every granule still mapped (outstanding allocations and a claimant's
  /// commits alike). Failures are reported on stderr: destructors cannot throw.
  void release_everything() noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return name_; }
  std::size_t do_free_bytes_held() const noexcept override {
    // Stranded granules (mapped in a run whose other granules are committed) are held
    // but unused: a later commit revives them without a driver call.
    return mapped_bytes() - committed_bytes();
  }
  void do_release() override {}  // nothing is held free that could be given back alone

  /// Forwards to the derived backend, counting calls and tracking mapped bytes.
  class counting_backend final : public detail::granule_backend {
   public:
    counting_backend(virtual_range_resource& owner, detail::granule_backend& inner) : owner_{owner}, inner_{inner} {}
    std::uint64_t map(std::size_t offset, std::size_t bytes) override;
    void enable_access(std::size_t offset, std::size_t bytes) override { inner_.enable_access(offset, bytes); }
    void before_unmap() override { inner_.before_unmap(); }
    void unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) override;
    void save_contents(stretches const& saved) override { inner_.save_contents(saved); }
    void restore_contents(stretches const& restored) override { inner_.restore_contents(restored); }
    void drop_saved_contents() noexcept override { inner_.drop_saved_contents(); }

   private:
    virtual_range_resource& owner_;
    detail::granule_backend& inner_;
  };

  [[nodiscard]] std::size_t offset_of(void const* ptr, std::size_t bytes, char const* op) const;
  void sync_counters() noexcept;
  // A node of free_addresses_ for [offset, offset + bytes), made ahead of the change it records.
  static std::map<std::size_t, std::size_t>::node_type free_node(std::size_t offset, std::size_t bytes);
  // While asleep: forgets granules [first, last) (they are not mapped back); returns how many were asleep.
  std::size_t forget_asleep(std::size_t first, std::size_t last);
  void refuse_while_asleep(char const* op) const;

  std::string name_;
  std::uintptr_t base_;
  std::size_t range_bytes_;
  std::size_t granularity_;
  std::size_t map_granules_;

  mutable std::mutex mutex_;
  detail::granule_map map_;
  counting_backend backend_;
  std::map<std::size_t, std::size_t> free_addresses_;  // offset -> bytes, coalesced (the plain-upstream path)
  struct live_block {
    std::size_t bytes;      // as asked
    std::size_t alignment;  // as asked, at least 256 (as `system` records it)
  };
  std::map<std::size_t, live_block> live_;  // offset -> what was asked, for checked frees
  bool claimed_ = false;
  std::string claimant_;

  // Sleep: the committed granules as [first, last) stretches (first -> last), mapped back by wake.
  std::map<std::size_t, std::size_t> asleep_granules_;
  bool contents_kept_ = false;
  std::atomic<bool> asleep_{false};
  std::atomic<std::size_t> asleep_bytes_{0};

  std::atomic<std::size_t> committed_bytes_{0};
  std::atomic<std::size_t> mapped_bytes_{0};
  std::atomic<std::size_t> peak_mapped_bytes_{0};
  std::atomic<std::size_t> map_calls_{0};
  std::atomic<std::size_t> unmap_calls_{0};
};

}  // namespace mrstack
