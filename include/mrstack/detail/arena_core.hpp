#pragma once
/// `arena_core`: the CUDA-free engine of `arena_memory_resource`. Thread-safe.
///
/// Memory comes from an upstream (`arena_upstream`) in *chunks*, on demand: the arena's
/// size is a maximum (`max_size`), not what it takes. The chunks form the *global arena*
/// — a `stream_ordered_pool` — which carves them into *superblocks* of `superblock_size`
/// bytes (aligned to 64 KiB) and also serves large requests. When the global arena
/// cannot serve a request it grows by one chunk of max(request, held / `growth_divisor`,
/// `minimum_growth`), capped by `max_size`; wholly free chunks go back to the upstream
/// first (several small chunks become one larger one). When a free leaves the global
/// arena holding more than `max_free_bytes` free, its wholly free chunks go back to the
/// upstream until it holds no more than that (those another thread's stream still owns
/// wait for `release()` or for a later free on a stream that may return them). With
/// `eager`, the whole maximum is taken at construction as one chunk and never returned
/// before destruction (the arena of earlier versions).
///
/// Over a virtual range (`options::grow_in_place_over`: vmm, simulated_vmm) the global
/// arena grows in place instead, as the pool does (detail/in_place_pool_growth.hpp):
/// one chunk at the range's base whose end is extended by exactly the granules a request
/// lacks, so free memory on either side of a growth merges and no chunk's tail is
/// stranded. Past `max_free_bytes` free, and on `release_free_chunks()`, every whole free
/// granule of the global arena is decommitted (after the streams that freed them are
/// synchronized); holes are committed again before the end moves. `max_size` caps what is
/// committed.
///
/// Small requests (<= `max_small_size`, alignment 256)
/// are served by *stream arenas*: each stream gets one (every thread's per-thread
/// default stream is a stream of its own, so threads using them never share an arena),
/// holding superblocks dedicated to one size class each. A small allocation locks only
/// its own arena (uncontended when streams are per thread), takes a superblock with free
/// blocks of its class and pops a block index: O(1).
///
/// Threads sharing one stream (a created stream or the legacy one) would all take that
/// stream's arena lock. Once they contend for it (`shard_after_contentions` times found
/// it taken), the stream gets *thread shards*: one arena per thread shard index
/// (detail/sharded_counters.hpp: distinct among up to 64 live threads, handed on when a
/// thread exits), all on the same stream, the first being the stream's own arena, kept by
/// the thread that created it. A block freed on that stream by any thread goes straight
/// back to the shard it came from (same stream: no synchronization), a batch one shard
/// handed to the depot is another's with no wait, and a block held back during a capture
/// is settled at any thread's next call on the stream (arena_thread_shards.cpp).
///
/// Size classes: 256-byte units, exact up to 1 KiB, then four classes per power of two
/// (at most 25% rounding waste, 44 classes up to 1 MiB).
///
/// Freeing: the superblock of a small block is found in O(1) by address, without a lock:
/// a `page_map` with one page per superblock (superblocks are carved aligned to their
/// size) maps the address to its descriptor over the 64-bit address space; its levels are
/// made when a chunk is first added there and live as long as the arena. When the freeing
/// stream is the
/// superblock's arena's stream, the block goes straight back. Otherwise (another stream)
/// the freeing stream is synchronized first (host wait), so the arena's stream may reuse
/// the block at once — as RMM's arena does. A bitmap per superblock catches double and
/// foreign frees. A large block's free is refused when its address lies in a superblock
/// or starts no live global block of exactly its size; a superblock is mapped before the
/// global lock that carved it is let go, so a stale large pointer whose range became
/// superblocks never frees one, whichever thread frees it.
///
/// A superblock that becomes wholly free stays in its class list when it is the only one
/// there (a class that churns one block does not pay for re-setting it), else it becomes a
/// *spare* of its arena, ready for any class. Spares run up to `spare_limit` — twice
/// `empty_superblocks_kept`, or an eighth of the superblocks the arena owns when that is
/// more — and past it all but `empty_superblocks_kept` go, in one batch, to the *depot*
/// (arena_depot.cpp): a list of batches behind its own short lock, each still carved and
/// mapped, owned by no arena, and tagged with its stream and an event recorded there after
/// the batch's frees (no event while one stream is in use: no CUDA call then). A stream
/// arena that needs superblocks takes a batch of its own stream from the depot with no
/// wait, else another stream's after waiting for its event (a per-thread default stream's
/// batch has none: its taker waits on the legacy barrier, a record on the legacy stream,
/// which follows every blocking stream, made once for all batches handed in before it;
/// a batch that barrier covers needs no call for a stream that already waited on it),
/// up to `spare_limit` (at most 64) in one trip. Only when the depot has nothing
/// it may take does it go to the global arena, for up to 2 × `empty_superblocks_kept`: there each
/// superblock is a block-pool allocation, perhaps after an event wait, under the lock
/// every thread shares. (Sixteen threads growing and shrinking by a thousand superblocks
/// each spent most of their time asleep on that lock; through the depot a batch moves as
/// one list: docs/suballocators.md.) The depot gives everything it holds to the global
/// arena (`drain_depot_locked`) before the global arena grows, before chunks go back past
/// `max_free_bytes` (it holds at most what that bound leaves), and on `release()`; its
/// superblocks count as free memory outside the stream arenas. When the global arena
/// cannot serve a request even by growing, every arena's empty superblocks are reclaimed
/// and the request retried; then the device is synchronized (free memory of other threads'
/// streams becomes usable); only then does it fail.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <mrstack/detail/address_map.hpp>
#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/page_map.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack {
class virtual_range;
}  // namespace mrstack

