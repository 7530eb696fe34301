#pragma once
/// `block_pool`: the coalescing core of `pool_memory_resource` (and of the arena's global
/// arena). CUDA-free, not thread-safe (its owner locks), never touches the memory it
/// manages — all metadata lives out of band, so it works for device memory, pinned host
/// memory, or the fake addresses of the `simulated` upstream.
///
/// Model. The pool manages *chunks* (address ranges handed to it with `add_chunk`). Each
/// chunk is cut into *blocks* that tile it exactly, in address order; a block is live
/// (handed out), free, or withdrawn (a hole: the caller took its backing away, see
/// below). Every free block belongs to one *owner* — a small integer the caller maps to a
/// CUDA stream; owner 0 (`synchronized`) means "no pending work anywhere: any stream may
/// use it". `allocate(n, a, o)` only ever hands out blocks owned by `o`: choosing when
/// memory moves between owners (and what synchronization that takes) is the caller's job
/// (`transfer`).
///
/// Structures, all O(1) per operation:
/// - Block nodes live in a paged slab with a free list of its own (no system allocator on
///   the hot path once the slab has grown to the peak block count), addressed by 32-bit
///   index. Each node links its physical neighbours, so merging on free is O(1).
/// - Each owner has a two-level segregated-fit index (TLSF): first-level classes by power
///   of two of the size, each split into 32 linear second-level classes, with one bitmap
///   word per level. Finding a free block that fits is two find-first-set instructions.
///   Each class is a dense array of (node, size) entries, not an intrusive list: adding a
///   block appends to the array and removing one moves the last entry into its place, so
///   neither reads nor writes the (usually cold) nodes of other free blocks — an intrusive
///   doubly linked list touches up to three nodes per insert or removal. Good fit, not just
///   first fit: the request's own class is looked at for its last entries
///   (`exact_class_scan`, sizes read from the array, no node loads) before falling back to
///   the next larger non-empty class (every block there fits; sizes within a class differ
///   by at most 1/32, so the waste of a split is bounded and the remainder stays free).
///   The last entry is the block freed last, which catches a size freed and asked for
///   again.
/// - Live (and withdrawn) blocks are found by address through `block_start_table`, an
///   open-addressing hash table of 8-byte slots: deallocate costs one cache line there,
///   flat in the number of live blocks.
///
/// Merging rule: a freed block merges with a free neighbour when both belong to the same
/// owner or one of them is `synchronized`; the merged block belongs to the non-synchronized
/// owner (it inherits that stream's pending work). Blocks of two different streams never
/// merge: neither may be used by the other stream without a wait. An *exclusive* owner
/// (`set_exclusive`: a stream other streams can only wait for at great cost, such as
/// another thread's per-thread default stream) never absorbs synchronized memory, so
/// that memory stays available to every stream.
///
/// Growth in place (for an expandable virtual-memory upstream):
/// - `add_chunk(base, size, owner)` adds a chunk (one free block).
/// - `extend_chunk(chunk, bytes, owner)` appends `bytes` at the chunk's end; they merge
///   into the free block at its end when the owners allow, else form a new free block.
/// - `withdraw_free_ranges(choose)` visits every free block and lets the caller carve a
///   sub-range out of it (e.g. the whole 2 MiB granules inside it, to unmap them); the
///   range becomes a withdrawn hole that is never handed out and not counted as free.
///   `restore(address, owner)` turns a hole back into free memory (after re-mapping);
///   `split_hole(address, offset)` cuts a hole in two, so that part of it can be restored.
/// - `remove_chunk(chunk)` drops a chunk with no live blocks (free and withdrawn blocks
///   go with it), so the caller can hand the range back to its upstream.
///
/// All sizes and addresses are multiples of `granularity` (256 bytes).
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mrstack/detail/block_start_table.hpp>
#include <mrstack/detail/metadata_memory.hpp>

