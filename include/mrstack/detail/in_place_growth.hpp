#pragma once
/// `in_place_growth`: how a pool grows and shrinks over a `virtual_range` upstream (vmm,
/// simulated_vmm) instead of taking separate chunks. CUDA-free; the pool's own algorithm
/// core does all the allocating — this object only decides where physical memory goes.
///
/// Why: a pool over an ordinary upstream takes memory in chunks, and free bytes on the two
/// sides of a chunk boundary never merge, so fragmentation piles up (RMM's pool holds up to
/// 1.8x the live bytes on real workloads). Over a virtual range the pool keeps ONE chunk,
/// starting at the range's base: growing commits the granules right after its end (the
/// *frontier*) and extends the chunk, so the new bytes merge with the free block at its end.
///
/// Release: `release(core)` withdraws every whole granule lying inside a free block from
/// the core (it becomes a *hole*: never handed out, not counted free) and decommits it.
/// Afterwards the committed granules are exactly those a live block touches. A range whose
/// decommit fails with granules of it still committed goes back to the core as free memory
/// instead, for a later release (as a hole its reuse counted them twice). Holes are
/// reused before the frontier moves: `grow` takes the smallest stretch of adjacent holes
/// that fits (cutting the hole the request ends inside in two first and committing only
/// the part it needs: the rest stays a hole, never free memory with nothing behind it),
/// else the holes that end at the frontier plus an extension, else an extension alone (the
/// frontier also when the holes would pass the maximum and it would not, or the device
/// has no room for their granules). So a long run of grow/release cycles reuses addresses
/// instead of walking off the range's end.
/// When is release called:
/// - on demand (the pool's `release()`);
/// - `after_deallocate`: when the core's free bytes exceed `release_threshold` above what
///   the previous release could not give back (the margin stops a pool whose free bytes
///   hover above the threshold from rescanning on every free);
/// - in `grow`, when the upstream is out of physical memory: release, then retry once.
///
/// The core (block_pool) must offer: add_chunk(base, size, owner) -> chunk id,
/// extend_chunk(chunk, bytes, owner), withdraw_free_ranges(choose) with
/// choose(address, size, owner) -> Core::range{offset, length}, restore(address, owner),
/// split_hole(address, offset) (both parts stay holes; throws before changing anything),
/// for_each_free_block(f) with f(address, size, owner), free_bytes(), merges(a, b) (free
/// blocks of owners a and b merge as neighbours), before_release()
/// (called first in every release: a stream-ordered core waits there for the work queued
/// on the streams that freed its blocks), and the constants Core::granularity (its unit)
/// and Core::synchronized (the owner that merges with any). Sizes and addresses given to it are multiples of the range's granularity.
/// Not thread-safe: the pool calls it under its own lock.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <mrstack/detail/align.hpp>
#include <mrstack/detail/virtual_range.hpp>

