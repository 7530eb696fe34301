#pragma once
/// `granule_map`: the bookkeeping of a reserved virtual address range whose physical
/// backing comes and goes in granules. CUDA-free: the driver (vmm) and the simulation
/// (simulated_vmm) plug in through `granule_backend`, so the same code is tested on the CPU.
///
/// Two states per granule (index g covers bytes [g*G, (g+1)*G) of the range):
/// - *committed*: a client asked for it (commit) and has not given it back (decommit).
/// - *mapped*: physical memory sits behind it. Committed implies mapped.
/// Physical memory is created in *runs*: one backend allocation covers up to
/// `map_granules` consecutive granules, and a run never crosses a multiple of
/// `map_granules` (runs live inside aligned "superblocks", so the layout is predictable).
/// A run can only be given back whole (the driver releases a physical allocation only when
/// all of it is unmapped), so a granule that is decommitted while others of its run stay
/// committed is *stranded*: still mapped, counted in `mapped_granules()`, and revived for
/// free by a later commit. With `map_granules == 1` nothing is ever stranded and
/// mapped == committed exactly; larger runs trade release precision for fewer driver calls.
///
/// Not thread-safe: the owner serializes calls. When the backend throws:
/// - `commit` is all-or-nothing: nothing becomes committed, and what the call mapped is
///   unmapped again; a run that cannot be unmapped then stays recorded as mapped with
///   nothing committed (so no later map lands on memory still mapped).
/// - `decommit` still decommits every granule asked and unmaps every run it freed that it
///   can; a run the backend fails to unmap stays recorded as mapped with nothing committed
///   (the next decommit over it retries, a commit revives it). The first error is rethrown
///   once all of that is done, so one failure never strands committed granules nobody owns.
/// A full heap is no exception to that: `commit` makes its records before it maps
/// anything, and `decommit` allocates nothing.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mrstack::detail {

/// What actually creates and destroys physical memory behind the range. Offsets are bytes
/// from the start of the range, always multiples of the granularity.
class granule_backend {
 public:
  /// Backs [offset, offset + bytes) with one new physical allocation and returns a handle
  /// for `unmap`. Throws (out_of_memory when there is no physical memory left).
  virtual std::uint64_t map(std::size_t offset, std::size_t bytes) = 0;
  /// Makes a contiguous stretch of runs just mapped by one commit accessible. Throws.
  virtual void enable_access(std::size_t offset, std::size_t bytes) = 0;
  /// Called once before a batch of unmaps (the driver backend waits for in-flight work here,
  /// because unmapping does not wait for kernels that may still touch the memory).
  virtual void before_unmap() = 0;
  /// Undoes one `map` (the whole run). Throws on failure: any exception means the run is
  /// still mapped (the map keeps it recorded, so a later commit revives it and a later
  /// decommit retries). When the addresses were unmapped but a later step failed (the
  /// driver unmapped, then could not release the physical allocation), throw
  /// `unmapped_with_error` instead: the map then forgets the run like a successful unmap.
  virtual void unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) = 0;

  /// [offset, offset + bytes) stretches of the range, in address order.
  using stretches = std::vector<std::pair<std::size_t, std::size_t>>;
  /// Sleep with contents kept: copies every stretch (all mapped and accessible) somewhere
  /// that survives the unmapping that follows. All or nothing. Default: no contents to keep.
  virtual void save_contents(stretches const& /*saved*/) {}
  /// Wake: copies saved contents back into `restored` (each stretch lies inside one that
  /// was saved, and is mapped and accessible again). Throws.
  virtual void restore_contents(stretches const& /*restored*/) {}
  /// Forgets what `save_contents` kept (after a restore, or when nothing will be restored).
  virtual void drop_saved_contents() noexcept {}

 protected:
  granule_backend() = default;
  ~granule_backend() = default;
  granule_backend(granule_backend const&) = default;
  granule_backend& operator=(granule_backend const&) = default;
};

/// Thrown by `granule_backend::unmap` when the run is unmapped but giving it back failed
/// afterwards. `cause()` is the failure itself; `granule_map` rethrows it (not this wrapper)
/// once the run is forgotten, so callers see the backend's own error type.
class unmapped_with_error : public std::runtime_error {
 public:
  explicit unmapped_with_error(std::exception_ptr cause)
      : std::runtime_error{"granule_map: a run was unmapped, then giving it back failed"}, cause_{std::move(cause)} {}
  [[nodiscard]] std::exception_ptr const& cause() const noexcept { return cause_; }

 private:
  std::exception_ptr cause_;
};