namespace mrstack::detail {

class in_place_pool_growth;

/// Small-block size classes (sizes in bytes, multiples of 256).
struct arena_size_classes {
  static constexpr unsigned max_classes = 64;
  static unsigned class_of(std::size_t size) noexcept;
  static std::size_t class_size(unsigned cls) noexcept;
};

/// Where the arena's chunks come from (the resource's upstream). Called under the global
/// arena's lock.
class arena_upstream {
 public:
  virtual ~arena_upstream() = default;
  /// `size` bytes (a multiple of 256), 256-byte aligned, usable on `s` at once; 0 when the
  /// upstream has no room (other failures throw).
  virtual std::uintptr_t allocate(std::size_t size, stream_ref const& s) = 0;
  /// Gives a chunk back on `s` (whose work on it is all that may still be pending).
  virtual void deallocate(std::uintptr_t base, std::size_t size, stream_ref const& s) noexcept = 0;
  /// Why growing in place was refused during the current call (on the calling thread), for
  /// the out_of_memory that call may end in.
  virtual void refused(std::string const& /*why*/) const {}
};

class arena_core {
 public:
  struct options {
    std::size_t superblock_size = std::size_t{4} << 20;
    std::size_t max_small_size = std::size_t{1} << 20;
    std::size_t empty_superblocks_kept = 4;  ///< per stream arena, before they go back to the global arena
    std::size_t max_size = std::size_t{1} << 30;  ///< most bytes held from the upstream at once
    bool eager = false;                       ///< take `max_size` at construction, keep it until destruction
    std::size_t max_free_bytes = std::size_t{256} << 20;  ///< free bytes the global arena keeps before chunks go back
    std::size_t growth_divisor = 12;          ///< a chunk is at least held / this
    std::size_t minimum_growth = std::size_t{32} << 20;  ///< a chunk is at least this (capped by `max_size`)
    /// Not null (and not `eager`): grow one chunk in place over this range instead of
    /// taking chunks from the upstream; the range must outlive the core.
    virtual_range* grow_in_place_over = nullptr;
    /// Threads contending for one stream's arena get an arena each on that stream
    /// (thread shards), once they found its lock taken `shard_after_contentions` times
    /// (0: once a second thread calls on the stream).
    bool thread_shards = true;
    std::size_t shard_after_contentions = 256;
  };

  /// Takes its chunks from `upstream` (which must outlive the core); with `opts.eager`,
  /// all of `max_size` at once, here.
  arena_core(arena_upstream& upstream, options const& opts, std::shared_ptr<stream_sync> sync,
             thread_key_fn thread_key = &this_thread_key);
  ~arena_core();
  arena_core(arena_core const&) = delete;
  arena_core& operator=(arena_core const&) = delete;