namespace mrstack::detail {

using owner_id = std::uint16_t;
using chunk_id = std::uint32_t;

class block_pool {
 public:
  static constexpr std::size_t granularity = 256;
  static constexpr owner_id synchronized = 0;
  static constexpr std::uint32_t npos = 0xffffffffU;
  /// How many of the last entries of the request's own size class are looked at for a
  /// better fit before taking the next larger class. They are read from the class's array
  /// (8 entries per cache line), not from the nodes, so looking costs almost nothing.
  static constexpr int exact_class_scan = 4;
  // Nodes live in one flat array in reserved address space (metadata_reservation): a
  // node is one address computation away from its index — no page table to load on every
  // step of a free's chain of cache misses — and never moves as the array grows. Up to
  // 2^28 nodes by default (8 GiB of address space, committed only as used; down to 2^20
  // where the process's address space is limited).
  static constexpr std::size_t max_nodes = std::size_t{1} << 28;
  static constexpr std::size_t min_reserved_nodes = std::size_t{1} << 20;

  /// `max_blocks`: how many blocks (live, free and withdrawn together) the pool may hold;
  /// its node array's address space is reserved for that many up front (rounded up to
  /// 2 MiB; less where the process's address space is limited). Past it, a call that
  /// needs a new block throws std::length_error saying so, and changes nothing. So do
  /// allocate, add_chunk, extend_chunk and each withdrawal when host memory for the
  /// address table or a class array runs out (std::bad_alloc): what a call needs is
  /// taken before anything moves.
  explicit block_pool(std::size_t max_blocks = max_nodes);
  ~block_pool();
  block_pool(block_pool const&) = delete;
  block_pool& operator=(block_pool const&) = delete;

  // ---- chunks ------------------------------------------------------------------------
  /// Adds [base, base + size) as a new chunk, wholly free and owned by `owner`.
  /// `base` and `size` must be multiples of `granularity`, size > 0.
  chunk_id add_chunk(std::uintptr_t base, std::size_t size, owner_id owner);
  /// Makes the room `add_chunk(base, size, owner)` needs (a node, a chunk slot, an entry
  /// in `owner`'s class of `size`), so that it cannot throw as long as nothing else
  /// changes the pool first: a caller that takes a range from elsewhere (a pool's slab)
  /// makes sure of its place before the range leaves its source. Throws std::bad_alloc
  /// (or std::length_error at the node limit) with nothing changed but capacity.
  void reserve_add_chunk(std::size_t size, owner_id owner);
  /// Appends `bytes` (a multiple of `granularity`) at the end of `chunk`, owned by `owner`.
  void extend_chunk(chunk_id chunk, std::size_t bytes, owner_id owner);
  /// Removes a chunk that has no live block. Returns false (and changes nothing) when it
  /// has one. Never runs out of host memory (add_chunk made room for the freed slot): a
  /// caller can take a chunk out once it has made sure of its next home.
  bool remove_chunk(chunk_id chunk);

  struct chunk_info {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::size_t live_blocks = 0;
    std::size_t withdrawn_blocks = 0;
  };
  [[nodiscard]] chunk_info chunk(chunk_id c) const;
  /// The largest chunk (or extended chunk) a pool can manage: 2^32 granules.
  static constexpr std::size_t max_chunk_size = (std::size_t{1} << 32) * 256 - 256;
  /// Calls f(chunk_id, chunk_info) for every chunk.
  template <typename F>
  void for_each_chunk(F&& f) const {
    for (chunk_id c = 0; c < chunks_.size(); ++c) {
      if (chunks_[c].in_use) { f(c, chunk(c)); }
    }
  }
  /// The owners of the free blocks of `c` (each owner once, in address order of first appearance).
  [[nodiscard]] std::vector<owner_id> chunk_owners(chunk_id c) const;

