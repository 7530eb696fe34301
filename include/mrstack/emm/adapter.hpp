#pragma once
/// `emm::adapter`: the top of any stack as Numba's External Memory Management (EMM) plugin
/// interface sees it, in C++ terms. The C ABI (c_api.h) and the Python module
/// `mrstack.numba` are thin shells over it.
///
/// | Numba calls          | adapter does                                                    |
/// |----------------------|-----------------------------------------------------------------|
/// | `memalloc(size)`     | allocates from the stack; returns a `memory_pointer` whose      |
/// |                      | `token` is the finalizer's key: `free(token)` returns the memory |
/// |                      | exactly once                                                    |
/// | `get_memory_info()`  | (free, total), counting memory the stack holds free as free      |
/// | `get_ipc_handle(p)`  | the CUDA IPC handle of the upstream allocation containing `p`,   |
/// |                      | plus the offset of `p` in it                                    |
/// | `reset()`            | frees everything outstanding; stale tokens become no-ops; the    |
/// |                      | adapter stays usable                                            |
/// | `defer_cleanup()`    | a guard: frees wait until the outermost guard ends              |
/// | `initialize()`       | idempotent                                                      |
/// | `interface_version`  | 1                                                               |
///
/// Contract:
/// - Tokens are unique ids, never addresses: an address is handed out again after a free or
///   a reset, a token is not (the low 32 bits name a slot, the high 32 bits that slot's
///   generation, which changes on every use and on reset; a stale token could only match
///   again after 2^32 reuses of one slot while its old finalizer is still pending). Token 0
///   is never issued. Each adapter starts its generations elsewhere (spread over the 32
///   bits), so another adapter's token names none of this one's allocations (`issued`)
///   until one slot has been reused about 2^32 / (adapters made) times.
/// - `free(token)` is the finalizer: the first call for a live token takes the allocation
///   out of the table and returns the memory to the stack (or queues it while a cleanup
///   guard is active); any later call, and any call after a `reset()` made the token stale,
///   does nothing and returns an empty optional.
/// - `reset()` takes every outstanding allocation out of the table and frees it, and empties
///   the queue of deferred frees — unless a cleanup guard is active, in which case those
///   frees wait for the outermost guard like any other (Numba's own manager behaves the
///   same way). It then asks the stack to `release()` what it holds free, because Numba
///   resets the CUDA context right after resetting its memory manager.
/// - Memory is freed on the stream given in `options` (the legacy default stream unless told
///   otherwise): Numba does not say which stream a buffer was last used on.
/// - Thread-safe: one mutex guards the token table and the deferred-free queue; the stack's
///   own allocate/deallocate run outside it.
/// - `get_ipc_handle` shares device memory two ways. From cudaMalloc (a stack over
///   `cuda`): the legacy CUDA IPC handle of the base allocation, found with the driver's
///   cuMemGetAddressRange (reached through cudaGetDriverEntryPointByVersion: mrstack links
///   only the static CUDA runtime, never libcuda), and the pointer's offset in it. From a
///   `vmm` layer: a vmm IPC handle (upstream/vmm_ipc.hpp) of exactly [ptr, ptr + size) in
///   the same 64 bytes, `vmm` set, `base` = ptr and offset 0; it needs the block's `size`
///   and a vmm made with ipc=fd or ipc=fabric. Memory from a stream-ordered (`cuda_async`)
///   upstream, and host or managed memory, cannot be shared: it throws a `logic_error`
///   saying so.
/// - Sleep: while the stack's vmm layer is asleep (upstream/virtual_range.hpp), `memalloc`
///   throws a `logic_error` (its memory has no physical backing until wake); `free` works.
/// - Nothing here touches CUDA except `get_memory_info` on a device stack and
///   `get_ipc_handle`, so the adapter is tested on a CPU over a `system` upstream.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <mrstack/resource.hpp>
#include <mrstack/stream.hpp>

namespace mrstack {
class virtual_range_resource;
}