  /// `size` a multiple of 256. 0 when the arena cannot serve it (after reclaiming and synchronizing).
  std::uintptr_t allocate(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// False (and nothing changes) when `p` is not a live block of this arena of that size
  /// and alignment (a foreign, double, wrong-size or wrong-alignment free).
  bool deallocate(std::uintptr_t p, std::size_t size, std::size_t alignment, stream_ref const& s);
  /// The size (a multiple of 256) of the live block at `p`, or 0: what a refused free
  /// names.
  [[nodiscard]] std::size_t live_size(std::uintptr_t p) const;
  /// The alignment a live block at `p` was handed out with (256 for any below): what a
  /// free refused for its alignment names.
  [[nodiscard]] std::size_t handed_out_alignment(std::uintptr_t p) const;

  [[nodiscard]] bool is_small(std::size_t size, std::size_t alignment) const noexcept {
    return size <= opts_.max_small_size && alignment <= 256;
  }
  /// Returns every stream arena's wholly free superblocks to the global arena; the bytes returned.
  /// `caller`: the stream the current call names (the legacy stream when none).
  std::size_t reclaim(stream_ref const& caller = {});
  /// Called on a thread that exits, for each arena it used last: its own per-thread
  /// stream's arena returns its free superblocks (nobody allocates from it again).
  void thread_exiting(void* arena) noexcept;
  /// Makes all free memory usable by any stream (synchronizing the device if needed).
  bool synchronize_everything();
  /// Adopts the region the resource took at construction for `eager` (synchronized:
  /// usable by every stream); it goes back to the upstream at destruction.
  void add_eager_region(std::uintptr_t base, std::size_t size) {
    std::lock_guard lock{global_mutex_};
    add_chunk(base, size, stream_ref{}, true);
  }
  /// Gives every wholly free chunk back to the upstream (synchronizing the device when
  /// streams that cannot be named here own some); growing in place, every whole free
  /// granule. The bytes returned.
  std::size_t release_free_chunks();
  [[nodiscard]] bool grows_in_place() const noexcept { return in_place_ != nullptr; }

  struct statistics {
    std::size_t held_bytes = 0;               ///< taken from the upstream now
    std::size_t peak_held_bytes = 0;
    std::size_t chunks = 0;
    std::size_t upstream_allocations = 0;     ///< chunks taken so far
    std::size_t upstream_deallocations = 0;   ///< chunks given back so far (not counting destruction)
    std::size_t global_free_bytes = 0;
    std::size_t largest_free_block = 0;       ///< in the global arena
    std::size_t superblocks_in_arenas = 0;
    std::size_t free_bytes_in_arenas = 0;     ///< free small blocks inside arenas' superblocks
    std::size_t stream_arenas = 0;            ///< one per stream, its thread shards not counted
    std::size_t thread_shard_arenas = 0;      ///< arenas of streams' thread shards besides the streams' own
    std::size_t large_live_bytes = 0;
    std::size_t small_live_bytes = 0;         ///< small blocks handed out and not freed (held-back ones not counted)
    std::size_t free_blocks_in_arenas = 0;
    std::size_t global_free_blocks = 0;
    std::size_t largest_free_in_arenas = 0;   ///< the largest small request an arena serves without a superblock more
    struct stream_share {
      stream_ref stream;
      std::size_t free_bytes = 0;
      std::size_t largest_free_block = 0;
      std::size_t free_blocks = 0;
    };
    std::vector<stream_share> streams;        ///< one per stream (its thread shards summed)
  };
  /// No walk over blocks: O(stream arenas x size classes); each lock held briefly, one at a time.
  [[nodiscard]] statistics stats() const;
  [[nodiscard]] options const& opts() const noexcept { return opts_; }
  /// Every structural invariant; empty when all hold. Takes every lock: for tests.
  [[nodiscard]] std::string check_invariants() const;

 private:
  struct stream_arena;
  /// A stream's thread shards: its arenas by thread shard index (null: not made yet).
  struct shard_table {
    std::array<std::atomic<stream_arena*>, counter_shards> arenas{};
  };
  struct superblock {
    std::uintptr_t base = 0;
    // Owner while carved out of the global arena. Atomic: a free reads it before it takes
    // any lock (and a stale or bogus free may race a superblock changing hands).
    std::atomic<stream_arena*> arena{nullptr};
    std::size_t block_size = 0;
    std::uint32_t capacity = 0;
    std::uint32_t free_count = 0;
    std::uint32_t bump = 0;           // blocks [bump, capacity) were never handed out
    unsigned cls = 0;
    std::uint32_t held_back = 0;      // freed inside a graph capture, not yet free (see hold_back)
    bool listed = false;              // in its arena's list for its class
    bool spare = false;               // wholly free, held by its arena for any class
    superblock* prev = nullptr;
    superblock* next = nullptr;
    std::vector<std::uint16_t> free_stack;
    std::vector<std::uint64_t> live_bits;
    // Classes that hold several sizes (above 2 KiB): each live block's size in 256-byte
    // units, so that a free with another size of the same class is refused too. Empty
    // for classes of one size.
    std::vector<std::uint16_t> units;
  };
  struct alignas(64) stream_arena {
    lean_mutex mutex;  // taken on every small call: uncontended when streams are per thread
    stream_ref stream;
    std::array<superblock*, arena_size_classes::max_classes> lists{};  // superblocks with free blocks
    std::size_t empty = 0;             // wholly free superblocks still in a class list
    std::vector<superblock*> spares;   // wholly free superblocks ready for any class
    std::size_t superblocks = 0;
    // Other arenas' blocks this arena's stream freed while it was being captured into a
    // graph: they go back to their arenas at its first call after the capture. Numbered
    // in order (held_back_total counts them), so a settlement takes exactly those held
    // before its synchronization.
    struct held_block {
      superblock* sb;
      std::uint32_t index;
      std::uint64_t number;
    };
    std::vector<held_block> freed_in_capture;
    std::uint64_t held_back_total = 0;
    std::size_t free_bytes = 0;
    std::size_t free_blocks = 0;
    // What its superblocks' blocks cover (capacity x block size): the rest of a superblock
    // is a tail its class cannot use, neither free nor live.
    std::size_t usable_bytes = 0;
    // Its thread exited and it held nothing: out of the key map, kept for the next new
    // stream (create_arena), so a program that runs a thread per task does not pile up
    // arenas that every statistics call and every exhaustion walks.
    bool retired = false;
    // Its thread exited while other threads still held its blocks: no allocation uses it
    // again, so each superblock their frees empty goes back at once (push_block), and the
    // free that empties it retires it (under its lock).
    bool orphaned = false;
    // A hand-back failed for host memory: spares and empty superblocks may exceed their
    // bounds until the next reclaim takes them all (under its lock).
    bool over_bounds = false;
    // Calls from its thread after that thread's exit hook that use it now (late_call;
    // under the registry lock): it is not retired meanwhile.
    std::uint32_t late_calls = 0;
    // Thread shards (arena_thread_shards.cpp), on a line of their own: every thread on a
    // sharded stream reads them at each call, while the creator's calls write the fields
    // above. `family`: the arena the stream's key maps to (this one, or the one whose
    // shard this is); set before the arena is published and never changed, so a free
    // compares families without a lock. `shards`: set once threads contend for this
    // arena (published under its lock, read without).
    alignas(64) stream_arena* family = this;
    std::atomic<shard_table*> shards{nullptr};
    std::unique_ptr<shard_table> shard_storage;  // what `shards` points to
    std::size_t contentions = 0;                 // locks found taken (under the lock)
    std::size_t creator_shard = 0;               // the shard index this arena serves once sharded
    // The depot's legacy barrier this arena's stream waited on covered the per-thread
    // default streams' batches up to this depot_batch::seq (under this arena's lock; 0 when
    // the arena is given to a new stream).
    std::uint64_t barrier_waited = 0;
  };
  struct chunk_record {
    chunk_id id = 0;
    std::size_t size = 0;
    bool candidate = false;  // in `empty_candidates_`: was wholly free when last looked at
  };

  /// allocate and deallocate, for a call that needs no late_call or has made one.
  std::uintptr_t allocate_now(std::size_t size, std::size_t alignment, stream_ref const& s);
  bool deallocate_now(std::uintptr_t p, std::size_t size, std::size_t alignment, stream_ref const& s);
  /// The calling thread's arena on `s`: the stream's own, or its thread shard once it has them.
  stream_arena* arena_for(stream_ref const& s);
  /// The arena `s`'s key maps to (through the thread's cache), not a thread shard; made
  /// when `s` has none, unless `create` is false (then null).
  stream_arena* keyed_arena_for(stream_ref const& s, bool create = true);
  // ---- thread shards (arena_thread_shards.cpp) ----
  /// `a`'s lock was found taken (held now): shards its stream past the threshold.
  void note_contention(stream_arena& a);
  /// Gives `a` (locked by the caller; a created or legacy stream's own arena) its shard
  /// table; false (nothing changed) when there is no host memory for it.
  bool start_thread_shards_locked(stream_arena& a);
  /// The calling thread's shard of `family`'s stream, made when first needed (`family`
  /// itself when there is no host memory to make it).
  stream_arena* thread_shard(stream_arena& family, shard_table& table, stream_ref const& s);
  /// True when threads may shard `a`'s stream (not a per-thread default stream's, not a shard).
  [[nodiscard]] bool may_shard(stream_arena const& a) const noexcept {
    return opts_.thread_shards && !a.stream.thread_bound && a.family == &a;
  }
  /// Settles what `a` holds back for `s` (see settle_held_back); true when a block went
  /// back to an exited thread's arena that then held nothing (see after_orphan_emptied).
  bool settle_arena(stream_arena& a, stream_ref const& s);
  stream_arena* create_arena(stream_ref const& s);
  /// `s`'s arena by key, or null (registry locked here; nothing made).
  stream_arena* find_arena(stream_ref const& s);
  /// `s`'s arena by key, else a retired one or a new one for it (registry locked).
  stream_arena* find_or_create_arena_locked(stream_ref const& s);
  /// A call on the calling thread's default stream after its exit hook ran (from a
  /// thread_local destroyed later): pins that stream's arena for the call (arena_core.cpp).
  class late_call;
  /// The end of the last late call using `a`: retires it, as at its thread's exit, or
  /// leaves it to the frees still due.
  void end_late_call(stream_arena& a) noexcept;
  std::uintptr_t allocate_small(std::size_t size, stream_ref const& s);
  std::uintptr_t allocate_large(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// Takes a superblock from the global arena for `a` (locked by the caller); null when none.
  superblock* acquire_superblock(stream_arena& a, unsigned cls);
  /// Most spares `a` holds before handing the excess back, and most superblocks it takes
  /// in one trip to the global lock: twice `empty_superblocks_kept`, or an eighth of the
  /// superblocks it owns when that is more (none when it keeps none).
  [[nodiscard]] std::size_t spare_limit(stream_arena const& a) const noexcept {
    std::size_t const kept = opts_.empty_superblocks_kept;
    return kept == 0 ? 0 : std::max(2 * kept, a.superblocks / superblocks_per_batch_divisor);
  }
  static constexpr std::size_t superblocks_per_batch_divisor = 8;
  static constexpr std::size_t most_superblocks_per_trip = 64;
  /// Adds `sb` (wholly free, owned by `a`, in no list) to `a`'s spares.
  void make_spare(stream_arena& a, superblock& sb) noexcept;
  /// Unmaps and gives back a superblock taken for `s` but never set up (`global_mutex_` held).
  void release_descriptor_locked(superblock& sb, stream_ref const& s);
  /// Unlinks `sb` (wholly free, owned by `a`, in no list) from `a` and the lookup table.
  void detach_superblock(stream_arena& a, superblock& sb) noexcept;
  /// Gives all but `keep` of `a`'s spares back to the global arena in one lock trip (`a` locked by the caller).
  void surrender_spares(stream_arena& a, std::size_t keep, stream_ref const& caller);
  /// Sets up `sb` (wholly free) for blocks of class `cls`.
  void reclass(stream_arena& a, superblock& sb, unsigned cls);
  std::size_t reclaim_from(stream_arena& a, stream_ref const& caller);
  /// After an exiting thread's arena gave back what it could (registry and `a` locked):
  /// retires it when it holds nothing. False while other threads' frees are still due.
  bool retire_if_empty(stream_arena& a, stream_ref const& caller);
  /// Retires the arenas of exited threads that have since emptied (registry locked).
  void retire_emptied_orphans();
  /// After a free into `a` that left it an orphan holding nothing: retires it now, not
  /// at some other thread's exit (best effort; the free has succeeded).
  void after_orphan_emptied() noexcept;
  /// After memory went back to the global arena: past `max_free_bytes`, free granules
  /// (in place, unless a capture may hold free memory) or wholly free chunks go back.
  void after_global_free(stream_ref const& caller);
  // ---- chunks (arena_growth.cpp); all with `global_mutex_` held ----
  /// From the global arena, growing it when nothing fits; 0 when even growing cannot serve.
  std::uintptr_t global_allocate(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// Frees into the global arena; then, past `max_free_bytes`, wholly free chunks go back.
  std::size_t global_deallocate(std::uintptr_t address, stream_ref const& s,
                                std::size_t expected_size = block_pool::any_size);
  /// Remembers the alignment of a large block `p` handed out aligned above 256 (its free
  /// must name it); on failure the block goes back and the error passes on. Returns `p`.
  std::uintptr_t note_large_alignment(std::uintptr_t p, std::size_t alignment, stream_ref const& s);
  /// Adds one chunk of at least `needed` bytes; false when the maximum or the upstream refuses.
  bool grow(std::size_t needed, stream_ref const& s);
  /// Over a virtual range: extends the one chunk for a block of `size` aligned to
  /// `alignment` on `s`, then allocates it; 0 when growth was refused (told to the upstream's `refused`).
  std::uintptr_t grow_in_place_and_allocate(std::size_t size, std::size_t alignment, stream_ref const& s);
  /// Bytes held from the upstream: committed granules in place, else the chunks' sizes.
  [[nodiscard]] std::size_t held_bytes_locked() const noexcept;
  /// Registers a chunk the upstream handed out (owned by `s`, or synchronized for the eager region).
  void add_chunk(std::uintptr_t base, std::size_t size, stream_ref const& s, bool synchronized);
  /// Notes the chunk holding `address` as possibly wholly free.
  void note_maybe_empty(std::uintptr_t address);
  /// Returns wholly free chunks until the global arena holds at most `keep_free` free
  /// bytes; `may_synchronize`: also those only a device synchronization can return.
  std::size_t return_empty_chunks(std::size_t keep_free, bool may_synchronize, stream_ref const& caller);
  /// At destruction: every chunk goes back, leaked blocks and all.
  void return_all_chunks() noexcept;
  void return_chunk(std::map<std::uintptr_t, chunk_record>::iterator it, stream_ref const& s) noexcept;
  /// The descriptor for the superblock at `address` (recycled when one is free).
  superblock& descriptor_for(std::uintptr_t address);
  static void list_push(stream_arena& a, superblock& sb) noexcept;
  static void list_remove(stream_arena& a, superblock& sb) noexcept;
  std::uintptr_t pop_block(stream_arena& a, superblock& sb, std::size_t size) noexcept;
  void push_block(stream_arena& a, superblock& sb, std::uint32_t index, stream_ref const& caller);
  /// True (and `index` set) when `p` starts a live block of `sb` while `owner` holds it;
  /// the caller holds `owner`'s lock.
  bool live_block(superblock const& sb, stream_arena const* owner, std::uintptr_t p, std::uint32_t& index) const noexcept;
  /// The size a live small block was handed out with: its own where the class holds several.
  static std::size_t small_size(superblock const& sb, std::uint32_t index) noexcept;
  /// A small block of `owner`'s freed on stream `s` while `s` is being captured into a
  /// graph: neither live nor free, kept on `s`'s arena until `s`'s first call after the
  /// capture, or the exit of the thread whose default stream `s` is (the graph's work on
  /// it has not run, and CUDA allows no synchronization of a stream being captured). False for a foreign, double or wrong-size free.
  bool hold_back(superblock& sb, stream_arena* owner, std::uintptr_t p, std::size_t size, stream_ref const& s);
  // ---- the depot (arena_depot.cpp) ----
  /// Wholly free superblocks handed back by one stream arena in one trip, not yet merged
  /// into the global arena. They stay carved and mapped (owned by no arena), linked
  /// through `superblock::next`.
  struct depot_batch {
    stream_ref stream;              // the stream arena's stream: all their frees were on it
    // Recorded on `stream` after those frees; 0: none (one stream in use, or a per-thread
    // default stream: the legacy barrier orders takers after it, see `order_after_batch`).
    stream_sync::handle event = 0;
    superblock* head = nullptr;
    std::size_t count = 0;
    std::uint64_t seq = 0;  // depot_seq_ when it was handed in: batches are in this order
  };
  /// Hands `a`'s spares past `keep` to the depot (`a` locked by the caller). False, with
  /// nothing moved, when they must go to the global arena instead: the depot is full, or
  /// other streams are in use and no event can be recorded on `a`'s stream for them.
  bool surrender_to_depot(stream_arena& a, std::size_t keep, stream_ref const& caller);
  /// Moves up to `want` depot superblocks to `a` (locked by the caller) into `got`, after
  /// making `a`'s stream wait for their frees where another stream made them; the count.
  std::size_t take_from_depot(stream_arena& a, superblock** got, std::size_t want);
  /// Orders `a`'s stream after the frees of another stream's `batch` (depot and `a`
  /// locked); false when it cannot be now (the stream, or a needed legacy record, is in a
  /// graph capture; no event to be had).
  bool order_after_batch(stream_arena& a, depot_batch const& batch);
  /// The index of a per-thread default stream's batch that `a`'s stream already waited
  /// for (through the legacy barrier), among the newest few so covered; npos if none.
  [[nodiscard]] std::size_t covered_batch(stream_arena const& a) const noexcept;
  /// Frees every depot superblock into the global arena for a call naming `caller`
  /// (`global_mutex_` held): before the global arena grows, gives chunks back or reports
  /// exhaustion, none of which can use a superblock that is not its free memory.
  void drain_depot_locked(stream_ref const& caller);
  /// Publishes the global arena's free bytes for the depot's bound (`global_mutex_` held):
  /// after frees and growth, which raise them (allocations since only lower them, so the
  /// depot errs towards the global arena).
  void note_global_free_locked() noexcept {
    global_free_seen_.store(global_.blocks().free_bytes(), std::memory_order_relaxed);
  }
  /// Notes the global arena's free bytes when it goes (`global_mutex_` held meanwhile).
  struct global_free_note {
    arena_core& core;
    explicit global_free_note(arena_core& c) : core{c} {}
    global_free_note(global_free_note const&) = delete;
    global_free_note& operator=(global_free_note const&) = delete;
    ~global_free_note() { core.note_global_free_locked(); }
  };
  /// An event for a depot batch (a spare one when there is one).
  stream_sync::handle depot_event();
  /// Takes `sb` (wholly free, in no list) out of `a`'s accounting; it stays mapped.
  void leave_arena(stream_arena& a, superblock& sb) noexcept;
  /// The depot's superblocks as the free ranges they make once merged (depot locked).
  struct depot_ranges {
    std::size_t count = 0;
    std::size_t largest = 0;
  };
  [[nodiscard]] depot_ranges depot_free_ranges_locked() const;
  /// Depot batches and superblocks agree (every lock held).
  [[nodiscard]] std::string check_depot() const;

  /// At a call naming `s`: when `s` holds blocks back and is no longer captured,
  /// synchronizes it and gives them back to their arenas. One relaxed load otherwise.
  void settle_held_back(stream_ref const& s) {
    if (held_back_streams_.load(std::memory_order_relaxed) != 0) { settle_held_back_slow(s); }
  }
  void settle_held_back_slow(stream_ref const& s);
  /// Held-back blocks agree between superblocks, lists and the count (every lock held).
  [[nodiscard]] std::string check_held_back() const;
  /// One stream arena's lists, spares and counts against its superblocks (`usable`: what
  /// the blocks of the superblocks it owns cover), every lock held.
  [[nodiscard]] std::string check_arena_locked(stream_arena const& a, std::size_t usable) const;

  options opts_;
  arena_upstream& upstream_;
  std::uint64_t id_;                    // unique per arena_core, for the threads' caches
  std::shared_ptr<stream_sync> sync_;
  thread_key_fn thread_key_;

  // Stream arenas whose freed_in_capture is not empty; read on every call, so on a line
  // of its own, away from the contended global lock.
  alignas(64) std::atomic<std::size_t> held_back_streams_{0};
  alignas(64) mutable lean_mutex global_mutex_;  // contended only on superblock batches and large blocks
  stream_ordered_pool global_;
  std::map<std::uintptr_t, chunk_record> chunks_;   // by base
  std::vector<std::uintptr_t> empty_candidates_;    // chunk bases that may be wholly free
  // Live global blocks handed out aligned above 256, by address: the block pool keeps no
  // alignment, and a free naming another one must be refused (resource.hpp's contract).
  std::unordered_map<std::uintptr_t, std::size_t> large_alignments_;
  std::uint64_t emptied_seen_ = 0;                   // global_'s chunks_emptied() when last looked at
  std::unique_ptr<in_place_pool_growth> in_place_;  // over a virtual range, else null
  std::size_t held_ = 0;                             // chunks' bytes (not in place)
  std::size_t peak_held_ = 0;
  std::size_t upstream_allocations_ = 0;
  std::size_t upstream_deallocations_ = 0;
  std::vector<std::unique_ptr<superblock>> descriptors_;  // every descriptor made (freed at destruction)
  std::vector<superblock*> idle_descriptors_;             // not describing a carved superblock now
  // Carved superblocks by address, one page per superblock (they are carved aligned to
  // their size). One entry a superblock keeps the map in cache: with an entry per 64 KiB,
  // random frees over tens of GiB of superblocks missed the cache on the map itself (2.5x
  // the time per free at 1e5 live blocks). The price is alignment: a chunk's first
  // superblock may leave up to a superblock of padding, free in the global arena for
  // large blocks.
  page_map<superblock*> map_;

  // The depot: taken and filled with no block-pool work, so threads that grow and shrink
  // by hundreds of superblocks at once meet only on this short lock (after the global one
  // when both are held).
  alignas(64) mutable lean_mutex depot_mutex_;
  std::vector<depot_batch> depot_;
  std::size_t depot_superblocks_ = 0;
  std::vector<stream_sync::handle> depot_events_;           // spare events
  // Per-thread default streams' batches carry no event: their thread would record one at
  // every hand-in, and with 16 threads those records and the takers' waits (made under
  // this lock) halved the arena's rate. A taker instead waits on the *legacy barrier*, an
  // event recorded on the legacy stream — which follows every blocking stream's earlier
  // work — after every batch up to `legacy_barrier_covers_` was handed in; and a stream
  // that waited on it needs no call for those batches again (stream_arena::barrier_waited).
  std::uint64_t depot_seq_ = 0;
  stream_sync::handle legacy_barrier_ = 0;
  std::uint64_t legacy_barrier_covers_ = 0;
  std::atomic<std::size_t> depot_superblocks_seen_{0};      // depot_superblocks_, read without the lock
  std::atomic<std::size_t> global_free_seen_{0};            // the global arena's free bytes when last looked at
  std::atomic<std::size_t> streams_in_use_{0};              // stream arenas not retired

  mutable std::mutex registry_mutex_;
  std::vector<std::unique_ptr<stream_arena>> arenas_;
  address_map arena_by_key_;
  std::vector<std::uint32_t> retired_arenas_;  // indices into arenas_, reused first
  std::vector<std::uint32_t> orphaned_arenas_;  // exited threads' arenas others still free into
};

}  // namespace mrstack::detail