namespace mrstack::detail {

struct in_place_growth_options {
  /// Committed at construction (rounded up to granules); the pool starts with this much.
  std::size_t initial_bytes = 0;
  /// The pool never commits more than this (rounded down to granules).
  std::size_t maximum_bytes = std::numeric_limits<std::size_t>::max();
  /// Least bytes one extension of the frontier commits (fewer, larger commits when a
  /// workload grows in small steps; less where the maximum is nearer). 0: exactly the
  /// granules a request needs.
  std::size_t growth_step = 0;
  /// `after_deallocate` releases when free bytes exceed this (see above). max: never.
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
};

/// Thrown by `grow` when no physical memory or address range can be found even after a
/// release. Carries numbers for the pool's out_of_memory message.
struct growth_failure : std::bad_alloc {
  std::string message;
  std::size_t committed_bytes = 0;
  explicit growth_failure(std::string m, std::size_t committed) : message{std::move(m)}, committed_bytes{committed} {}
  [[nodiscard]] char const* what() const noexcept override { return message.c_str(); }
};

template <typename Core>
class in_place_growth {
 public:
  in_place_growth(virtual_range& range, std::string_view claimant, in_place_growth_options const& options)
      : range_{range},
        granularity_{range.granularity()},
        base_{reinterpret_cast<std::uintptr_t>(range.range_base())},
        range_bytes_{usable_bytes(range)},
        maximum_{align_down(std::min(options.maximum_bytes, range.range_bytes()), range.granularity())},
        step_{align_up(options.growth_step, range.granularity())},
        initial_{align_up(options.initial_bytes, range.granularity())},
        threshold_{options.release_threshold} {
    if (initial_ > maximum_ || initial_ > range_bytes_) {
      throw std::invalid_argument("in_place_growth: initial size " + std::to_string(initial_) +
                                  " B is above the maximum " + std::to_string(std::min(maximum_, range_bytes_)) +
                                  " B");
    }
    range_.claim(claimant);
  }
  ~in_place_growth() { range_.unclaim(); }  // decommits everything the pool held
  in_place_growth(in_place_growth const&) = delete;
  in_place_growth& operator=(in_place_growth const&) = delete;

  /// Commits the initial size and gives it to the core. Call once, right after construction.
  template <typename Owner>
  void start(Core& core, Owner owner) {
    if (initial_ > 0) { extend(core, initial_, owner); }
  }

  /// Makes room in `core` for one block of `bytes` aligned to `alignment`, owned by
  /// `owner`: afterwards the core holds a free block (of `owner` or merged into one) where
  /// such a block fits. Pass the size the core's search is certain to find: for a
  /// segregated-fit core, the request rounded up to its next size class. When there is no
  /// physical memory, or the maximum or the range's end is in the way, releases every free
  /// granule and plans again once; then throws `growth_failure` saying why.
  template <typename Owner>
  void grow(Core& core, std::size_t bytes, std::size_t alignment, Owner owner) {
    std::size_t const slack = alignment > Core::granularity ? alignment : 0;
    if (bytes > range_bytes_ || slack > range_bytes_ - bytes) {
      fail("a block of " + std::to_string(bytes) + " B is larger than " + limit_text());
    }
    ++grows_;
    // The pool ran short, so whatever the last release could not give back is in use by now.
    unreleasable_ = std::min(unreleasable_, core.free_bytes());
    try {
      plan_and_commit(core, bytes, alignment, owner);
      return;
    } catch (std::bad_alloc const&) {
      // Out of memory, maximum or addresses: the pool's free granules may be the answer.
    }
    // A release that failed (a decommit the driver refused) may still have given other
    // holes back: its error ended the grow before, with the room it made unused. So plan
    // again either way, and should that fail too, say why the release failed as well.
    std::string release_failure;
    try {
      release(core);
    } catch (std::logic_error const&) {
      throw;  // a bug's symptom (the core's books, a broken contract): not for a retry to hide
    } catch (std::exception const& e) {
      release_failure = std::string{" (releasing the free granules first failed: "} + e.what() + ")";
    }
    try {
      plan_and_commit(core, bytes, alignment, owner);
    } catch (growth_failure const& e) {
      if (release_failure.empty()) { throw; }
      throw growth_failure(e.message + release_failure, e.committed_bytes);
    } catch (std::bad_alloc const& e) {
      fail("no physical memory for " + std::to_string(bytes) + " B even after releasing every free granule (" +
           std::to_string(range_.committed_bytes()) + " B committed): " + e.what() + release_failure);
    }
  }

