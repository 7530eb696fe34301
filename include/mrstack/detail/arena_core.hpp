#pragma once
/// `arena_core`: the CUDA-free engine of `arena_memory_resource`. Thread-safe.
///
/// One region (the arena) is split into *superblocks* of `superblock_size` bytes, aligned
/// to that size, carved by the *global arena* — a `stream_ordered_pool` over the region
/// that also serves large requests. Small requests (<= `max_small_size`, alignment 256)
/// are served by *stream arenas*: each stream gets one (every thread's per-thread
/// default stream is a stream of its own, so threads using them never share an arena),
/// holding superblocks dedicated to one size class each. A small allocation locks only
/// its own arena (uncontended when streams are per thread), takes a superblock with free
/// blocks of its class and pops a block index: O(1).
///
/// Size classes: 256-byte units, exact up to 1 KiB, then four classes per power of two
/// (at most 25% rounding waste, 44 classes up to 1 MiB).
///
/// Freeing: the superblock of a small block is found in O(1) by address (the region is
/// one range; a table maps superblock index -> descriptor). When the freeing stream is the
/// superblock's arena's stream, the block goes straight back. Otherwise (another stream)
/// the freeing stream is synchronized first (host wait), so the arena's stream may reuse
/// the block at once — as RMM's arena does. A bitmap per superblock catches double and
/// foreign frees.
///
/// A superblock that becomes wholly free stays in its class list when it is the only one
/// there (a class that churns one block does not pay for re-setting it), else it becomes a
/// *spare* of its arena, ready for any class. Spares run up to twice
/// `empty_superblocks_kept`; past that, all but `empty_superblocks_kept` return to the
/// global arena in one trip to its lock, owned by the arena's stream: the global arena's
/// stream ordering then decides when another stream may take it (event wait). Superblocks
/// come from the global arena up to 2 × `empty_superblocks_kept` (at most 32) at a time (one lock trip),
/// the extras kept as spares. Both batches exist because the global lock is what threads
/// share: a thread growing or shrinking by hundreds of superblocks meets the others there
/// once per batch, not once per superblock. When the global arena cannot serve a
/// request, every arena's empty superblocks are reclaimed and the request retried; then
/// the device is synchronized (free memory of other threads' streams becomes usable);
/// only then does it fail.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <mrstack/detail/address_map.hpp>
#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

/// Small-block size classes (sizes in bytes, multiples of 256).
struct arena_size_classes {
  static constexpr unsigned max_classes = 64;
  static unsigned class_of(std::size_t size) noexcept;
  static std::size_t class_size(unsigned cls) noexcept;
};

class arena_core {
 public:
  struct options {
    std::size_t superblock_size = std::size_t{4} << 20;
    std::size_t max_small_size = std::size_t{1} << 20;
    std::size_t empty_superblocks_kept = 4;  ///< per stream arena, before they go back to the global arena
  };

  /// Manages [base, base + size); `base` must be aligned to the superblock size.
  arena_core(std::uintptr_t base, std::size_t size, options const& opts, std::shared_ptr<stream_sync> sync,
             thread_key_fn thread_key = &this_thread_key);
  ~arena_core();
  arena_core(arena_core const&) = delete;
  arena_core& operator=(arena_core const&) = delete;

