#pragma once
/// `fixed_size_blocks`: the CUDA-free core of `fixed_size_memory_resource` — free blocks
/// of one size kept as one LIFO stack of addresses per owning stream (metadata out of
/// band: the memory may be device memory). Allocate and free are a pop and a push: O(1)
/// with no search. Cross-stream reuse follows detail/stream_ordering.hpp: a stream takes
/// over another stream's whole stack after an event wait. Not thread-safe (its owner locks).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <mrstack/detail/stream_ordering.hpp>

namespace mrstack::detail {

class fixed_size_blocks {
 public:
  fixed_size_blocks(std::size_t block_size, std::shared_ptr<stream_sync> sync, thread_key_fn thread_key = &this_thread_key)
      : block_size_{block_size}, owners_{std::move(sync), thread_key} {
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
  void deallocate(std::uintptr_t block, stream_ref const& s) {
    owner_id const o = owner_of(s);
    stacks_[o].push_back(block);
    ++free_;
    owners_.note_free(o, s);
  }
  /// Adds `count` consecutive blocks starting at `base`, owned by `s` (or, with
  /// `synchronized`, usable by every stream: the caller waited for the upstream's work).
  void add_blocks(std::uintptr_t base, std::size_t count, stream_ref const& s, bool synchronized = false) {
    owner_id const o = synchronized ? block_pool::synchronized : owner_of(s);
    auto& stack = stacks_[o];
    stack.reserve(stack.size() + count);
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
  stream_owners owners_;
  std::vector<std::vector<std::uintptr_t>> stacks_;  // per owner; 0 = synchronized
  std::size_t free_ = 0;
  std::size_t total_ = 0;
};

}  // namespace mrstack::detail