  /// Withdraws every whole granule inside a free block of `core` and decommits it.
  /// Returns the bytes given back.
  std::size_t release(Core& core) {
    // Free blocks may still be in use by work queued on the streams that freed them:
    // the core waits for that before their granules are unmapped or handed to another stream.
    core.before_release();
    ++releases_;
    std::exception_ptr first_error;
    std::size_t given_back = stale_holes_ ? decommit_stale_holes(first_error) : 0;
    if (stale_end_ > frontier_) { given_back += decommit_stale_extension(first_error); }
    withdrawn_.clear();
    std::size_t const g = granularity_;
    std::uintptr_t const base = base_;
    auto const whole_granules = [&](std::uintptr_t address, std::size_t size) {
      std::uintptr_t const lo = align_up(address, g);
      std::uintptr_t const hi = align_down(address + size, g);
      return address < base || hi <= lo ? std::pair<std::size_t, std::size_t>{0, 0}
                                        : std::pair<std::size_t, std::size_t>{lo - base, hi - lo};
    };
    // Every hole's record (a node of holes_) and its place in withdrawn_ are made before any
    // range leaves the core, and each moves into holes_ as its range is withdrawn: out of
    // host memory (here, or in the core's withdraw), no range is left withdrawn and
    // unrecorded, neither free nor a hole, its granules committed for good.
    std::map<std::size_t, std::size_t> planned;
    core.for_each_free_block([&](std::uintptr_t address, std::size_t size, auto) {
      if (auto const [offset, length] = whole_granules(address, size); length != 0) { planned.emplace(offset, length); }
    });
    withdrawn_.reserve(planned.size());
    try {
      core.withdraw_free_ranges([&](std::uintptr_t address, std::size_t size, auto owner) {
        auto const [offset, length] = whole_granules(address, size);
        auto const it = length == 0 ? planned.end() : planned.find(offset);
        if (it == planned.end() || it->second != length) { return typename Core::range{0, 0}; }
        holes_.insert(planned.extract(it));  // until its decommit fails (keep_committed)
        hole_bytes_ += length;
        withdrawn_.push_back({offset, length, owner});  // reserved: no allocation
        return typename Core::range{offset + base - address, length};
      });
    } catch (...) {
      first_error = std::current_exception();
      // Only the core's withdraw throws, right after its range was recorded (the last in
      // withdrawn_): that range is free there still.
      if (!withdrawn_.empty()) {
        holes_.erase(withdrawn_.back().offset);
        hole_bytes_ -= withdrawn_.back().length;
        withdrawn_.pop_back();
      }
    }
    // Every hole is tried: stopping at one whose decommit fails left the later ones
    // committed. The first error is reported.
    for (auto const& hole : withdrawn_) {
      std::size_t const committed_before = range_.committed_bytes();
      try {
        given_back += range_.decommit(reinterpret_cast<void*>(base_ + hole.offset), hole.length);
      } catch (...) {
        if (!first_error) { first_error = std::current_exception(); }
        std::size_t const gone = committed_before - std::min(committed_before, range_.committed_bytes());
        if (gone < hole.length) { keep_committed(core, hole, gone); }
      }
    }
    unreleasable_ = core.free_bytes();
    if (first_error) { std::rethrow_exception(first_error); }
    return given_back;
  }

  /// Call after each deallocate: releases when free bytes passed the threshold. O(1) when not.
  void after_deallocate(Core& core) {
    if (past_threshold(core.free_bytes())) { release(core); }
  }
  /// True when `after_deallocate` would release with `free_now` bytes free. O(1).
  [[nodiscard]] bool past_threshold(std::size_t free_now) const noexcept {
    return threshold_ != std::numeric_limits<std::size_t>::max() && free_now > threshold_ &&
           free_now - threshold_ > unreleasable_;
  }