  // ---- allocation --------------------------------------------------------------------
  /// A block of `size` bytes aligned to `alignment` (a power of two >= granularity) from
  /// `owner`'s free blocks; 0 when none fits. `size` must be a multiple of granularity.
  std::uintptr_t allocate(std::size_t size, std::size_t alignment, owner_id owner);
  /// As `allocate`, from a run of neighbouring free blocks of `owner` and `partner`
  /// (which need not merge by the rule below: the caller may use both, e.g. a stream's
  /// own blocks and those it parked). The run is merged into one block of `owner` (the
  /// partner's other blocks stay its own) and the block taken from `owner`. 0 when no
  /// run holds the request. O(the fewer free blocks of the two × run length), none
  /// visited when the two owners' free bytes together fall short.
  std::uintptr_t allocate_across(std::size_t size, std::size_t alignment, owner_id owner, owner_id partner);
  /// True when `allocate(size, alignment, owner)` would succeed. O(1) (may be
  /// conservative for alignments above `granularity`: then it asks for room to align).
  [[nodiscard]] bool can_allocate(std::size_t size, std::size_t alignment, owner_id owner) const;
  /// `deallocate` without a size check.
  static constexpr std::size_t any_size = ~std::size_t{0};
  /// Frees the live block at `address` into `owner`; returns its size. Returns 0 and
  /// changes nothing when no live block starts there (a foreign or double free), or when
  /// `expected_size` is given and is not the block's size (`live_size` tells the caller
  /// what it is): misuse is refused before anything moves. Throws std::bad_alloc, the
  /// block still live and nothing changed, when host memory for its class array runs out.
  std::size_t deallocate(std::uintptr_t address, owner_id owner, std::size_t expected_size = any_size);
  /// Makes the room in `owner`'s books that `deallocate(address, owner)` of the live block
  /// at `address` will need (its index, one entry in the class array of the block it
  /// merges into), so that this free cannot throw as long as nothing else changes the pool
  /// first. Throws std::bad_alloc with nothing changed but capacity. False when no live
  /// block starts there (that free would be refused). For a caller that must not have a
  /// block leave its hands before its free is certain (a pool's slab on its way back
  /// from a thread shard).
  bool reserve_deallocate(std::uintptr_t address, owner_id owner);
  /// Starts loading what `deallocate(address, ...)` reads first (its address-table slot).
  void prefetch_deallocate(std::uintptr_t address) const noexcept { live_.prefetch(address); }
  /// Size of the live block at `address`, or 0.
  [[nodiscard]] std::size_t live_size(std::uintptr_t address) const;

  // ---- owners ------------------------------------------------------------------------
  /// Moves every free block of `from` to `to`, merging with `to`'s (and synchronized)
  /// neighbours. O(free blocks of `from`). Block by block: when host memory for a class
  /// array runs out it throws std::bad_alloc with the blocks moved so far moved and the
  /// rest still `from`'s, every block indexed once (so do the two calls below).
  void transfer(owner_id from, owner_id to);
  /// After the whole device was synchronized: every free block becomes `synchronized`,
  /// merged with every free neighbour.
  void synchronize_all_owners();
  /// The owner of the free block that ends at `end`; none when no free block ends there.
  [[nodiscard]] std::optional<owner_id> owner_of_free_block_ending_at(std::uintptr_t end) const;
  /// Gives the free block that ends at `end` to `to`, merging it with `to`'s (and
  /// synchronized) neighbours; nothing when no free block ends there.
  void transfer_free_block_ending_at(std::uintptr_t end, owner_id to);
  [[nodiscard]] std::size_t free_bytes(owner_id owner) const noexcept;
  [[nodiscard]] std::size_t free_blocks(owner_id owner) const noexcept;
  /// Owners that currently hold free blocks are < owner_limit().
  [[nodiscard]] std::size_t owner_limit() const noexcept { return indexes_.size(); }
  /// Marks `owner` exclusive (see the merging rule above).
  void set_exclusive(owner_id owner, bool exclusive);
  [[nodiscard]] bool exclusive(owner_id owner) const noexcept {
    return owner < exclusive_.size() && exclusive_[owner] != 0;
  }
  /// True when free blocks of `a` and `b` merge as neighbours (the merging rule above).
  [[nodiscard]] bool merges(owner_id a, owner_id b) const noexcept { return a == b || sync_mergeable(a, b); }

  // ---- holes (in-place growth support) -------------------------------------------------
  struct range {
    std::size_t offset = 0;  ///< from the start of the free block
    std::size_t length = 0;  ///< 0: withdraw nothing from this block
  };
  /// For every free block, `choose(address, size, owner)` returns a sub-range to withdraw
  /// (offset and length multiples of granularity, inside the block). Returns the bytes
  /// withdrawn. Withdrawn ranges are holes until `restore`.
  template <typename Choose>
  std::size_t withdraw_free_ranges(Choose&& choose) {
    std::size_t total = 0;
    for (chunk_id c = 0; c < chunks_.size(); ++c) {
      if (!chunks_[c].in_use) { continue; }
      for (std::uint32_t b = chunks_[c].first; b != npos;) {
        block const& node = at(b);
        if (node.state != state_free) {
          b = node.next;
          continue;
        }
        range const r = choose(addr_of(node), size_of(node), owner_id{node.owner});
        if (r.length == 0) {
          b = node.next;
          continue;
        }
        std::uint32_t const hole = withdraw(b, r.offset, r.length);
        total += r.length;
        b = at(hole).next;
      }
    }
    return total;
  }
  /// Turns the hole starting at `address` back into free memory owned by `owner`.
  /// Returns its size, or 0 when no hole starts there.
  std::size_t restore(std::uintptr_t address, owner_id owner);
  /// Cuts the hole starting at `address` in two at `address + offset` (a multiple of
  /// granularity inside it): both stay holes, so a caller that backs only the first part
  /// restores it alone and the rest never becomes free memory. Returns the first part's
  /// size, or 0 when no hole starts there. Takes what it needs (a node, an address-table
  /// slot) before changing anything: throws std::bad_alloc (std::length_error at the node
  /// limit) with nothing changed but capacity.
  std::size_t split_hole(std::uintptr_t address, std::size_t offset);