class granule_map {
 public:
  struct run {
    std::size_t count = 0;      ///< granules in this physical allocation
    std::size_t committed = 0;  ///< of those, committed now (0: the run is being given back)
    std::uint64_t handle = 0;   ///< the backend's handle
    /// A commit's rollback could not unmap this run, possibly before its access was
    /// enabled: the commit that revives it enables access first.
    bool needs_access = false;
  };

  /// `range_bytes` and `granularity` in bytes; `range_bytes` a non-zero multiple of
  /// `granularity`; `map_granules` >= 1.
  granule_map(std::size_t range_bytes, std::size_t granularity, std::size_t map_granules)
      : granularity_{granularity}, granule_count_{granularity == 0 ? 0 : range_bytes / granularity},
        map_granules_{map_granules}, committed_bits_((granule_count_ + 63) / 64, 0) {
    if (granularity == 0 || range_bytes == 0 || range_bytes % granularity != 0 || map_granules == 0) {
      throw std::invalid_argument("granule_map: range of " + std::to_string(range_bytes) +
                                  " B must be a non-zero multiple of the granularity (" + std::to_string(granularity) +
                                  " B), and map_granules (" + std::to_string(map_granules) + ") at least 1");
    }
  }

  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t granule_count() const noexcept { return granule_count_; }
  [[nodiscard]] std::size_t map_granules() const noexcept { return map_granules_; }
  [[nodiscard]] std::size_t committed_granules() const noexcept { return committed_count_; }
  [[nodiscard]] std::size_t mapped_granules() const noexcept { return mapped_count_; }
  [[nodiscard]] std::size_t run_count() const noexcept { return runs_.size(); }

  [[nodiscard]] bool is_committed(std::size_t g) const noexcept {
    return g < granule_count_ && ((committed_bits_[g / 64] >> (g % 64)) & 1U) != 0;
  }
  [[nodiscard]] bool is_mapped(std::size_t g) const noexcept { return find_run(g) != runs_.end(); }
  /// True when every granule in [first, last) is committed.
  [[nodiscard]] bool all_committed(std::size_t first, std::size_t last) const noexcept {
    for (std::size_t g = first; g < last; ++g) {
      if (!is_committed(g)) { return false; }
    }
    return true;
  }

  /// Commits granules [first, last): maps the ones with no physical memory (in runs of at
  /// most `map_granules`, one backend call each, then one `enable_access` per contiguous
  /// stretch) and revives stranded ones (enabling access first on a run a failed commit
  /// left mapped). Returns how many granules became committed.
  std::size_t commit(std::size_t first, std::size_t last, granule_backend& backend) {
    check_bounds(first, last, "commit");
    std::vector<std::size_t> revived;  // stranded granules committed again (no backend call)
    std::vector<piece> pieces;         // unmapped stretches to map, in address order
    std::vector<std::size_t> needs_access;  // first granules of revived runs left without access
    std::size_t g = first;
    while (g < last) {
      auto next = runs_.upper_bound(g);
      if (next != runs_.begin()) {
        auto const inside = std::prev(next);
        std::size_t const run_end = inside->first + inside->second.count;
        if (g < run_end) {
          if (inside->second.needs_access) { needs_access.push_back(inside->first); }
          for (std::size_t const end = std::min(last, run_end); g < end; ++g) {
            if (!is_committed(g)) { revived.push_back(g); }
          }
          continue;
        }
      }
      std::size_t const gap_end = std::min(last, next == runs_.end() ? granule_count_ : next->first);
      while (g < gap_end) {
        std::size_t const boundary = (g / map_granules_ + 1) * map_granules_;
        std::size_t const end = std::min(gap_end, boundary);
        pieces.push_back({g, end - g, 0});
        g = end;
      }
    }
    // The new runs' records are made before anything is mapped: recorded after, a full
    // heap left physical memory mapped that the books did not know.
    std::map<std::size_t, run> fresh;
    for (auto const& p : pieces) { fresh.emplace(p.first, run{p.count, p.count, 0}); }
    // Before anything is mapped, so a failure here leaves nothing to undo (enabling access
    // twice is harmless when a later step fails and the commit is retried).
    for (std::size_t run_first : needs_access) {
      backend.enable_access(run_first * granularity_, runs_.at(run_first).count * granularity_);
    }
    map_pieces(pieces, backend);  // all or nothing; nothing below throws
    for (std::size_t run_first : needs_access) { runs_.find(run_first)->second.needs_access = false; }
    for (auto const& p : pieces) {
      fresh.find(p.first)->second.handle = p.handle;
      for (std::size_t x = p.first; x < p.first + p.count; ++x) { set_bit(x); }
      mapped_count_ += p.count;
      committed_count_ += p.count;
    }
    runs_.merge(fresh);  // moves the nodes: allocates nothing
    for (std::size_t x : revived) {
      set_bit(x);
      ++find_run(x)->second.committed;
      ++committed_count_;
    }
    std::size_t newly = revived.size();
    for (auto const& p : pieces) { newly += p.count; }
    return newly;
  }

