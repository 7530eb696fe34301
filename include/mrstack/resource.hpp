#pragma once
/// The one interface every mrstack layer implements: upstreams, suballocators and adaptors.
///
/// Shape: `std::pmr::memory_resource` (public non-virtual functions over private virtual
/// ones) extended with streams and alignment, as RMM does.
///
/// Contract for every implementation:
/// - `allocate(bytes, stream, alignment)` returns memory usable on `stream` at once,
///   aligned to at least `alignment` (a power of two; 256 by default — every resource
///   returns 256-byte aligned memory even when asked for less). It throws
///   `out_of_memory` when the request cannot be met, never returns null for bytes > 0.
///   A request of 0 bytes returns nullptr without reaching the resource.
/// - `deallocate(p, bytes, stream, alignment)` takes `p` back, with the same `bytes` and
///   `alignment` it was allocated with. The memory becomes reusable on `stream` at once;
///   another stream may reuse it only after waiting on work recorded on `stream`
///   (stream-ordered resources handle that themselves). `deallocate(nullptr, ...)` is a
///   no-op. A bad free (a pointer the resource never gave out or already took back, a
///   wrong size or alignment) is a `logic_error` naming the pointer, with nothing changed,
///   from every suballocator, `aligned` and the host and simulated upstreams; `tracking`
///   adds the check above layers that cannot make it (`cuda`) — which is why `deallocate`
///   is not `noexcept` here, unlike RMM's. (fixed_size takes any size up to its block.)
/// - Thread-safe unless the resource's own doc comment says otherwise.
/// - A stack owns its layers: an adaptor or suballocator holds its upstream by
///   `std::shared_ptr`, so a stack is one object with one lifetime.
///
/// Host memory (pinned or pageable) uses this same interface: a pool over pinned host
/// memory is the same algorithm as a pool over device memory, so `kind()` tells where the
/// memory lives instead of a second class hierarchy.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mrstack/detail/align.hpp>
#include <mrstack/error.hpp>
#include <mrstack/stream.hpp>

namespace mrstack {

inline constexpr std::size_t default_alignment = 256;

/// Where a resource's memory lives, and so who may touch it.
enum class memory_kind {
  device,       ///< device memory (cudaMalloc and its kin)
  managed,      ///< unified memory, accessible from host and device
  pinned_host,  ///< page-locked host memory, accessible from the device
  host,         ///< ordinary pageable host memory (the `system` upstream)
  none,         ///< no memory at all: addresses only (the `simulated` upstream)
};
char const* to_string(memory_kind kind) noexcept;

/// How fragmented a stack's free memory is, as the layer that carves it sees it (one
/// suballocator: the topmost one in the stack; adaptors forward the query down).
/// `resource` is empty when no layer of the stack keeps free memory (bare upstreams,
/// `simulated`): then every number is 0. Queries are cheap (no walk over blocks) and
/// hold no lock longer than an allocation does.
struct fragmentation_info {
  /// Free memory that only one stream may use at once (stream-ordered suballocators).
  struct stream_share {
    std::uintptr_t stream = 0;  ///< the stream's handle (0: the legacy default stream)
    bool thread_bound = false;  ///< a per-thread default stream (`stream` is then a thread key)
    std::size_t free_bytes = 0;
    std::size_t largest_free_block = 0;
    std::size_t free_blocks = 0;
  };
  std::string resource;                ///< the layer that answered ("pool", "arena", ...)
  std::size_t held_bytes = 0;          ///< bytes it holds from its upstream (its footprint)
  std::size_t live_bytes = 0;          ///< bytes handed out and not yet freed
  std::size_t free_bytes = 0;          ///< bytes held and free to hand out (any stream)
  // live_bytes + free_bytes <= held_bytes. The rest is held but neither handed out nor free
  // to hand out: the tail of an arena superblock that its size class cannot use, a
  // fixed_size chunk's alignment slack, blocks freed inside a graph capture until it ends.
  std::size_t largest_free_block = 0;  ///< the largest request it could serve without growing
  std::size_t free_blocks = 0;         ///< number of free blocks (runs of free bytes)
  std::vector<stream_share> streams;   ///< free memory per stream, where it is per stream
};

class memory_resource {
 public:
  memory_resource() = default;
  virtual ~memory_resource() = default;
  memory_resource(memory_resource const&) = delete;
  memory_resource& operator=(memory_resource const&) = delete;
  memory_resource(memory_resource&&) = delete;
  memory_resource& operator=(memory_resource&&) = delete;

