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
/// Not thread-safe: the owner serializes calls. Every operation is all-or-nothing: when the
/// backend throws, the map is as it was before the call.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
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
  /// Undoes one `map` (the whole run). Throws on failure.
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

class granule_map {
 public:
  struct run {
    std::size_t count = 0;      ///< granules in this physical allocation
    std::size_t committed = 0;  ///< of those, committed now (0: the run is being given back)
    std::uint64_t handle = 0;   ///< the backend's handle
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
  /// stretch) and revives stranded ones. Returns how many granules became committed.
  std::size_t commit(std::size_t first, std::size_t last, granule_backend& backend) {
    check_bounds(first, last, "commit");
    std::vector<std::size_t> revived;  // stranded granules committed again (no backend call)
    std::vector<piece> pieces;         // unmapped stretches to map, in address order
    std::size_t g = first;
    while (g < last) {
      auto next = runs_.upper_bound(g);
      if (next != runs_.begin()) {
        auto const inside = std::prev(next);
        std::size_t const run_end = inside->first + inside->second.count;
        if (g < run_end) {
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
    map_pieces(pieces, backend);  // all or nothing; nothing below throws
    for (auto const& p : pieces) {
      runs_.emplace(p.first, run{p.count, p.count, p.handle});
      for (std::size_t x = p.first; x < p.first + p.count; ++x) { set_bit(x); }
      mapped_count_ += p.count;
      committed_count_ += p.count;
    }
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
  /// granules stays committed. Returns how many granules were decommitted. If the backend
  /// fails to unmap a run, the run stays recorded as mapped with nothing committed (it is
  /// retried by the next decommit that touches it) and the error propagates.
  std::size_t decommit(std::size_t first, std::size_t last, granule_backend& backend) {
    check_bounds(first, last, "decommit");
    if (first == last) { return 0; }
    std::size_t released = 0;
    bool synchronized = false;
    auto it = runs_.upper_bound(first);
    if (it != runs_.begin()) { --it; }
    while (it != runs_.end() && it->first < last) {
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
      if (r.committed == 0 && lo < hi) {
        if (!synchronized) {
          backend.before_unmap();
          synchronized = true;
        }
        backend.unmap(it->first * granularity_, r.count * granularity_, r.handle);
        mapped_count_ -= r.count;
        it = runs_.erase(it);
      } else {
        ++it;
      }
    }
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
      if (done > 0) {
        try {
          backend.before_unmap();
          for (std::size_t i = 0; i < done; ++i) {
            backend.unmap(pieces[i].first * granularity_, pieces[i].count * granularity_, pieces[i].handle);
          }
        } catch (...) {
          // The first error is the one worth reporting; a failed rollback leaks the run.
        }
      }
      throw;
    }
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