  /// Decommits granules [first, last) and gives back (unmaps) every run none of whose
  /// granules stays committed. Returns how many granules were decommitted. On a backend
  /// failure every granule asked is still decommitted and every other freed run unmapped;
  /// the runs not unmapped stay recorded as mapped with nothing committed (retried by the
  /// next decommit that touches them), and the first error propagates at the end.
  std::size_t decommit(std::size_t first, std::size_t last, granule_backend& backend) {
    check_bounds(first, last, "decommit");
    if (first == last) { return 0; }
    // Allocates nothing: a full heap halfway (a list of the runs to free, once) left
    // granules committed that the caller counts as given back, owned by nobody.
    std::size_t released = 0;
    bool any_freed = false;  // a run touched here is left with nothing committed
    for (auto it = first_run_touching(first); it != runs_.end() && it->first < last; ++it) {
      run& r = it->second;
      std::size_t const lo = std::max(first, it->first);
      std::size_t const hi = std::min(last, it->first + r.count);
      for (std::size_t x = lo; x < hi; ++x) {
        if (is_committed(x)) {
          clear_bit(x);
          --r.committed;
          --committed_count_;
          ++released;
        }
      }
      any_freed = any_freed || (r.committed == 0 && lo < hi);
    }
    if (any_freed) { unmap_freed_runs(first, last, backend); }
    return released;
  }

