#pragma once
/// `fixed_size_blocks`: the CUDA-free core of `fixed_size_memory_resource` — free blocks
/// of one size kept as one LIFO stack of addresses per owning stream (metadata out of
/// band: the memory may be device memory). Allocate and free are a pop and a push: O(1)
/// with no search. Cross-stream reuse follows detail/stream_ordering.hpp: a stream takes
/// over another stream's whole stack after an event wait. Not thread-safe (its owner locks).
///
/// Every free is checked in O(1) before it touches a stack (`fixed_size_chunks`): the
/// address must be the start of a block of one of the chunks, and that block must be in
/// use. A foreign pointer, a pointer into the middle of a block, or a second free of the
/// same block is refused with the stacks unchanged — a corrupted free list would hand the
/// same memory out twice.
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

/// A block's in-use flag: `free_state` while it is free (in a stack or a thread cache),
/// `used_state` while handed out. One byte per block, so threads freeing different blocks
/// never write the same memory location. A free exchanges it (one read-modify-write), so
/// of two threads freeing one block at the same instant exactly one passes: with a load
/// and a store both could, and the block was later handed out twice
/// (tests/suballocators_threads_misuse.cpp).
using block_state = std::atomic<std::uint8_t>;
inline constexpr std::uint8_t used_state = 0;
inline constexpr std::uint8_t free_state = 1;

/// An immutable map from address to the state of the block starting there: a page hash
/// whose pages are `2^page_shift` bytes (the largest power of two not above a standard
/// chunk, or the smallest one at least 1/256 of the largest chunk when that is larger), so
/// a chunk spans at most 257 pages and a page meets at most a few chunks as large as it. Each page keeps
/// up to `slots_per_page` candidate chunks; a page that meets more (chunks shrunk after
/// the upstream refused, or standard chunks under pages grown larger) sends lookups to a
/// binary search over all chunks. Built whole and never changed, so threads may read it with no lock while a new
/// one is being built.
class chunk_snapshot {
 public:
  struct chunk_ref {
    std::uintptr_t first_block;
    std::uintptr_t end;  // one past its last block
    block_state* states;
  };
  chunk_snapshot(std::vector<chunk_ref> chunks, std::size_t block_size, unsigned page_shift);

  /// The state of the block starting at `a`, or null when `a` is not the start of a block.
  [[nodiscard]] block_state* find(std::uintptr_t a) const noexcept {
    std::uintptr_t const page = a >> page_shift_;
    for (std::size_t i = home(page);; i = (i + 1) & mask_) {
      slot const& s = slots_[i];
      if (s.page == page) {
        if (s.crowded) { return find_ordered(a); }
        for (std::size_t k = 0; k < s.used; ++k) {
          if (block_state* st = locate(s.chunks[k], a)) { return st; }
        }
        return nullptr;
      }
      if (s.page == empty_page) { return nullptr; }
    }
  }
  [[nodiscard]] std::vector<chunk_ref> const& chunks() const noexcept { return chunks_; }
  /// Slots of the page hash (what the snapshot costs: 64 bytes each).
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }

 private:
  // Two chunks per page inline: one cache line answers most lookups (a page meets at
  // most two standard chunks unless their bases are far apart).
  static constexpr std::size_t slots_per_page = 2;
  static constexpr std::size_t max_pages_per_chunk = 256;
  static constexpr std::uintptr_t empty_page = ~std::uintptr_t{0};
  struct alignas(64) slot {
    std::uintptr_t page = empty_page;
    std::uint32_t used = 0;
    bool crowded = false;
    chunk_ref chunks[slots_per_page] = {};
  };

  [[nodiscard]] std::size_t home(std::uintptr_t page) const noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(page) * 0x9E3779B97F4A7C15ULL) >> hash_shift_);
  }
  [[nodiscard]] block_state* locate(chunk_ref const& c, std::uintptr_t a) const noexcept {
    if (a < c.first_block || a >= c.end) { return nullptr; }
    std::uintptr_t const offset = a - c.first_block;
    std::size_t index = 0;
    if (block_shift_ != 0) {
      index = offset >> block_shift_;
      if ((offset & (block_size_ - 1)) != 0) { return nullptr; }
    } else {
      index = offset / block_size_;
      if (index * block_size_ != offset) { return nullptr; }
    }
    return c.states + index;
  }
  [[nodiscard]] block_state* find_ordered(std::uintptr_t a) const noexcept;
  void index(std::uintptr_t page, chunk_ref const& chunk);

  std::vector<chunk_ref> chunks_;  // address order
  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned hash_shift_ = 0;
  std::size_t block_size_;
  unsigned block_shift_ = 0;  // log2(block size) when it is a power of two, else 0
  unsigned page_shift_;
};

