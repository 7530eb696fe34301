#pragma once
/// `fixed_size_memory_resource`: blocks of one size, O(1) allocate and free (a pop and a
/// push on a per-stream stack of free blocks), for programs that allocate one size over
/// and over — and as the bins of `binning_memory_resource`.
///
/// Contract:
/// - Every block is `block_size()` bytes (the size asked at construction, rounded up to
///   256) and aligned to `block_alignment()` (the largest power of two dividing the block
///   size, at least 256). A request larger than the block size, or asking for a larger
///   alignment, is a `logic_error` that says so — this resource serves one size only.
/// - Memory comes from the upstream in chunks of `blocks_per_chunk` blocks (the
///   constructor's `blocks_to_preallocate`; the first chunk is taken at construction);
///   past 64 chunks, a chunk is at least 1/8 of the blocks held, so growth stays O(log n)
///   chunks (each growth rebuilds the chunk lookup) with under 1/8 of them held unused.
///   When the upstream refuses, fewer blocks are asked for, down to one; then
///   `out_of_memory` names the request, footprint and free bytes. A chunk above
///   `blocks_per_chunk` that the upstream refuses with a `logic_error` (it serves sizes
///   only up to a bound, as a fixed_size does) is asked for smaller, down to
///   `blocks_per_chunk`, and later growth stays under it. The first chunk is
///   taken on the default stream, which is synchronized once so every stream may use it.
/// - Streams: as the pool (see pool_memory_resource.hpp): a block freed on stream s is
///   reused on s at once; another stream takes over s's free blocks after an event wait,
///   recorded lazily. One stream in use: no CUDA calls.
/// - `release()` returns every chunk to the upstream when no block is in use (blocks of a
///   chunk are not tracked individually, so a partly used resource keeps its chunks).
///   Destruction returns every chunk.
/// - Every free is checked in O(1) (a free bit per block, a page hash from address to
///   chunk): a pointer that is not the start of one of its blocks, a block freed twice,
///   or a size larger than the block is a `logic_error` naming the pointer, the size given
///   and the block size, and changes nothing.
/// - Sizes are bounded so no arithmetic wraps: blocks of at most `max_block_size`, chunks
///   of at most `max_chunk_bytes` (a `logic_error` at construction otherwise).
/// - Threads: used by one thread, the resource is one free list behind one lock (a cache
///   would only add a second lock and batch moves to every call). Once a second thread
///   calls, each thread keeps a small cache of free blocks per resource (up to
///   `thread_cache_blocks()`: 64 blocks or 64 MiB, at least 4) for one stream at a time,
///   so allocations and frees there touch only the thread's own lock; it refills from and
///   spills to the shared free stacks in batches of half its size. A cached block is
///   reused only on the stream it was freed on. Streams the user created are cached too:
///   from the second stream on, a spill during a call that names the stream records one
///   event for its whole batch (uncached, every free recorded one under the shared
///   lock). A cache of a created stream goes back unrecorded only when no call names
///   that stream (the stream may be gone): its thread has made 64 calls in a row on other
///   streams (until then those calls skip the cache), the caches are taken back, or the
///   thread exits; then no other stream takes those blocks until that stream records
///   again (some may have been freed during a graph capture, which a device
///   synchronization does not order after), or growth is refused.
///   Before the resource grows, reports out-of-memory or
///   releases, it takes every thread's cache back; a thread that exits hands its caches
///   back. Frees into a cache are checked like any other.
/// - Thread-safe. Works over any upstream (asks it for 256-byte alignment only).
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include <mrstack/detail/lean_mutex.hpp>
#include <mrstack/detail/fixed_size_blocks.hpp>
#include <mrstack/detail/thread_caches.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class fixed_size_memory_resource final : public memory_resource, private detail::thread_cache_owner {
 public:
  static constexpr std::size_t default_block_size = std::size_t{1} << 20;
  static constexpr std::size_t default_blocks_to_preallocate = 128;
  static constexpr std::size_t max_block_size = std::size_t{1} << 48;
  static constexpr std::size_t max_chunk_bytes = detail::fixed_size_chunks::max_bytes;

  explicit fixed_size_memory_resource(resource_ptr upstream, std::size_t block_size = default_block_size,
                                      std::size_t blocks_to_preallocate = default_blocks_to_preallocate,
                                      std::shared_ptr<detail::stream_sync> stream_sync = nullptr);
  ~fixed_size_memory_resource() override;

  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t block_alignment() const noexcept { return block_alignment_; }
  [[nodiscard]] std::size_t blocks_per_chunk() const noexcept { return blocks_per_chunk_; }
  /// Free blocks held in threads' caches now (takes the lock, then every cache's lock).
  [[nodiscard]] std::size_t cached_blocks() const;
  /// Most free blocks one thread's cache holds (0: no caches).
  [[nodiscard]] std::size_t thread_cache_blocks() const noexcept { return cache_capacity_; }
  /// Bytes held from the upstream (chunks, including any alignment slack).
  [[nodiscard]] std::size_t pool_size() const;
  [[nodiscard]] std::size_t free_bytes() const;
  [[nodiscard]] std::size_t free_blocks() const;
  [[nodiscard]] std::size_t total_blocks() const;
  [[nodiscard]] std::size_t chunk_count() const;
  /// True when `ptr` is the start of one of its blocks that is in use now.
  [[nodiscard]] bool holds_live_block(void const* ptr) const;
  /// Calls f(base, size) for every chunk's usable range (under the lock).
  template <typename F>
  void for_each_chunk(F&& f) const {
    std::lock_guard lock{mutex_};
    for (auto const& c : chunks_) { f(c.first_block, c.blocks * block_size_); }
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  bool do_is_equal(memory_resource const& other) const noexcept override { return this == &other; }
  std::string do_name() const override { return "fixed_size"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
  std::size_t do_free_bytes_held() const noexcept override;
  void do_release() override;
  fragmentation_info do_fragmentation() const override;

  void* grow_and_allocate(std::size_t bytes, detail::stream_ref const& s);
  /// Takes a chunk of up to `blocks` blocks (fewer when the upstream refuses); false when none.
  bool grow(std::size_t blocks, detail::stream_ref const& s, std::string& why, bool at_construction = false);
  /// Records the blocks of the chunk just taken (the last of `chunks_`); when that fails,
  /// the chunk goes back to the upstream before the error goes on.
  void add_chunk_blocks(std::uintptr_t first, std::size_t blocks, detail::stream_ref const& s, bool synchronized);
  /// Blocks the next growth asks for: `blocks_per_chunk_`, or past 64 chunks 1/8 of the total.
  [[nodiscard]] std::size_t next_chunk_blocks() const noexcept;
  [[noreturn]] void reject(std::size_t bytes, std::size_t alignment) const;
  /// A free whose size or alignment no block of this resource has.
  [[noreturn]] void reject_free_shape(void const* ptr, std::size_t bytes, std::size_t alignment) const;
  [[noreturn]] void reject_free(void const* ptr, std::size_t bytes, detail::fixed_size_blocks::free_result why) const;
  void return_all_chunks();
  /// return_all_chunks() for a constructor that fails: an error is reported on stderr.
  void give_back_chunks_quietly() noexcept;
  /// cached_blocks() with mutex_ held (it guards the list of caches).
  [[nodiscard]] std::size_t cached_blocks_locked() const;

  // Thread caches (src/suballoc/fixed_size_memory_resource.cpp says how they stay safe).
  struct thread_cache;
  /// Under the mutex, on the uncached path: turns the caches on once a second thread calls.
  void note_thread() noexcept {
    // The address of a trivial thread_local: one instruction, no guard (this_thread_key
    // is a call). A later thread may reuse an exited one's address, which is right here:
    // threads that never overlap need no caches.
    static thread_local char marker;
    auto const me = reinterpret_cast<std::uintptr_t>(&marker);
    if (first_thread_ == 0) {
      first_thread_ = me;
    } else if (first_thread_ != me && !caching_.load(std::memory_order_relaxed)) {
      caching_.store(true, std::memory_order_relaxed);
    }
  }
  [[nodiscard]] thread_cache* my_cache() const noexcept {
    return static_cast<thread_cache*>(detail::this_thread_cache(ticket_));
  }
  /// Under the mutex, for a call on `s` that missed its thread's cache `c`: true when `c`
  /// holds another created stream's blocks and keeps them (the call then goes to the
  /// shared stacks; see the .cpp).
  bool keeps_other_stream(thread_cache& c, detail::stream_ref const& s) const;
  /// Calls in a row a cache keeps a created stream's blocks for while its thread names
  /// other streams, before it gives them back unrecorded.
  static constexpr std::uint32_t max_cache_bypasses = 64;
  void* refill_and_allocate(std::size_t bytes, detail::stream_ref const& s);
  void spill_and_free(void* ptr, std::size_t bytes, detail::stream_ref const& s);
  /// The calling thread's cache, created when missing; null when it can keep none (exiting,
  /// or no host memory for one).
  thread_cache* cache_for_this_thread();
  /// Moves all but `keep` of `c`'s blocks to the shared stacks; `named`: the stream the
  /// current call names (null: none), the only created stream that may be recorded on.
  void spill(thread_cache& c, std::size_t keep, detail::stream_ref const* named);
  /// Takes the `n` oldest blocks out of `c` (they went to the shared stacks).
  static void drop_oldest(thread_cache& c, std::size_t n) noexcept;
  bool take_back_caches(detail::stream_ref const* named = nullptr);
  void thread_exiting(void* cache) noexcept override;

  struct chunk {
    void* allocation;          // what the upstream returned
    std::size_t allocation_size;
    std::uintptr_t first_block;
    std::size_t blocks;
  };

  resource_ptr upstream_;
  std::size_t block_size_;
  std::size_t block_alignment_;
  std::size_t blocks_per_chunk_;
  mutable detail::lean_mutex mutex_;  // a CAS to lock: see detail/lean_mutex.hpp
  detail::fixed_size_blocks blocks_;
  std::vector<chunk> chunks_;
  std::size_t pool_size_ = 0;
  /// Most blocks a growth asks for: lowered when the upstream refuses a larger chunk with
  /// a logic_error (it serves sizes only up to a bound).
  std::size_t largest_chunk_blocks_ = max_chunk_bytes / block_size_;
  std::size_t cache_capacity_;
  std::atomic<bool> caching_{false};  // a second thread has called: threads use their caches
  std::uintptr_t first_thread_ = 0;   // the first caller's thread key (under mutex_)
  detail::cache_ticket ticket_;
  std::vector<std::unique_ptr<thread_cache>> caches_;  // under mutex_
};

}  // namespace mrstack