  /// The committed granules as [first, last) stretches in address order, each as long as
  /// it can be within one run: committed again one by one, they are mapped as the same
  /// runs (a stretch joining two runs had been mapped as one after a sleep, so that freeing
  /// the memory of one of them could not unmap its granules).
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> committed_stretches() const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (auto const& [first, r] : runs_) {
      for (std::size_t g = first; g < first + r.count; ++g) {
        if (!is_committed(g)) { continue; }
        if (!out.empty() && out.back().second == g && g != first) {
          ++out.back().second;
        } else {
          out.emplace_back(g, g + 1);
        }
      }
    }
    return out;
  }

  /// Visits every run as (first granule, run) in address order (for tests and reports).
  template <typename Visitor>
  void for_each_run(Visitor&& visit) const {
    for (auto const& [first, r] : runs_) { visit(first, r); }
  }

  /// Throws std::logic_error describing the first broken invariant (tests call it).
  void check_invariants() const {
    std::size_t mapped = 0;
    std::size_t committed = 0;
    std::size_t prev_end = 0;
    for (auto const& [first, r] : runs_) {
      if (first < prev_end) { fail("runs overlap at granule " + std::to_string(first)); }
      if (r.count == 0 || r.count > map_granules_) { fail("run at " + std::to_string(first) + " has a bad size"); }
      if (first / map_granules_ != (first + r.count - 1) / map_granules_) {
        fail("run at " + std::to_string(first) + " crosses a superblock boundary");
      }
      std::size_t in_run = 0;
      for (std::size_t x = first; x < first + r.count; ++x) { in_run += is_committed(x) ? 1 : 0; }
      if (in_run != r.committed) { fail("run at " + std::to_string(first) + " miscounts its committed granules"); }
      if (r.needs_access && r.committed != 0) { fail("run at " + std::to_string(first) + " is committed without access"); }
      mapped += r.count;
      committed += in_run;
      prev_end = first + r.count;
    }
    std::size_t bits = 0;
    for (auto w : committed_bits_) { bits += static_cast<std::size_t>(std::popcount(w)); }
    if (bits != committed) { fail("a committed granule has no run"); }
    if (mapped != mapped_count_ || committed != committed_count_) { fail("counters disagree with the runs"); }
  }

 private:
  struct piece {
    std::size_t first;
    std::size_t count;
    std::uint64_t handle;
  };

  [[noreturn]] static void fail(std::string const& what) { throw std::logic_error("granule_map: " + what); }

  void check_bounds(std::size_t first, std::size_t last, char const* op) const {
    if (first > last || last > granule_count_) {
      throw std::out_of_range(std::string{"granule_map: "} + op + " of granules [" + std::to_string(first) + ", " +
                              std::to_string(last) + ") outside the range of " + std::to_string(granule_count_));
    }
  }

  /// Maps every piece and enables access on each contiguous stretch; on any failure undoes
  /// what this call mapped and rethrows.
  void map_pieces(std::vector<piece>& pieces, granule_backend& backend) {
    std::size_t done = 0;
    try {
      for (; done < pieces.size(); ++done) {
        pieces[done].handle = backend.map(pieces[done].first * granularity_, pieces[done].count * granularity_);
      }
      for (std::size_t i = 0; i < pieces.size();) {
        std::size_t j = i + 1;
        while (j < pieces.size() && pieces[j].first == pieces[j - 1].first + pieces[j - 1].count) { ++j; }
        std::size_t const end = pieces[j - 1].first + pieces[j - 1].count;
        backend.enable_access(pieces[i].first * granularity_, (end - pieces[i].first) * granularity_);
        i = j;
      }
    } catch (...) {
      roll_back(pieces, done, backend);
      throw;
    }
  }

  /// Unmaps the first `done` pieces a failed commit mapped. No before_unmap: nothing can
  /// have used memory that was just mapped, and a failing wait must not keep the rollback
  /// from running. A piece that cannot be unmapped is recorded as a run with nothing
  /// committed (and maybe no access), so no later map lands on it; the commit's own error
  /// is the one that propagates.
  void roll_back(std::vector<piece> const& pieces, std::size_t done, granule_backend& backend) noexcept {
    for (std::size_t i = 0; i < done; ++i) {
      bool still_mapped = false;
      try {
        backend.unmap(pieces[i].first * granularity_, pieces[i].count * granularity_, pieces[i].handle);
      } catch (unmapped_with_error const&) {
        // Unmapped after all: nothing to record.
      } catch (...) {
        still_mapped = true;
      }
      if (!still_mapped) { continue; }
      try {
        runs_.emplace(pieces[i].first, run{pieces[i].count, 0, pieces[i].handle, true});
        mapped_count_ += pieces[i].count;
      } catch (...) {
        // No memory for the record: the run is lost to the books (the driver still frees it
        // when the process ends); the commit's error is the one to report.
      }
    }
  }

  /// Unmaps every run touching [first, last) with nothing committed, after one
  /// before_unmap. If that wait fails nothing is unmapped (in-flight work may still use
  /// the memory); a run the backend fails to unmap stays recorded. Every run is tried;
  /// the first error is rethrown after the last.
  void unmap_freed_runs(std::size_t first, std::size_t last, granule_backend& backend) {
    backend.before_unmap();
    std::exception_ptr first_error;
    auto it = first_run_touching(first);
    while (it != runs_.end() && it->first < last) {
      run const& r = it->second;
      if (r.committed != 0 || std::max(first, it->first) >= std::min(last, it->first + r.count)) {
        ++it;
        continue;
      }
      try {
        backend.unmap(it->first * granularity_, r.count * granularity_, r.handle);
      } catch (unmapped_with_error const& e) {
        if (!first_error) { first_error = e.cause() ? e.cause() : std::current_exception(); }
      } catch (...) {
        if (!first_error) { first_error = std::current_exception(); }
        ++it;
        continue;  // still mapped: it stays recorded
      }
      mapped_count_ -= r.count;
      it = runs_.erase(it);
    }
    if (first_error) { std::rethrow_exception(first_error); }
  }

  /// The first run that may touch granule `first` onwards (the one holding it, or the next).
  [[nodiscard]] std::map<std::size_t, run>::iterator first_run_touching(std::size_t first) {
    auto it = runs_.upper_bound(first);
    if (it != runs_.begin()) { --it; }
    return it;
  }

  [[nodiscard]] std::map<std::size_t, run>::const_iterator find_run(std::size_t g) const {
    auto it = runs_.upper_bound(g);
    if (it == runs_.begin()) { return runs_.end(); }
    --it;
    return g < it->first + it->second.count ? it : runs_.end();
  }
  [[nodiscard]] std::map<std::size_t, run>::iterator find_run(std::size_t g) {
    auto it = runs_.upper_bound(g);
    if (it == runs_.begin()) { return runs_.end(); }
    --it;
    return g < it->first + it->second.count ? it : runs_.end();
  }

  void set_bit(std::size_t g) noexcept { committed_bits_[g / 64] |= std::uint64_t{1} << (g % 64); }
  void clear_bit(std::size_t g) noexcept { committed_bits_[g / 64] &= ~(std::uint64_t{1} << (g % 64)); }

  std::size_t granularity_;
  std::size_t granule_count_;
  std::size_t map_granules_;
  std::vector<std::uint64_t> committed_bits_;
  std::map<std::size_t, run> runs_;  // first granule -> run; slow path only (driver calls cost µs)
  std::size_t committed_count_ = 0;
  std::size_t mapped_count_ = 0;
};

}  // namespace mrstack::detail