namespace mrstack::emm {

/// The version of Numba's EMM plugin interface this adapter implements.
inline constexpr int supported_interface_version = 1;

/// One allocation handed out by `memalloc`.
struct memory_pointer {
  void* ptr = nullptr;       ///< device pointer (nullptr for a 0-byte request)
  std::size_t size = 0;      ///< bytes asked
  int device = 0;            ///< the device ordinal the adapter serves
  std::uint64_t token = 0;   ///< the finalizer's key; never 0
  std::uint32_t tag = 0;     ///< the caller's tag (the C ABI stores the client here)
};

/// Free and total bytes, as Numba's `MemoryInfo`.
struct memory_info {
  std::size_t free = 0;
  std::size_t total = 0;
};

/// A CUDA IPC handle for the upstream allocation containing a pointer.
struct ipc_handle {
  cudaIpcMemHandle_t handle{};  ///< of the base allocation
  void* base = nullptr;         ///< start of the base allocation
  std::size_t base_size = 0;    ///< its size
  std::size_t offset = 0;       ///< the pointer's offset from `base`
  int device = 0;
  bool vmm = false;             ///< `handle` holds a vmm IPC handle (vmm_ipc::open opens it)
};

/// A CUDA driver call failed (the driver API reports CUresult, not cudaError_t).
class driver_error : public std::runtime_error {
 public:
  driver_error(std::string const& message, int code) : std::runtime_error{message}, code_{code} {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

class adapter {
 public:
  struct options {
    int device = 0;          ///< the device ordinal this adapter serves (reported, and used for memory info)
    stream_view stream{};    ///< the stream allocations and frees are ordered on
    /// Where (free, total) come from before the stack's held-free bytes are added. Null:
    /// cudaMemGetInfo for device and managed stacks; over a `simulated` or `simulated_vmm`
    /// bottom, its capacity and what it has not handed out (the device it plays); the
    /// host's physical memory otherwise.
    memory_info (*query_memory)(int device, memory_kind kind) = nullptr;
    /// Called with `on_issued_context`, under the adapter's lock, as each allocation enters
    /// the token table: books kept beside the adapter (the C ABI's per-client counts) add it
    /// there, before any `reset()` can take it out and have them subtract it. Counted after
    /// `memalloc` returned, a reset on another thread in between subtracted bytes not yet
    /// added, and the counts wrapped past zero. Must not throw or call into the adapter.
    void (*on_issued)(void* context, std::uint32_t tag, std::size_t size) noexcept = nullptr;
    void* on_issued_context = nullptr;
  };

  explicit adapter(resource_ptr stack);
  adapter(resource_ptr stack, options opts);
  /// Frees everything still outstanding or deferred.
  ~adapter();
  adapter(adapter const&) = delete;
  adapter& operator=(adapter const&) = delete;
  adapter(adapter&&) = delete;
  adapter& operator=(adapter&&) = delete;

  [[nodiscard]] static constexpr int interface_version() noexcept { return supported_interface_version; }

  /// Idempotent; marks the adapter ready (Numba calls it every time a context is pushed).
  void initialize() noexcept;
  [[nodiscard]] bool initialized() const noexcept;

  /// Allocates `size` bytes from the stack. Throws what the stack throws (`out_of_memory`).
  [[nodiscard]] memory_pointer memalloc(std::size_t size, std::uint32_t tag = 0);

  /// The finalizer of the allocation `token` names: returns what was freed the first time,
  /// nothing for a token already freed or made stale by `reset()` (or never issued).
  std::optional<memory_pointer> free(std::uint64_t token);
  /// Whether this adapter ever issued `token` (live, freed or made stale), as opposed to a
  /// token of another adapter, 0, or any other value: what tells a finalizer's harmless
  /// second call from a foreign free when `free` returns nothing.
  [[nodiscard]] bool issued(std::uint64_t token) const;

  [[nodiscard]] memory_info get_memory_info() const;

  /// IPC handle of the upstream allocation that contains `ptr`, and the offset into it; for
  /// vmm memory, of the block [ptr, ptr + size) (`size` must then be given).
  [[nodiscard]] ipc_handle get_ipc_handle(void const* ptr, std::size_t size = 0) const;

  /// Throws `logic_error` naming `what` while the stack's vmm layer is asleep.
  void check_awake(char const* what) const;

  /// Frees every outstanding allocation (see the contract on deferral) and returns them, so
  /// callers that keep their own books can close them. Throws what the stack's deallocate
  /// (or release) threw first, after emptying the table and freeing the rest.
  std::vector<memory_pointer> reset();
  /// The same, but a refused free does not throw: the first refusal lands in `first_error`,
  /// every allocation still leaves the table, and those the stack took back (or that wait
  /// for a guard) are returned, so the caller's books close for exactly those. (A refused
  /// free is misuse — the block was freed some other way, whose books closed then — or a
  /// broken stack, which still holds the memory.)
  std::vector<memory_pointer> reset(std::exception_ptr& first_error);
  /// reset() for the end of the adapter's owner: first ends every cleanup deferral (no
  /// guard can end one later), so each outstanding or deferred allocation is freed once,
  /// here, and none is left for a sweep of the stack to find.
  std::vector<memory_pointer> close(std::exception_ptr& first_error);

  /// Holds frees back while it lives; the outermost guard's end returns them to the stack.
  class cleanup_guard {
   public:
    explicit cleanup_guard(adapter& owner) : owner_{&owner} { owner_->begin_deferral(); }
    ~cleanup_guard() {
      if (owner_ != nullptr) { owner_->end_deferral_noexcept(); }
    }
    cleanup_guard(cleanup_guard&& other) noexcept : owner_{std::exchange(other.owner_, nullptr)} {}
    cleanup_guard(cleanup_guard const&) = delete;
    cleanup_guard& operator=(cleanup_guard const&) = delete;
    cleanup_guard& operator=(cleanup_guard&&) = delete;

   private:
    adapter* owner_;
  };
  [[nodiscard]] cleanup_guard defer_cleanup() { return cleanup_guard{*this}; }

  /// The guard's two halves, for hosts that cannot hold a C++ object (the C ABI).
  void begin_deferral() noexcept;
  /// Ends one deferral; the outermost end frees what was held. Throws logic_error when no
  /// deferral is active, and what the stack's deallocate throws.
  void end_deferral();

  [[nodiscard]] std::size_t outstanding_count() const;  ///< allocations not yet freed
  [[nodiscard]] std::size_t outstanding_bytes() const;
  [[nodiscard]] std::size_t deferred_count() const;     ///< frees waiting for the outermost guard
  [[nodiscard]] int deferral_depth() const;
  [[nodiscard]] memory_resource& stack() const noexcept { return *stack_; }
  /// For tests of the callers' refusal paths (a reset's, a finalizer's), which no right
  /// free reaches on a host without a driver to fail: the next `count` frees this adapter
  /// forwards to the stack are refused with a `logic_error` instead, the stack keeping the
  /// memory, as a stack refusing them would. Never called in production: while no refusal
  /// is pending, a free pays one relaxed load for it.
  void refuse_next_frees_for_tests(std::size_t count) noexcept;
  [[nodiscard]] resource_ptr const& stack_ptr() const noexcept { return stack_; }
  [[nodiscard]] int device() const noexcept { return options_.device; }

 private:
  struct slot {
    void* ptr = nullptr;
    std::size_t size = 0;
    std::uint32_t generation = 0;  // of the token now (or last) issued from this slot
    std::uint32_t tag = 0;
    std::uint32_t next_free = 0;   // free-list link (index), valid while the slot is free
    bool live = false;
  };
  struct deferred_free {
    void* ptr;
    std::size_t size;
  };
  static constexpr std::uint32_t no_slot = 0xffffffffU;

  void end_deferral_noexcept() noexcept;
  // Frees a batch outside the lock; keeps going past a failing deallocate and returns the
  // first error (null when every free passed), adding each refused pointer to `refused`.
  std::exception_ptr free_all(std::vector<deferred_free>& batch, std::vector<void*>* refused = nullptr) noexcept;
  std::vector<memory_pointer> take_out_all(bool end_deferrals, std::exception_ptr& first_error);
  // Returns [ptr, ptr + size) to the stack, unless a refusal for tests is pending.
  void forward_free(void* ptr, std::size_t size);

  resource_ptr stack_;
  options options_;
  virtual_range_resource const* sleepable_ = nullptr;  // the stack's vmm layer, if any (for check_awake)
  mutable std::mutex mutex_;
  std::vector<slot> slots_;
  std::uint32_t free_head_ = no_slot;
  std::uint32_t generation_base_ = 0;  // every slot's generation starts here (see the contract)
  std::size_t outstanding_count_ = 0;
  std::size_t outstanding_bytes_ = 0;
  std::vector<deferred_free> deferred_;
  int deferral_depth_ = 0;
  std::atomic<bool> initialized_{false};
  std::atomic<std::size_t> refusals_for_tests_{0};
};

}  // namespace mrstack::emm