  [[nodiscard]] virtual_range& range() const noexcept { return range_; }
  [[nodiscard]] std::size_t committed_bytes() const noexcept { return range_.committed_bytes(); }
  /// Bytes from the range's base to the end of the pool's chunk (committed or in holes).
  [[nodiscard]] std::size_t frontier_bytes() const noexcept { return frontier_; }
  /// Where growth past the frontier starts: the frontier, or the first of the released
  /// holes just before it. A free block ending there is the one growth extends.
  [[nodiscard]] std::uintptr_t growth_start_address() const noexcept { return base_ + growth_start(); }
  [[nodiscard]] std::size_t hole_bytes() const noexcept { return hole_bytes_; }
  [[nodiscard]] std::size_t hole_count() const noexcept { return holes_.size(); }
  [[nodiscard]] std::size_t maximum_bytes() const noexcept { return maximum_; }
  [[nodiscard]] std::size_t release_threshold() const noexcept { return threshold_; }
  [[nodiscard]] std::size_t grow_count() const noexcept { return grows_; }
  [[nodiscard]] std::size_t release_count() const noexcept { return releases_; }

 private:
  struct hole_run {
    std::size_t start;
    std::size_t bytes;
    std::size_t need = 0;  // best_hole_run: the granules the request commits from its start
  };
  using owner_type = std::remove_cvref_t<decltype(Core::synchronized)>;
  struct withdrawn_range {
    std::size_t offset;
    std::size_t length;
    owner_type owner;  // of the free block it came from
  };

  /// A hole whose decommit failed with granules of it still committed (the driver refused):
  /// range_.committed_bytes() counts them, and as a hole its reuse commits and counts them
  /// again, so the pool ran out below its maximum. It goes back to the core as free memory
  /// of the owner it had, whole (re-committing what the decommit did give back, no more
  /// than this release took off the committed bytes), for a later release to try again.
  /// Should that fail too it stays a hole with granules committed (stale_holes_): its
  /// reuse counts it whole against the maximum, which refuses early but never commits past
  /// it, and the next release decommits it again (decommit_stale_holes).
  void keep_committed(Core& core, withdrawn_range const& hole, std::size_t decommitted) noexcept {
    try {
      if (decommitted != 0) { range_.commit(reinterpret_cast<void*>(base_ + hole.offset), hole.length); }
      if (core.restore(base_ + hole.offset, hole.owner) != 0) {
        holes_.erase(hole.offset);
        hole_bytes_ -= hole.length;
        return;
      }
    } catch (...) {
    }
    stale_holes_ = true;
  }

  /// Some hole may hold committed granules (keep_committed could not make it free memory
  /// again). Left so, they stayed committed for as long as the hole was not reused: no
  /// later release gave them back, even once the driver decommitted again, and a grow that
  /// needed them refused below the maximum. So every release decommits the holes again
  /// until all of them succeed (a granule not committed is skipped: holes lose nothing);
  /// a reuse in between may have moved the committed granules into another hole, which is
  /// why all of them are tried. The first error is reported.
  std::size_t decommit_stale_holes(std::exception_ptr& first_error) {
    std::size_t given_back = 0;
    bool all_decommitted = true;
    for (auto const& [offset, length] : holes_) {
      try {
        given_back += range_.decommit(reinterpret_cast<void*>(base_ + offset), length);
      } catch (...) {
        all_decommitted = false;
        if (!first_error) { first_error = std::current_exception(); }
      }
    }
    stale_holes_ = !all_decommitted;
    return given_back;
  }

  /// Granules past the frontier a grow committed and could not give to the core nor
  /// decommit (stale_end_): no block holds them, so only this gives them back.
  std::size_t decommit_stale_extension(std::exception_ptr& first_error) {
    try {
      std::size_t const given_back = range_.decommit(reinterpret_cast<void*>(base_ + frontier_), stale_end_ - frontier_);
      stale_end_ = 0;
      return given_back;
    } catch (...) {
      if (!first_error) { first_error = std::current_exception(); }
      return 0;
    }
  }

