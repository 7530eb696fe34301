// The handle table behind `mrstack_stack*`: a handle is (tag, generation, slot), so a
// destroyed or foreign handle is recognized instead of dereferenced.
//
//   bits 63..48  0x6d73 ("ms"): no user-space address on x86-64 or AArch64 has these set
//   bits 47..20  the slot's generation when the handle was made (28 bits, wraps; every
//                slot's first is one random number per process)
//   bits 19..0   the slot (at most 2^20 stacks alive at once)
//
// Slots live in chunks that are never freed, so a stale handle can always be looked at.
// A slot's state is (generation << 1 | alive). A call on a private stack counts itself in
// the slot before it re-checks the state, and a destroy flips the state before it waits
// for that count to reach zero (both sequentially consistent), so a stack is deleted only
// once no call can still be using it. Device stacks are never destroyed: their calls skip
// the count.
#include "c_api_internal.hpp"

#include <stdexcept>

#include <cinttypes>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace mrstack::c_api {

namespace {

constexpr std::uint64_t handle_tag = 0x6d73;
constexpr unsigned slot_bits = 20;
constexpr unsigned generation_bits = 28;
constexpr std::uint64_t slot_mask = (std::uint64_t{1} << slot_bits) - 1;
constexpr std::uint64_t generation_mask = (std::uint64_t{1} << generation_bits) - 1;
constexpr std::size_t slots_per_chunk = 1024;
constexpr std::size_t max_chunks = (std::size_t{1} << slot_bits) / slots_per_chunk;

struct slot {
  std::atomic<std::uint64_t> state{0};  // generation << 1 | alive
  std::atomic<bool> issued{false};      // a handle to this slot was ever made
  std::atomic<std::uint32_t> calls{0};  // calls in flight on a private stack
  std::atomic<mrstack_stack*> object{nullptr};
  std::atomic<bool> permanent{false};
};

struct handle_table {
  // Every slot's first generation: random per process, so that a handle another process
  // made (the same tag, slot and, without it, generation) names nothing here.
  std::uint64_t const first_generation = std::random_device{}() & generation_mask;
  std::mutex mutex;
  std::array<std::atomic<slot*>, max_chunks> chunks{};
  std::size_t slots_made = 0;
  std::deque<std::uint32_t> free_slots;  // FIFO: a freed slot is reused last, so generations wrap slowly
};

handle_table& table() {
  // Never destroyed: finalizers may free into device stacks while the process exits.
  static auto* t = new handle_table;
  return *t;
}

std::uint64_t bits_of(void const* handle) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle)); }

std::string hex(std::uint64_t v) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%" PRIx64, v);
  return buffer;
}

std::string not_a_handle(std::uint64_t bits) {
  return "stack handle " + hex(bits) +
         " is not a stack handle (not one mrstack_stack_create or mrstack_device_stack returned)";
}

/// The slot a well-formed handle names, or nullptr (then `why` says what is wrong).
slot* slot_of(std::uint64_t bits, std::string& why) {
  if (bits == 0) {
    why = "the stack is null";
    return nullptr;
  }
  if ((bits >> (slot_bits + generation_bits)) == handle_tag) {
    std::uint64_t const index = bits & slot_mask;
    if (auto* chunk = table().chunks[index / slots_per_chunk].load(std::memory_order_acquire)) {
      return &chunk[index % slots_per_chunk];
    }
  }
  why = not_a_handle(bits);
  return nullptr;
}

std::uint64_t alive_state(std::uint64_t bits) { return ((bits >> slot_bits) & generation_mask) << 1 | 1; }

/// Why a well-formed handle names no live stack: it was destroyed (its generation is one
/// the slot has had), or it was never made here (a slot never used, a generation the slot
/// has not reached: a forged handle, or another process's).
std::string why_not_alive(std::uint64_t bits, slot const& s) {
  std::uint64_t const first = table().first_generation;
  std::uint64_t const given = (bits >> slot_bits) & generation_mask;
  std::uint64_t const now = (s.state.load(std::memory_order_acquire) >> 1) & generation_mask;
  bool const had_it = ((given - first) & generation_mask) < ((now - first) & generation_mask);
  if (!s.issued.load(std::memory_order_acquire) || !had_it) { return not_a_handle(bits); }
  return "stack handle " + hex(bits) + " was destroyed (mrstack_stack_destroy); it cannot be used again";
}

}  // namespace

