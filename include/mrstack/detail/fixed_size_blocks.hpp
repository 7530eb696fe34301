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
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <mrstack/detail/address_map.hpp>
#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

/// The chunks of a fixed-size resource and which of their blocks are free: one bit per
/// block, and an O(1) "which chunk holds this address?" through a page hash. Pages are
/// `page_size` bytes (the largest power of two not above a standard chunk), so a standard
/// chunk spans at most three pages and a page meets at most a few chunks: each page keeps
/// up to `slots_per_page` candidate chunks. Chunks smaller than a page (taken when the
/// upstream refused a standard one) can crowd a page beyond that; such a page sends its
/// lookups to an address-ordered map (O(log chunks), only after refusals). Not thread-safe.
class fixed_size_chunks {
 public:
  static constexpr std::uint32_t none = address_map::npos;

  fixed_size_chunks(std::size_t block_size, std::size_t standard_blocks) : block_size_{block_size} {
    std::size_t const standard = standard_blocks > max_bytes / block_size ? max_bytes : standard_blocks * block_size;
    page_shift_ = static_cast<unsigned>(std::bit_width(standard) - 1);
    block_shift_ = std::has_single_bit(block_size) ? static_cast<unsigned>(std::countr_zero(block_size)) : 0;
  }

  /// Registers `blocks` consecutive blocks from `first`, all free. Returns the chunk's id.
  std::uint32_t add(std::uintptr_t first, std::size_t blocks) {
    auto const id = static_cast<std::uint32_t>(chunks_.size());
    chunks_.push_back(chunk{first, blocks, std::vector<std::uint64_t>((blocks + 63) / 64, 0)});
    auto& bits = chunks_.back().free_bits;
    for (std::size_t i = 0; i < blocks; ++i) { bits[i / 64] |= std::uint64_t{1} << (i % 64); }
    by_address_.emplace(first, id);
    std::uintptr_t const last = first + blocks * block_size_ - 1;
    for (std::uintptr_t page = first >> page_shift_; page <= last >> page_shift_; ++page) { index_page(page, id); }
    return id;
  }

  /// Where block `a` is: its chunk and index, or chunk `none` when `a` is not the start
  /// of a block of any chunk.
  struct place {
    std::uint32_t chunk = none;
    std::size_t index = 0;
  };
  [[nodiscard]] place find(std::uintptr_t a) const noexcept {
    std::uintptr_t const page = a >> page_shift_;
    for (std::uintptr_t k = 0; k < slots_per_page; ++k) {
      std::uint32_t const c = pages_.find(page * slots_per_page + k);
      if (c == none) { return place{}; }
      if (c == crowded) { return find_ordered(a); }
      if (place const p = locate(c, a); p.chunk != none) { return p; }
    }
    return place{};
  }

  [[nodiscard]] bool is_free(place p) const noexcept {
    return (chunks_[p.chunk].free_bits[p.index / 64] >> (p.index % 64)) & 1U;
  }
  void set_free(place p, bool free) noexcept {
    std::uint64_t& word = chunks_[p.chunk].free_bits[p.index / 64];
    std::uint64_t const bit = std::uint64_t{1} << (p.index % 64);
    word = free ? (word | bit) : (word & ~bit);
  }
  /// Marks the block at `a` (which must be a free block of ours) in use.
  void mark_used(std::uintptr_t a) noexcept { set_free(find(a), false); }

  [[nodiscard]] std::size_t count() const noexcept { return chunks_.size(); }
  void clear() {
    chunks_.clear();
    by_address_.clear();
    pages_.clear();
  }

  /// Bytes no chunk may reach: sizes and offsets stay far from wrapping.
  static constexpr std::size_t max_bytes = std::size_t{1} << 52;

 private:
  static constexpr std::uintptr_t slots_per_page = 4;
  static constexpr std::uint32_t crowded = none - 1;  // the page met too many chunks

  struct chunk {
    std::uintptr_t first_block;
    std::size_t blocks;
    std::vector<std::uint64_t> free_bits;  // bit i set: block i is free
  };

  void index_page(std::uintptr_t page, std::uint32_t id) {
    for (std::uintptr_t k = 0; k < slots_per_page; ++k) {
      std::uint32_t const c = pages_.find(page * slots_per_page + k);
      if (c == crowded) { return; }
      if (c == none) {
        pages_.insert(page * slots_per_page + k, id);
        return;
      }
    }
    pages_.assign(page * slots_per_page + slots_per_page - 1, crowded);
  }

  [[nodiscard]] place locate(std::uint32_t c, std::uintptr_t a) const noexcept {
    chunk const& ch = chunks_[c];
    if (a < ch.first_block) { return place{}; }
    std::uintptr_t const offset = a - ch.first_block;
    std::size_t index = 0;
    if (block_shift_ != 0) {
      index = offset >> block_shift_;
      if ((offset & (block_size_ - 1)) != 0) { return place{}; }
    } else {
      index = offset / block_size_;
      if (index * block_size_ != offset) { return place{}; }
    }
    return index < ch.blocks ? place{c, index} : place{};
  }