  /// Where the frontier may go: the reserved range, but no further than the core's one
  /// chunk can hold (block_pool: 1 TiB - 256 B, one granule less than simulated_vmm's
  /// default reserve). Past it, growth committed granules and then failed to append them:
  /// the core's invalid_argument escaped, and the granules stayed committed in no block.
  static std::size_t usable_bytes(virtual_range const& range) noexcept {
    std::size_t limit = range.range_bytes();
    if constexpr (requires { Core::max_chunk_size; }) { limit = std::min<std::size_t>(limit, Core::max_chunk_size); }
    return align_down(limit, range.granularity());
  }
  [[nodiscard]] std::string limit_text() const {
    return range_bytes_ < range_.range_bytes()
               ? "the " + std::to_string(range_bytes_) + " B one chunk of the pool can hold (of a reserved range of " +
                     std::to_string(range_.range_bytes()) + " B)"
               : "the reserved range of " + std::to_string(range_bytes_) + " B (raise reserve=)";
  }

  [[noreturn]] void fail(std::string const& why) const {
    throw growth_failure(std::string{"in-place growth: "} + why, range_.committed_bytes());
  }

  [[nodiscard]] std::size_t growth_start() const noexcept {
    if (holes_.empty()) { return frontier_; }
    auto const last = std::prev(holes_.end());
    return last->first + last->second == frontier_ ? hole_run_start(last) : frontier_;
  }

  std::size_t hole_run_start(std::map<std::size_t, std::size_t>::const_iterator last) const {
    std::size_t start = last->first;
    while (last != holes_.begin()) {
      auto const before = std::prev(last);
      if (before->first + before->second != start) { break; }
      start = before->first;
      last = before;
    }
    return start;
  }

  /// The granules a block of `bytes` aligned to `alignment` needs from a stretch of holes
  /// starting at `start`: the padding up to its first aligned address, then the block.
  /// Holes start on granule boundaries, so an alignment dividing the granule needs none
  /// (counting a whole alignment asked a hole one granule larger than the request: a
  /// granule committed for nothing, or, with the range used up, a refusal).
  [[nodiscard]] std::size_t need_at(std::size_t start, std::size_t bytes, std::size_t alignment) const noexcept {
    std::uintptr_t const at = base_ + start;
    return align_up(align_up(at, std::max(alignment, Core::granularity)) - at + bytes, granularity_);
  }

  /// The smallest stretch of adjacent holes holding a block of `bytes` aligned to
  /// `alignment` (lowest address on ties); its `need` is what it must commit.
  [[nodiscard]] std::optional<hole_run> best_hole_run(std::size_t bytes, std::size_t alignment) const {
    std::optional<hole_run> best;
    for (auto it = holes_.begin(); it != holes_.end();) {
      std::size_t const start = it->first;
      std::size_t end = it->first + it->second;
      for (++it; it != holes_.end() && it->first == end; ++it) { end += it->second; }
      std::size_t const need = need_at(start, bytes, alignment);
      if (end - start >= need && (!best || end - start < best->bytes)) { best = hole_run{start, end - start, need}; }
    }
    return best;
  }