mrstack_stack* register_stack(mrstack_stack* stack) {
  auto& t = table();
  std::lock_guard lock{t.mutex};
  std::uint64_t index = 0;
  if (!t.free_slots.empty()) {
    index = t.free_slots.front();
    t.free_slots.pop_front();
  } else {
    if (t.slots_made == max_chunks * slots_per_chunk) {
      throw std::length_error("mrstack_stack_create: " + std::to_string(t.slots_made) +
                          " stacks are alive at once, the most the handle table holds");
    }
    index = t.slots_made++;
    auto& chunk = t.chunks[index / slots_per_chunk];
    if (chunk.load(std::memory_order_relaxed) == nullptr) {
      auto* made = new slot[slots_per_chunk];  // never freed (see table())
      for (std::size_t i = 0; i < slots_per_chunk; ++i) { made[i].state.store(t.first_generation << 1); }
      chunk.store(made, std::memory_order_release);
    }
  }
  slot& s = t.chunks[index / slots_per_chunk].load(std::memory_order_relaxed)[index % slots_per_chunk];
  std::uint64_t const generation = (s.state.load(std::memory_order_relaxed) >> 1) & generation_mask;
  s.object.store(stack, std::memory_order_relaxed);
  s.permanent.store(stack->process_wide, std::memory_order_relaxed);
  s.issued.store(true, std::memory_order_relaxed);
  s.state.store(generation << 1 | 1, std::memory_order_release);
  auto const bits = handle_tag << (slot_bits + generation_bits) | generation << slot_bits | index;
  stack->handle = reinterpret_cast<mrstack_stack*>(static_cast<std::uintptr_t>(bits));
  return stack->handle;
}

stack_ref resolve_stack(mrstack_stack const* handle, char const* function) noexcept {
  std::uint64_t const bits = bits_of(handle);
  std::string why;
  slot* s = slot_of(bits, why);
  if (s != nullptr) {
    std::uint64_t const alive = alive_state(bits);
    if (s->state.load(std::memory_order_acquire) == alive) {
      if (s->permanent.load(std::memory_order_relaxed)) { return {s->object.load(std::memory_order_relaxed), nullptr}; }
      s->calls.fetch_add(1, std::memory_order_seq_cst);
      if (s->state.load(std::memory_order_seq_cst) == alive) {
        return {s->object.load(std::memory_order_relaxed), &s->calls};
      }
      s->calls.fetch_sub(1, std::memory_order_release);
    }
    why = why_not_alive(bits, *s);
  }
  try {
    set_last_error(std::string{function} + ": " + why);
  } catch (...) {
    set_last_error({});
  }
  return {};
}

mrstack_stack* retire_stack(mrstack_stack* handle, char const* function, mrstack_status* status) noexcept {
  *status = MRSTACK_ERROR_INVALID_ARGUMENT;
  std::uint64_t const bits = bits_of(handle);
  try {
    std::string why;
    slot* s = slot_of(bits, why);
    if (s == nullptr) {
      set_last_error(std::string{function} + ": " + why);
      return nullptr;
    }
    std::uint64_t alive = alive_state(bits);
    if (s->state.load(std::memory_order_acquire) == alive && s->permanent.load(std::memory_order_relaxed)) {
      *status = MRSTACK_ERROR_STATE;
      set_last_error(std::string{function} + ": device " + std::to_string(s->object.load()->device) +
                         "'s stack is process-wide and lives until the process exits",
                     0, MRSTACK_ERROR_STATE);
      return nullptr;
    }
    std::uint64_t const next = (((alive >> 1) + 1) & generation_mask) << 1;
    if (!s->state.compare_exchange_strong(alive, next, std::memory_order_seq_cst)) {
      set_last_error(std::string{function} + ": " + why_not_alive(bits, *s));
      return nullptr;
    }
    while (s->calls.load(std::memory_order_seq_cst) != 0) { std::this_thread::yield(); }
    mrstack_stack* const stack = s->object.exchange(nullptr, std::memory_order_acquire);
    auto& t = table();
    std::lock_guard lock{t.mutex};
    t.free_slots.push_back(static_cast<std::uint32_t>(bits & slot_mask));
    *status = MRSTACK_SUCCESS;
    return stack;
  } catch (...) {
    *status = status_from_current_exception();
    return nullptr;
  }
}

}  // namespace mrstack::c_api
