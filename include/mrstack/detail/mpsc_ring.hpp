#pragma once
/// `mpsc_ring<T>`: a bounded multi-producer, single-consumer queue of trivially copyable
/// records. CUDA-free. Nothing in the library uses it now: the asynchronous logging
/// adaptor, which did, keeps one single-producer ring per thread instead (a shared claim
/// counter was written by every logging thread on every call;
/// src/adaptor/logging_resource_adaptor.cpp).
///
/// Shape (after Dmitry Vyukov's bounded queue, with a wait-free claim): each cell carries
/// a sequence number. A producer claims ticket `t` with one `fetch_add`, waits until cell
/// `t % capacity` is free for that ticket (only when the ring is full: back-pressure, so
/// no record is ever dropped), writes the record and publishes it by storing `t + 1` into
/// the cell's sequence. The consumer reads cells strictly in ticket order, so the
/// sequence of records it sees is the order in which tickets were claimed — a total
/// order consistent with each producer's program order. Producers never take a lock, make
/// a system call or allocate. `push` returns the ticket so the owner can, for example,
/// wake the consumer every so many records.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <mrstack/detail/align.hpp>

namespace mrstack::detail {

template <typename T>
class mpsc_ring {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  /// `capacity` must be a power of two (at least 2).
  explicit mpsc_ring(std::size_t capacity) : cells_{new cell[checked(capacity)]}, mask_{capacity - 1} {
    for (std::size_t i = 0; i < capacity; ++i) { cells_[i].sequence.store(i, std::memory_order_relaxed); }
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return mask_ + 1; }

  /// Appends `value`; waits (spinning, then yielding, then calling `stalled()`) while the
  /// ring is full. Returns the ticket the record got.
  template <typename Stalled>
  std::size_t push(T const& value, Stalled&& stalled) noexcept {
    std::size_t const ticket = enqueue_pos_.fetch_add(1, std::memory_order_relaxed);
    cell& c = cells_[ticket & mask_];
    for (unsigned spins = 0; c.sequence.load(std::memory_order_acquire) != ticket; ++spins) {
      // Full: the consumer has not yet read the record a lap ago. Tell the owner (so it
      // can wake the consumer) now and then, and give the core away meanwhile.
      if ((spins & 63U) == 63U) { stalled(); }
      std::this_thread::yield();
    }
    c.value = value;
    c.sequence.store(ticket + 1, std::memory_order_release);
    return ticket;
  }

  /// Consumer only: takes the next record in ticket order, or returns false when it has
  /// not been published yet (the ring is empty, or its producer is mid-write).
  bool try_pop(T& out) noexcept {
    cell& c = cells_[dequeue_pos_ & mask_];
    if (c.sequence.load(std::memory_order_acquire) != dequeue_pos_ + 1) { return false; }
    out = c.value;
    c.sequence.store(dequeue_pos_ + mask_ + 1, std::memory_order_release);  // free for the next lap
    ++dequeue_pos_;
    return true;
  }

  /// Consumer only: whether the next record in ticket order is published.
  [[nodiscard]] bool has_next() const noexcept {
    return cells_[dequeue_pos_ & mask_].sequence.load(std::memory_order_acquire) == dequeue_pos_ + 1;
  }

  /// Tickets claimed so far (records pushed or being pushed).
  [[nodiscard]] std::size_t claimed() const noexcept { return enqueue_pos_.load(std::memory_order_acquire); }
  /// Consumer only: records taken so far.
  [[nodiscard]] std::size_t popped() const noexcept { return dequeue_pos_; }

 private:
  // One cache line per cell, so producers writing neighbouring cells do not contend.
  struct alignas(64) cell {
    std::atomic<std::size_t> sequence{0};
    T value{};
  };

  static std::size_t checked(std::size_t capacity) {
    if (!is_pow2(capacity) || capacity < 2) {
      throw std::invalid_argument("mpsc_ring: capacity must be a power of two >= 2");
    }
    return capacity;
  }

  std::unique_ptr<cell[]> cells_;
  std::size_t mask_;
  alignas(64) std::atomic<std::size_t> enqueue_pos_{0};
  alignas(64) std::size_t dequeue_pos_{0};
};

}  // namespace mrstack::detail