  [[nodiscard]] void* allocate(std::size_t bytes, stream_view stream = {},
                               std::size_t alignment = default_alignment) {
    if (bytes == 0) { return nullptr; }
    if (!detail::is_pow2(alignment)) { throw_bad_alignment(alignment); }
    void* const ptr = do_allocate(bytes, alignment, stream);
    // A resource says no by throwing; null for bytes > 0 is a broken layer, and the layers
    // above would book it as a block no free can reach.
    if (ptr == nullptr) [[unlikely]] { throw_null_allocation(bytes); }
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes, stream_view stream = {},
                  std::size_t alignment = default_alignment) {
    if (ptr == nullptr) { return; }
    do_deallocate(ptr, bytes, alignment, stream);
  }

  /// True when memory from one may be freed through the other.
  [[nodiscard]] bool is_equal(memory_resource const& other) const noexcept {
    return this == &other || do_is_equal(other);
  }

  /// Short name of this layer as the stack spec writes it ("pool", "cuda", ...).
  [[nodiscard]] std::string name() const { return do_name(); }
  /// The layer below, or nullptr at the bottom of a stack.
  [[nodiscard]] memory_resource* upstream() const noexcept { return do_upstream(); }
  /// Where the memory lives; layers above an upstream report the upstream's kind.
  [[nodiscard]] memory_kind kind() const noexcept { return do_kind(); }
  /// Bytes this layer and those below it hold from the system that are free to hand out
  /// (a pool's free blocks). Counted as free memory by `get_memory_info`-style queries.
  [[nodiscard]] std::size_t free_bytes_held() const noexcept { return do_free_bytes_held(); }
  /// Returns whatever free memory this layer and those below it can give back to the
  /// system (a pool's wholly free chunks). Safe to call at any time.
  void release() { do_release(); }
  /// Fragmentation of the free memory this stack holds (see `fragmentation_info`):
  /// answered by the topmost suballocator; adaptors forward it down.
  [[nodiscard]] fragmentation_info fragmentation() const { return do_fragmentation(); }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) = 0;
  virtual bool do_is_equal(memory_resource const& /*other*/) const noexcept { return false; }

  virtual std::string do_name() const = 0;
  virtual memory_resource* do_upstream() const noexcept { return nullptr; }
  virtual memory_kind do_kind() const noexcept {
    auto const* up = do_upstream();
    return up != nullptr ? up->kind() : memory_kind::device;
  }
  virtual std::size_t do_free_bytes_held() const noexcept {
    auto const* up = do_upstream();
    return up != nullptr ? up->free_bytes_held() : 0;
  }
  virtual void do_release() {
    if (auto* up = do_upstream()) { up->release(); }
  }
  virtual fragmentation_info do_fragmentation() const {
    auto const* up = do_upstream();
    return up != nullptr ? up->fragmentation() : fragmentation_info{};
  }

  [[noreturn]] static void throw_bad_alignment(std::size_t alignment);
  [[noreturn]] void throw_null_allocation(std::size_t bytes) const;
};

using resource_ptr = std::shared_ptr<memory_resource>;

/// The stack below and including `top`, as the spec would write it: "logging > pool > cuda".
std::string describe_stack(memory_resource const& top);

/// The bottom layer of the stack under `top` (the upstream that talks to the system).
memory_resource& bottom_of_stack(memory_resource& top) noexcept;

}  // namespace mrstack