  [[nodiscard]] place find_ordered(std::uintptr_t a) const noexcept {
    auto it = by_address_.upper_bound(a);
    if (it == by_address_.begin()) { return place{}; }
    return locate(std::prev(it)->second, a);
  }

  std::size_t block_size_;
  unsigned page_shift_ = 0;
  unsigned block_shift_ = 0;  // log2(block size) when it is a power of two, else 0
  std::vector<chunk> chunks_;
  address_map pages_;                                 // page * slots_per_page + k -> chunk
  std::map<std::uintptr_t, std::uint32_t> by_address_;  // first block -> chunk
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
    owner_id const o = owner_of(s);
    owners_.note_use(o, s);
    if (!stacks_[o].empty()) { return pop(o); }
    if (!stacks_[block_pool::synchronized].empty()) { return pop(block_pool::synchronized); }
    return take_over(s, o);
  }

  /// What a free found: `freed`, or why it was refused (nothing changed then).
  enum class free_result { freed, foreign, already_free };
  free_result deallocate(std::uintptr_t block, stream_ref const& s) {
    fixed_size_chunks::place const p = chunks_.find(block);
    if (p.chunk == fixed_size_chunks::none) { return free_result::foreign; }
    if (chunks_.is_free(p)) { return free_result::already_free; }
    owner_id const o = owner_of(s);
    stacks_[o].push_back(block);
    chunks_.set_free(p, true);
    ++free_;
    owners_.note_free(o, s);
    return free_result::freed;
  }
  /// Whether `block` is a block of ours, and whether it is free (for error messages).
  [[nodiscard]] free_result state_of(std::uintptr_t block) const noexcept {
    fixed_size_chunks::place const p = chunks_.find(block);
    if (p.chunk == fixed_size_chunks::none) { return free_result::foreign; }
    return chunks_.is_free(p) ? free_result::already_free : free_result::freed;
  }
  /// Adds `count` consecutive blocks starting at `base`, owned by `s` (or, with
  /// `synchronized`, usable by every stream: the caller waited for the upstream's work).
  void add_blocks(std::uintptr_t base, std::size_t count, stream_ref const& s, bool synchronized = false) {
    owner_id const o = synchronized ? block_pool::synchronized : owner_of(s);
    auto& stack = stacks_[o];
    stack.reserve(stack.size() + count);
    chunks_.add(base, count);
    // Pushed in reverse so the lowest address is handed out first.
    for (std::size_t i = count; i-- > 0;) { stack.push_back(base + i * block_size_); }
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
    for (auto& stack : stacks_) { stack.clear(); }
    chunks_.clear();
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
      for (std::uintptr_t b : stacks_[o]) { f(b, static_cast<owner_id>(o)); }
    }
  }

 private:
  owner_id owner_of(stream_ref const& s) {
    owner_id const o = owners_.acquire(s, [this](owner_id x) { return x < stacks_.size() && !stacks_[x].empty(); });
    if (o >= stacks_.size()) { stacks_.resize(std::size_t{o} + 1); }
    return o;
  }
  std::uintptr_t pop(owner_id o) {
    std::uintptr_t const b = stacks_[o].back();
    stacks_[o].pop_back();
    chunks_.mark_used(b);
    --free_;
    return b;
  }
  void move_all(owner_id from, owner_id to) {
    auto& src = stacks_[from];
    auto& dst = stacks_[to];
    dst.insert(dst.end(), src.begin(), src.end());
    src.clear();
  }
  std::uintptr_t take_over(stream_ref const& s, owner_id o) {
    for (std::size_t i = 1; i < stacks_.size(); ++i) {
      auto const t = static_cast<owner_id>(i);
      if (t == o || stacks_[t].empty()) { continue; }
      switch (owners_.hand_over(t, s)) {
        case stream_owners::handover::ready:
          if (owners_.ref(t).thread_bound && !thread_has_exited(owners_.ref(t).key)) {
            return pop(t);  // a live thread's cache: take one block
          }
          move_all(t, o);
          owners_.note_acquired(o, s);
          return pop(o);
        case stream_owners::handover::everything_synchronized:
          for (std::size_t x = 1; x < stacks_.size(); ++x) { move_all(static_cast<owner_id>(x), block_pool::synchronized); }
          return stacks_[block_pool::synchronized].empty() ? 0 : pop(block_pool::synchronized);
      }
    }
    return 0;
  }

  std::size_t block_size_;
  fixed_size_chunks chunks_;
  stream_owners owners_;
  std::vector<std::vector<std::uintptr_t>> stacks_;  // per owner; 0 = synchronized
  std::size_t free_ = 0;
  std::size_t total_ = 0;
};

}  // namespace mrstack::detail
