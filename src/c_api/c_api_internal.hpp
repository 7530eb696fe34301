#pragma once
// Internal to libmrstack_c: the stack object behind the opaque handle, the handle table,
// per-client books, the per-thread last error and the exception-to-status barrier every
// entry point uses.
#include <mrstack/c_api.h>
#include <mrstack/detail/pointer_map.hpp>
#include <mrstack/detail/shard_spin_lock.hpp>
#include <mrstack/emm/adapter.hpp>
#include <mrstack/resource.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

struct mrstack_stack {
  mrstack_stack(mrstack::resource_ptr stack, int device, bool process_wide);

  // Books of one client. Relaxed atomics: each counter is exact; a reader sees each
  // counter at some recent moment (statistics are not a snapshot across counters).
  struct client_books {
    std::atomic<std::uint64_t> live_bytes{0};
    std::atomic<std::uint64_t> peak_bytes{0};
    std::atomic<std::uint64_t> live_count{0};
    std::atomic<std::uint64_t> allocations{0};
  };

  void count_allocation(int client, std::uint64_t bytes) noexcept;
  void count_free(int client, std::uint64_t bytes) noexcept;

  /// A live block of mrstack_allocate: its free must name this size and client. Counters
  /// alone cannot tell a free of the wrong size or client while the client holds enough
  /// (a pool takes 1000 and 1024 bytes back as one block), nor another stack's block where
  /// both stacks' layers share one heap (`system`); the books then drifted, and a later
  /// right free was refused and its block leaked.
  struct plain_block {
    std::uint64_t bytes;
    int client;
  };
  struct alignas(64) plain_shard {  // a line of its own: frees of other shards' blocks do not pull it over
    // A spin lock, as the torch books' shards have: every allocate and free takes one, and
    // a std::mutex's lock and unlock are two locked instructions (~20 ns each on the H200
    // hosts' Xeons). Holders never wait: a probe, or an insert that may grow the table.
    mrstack::detail::shard_spin_lock mutex;
    mrstack::detail::pointer_map<plain_block> live;
  };
  static constexpr std::size_t plain_shard_count = 16;  // frees from many threads seldom meet
  plain_shard& plain_shard_of(void const* ptr) noexcept;

  mrstack::resource_ptr top;
  mrstack::emm::adapter emm;
  int device;
  bool process_wide;  // a device stack: lives until the process exits, never destroyed
  mrstack_stack* handle = nullptr;  // what the C ABI hands out for it (see resolve_stack)
  std::array<client_books, MRSTACK_CLIENT_COUNT> clients;
  std::atomic<std::uint64_t> live_bytes{0};
  std::atomic<std::uint64_t> peak_bytes{0};
  std::array<plain_shard, plain_shard_count> plain_blocks;
};

namespace mrstack::c_api {

/// Records `message` (a spec column, 0 for none, and the status the failing call returns)
/// as this thread's last error. A view, copied inside: out of host memory the status is
/// still set and the message left empty (a string argument made at the call had thrown
/// out of noexcept callers such as status_from_current_exception).
void set_last_error(std::string_view message, std::size_t column = 0,
                    int status = MRSTACK_ERROR_INVALID_ARGUMENT) noexcept;

/// Host memory ran out for books the C ABI keeps (the torch entry points' live blocks and
/// recorded uses): a std::bad_alloc whose message, written into `text()` without
/// allocating, says which books. status_from_current_exception reports it as it is
/// (MRSTACK_ERROR_OUT_OF_MEMORY), where a bare bad_alloc reads "out of host memory:
/// std::bad_alloc".
class books_out_of_host_memory : public std::bad_alloc {
 public:
  [[nodiscard]] char const* what() const noexcept override { return text_.data(); }
  [[nodiscard]] std::array<char, 224>& text() noexcept { return text_; }

 private:
  std::array<char, 224> text_{};
};

/// Turns the exception being handled into a status and this thread's last error. Call
/// only inside a catch block.
mrstack_status status_from_current_exception() noexcept;

/// Runs `body` (which returns nothing) and reports any exception as a status.
template <class Body>
mrstack_status guarded(Body&& body) noexcept {
  try {
    body();
    return MRSTACK_SUCCESS;
  } catch (...) {
    return status_from_current_exception();
  }
}

/// Handles. What the C ABI hands out as a `mrstack_stack*` is not the object's address but
/// a slot of a process-wide table and the slot's generation, under a tag no user-space
/// address has (src/c_api/handles.cpp). A destroyed stack's slot moves to the next
/// generation, so its old handle is recognized as destroyed, and a value the table never
/// handed out (a stray pointer, a handle from another process) as not a handle — each an
/// MRSTACK_ERROR_INVALID_ARGUMENT with a message, never a crash.

/// A resolved handle. For a private stack it keeps the stack from being destroyed while
/// held (a destroy waits for calls in flight); device stacks are never destroyed.
class stack_ref {
 public:
  stack_ref() = default;
  stack_ref(mrstack_stack* stack, std::atomic<std::uint32_t>* calls) noexcept : stack_{stack}, calls_{calls} {}
  stack_ref(stack_ref&& other) noexcept : stack_{other.stack_}, calls_{other.calls_} {
    other.stack_ = nullptr;
    other.calls_ = nullptr;
  }
  stack_ref(stack_ref const&) = delete;
  stack_ref& operator=(stack_ref const&) = delete;
  stack_ref& operator=(stack_ref&&) = delete;
  ~stack_ref() {
    if (calls_ != nullptr) { calls_->fetch_sub(1, std::memory_order_release); }
  }
  explicit operator bool() const noexcept { return stack_ != nullptr; }
  mrstack_stack* operator->() const noexcept { return stack_; }
  mrstack_stack& operator*() const noexcept { return *stack_; }

 private:
  mrstack_stack* stack_ = nullptr;
  std::atomic<std::uint32_t>* calls_ = nullptr;
};

/// Gives `stack` a handle (stored in `stack->handle` and returned). Throws length_error
/// when 2^20 stacks are alive at once.
mrstack_stack* register_stack(mrstack_stack* stack);
/// The stack behind `handle`, or an empty ref after recording why as this thread's last
/// error ("<function>: the stack is null / was destroyed / is not a stack handle").
stack_ref resolve_stack(mrstack_stack const* handle, char const* function) noexcept;
/// Retires `handle`: later calls with it are refused; waits for calls in flight; returns
/// the stack for deletion. nullptr (last error set, `*status` its status) for a null,
/// destroyed, foreign or process-wide handle.
mrstack_stack* retire_stack(mrstack_stack* handle, char const* function, mrstack_status* status) noexcept;

/// Before a private stack is deleted: frees its EMM allocations, then any allocation made
/// with mrstack_allocate that is still live, where the stack can find them (a tracking
/// layer on top). Returns "" when none was live, else what was live (count, bytes) and
/// what became of it.
std::string release_live_allocations(mrstack_stack& stack);

inline bool valid_client(int client) noexcept { return client >= 0 && client < MRSTACK_CLIENT_COUNT; }

/// The built stack of `device`, or nullptr (no lookup beyond one atomic load).
mrstack_stack* built_device_stack(int device) noexcept;
/// The stack of `device`, built from the configured spec on first use. Throws.
mrstack_stack& device_stack(int device);

}  // namespace mrstack::c_api