/// The chunks of a fixed-size resource and the state of each block: the O(1) check behind
/// every free. Changed only under its owner's lock (`add`, `clear`), each change
/// publishing a new `chunk_snapshot`; readers with no lock (the thread caches) use
/// `current()`. Replaced snapshots and cleared chunks' states are kept until the owner
/// calls `collect()` after a grace period (every reader that might hold them has finished).
class fixed_size_chunks {
 public:
  fixed_size_chunks(std::size_t block_size, std::size_t standard_blocks);
  ~fixed_size_chunks();
  fixed_size_chunks(fixed_size_chunks const&) = delete;
  fixed_size_chunks& operator=(fixed_size_chunks const&) = delete;

  /// Registers `blocks` consecutive blocks from `first`, all free; returns their states.
  /// Nothing changes when it runs out of host memory.
  block_state* add(std::uintptr_t first, std::size_t blocks);
  /// Forgets every chunk (after the owner returned them all); nothing changes when it
  /// runs out of host memory.
  void clear();
  /// Frees the snapshots and states replaced before the grace period began.
  void collect() noexcept;

  [[nodiscard]] chunk_snapshot const& current() const noexcept { return *current_.load(std::memory_order_acquire); }
  [[nodiscard]] block_state* find(std::uintptr_t a) const noexcept { return current().find(a); }
  [[nodiscard]] std::size_t count() const noexcept { return states_.size(); }

  /// Bytes no chunk may reach: sizes and offsets stay far from wrapping.
  static constexpr std::size_t max_bytes = std::size_t{1} << 52;

 private:
  void publish(std::vector<chunk_snapshot::chunk_ref> chunks);

  std::size_t block_size_;
  unsigned page_shift_;
  std::atomic<chunk_snapshot const*> current_{nullptr};
  std::vector<std::unique_ptr<block_state[]>> states_;
  std::vector<chunk_snapshot const*> retired_;
  std::vector<std::unique_ptr<block_state[]>> retired_states_;
};

/// A free block and where its in-use flag lives (so handing it out needs no lookup).
struct free_block {
  std::uintptr_t address = 0;
  block_state* state = nullptr;
};

class fixed_size_blocks {
 public:
  fixed_size_blocks(std::size_t block_size, std::size_t standard_blocks, std::shared_ptr<stream_sync> sync,
                    thread_key_fn thread_key = &this_thread_key)
      : block_size_{block_size}, chunks_{block_size, standard_blocks}, owners_{std::move(sync), thread_key} {
    stacks_.resize(1);
  }

  /// A free block for stream `s`: its own, then synchronized ones, then a stack taken over
  /// from another stream (with an event wait); 0 when none is free anywhere.
  std::uintptr_t allocate(stream_ref const& s) {
    free_block const b = take(s);
    if (b.state != nullptr) { b.state->store(used_state, std::memory_order_relaxed); }
    return b.address;
  }