  // ---- introspection -------------------------------------------------------------------
  [[nodiscard]] std::size_t total_bytes() const noexcept { return total_bytes_; }
  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_bytes_total_; }
  [[nodiscard]] std::size_t live_bytes() const noexcept { return live_bytes_; }
  [[nodiscard]] std::size_t withdrawn_bytes() const noexcept { return withdrawn_bytes_; }
  /// Live blocks: the address table less the holes it also holds (counted as live, a
  /// pool grown in place reported a live block for every hole it had released).
  [[nodiscard]] std::size_t live_blocks() const noexcept { return live_.size() - withdrawn_count_; }
  /// Withdrawn holes.
  [[nodiscard]] std::size_t withdrawn_blocks() const noexcept { return withdrawn_count_; }
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunk_count_; }
  /// How many times a deallocate left a chunk with no live block: a caller that looks for
  /// empty chunks after frees looks only when this moved.
  [[nodiscard]] std::uint64_t chunks_emptied() const noexcept { return chunks_emptied_; }
  /// Free blocks of all owners (O(owners)).
  [[nodiscard]] std::size_t free_block_count() const noexcept {
    std::size_t n = 0;
    for (auto const& idx : indexes_) { n += idx ? idx->count : 0; }
    return n;
  }
  /// The largest free block of any owner (exact; O(owners + blocks in the top class)).
  [[nodiscard]] std::size_t largest_free_block() const noexcept;
  /// The largest free block of `owner`.
  [[nodiscard]] std::size_t largest_free_block(owner_id owner) const noexcept;

  /// Calls f(address, size, owner) for every free block, in address order within each chunk.
  template <typename F>
  void for_each_free_block(F&& f) const {
    for (chunk_id c = 0; c < chunks_.size(); ++c) {
      if (!chunks_[c].in_use) { continue; }
      for (std::uint32_t b = chunks_[c].first; b != npos; b = at(b).next) {
        block const& node = at(b);
        if (node.state == state_free) { f(addr_of(node), size_of(node), owner_id{node.owner}); }
      }
    }
  }

  /// Checks every structural invariant (tiling, links, indexes, accounting, no two
  /// mergeable neighbours); returns an empty string when all hold, else what broke.
  /// O(blocks): for tests.
  [[nodiscard]] std::string check_invariants() const;

 private:
  static constexpr unsigned sl_bits = 5;
  static constexpr unsigned sl_count = 1U << sl_bits;  // 32 second-level classes
  // Sizes count granules in 32 bits, so the largest class is that of 2^32 - 1 units:
  // first level 31 - sl_bits + 1 = 27.
  static constexpr unsigned fl_count = 28;
  static constexpr unsigned class_count = fl_count * sl_count;
  static constexpr std::size_t max_units = 0xffffffffU;
  static constexpr std::uint8_t state_free = 0;
  static constexpr std::uint8_t state_live = 1;
  static constexpr std::uint8_t state_withdrawn = 2;
  static constexpr std::uint8_t state_unused = 3;      // on the node free list

  // 32 bytes, two to a cache line: the hot path touches a handful of nodes per call, so
  // their size is what the per-call cost is made of once they no longer fit in cache.
  // Addresses are the chunk's base plus an offset; sizes count 256-byte granules (a
  // chunk holds at most 2^32 of them: 1 TiB).
  struct block {
    std::uint32_t offset;     // from the chunk's base, in granules
    std::uint32_t units;      // size in granules
    std::uint32_t prev;       // physical neighbours inside the chunk (npos at the ends)
    std::uint32_t next;
    std::uint32_t free_pos;   // position in its class's array (free blocks only)
    std::uint32_t free_class; // that class (free blocks only): removal needs no class_of
    chunk_id chunk;
    std::uint16_t owner;
    std::uint8_t state;
  };
  static_assert(sizeof(block) == 32, "block nodes are meant to be two to a cache line");

  // One free block in a class array: its size is here too, so choosing among a class's
  // blocks reads the array, not the nodes.
  struct free_entry {
    std::uint32_t node;
    std::uint32_t units;
  };

  struct class_index {
    std::uint32_t fl_bitmap = 0;
    std::array<std::uint32_t, fl_count> sl_bitmap{};
    std::array<std::vector<free_entry>, class_count> lists;
    std::size_t bytes = 0;
    std::size_t count = 0;
  };

  struct chunk_record {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::uint32_t first = npos;
    std::uint32_t last = npos;
    std::size_t live_blocks = 0;
    std::size_t withdrawn_blocks = 0;
    bool in_use = false;
  };

  [[nodiscard]] std::uintptr_t addr_of(block const& n) const noexcept {
    return chunks_[n.chunk].base + std::uintptr_t{n.offset} * granularity;
  }
  [[nodiscard]] static std::size_t size_of(block const& n) noexcept { return std::size_t{n.units} * granularity; }
  /// The bytes of the run of free blocks of `owner` and `partner` around `node` (a free
  /// block of one of them), or 0 unless the run holds blocks of both.
  [[nodiscard]] std::size_t run_with(std::uint32_t node, owner_id owner, owner_id partner) const noexcept;
  [[nodiscard]] block& at(std::uint32_t i) noexcept { return static_cast<block*>(node_space_.data())[i]; }
  [[nodiscard]] block const& at(std::uint32_t i) const noexcept {
    return static_cast<block const*>(node_space_.data())[i];
  }
  /// The free block ending at `end`, or npos. O(blocks after it in its chunk).
  [[nodiscard]] std::uint32_t free_block_ending_at(std::uintptr_t end) const noexcept;
  std::uint32_t new_node();
  /// Commits more node space (new_node's rare path). Throws when the reservation is full.
  [[gnu::cold, gnu::noinline]] void grow_node_space();
  void delete_node(std::uint32_t i) noexcept;
  class_index& index_of(owner_id owner);

  // Size classes: two-level segregated fit (first level: the highest set bit; second
  // level: the next sl_bits bits). Here so that the invariant checks share them.
  static unsigned class_of(std::size_t units) noexcept {
    if (units < sl_count) { return static_cast<unsigned>(units); }  // first level 0: one class per unit
    auto const msb = static_cast<unsigned>(63 - std::countl_zero(static_cast<std::uint64_t>(units)));
    unsigned const fl = msb - sl_bits + 1;
    auto const sl = static_cast<unsigned>((units >> (msb - sl_bits)) & (sl_count - 1));
    return fl * sl_count + sl;
  }
  static std::size_t class_floor(unsigned cls) noexcept {
    unsigned const fl = cls / sl_count;
    unsigned const sl = cls % sl_count;
    if (fl == 0) { return sl; }
    return std::size_t{sl_count + sl} << (fl - 1);
  }
  // check_invariants, in parts (src/detail/block_pool_checks.cpp).
  struct invariant_totals {
    std::size_t total = 0, free = 0, live = 0, withdrawn = 0, free_count = 0, keyed = 0, chunks = 0, holes = 0;
  };
  [[nodiscard]] std::string check_chunk(chunk_id c, invariant_totals& t) const;
  [[nodiscard]] std::string check_class_index(std::size_t owner, std::size_t& indexed) const;
  void insert_free(std::uint32_t b, owner_id owner);
  void remove_free(std::uint32_t b) noexcept;
  /// Takes free block b's entry out of its class array (the last entry fills the hole) and
  /// clears the class's bitmap bit when it empties; no accounting.
  void unlink_entry(class_index& idx, std::uint32_t b) noexcept;
  /// The tightest fit for `size` (with `alignment`) among the last `exact_class_scan`
  /// entries of class `cls` (the request's own, or with alignment the class of the size
  /// padded for it), or npos.
  [[nodiscard]] std::uint32_t best_in_class(class_index const& idx, unsigned cls, std::size_t size,
                                            std::size_t alignment) const;
  /// Confirms a `live_` tag match: does node n start at `address`?
  [[nodiscard]] auto starts_at(std::uintptr_t address) const noexcept {
    return [this, address](std::uint32_t n) { return addr_of(at(n)) == address; };
  }
  /// The last entry of the first non-empty class > cls in `idx`, or npos.
  [[nodiscard]] static std::uint32_t first_in_larger_class(class_index const& idx, unsigned cls) noexcept;
  /// Splits b at `offset` bytes into node `u` (fresh from new_node); returns u, the upper
  /// part (same state/owner fields).
  std::uint32_t split(std::uint32_t b, std::size_t offset, std::uint32_t u) noexcept;
  /// Takes [offset, offset + length) of free block b out of its index as a block of its
  /// own (returned; state still free, the caller sets it); what lies before and after
  /// stays free, b's owner's. Throws (length_error at the node limit, bad_alloc) before
  /// changing anything.
  std::uint32_t carve(std::uint32_t b, std::size_t offset, std::size_t length);
  /// `count` (at most 2) new nodes into `out`, all or none.
  void new_nodes(std::array<std::uint32_t, 2>& out, unsigned count);
  /// Room for `extra` more entries in class `cls` of `idx`, so that inserting them cannot
  /// throw: a call that must fail whole makes room before it changes anything.
  void make_room(class_index& idx, unsigned cls, std::size_t extra);
  /// make_room's rare part, out of line so that the hot path stays small.
  [[gnu::cold, gnu::noinline]] static void grow_class_array(std::vector<free_entry>& list, std::size_t extra);
  struct merge_rules;  // which free neighbours a merge takes, and who owns the result
  /// Room in the class array that `coalesce(b, owner, also_mergeable, merge_any)`'s result
  /// will be indexed in (the merge is worked out first, reading only), so that indexing it
  /// cannot throw: callers make it before anything changes.
  void make_room_for_merge(std::uint32_t b, owner_id owner, owner_id also_mergeable, bool merge_any = false);
  /// Freed block b joins its previous free neighbour (`into_prev`; the next one too when
  /// `with_next`) or else its next one, all of one owner, which grows to `units` in place
  /// in its class array (room made by the caller where the class changes).
  void absorb_freed(std::uint32_t b, bool into_prev, bool with_next, std::uint32_t units);
  /// Merges free block b with mergeable free neighbours (b is not in any index); returns
  /// the surviving node and sets its owner.
  /// `merge_any`: every free neighbour is mergeable and the result stays `owner` (used
  /// once the device has been synchronized).
  std::uint32_t coalesce(std::uint32_t b, owner_id owner, owner_id also_mergeable, bool merge_any = false);
  std::uint32_t withdraw(std::uint32_t b, std::size_t offset, std::size_t length);
  /// Sets the size of free block b (indexed, owner unchanged) to `units`, moving its index
  /// entry only when its class changes. The caller has fixed offset and links.
  void resize_free(std::uint32_t b, std::uint32_t units);
  std::uintptr_t take(std::uint32_t b, std::size_t size, std::size_t alignment, owner_id owner);
  /// Two different owners' free blocks may merge: one is synchronized, the other not exclusive.
  [[nodiscard]] bool sync_mergeable(owner_id a, owner_id b) const noexcept {
    return (a == synchronized && !exclusive(b)) || (b == synchronized && !exclusive(a));
  }

  metadata_reservation node_space_;    // the node array
  std::uint32_t node_count_ = 0;       // nodes ever created
  std::vector<std::uint32_t> free_nodes_;  // unused node indices
  std::vector<std::unique_ptr<class_index>> indexes_;
  std::vector<std::uint8_t> exclusive_;  // per owner
  std::vector<chunk_record> chunks_;
  std::vector<chunk_id> free_chunk_slots_;
  block_start_table live_;             // start address -> node, for live and withdrawn blocks
  std::size_t total_bytes_ = 0;
  std::size_t free_bytes_total_ = 0;
  std::size_t live_bytes_ = 0;
  std::size_t withdrawn_bytes_ = 0;
  std::size_t withdrawn_count_ = 0;    // holes: in live_ too, but not live
  std::uint64_t chunks_emptied_ = 0;
  std::size_t chunk_count_ = 0;
};

}  // namespace mrstack::detail