  /// `size` a multiple of 256. 0 when the arena cannot serve it (after reclaiming and synchronizing).
  std::uintptr_t allocate(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// False when `p` is not a live block of this arena of that size class (a foreign or double free).
  bool deallocate(std::uintptr_t p, std::size_t size, std::size_t alignment, stream_ref const& s);

  [[nodiscard]] bool is_small(std::size_t size, std::size_t alignment) const noexcept {
    return size <= opts_.max_small_size && alignment <= 256;
  }
  /// Returns every stream arena's wholly free superblocks to the global arena; the bytes returned.
  std::size_t reclaim();
  /// Called on a thread that exits, for each arena it used last: its own per-thread
  /// stream's arena returns its free superblocks (nobody allocates from it again).
  void thread_exiting(void* arena) noexcept;
  /// Makes all free memory usable by any stream (synchronizing the device if needed).
  bool synchronize_everything();
  /// The stream to give the region back on (synchronizing when several streams used it).
  stream_ref return_stream();

  struct statistics {
    std::size_t global_free_bytes = 0;
    std::size_t largest_free_block = 0;       ///< in the global arena
    std::size_t superblocks_in_arenas = 0;
    std::size_t free_bytes_in_arenas = 0;     ///< free small blocks inside arenas' superblocks
    std::size_t stream_arenas = 0;
    std::size_t large_live_bytes = 0;
  };
  [[nodiscard]] statistics stats() const;
  [[nodiscard]] options const& opts() const noexcept { return opts_; }
  /// Every structural invariant; empty when all hold. Takes every lock: for tests.
  [[nodiscard]] std::string check_invariants() const;

 private:
  struct stream_arena;
  struct superblock {
    std::uintptr_t base = 0;
    stream_arena* arena = nullptr;    // owner while carved out of the global arena
    std::size_t block_size = 0;
    std::uint32_t capacity = 0;
    std::uint32_t free_count = 0;
    std::uint32_t bump = 0;           // blocks [bump, capacity) were never handed out
    unsigned cls = 0;
    bool listed = false;              // in its arena's list for its class
    bool spare = false;               // wholly free, held by its arena for any class
    superblock* prev = nullptr;
    superblock* next = nullptr;
    std::vector<std::uint16_t> free_stack;
    std::vector<std::uint64_t> live_bits;
  };
  struct alignas(64) stream_arena {
    lean_mutex mutex;  // taken on every small call: uncontended when streams are per thread
    stream_ref stream;
    std::array<superblock*, arena_size_classes::max_classes> lists{};  // superblocks with free blocks
    std::size_t empty = 0;             // wholly free superblocks still in a class list
    std::vector<superblock*> spares;   // wholly free superblocks ready for any class
    std::size_t superblocks = 0;
    std::size_t free_bytes = 0;
  };

  stream_arena* arena_for(stream_ref const& s);
  stream_arena* create_arena(stream_ref const& s);
  std::uintptr_t allocate_small(std::size_t size, stream_ref const& s);
  std::uintptr_t allocate_large(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// Takes a superblock from the global arena for `a` (locked by the caller); null when none.
  superblock* acquire_superblock(stream_arena& a, unsigned cls);
  /// Most spares an arena holds before handing the excess back.
  [[nodiscard]] std::size_t spare_limit() const noexcept { return 2 * opts_.empty_superblocks_kept; }
  /// Adds `sb` (wholly free, owned by `a`, in no list) to `a`'s spares.
  void make_spare(stream_arena& a, superblock& sb) noexcept;
  /// Unlinks `sb` (wholly free, owned by `a`, in no list) from `a` and the lookup table.
  void detach_superblock(stream_arena& a, superblock& sb) noexcept;
  /// Gives all but `keep` of `a`'s spares back to the global arena in one lock trip (`a` locked by the caller).
  void surrender_spares(stream_arena& a, std::size_t keep);
  /// Sets up `sb` (wholly free) for blocks of class `cls`.
  void reclass(stream_arena& a, superblock& sb, unsigned cls);
  std::size_t reclaim_from(stream_arena& a);
  static void list_push(stream_arena& a, superblock& sb) noexcept;
  static void list_remove(stream_arena& a, superblock& sb) noexcept;
  std::uintptr_t pop_block(stream_arena& a, superblock& sb) noexcept;
  void push_block(stream_arena& a, superblock& sb, std::uint32_t index);

  options opts_;
  unsigned shift_;                      // log2(superblock_size)
  std::uintptr_t base_;
  std::size_t size_;
  std::uint64_t id_;                    // unique per arena_core, for the threads' caches
  std::shared_ptr<stream_sync> sync_;
  thread_key_fn thread_key_;

  mutable lean_mutex global_mutex_;  // contended only on superblock batches and large blocks
  stream_ordered_pool global_;
  std::vector<std::unique_ptr<superblock>> descriptors_;     // per superblock slot (created on first use)
  std::unique_ptr<std::atomic<superblock*>[]> table_;        // slot -> carved superblock, or null
  std::size_t slots_;

  mutable std::mutex registry_mutex_;
  std::vector<std::unique_ptr<stream_arena>> arenas_;
  address_map arena_by_key_;
};

}  // namespace mrstack::detail