  /// What a free found: `freed`, or why it was refused (nothing changed then).
  enum class free_result { freed, foreign, already_free };
  /// Checks a free of `block` and marks it free; `state` is then where its flag lives.
  free_result check_free(std::uintptr_t block, block_state*& state) const noexcept {
    state = chunks_.find(block);
    if (state == nullptr) { return free_result::foreign; }
    if (state->exchange(free_state, std::memory_order_relaxed) == free_state) { return free_result::already_free; }
    return free_result::freed;
  }
  free_result deallocate(std::uintptr_t block, stream_ref const& s) {
    // A refused free must not make `s` a stream in use (its slot would turn on the eager
    // rule for every later free): look before reserving.
    if (free_result const early = state_of(block); early != free_result::freed) { return early; }
    // Room first: once the check has marked the block free, a push that failed for want
    // of host memory would lose it (and its second free be refused as a double free).
    reserve_free(s, 1);
    block_state* state = nullptr;
    free_result const r = check_free(block, state);
    if (r == free_result::freed) { push_free(free_block{block, state}, s); }
    return r;
  }
  /// Puts back a block already marked free (from a thread cache) as freed on `s`.
  /// `named`: the current call names `s`. A created stream it does not name may be gone:
  /// nothing is recorded on it, and no other stream takes its memory until it records
  /// again (stream_owners::mark_spilled_unnamed).
  void push_free(free_block b, stream_ref const& s, bool named = true) { push_free_batch(&b, 1, s, named); }
  /// Puts back `count` blocks already marked free (a thread cache's spill) as freed on
  /// `s`, noted once for all: under the eager rule one record on a created stream covers
  /// the whole batch. Room must have been reserved (`reserve_free`), so only the record
  /// can fail, with every block in the stacks already.
  void push_free_batch(free_block const* b, std::size_t count, stream_ref const& s, bool named = true) {
    if (count == 0) { return; }
    owner_id const o = owner_of(s);
    stacks_[o].insert(stacks_[o].end(), b, b + count);
    free_ += count;
    if (named || !stream_owners::is_created(s)) {
      (void)owners_.note_free(o, s);  // eager rule: never asks to park
    } else {
      owners_.mark_spilled_unnamed(o);
    }
  }
  /// Room for `count` more blocks freed on `s` (and its owner slot), so that as many
  /// `push_free` calls for `s` cannot fail for want of host memory.
  void reserve_free(stream_ref const& s, std::size_t count) {
    auto& stack = stacks_[owner_of(s)];
    if (stack.capacity() - stack.size() < count) { stack.reserve(std::max(stack.size() + count, 2 * stack.capacity())); }
  }
  /// Registers stream `s` (its owner slot), as any call with it would.
  void note_stream(stream_ref const& s) { (void)owner_of(s); }
  /// True once a second stream is in use: created streams record their frees (a cache's
  /// spilled batch at once).
  [[nodiscard]] bool records_eagerly() const noexcept { return owners_.records_eagerly(); }
  /// A free block for `s` that stays marked free (for a thread cache); `address` 0: none.
  /// `batch`: how many blocks the caller is about to take (a cache refilling): from a
  /// live thread's stream that many move over after one wait, not one per wait.
  free_block take(stream_ref const& s, std::size_t batch = 1) {
    owner_id const o = owner_of(s);
    (void)owners_.note_use(o, s);  // eager rule: never asks to park
    if (!stacks_[o].empty()) { return pop(o); }
    if (!stacks_[block_pool::synchronized].empty()) { return pop(block_pool::synchronized); }
    owner_id const from = take_over(s, o, batch);
    return from == no_owner ? free_block{} : pop(from);
  }
  /// Whether `block` is a block of ours, and whether it is free (for error messages).
  [[nodiscard]] free_result state_of(std::uintptr_t block) const noexcept {
    block_state const* state = chunks_.find(block);
    if (state == nullptr) { return free_result::foreign; }
    return state->load(std::memory_order_relaxed) == free_state ? free_result::already_free : free_result::freed;
  }
  [[nodiscard]] fixed_size_chunks& chunks() noexcept { return chunks_; }
  [[nodiscard]] fixed_size_chunks const& chunks() const noexcept { return chunks_; }
  /// Adds `count` consecutive blocks starting at `base`, owned by `s` (or, with
  /// `synchronized`, usable by every stream: the caller waited for the upstream's work).
  void add_blocks(std::uintptr_t base, std::size_t count, stream_ref const& s, bool synchronized = false) {
    owner_id const o = synchronized ? block_pool::synchronized : owner_of(s);
    auto& stack = stacks_[o];
    stack.reserve(stack.size() + count);
    block_state* const states = chunks_.add(base, count);
    // Pushed in reverse so the lowest address is handed out first.
    for (std::size_t i = count; i-- > 0;) { stack.push_back(free_block{base + i * block_size_, states + i}); }
    free_ += count;
    total_ += count;
    if (o != block_pool::synchronized) { owners_.note_acquired(o, s); }
  }
  [[nodiscard]] stream_sync& sync() const noexcept { return owners_.sync(); }
  /// Synchronizes when other streams hold free blocks; then all are synchronized.
  bool synchronize_everything() {
    bool pending = false;
    for (std::size_t o = 1; o < stacks_.size(); ++o) { pending = pending || !stacks_[o].empty(); }
    if (!pending) { return false; }
    owners_.synchronize_all();
    for (std::size_t o = 1; o < stacks_.size(); ++o) { move_all(static_cast<owner_id>(o), block_pool::synchronized); }
    return true;
  }
  /// Forgets every block (after the caller returned all chunks).
  void clear() {
    // The chunks first: when that runs out of host memory, every block is still in the
    // stacks (emptied first, the blocks were counted free with none left to hand out).
    chunks_.clear();
    for (auto& stack : stacks_) { stack.clear(); }
    free_ = 0;
    total_ = 0;
  }
  /// The one stream all free blocks belong to (to return chunks on), synchronizing when
  /// they belong to several or to another thread's default stream.
  stream_ref return_stream() {
    owner_id single = 0;
    std::size_t holders = 0;
    for (std::size_t o = 1; o < stacks_.size(); ++o) {
      if (!stacks_[o].empty()) {
        ++holders;
        single = static_cast<owner_id>(o);
      }
    }
    if (holders == 0) { return stream_ref{}; }
    if (holders == 1 && owners_.nameable_here(single)) { return owners_.ref(single); }
    synchronize_everything();
    return stream_ref{};
  }

  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t free_blocks() const noexcept { return free_; }
  [[nodiscard]] std::size_t total_blocks() const noexcept { return total_; }
  [[nodiscard]] stream_owners const& owners() const noexcept { return owners_; }
  /// Calls f(stream, free blocks) for every stream that holds free blocks of its own (not
  /// the synchronized ones, which every stream may use).
  template <typename F>
  void for_each_stream_share(F&& f) const {
    for (std::size_t o = 1; o < stacks_.size(); ++o) {
      if (!stacks_[o].empty()) { f(owners_.ref(static_cast<owner_id>(o)), stacks_[o].size()); }
    }
  }
  /// Calls f(address, owner) for every free block (tests).
  template <typename F>
  void for_each_free_block(F&& f) const {
    for (std::size_t o = 0; o < stacks_.size(); ++o) {
      for (free_block const& b : stacks_[o]) { f(b.address, static_cast<owner_id>(o)); }
    }
  }