  /// One attempt: the smallest stretch of holes that fits, else the frontier (counting the
  /// holes and the free block already at the end). Throws std::bad_alloc-derived errors
  /// and leaves the core and the range as they were.
  template <typename Owner>
  void plan_and_commit(Core& core, std::size_t bytes, std::size_t alignment, Owner owner) {
    auto const run = best_hole_run(bytes, alignment);
    // The device refused the holes' granules (nothing changed): the frontier is tried, as
    // it may need fewer. Refusing there, the grow refused (before and after its release) a
    // request the device had room for.
    std::exception_ptr holes_refused;
    if (run && fits_maximum(run->need)) {
      if (try_reuse_holes(core, *run, owner, holes_refused)) { return; }
    }
    std::size_t const start = growth_start();
    std::uintptr_t block_start = base_ + start;
    Owner grow_owner = owner;
    core.for_each_free_block([&](std::uintptr_t address, std::size_t size, auto block_owner) {
      if (address + size != base_ + start) { return; }
      if (block_owner == Core::synchronized) {
        // Fresh granules have no pending work: they join a synchronized block at the end
        // as synchronized memory, which every stream allocates from. Given to the asker,
        // they did not merge when it was exclusive (a per-thread default stream), so
        // growth added only the bytes the request lacked behind a block it could not
        // use: an arena over simulated_vmm failed its request (tests/arena_vmm.cpp), and
        // the pool synchronized the device to merge them (tests/pool_vmm.cpp).
        block_start = address;
        grow_owner = Core::synchronized;
      } else if (core.merges(block_owner, owner)) {
        block_start = address;
      }
    });
    std::uintptr_t const block_end = align_up(block_start, std::max(alignment, Core::granularity)) + bytes;
    std::size_t const target = align_up(block_end - base_, granularity_);
    bool const inside_holes = start < frontier_ && target < frontier_;
    std::size_t const extension = target > frontier_ ? target - frontier_ : 0;
    // A stretch of holes that fits but would pass the maximum: the frontier can need fewer
    // granules (the free block at the chunk's end holds part of the request), so it is
    // used when it stays under the maximum. Refusing on the holes alone refused a request
    // the frontier had room for. Else the holes are tried, and refused by the maximum.
    bool const frontier_fits = extension <= range_bytes_ - frontier_ &&
                               fits_maximum(inside_holes ? (target > start ? target - start : 0)
                                                         : frontier_ + extension - start);
    if (run && !frontier_fits) {
      if (holes_refused) { std::rethrow_exception(holes_refused); }
      reuse_holes(core, *run, run->need, owner);
      return;
    }
    if (inside_holes) {
      // The request ends inside the holes at the frontier (the free block before them
      // holds the rest): commit them only as far as it reaches, as any stretch of holes.
      // All of them were committed, the rest for nothing (tests/in_place_growth.cpp).
      reuse_holes(core, hole_run{start, frontier_ - start}, target > start ? target - start : 0, grow_owner);
      return;
    }
    if (extension > range_bytes_ - frontier_) {
      fail(limit_text() + " is exhausted at " + std::to_string(frontier_) + " B (" + std::to_string(hole_bytes_) +
           " B of it in released holes too small for " + std::to_string(bytes) + " B)");
    }
    std::size_t const grown = commit_stepped(start, extension);
    try {
      restore_holes(core, start, frontier_, grow_owner);
      append(core, grown, grow_owner);
    } catch (...) {
      // The core refused (out of host memory): what it did not take is decommitted again.
      // Left committed, the extension lay in no block, which no release gave back.
      give_back_holes(start, frontier_);
      try {
        if (grown != 0) { (void)range_.decommit(reinterpret_cast<void*>(base_ + frontier_), grown); }
      } catch (...) {
        stale_end_ = std::max(stale_end_, frontier_ + grown);
      }
      rethrow_core_refusal(frontier_ + grown - start);
    }
  }

  /// reuse_holes, unless the device refuses the granules the holes need (out of physical
  /// memory; nothing changed but the split of the hole the request ends inside): then
  /// false, with its error in `refused`.
  template <typename Owner>
  bool try_reuse_holes(Core& core, hole_run const& run, Owner owner, std::exception_ptr& refused) {
    split_hole_at(core, run.start + run.need);
    try {
      commit_checked(run.start, run.need);
    } catch (growth_failure const&) {
      throw;
    } catch (std::bad_alloc const&) {
      refused = std::current_exception();
      return false;
    }
    reuse_holes(core, run, run.need, owner, /*committed=*/true);
    return true;
  }

  /// Commits the holes from `start` to the frontier and an extension of it by at least
  /// `extension` bytes, raised to the growth step (stepped); returns the extension
  /// committed. The step is a preference: where the device has no room for it, only the
  /// extension is committed (the step refused a request the device had room for).
  std::size_t commit_stepped(std::size_t start, std::size_t extension) {
    std::size_t const grown = stepped(extension, start);
    try {
      commit_checked(start, frontier_ + grown - start);
      return grown;
    } catch (growth_failure const&) {
      throw;
    } catch (std::bad_alloc const&) {
      if (grown == extension) { throw; }
    }
    commit_checked(start, frontier_ + extension - start);
    return extension;
  }

  /// Whether committing `bytes` more (none of them committed yet) stays within the maximum.
  [[nodiscard]] bool fits_maximum(std::size_t bytes) const noexcept {
    std::size_t const committed = range_.committed_bytes();
    return committed <= maximum_ && bytes <= maximum_ - committed;
  }

  /// An extension of the frontier by `extension` bytes (with the holes from `start` to the
  /// frontier committed too), raised to the growth step as far as the range and the maximum
  /// allow: a step past the maximum refused a request whose own granules fitted under it.
  [[nodiscard]] std::size_t stepped(std::size_t extension, std::size_t start) const noexcept {
    if (extension == 0 || extension >= step_) { return extension; }
    std::size_t room = range_bytes_ - frontier_;
    std::size_t const committed = range_.committed_bytes() + (frontier_ - start);
    if (committed <= maximum_) { room = std::min(room, align_down(maximum_ - committed, granularity_)); }
    return std::max(extension, std::min(step_, room));
  }

  /// Commits the first `need` bytes of `run` (unless `committed`: the caller split the
  /// holes and committed them, try_reuse_holes) and gives the holes there to the core. The
  /// hole the request ends inside is cut there first (split_hole_at), so only whole holes
  /// are restored and the rest of it stays a hole. A refused restore left committed
  /// granules in holes: what the core did not take is decommitted again.
  template <typename Owner>
  void reuse_holes(Core& core, hole_run run, std::size_t need, Owner owner, bool committed = false) {
    std::size_t const end = run.start + need;
    if (!committed) {
      split_hole_at(core, end);
      commit_checked(run.start, need);
    }
    try {
      restore_holes(core, run.start, end, owner);
    } catch (...) {
      give_back_holes(run.start, end);
      rethrow_core_refusal(need);
    }
  }

  /// Cuts the hole `end` lies inside (not at its start) in two at `end`, in the core and in
  /// holes_, before anything is committed: a refusal (the core out of host memory, a
  /// growth_failure) changes nothing. The split stays should the grow fail later: two
  /// adjacent holes, which the next grow reuses as one stretch.
  /// Why: a grow restored the whole hole and withdrew its rest again, and the core could
  /// refuse that withdraw. The rest was then free memory in the core with nothing behind
  /// it; committing it there passed the maximum, and with the device refusing that commit
  /// too, a block later allocated there faulted. No order of commit, restore and withdraw
  /// avoids that, as each may refuse; a split before them leaves nothing to withdraw.
  void split_hole_at(Core& core, std::size_t end) {
    auto it = holes_.lower_bound(end);
    if (it == holes_.begin()) { return; }
    --it;
    std::size_t const start = it->first;
    std::size_t const bytes = it->second;
    if (start + bytes <= end) { return; }
    std::map<std::size_t, std::size_t> rest;  // the second part's record, made before the core changes
    rest.emplace(end, start + bytes - end);
    std::size_t split = 0;
    try {
      split = core.split_hole(base_ + start, end - start);
    } catch (std::bad_alloc const& e) {
      fail("the pool's books had no host memory to split the " + std::to_string(bytes) + " B hole at offset " +
           std::to_string(start) + " for a grow (" + e.what() + ")");
    }
    if (split != end - start) {
      throw std::logic_error("in_place_growth: the core split " + std::to_string(split) + " B off the " +
                             std::to_string(bytes) + " B hole at offset " + std::to_string(start) + ", not " +
                             std::to_string(end - start) + " B");
    }
    it->second = end - start;
    holes_.insert(rest.extract(rest.begin()));
  }