 private:
  owner_id owner_of(stream_ref const& s) {
    owner_id const o = owners_.acquire(
        s, [this](owner_id x) { return x < stacks_.size() && !stacks_[x].empty(); },
        [this] { (void)synchronize_everything(); });
    if (o >= stacks_.size()) { stacks_.resize(std::size_t{o} + 1); }
    return o;
  }
  static constexpr owner_id no_owner = static_cast<owner_id>(~owner_id{0});
  free_block pop(owner_id o) {
    free_block const b = stacks_[o].back();
    stacks_[o].pop_back();
    --free_;
    return b;
  }
  void move_some(owner_id from, owner_id to, std::size_t count) {
    auto& src = stacks_[from];
    auto& dst = stacks_[to];
    std::size_t const n = std::min(count, src.size());
    dst.insert(dst.end(), src.end() - static_cast<std::ptrdiff_t>(n), src.end());
    src.resize(src.size() - n);
  }
  void move_all(owner_id from, owner_id to) {
    auto& src = stacks_[from];
    auto& dst = stacks_[to];
    dst.insert(dst.end(), src.begin(), src.end());
    src.clear();
  }
  /// Makes another stream's free blocks usable by `s`; returns the owner to pop from.
  owner_id take_over(stream_ref const& s, owner_id o, std::size_t batch) {
    for (std::size_t i = 1; i < stacks_.size(); ++i) {
      auto const t = static_cast<owner_id>(i);
      if (t == o || stacks_[t].empty()) { continue; }
      switch (owners_.hand_over(t, s)) {
        case stream_owners::handover::ready:
          if (owners_.ref(t).thread_bound && !thread_has_exited(owners_.ref(t).key)) {
            // A live thread's stream: only what the caller is about to take (all of it
            // would leave that thread nothing, and the two would pass blocks back and forth).
            move_some(t, o, batch);
          } else {
            move_all(t, o);
          }
          owners_.note_acquired(o, s);
          return o;
        case stream_owners::handover::everything_synchronized:
          for (std::size_t x = 1; x < stacks_.size(); ++x) { move_all(static_cast<owner_id>(x), block_pool::synchronized); }
          return stacks_[block_pool::synchronized].empty() ? no_owner : block_pool::synchronized;
        case stream_owners::handover::not_now:  // the on-demand rule only
          break;
      }
    }
    return no_owner;
  }

  std::size_t block_size_;
  fixed_size_chunks chunks_;
  stream_owners owners_;
  std::vector<std::vector<free_block>> stacks_;  // per owner; 0 = synchronized
  std::size_t free_ = 0;
  std::size_t total_ = 0;
};

}  // namespace mrstack::detail