  /// Called in a handler for what the core threw while taking `bytes` a grow committed:
  /// out of host memory, says so. As it was, the grow's message blamed the device ("no
  /// physical memory for ...: std::bad_alloc").
  [[noreturn]] void rethrow_core_refusal(std::size_t bytes) const {
    try {
      throw;
    } catch (growth_failure const&) {
      throw;
    } catch (std::bad_alloc const& e) {
      fail("the pool's books had no host memory for the " + std::to_string(bytes) + " B a grow committed (" +
           e.what() + ")");
    }
  }

  /// A grow committed [lo, hi) and then the core refused part of it (out of host memory):
  /// the granules of the holes there that it did not restore are decommitted again, or
  /// left to the next release (stale_holes_) should the driver refuse.
  void give_back_holes(std::size_t lo, std::size_t hi) noexcept {
    for (auto it = holes_.lower_bound(lo); it != holes_.end() && it->first < hi; ++it) {
      try {
        (void)range_.decommit(reinterpret_cast<void*>(base_ + it->first), std::min(hi, it->first + it->second) - it->first);
      } catch (...) {
        stale_holes_ = true;
      }
    }
  }

  /// Gives every hole in [start, end) back to the core (they must be committed by now).
  template <typename Owner>
  void restore_holes(Core& core, std::size_t start, std::size_t end, Owner owner) {
    auto it = holes_.lower_bound(start);
    while (it != holes_.end() && it->first < end) {
      std::size_t const restored = core.restore(base_ + it->first, owner);
      if (restored != it->second) {
        throw std::logic_error("in_place_growth: the core restored " + std::to_string(restored) + " B of the " +
                               std::to_string(it->second) + " B hole at offset " + std::to_string(it->first));
      }
      hole_bytes_ -= it->second;
      it = holes_.erase(it);
    }
  }

  /// Commits [offset, offset + bytes) (all of it uncommitted: holes or past the frontier)
  /// unless that would pass the maximum. Throws out_of_memory (a std::bad_alloc) or
  /// growth_failure; commits nothing then.
  void commit_checked(std::size_t offset, std::size_t bytes) {
    std::size_t const committed = range_.committed_bytes();
    if (committed > maximum_ || bytes > maximum_ - committed) {
      fail("committing " + std::to_string(bytes) + " B more would pass the maximum of " + std::to_string(maximum_) +
           " B (" + std::to_string(committed) + " B committed)");
    }
    range_.commit(reinterpret_cast<void*>(base_ + offset), bytes);
  }

  /// Commits and appends `bytes` at the frontier (the first call adds the chunk).
  template <typename Owner>
  void extend(Core& core, std::size_t bytes, Owner owner) {
    commit_checked(frontier_, bytes);
    append(core, bytes, owner);
  }

  template <typename Owner>
  void append(Core& core, std::size_t bytes, Owner owner) {
    if (bytes == 0) { return; }
    if (!chunk_) {
      chunk_ = core.add_chunk(base_, bytes, owner);
    } else {
      core.extend_chunk(*chunk_, bytes, owner);
    }
    frontier_ += bytes;
  }

  virtual_range& range_;
  std::size_t granularity_;
  std::uintptr_t base_;
  std::size_t range_bytes_;  // usable: see usable_bytes
  std::size_t maximum_;
  std::size_t step_;
  std::size_t initial_;
  std::size_t threshold_;

  std::optional<decltype(std::declval<Core&>().add_chunk(0, 0, {}))> chunk_;
  std::size_t frontier_ = 0;                   // offset of the chunk's end
  std::map<std::size_t, std::size_t> holes_;   // offset -> bytes, one entry per core hole (not merged)
  std::size_t hole_bytes_ = 0;
  bool stale_holes_ = false;                   // some hole may hold committed granules (keep_committed)
  std::size_t stale_end_ = 0;                  // granules past the frontier up to here may be committed
  std::size_t unreleasable_ = 0;               // free bytes the last release left in the core
  std::vector<withdrawn_range> withdrawn_;  // scratch for release
  std::size_t grows_ = 0;
  std::size_t releases_ = 0;
};

}  // namespace mrstack::detail
