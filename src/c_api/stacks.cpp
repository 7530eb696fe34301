// Stacks behind the C ABI: the process-wide per-device stacks and their configuration,
// private stacks, plain allocation with per-client books, and statistics.
#include "c_api_internal.hpp"

#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/detail/format.hpp>
#include <mrstack/spec.hpp>

#include <algorithm>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include "../device_scope.hpp"

using mrstack::c_api::guarded;
using mrstack::c_api::set_last_error;
using mrstack::c_api::valid_client;

namespace {

mrstack::emm::adapter::options emm_options(int device, mrstack_stack* books) {
  mrstack::emm::adapter::options opts;
  opts.device = device;
  // EMM allocations are counted as the adapter enters them in its table (see
  // adapter::options::on_issued), so a reset on another thread never frees one uncounted.
  opts.on_issued = [](void* stack, std::uint32_t client, std::size_t bytes) noexcept {
    static_cast<mrstack_stack*>(stack)->count_allocation(static_cast<int>(client), bytes);
  };
  opts.on_issued_context = books;
  return opts;
}

void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t now) noexcept {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
}

}  // namespace

mrstack_stack::mrstack_stack(mrstack::resource_ptr stack, int device_ordinal, bool is_process_wide)
    : top{stack}, emm{std::move(stack), emm_options(device_ordinal, this)}, device{device_ordinal},
      process_wide{is_process_wide} {}

void mrstack_stack::count_allocation(int client, std::uint64_t bytes) noexcept {
  auto& books = clients[static_cast<std::size_t>(client)];
  raise_peak(books.peak_bytes, books.live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  books.live_count.fetch_add(1, std::memory_order_relaxed);
  books.allocations.fetch_add(1, std::memory_order_relaxed);
  raise_peak(peak_bytes, live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void mrstack_stack::count_free(int client, std::uint64_t bytes) noexcept {
  auto& books = clients[static_cast<std::size_t>(client)];
  books.live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  books.live_count.fetch_sub(1, std::memory_order_relaxed);
  live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

mrstack_stack::plain_shard& mrstack_stack::plain_shard_of(void const* ptr) noexcept {
  static_assert(plain_shard_count == 16, "the shard index takes the hash's top 4 bits");
  // Blocks are at least 256-byte aligned: mix the bits above those into a shard index.
  auto const a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) >> 8;
  return plain_blocks[(a * 0x9E3779B97F4A7C15ULL) >> 60];
}

namespace mrstack::c_api {

namespace {

constexpr int max_devices = 64;

struct process_configuration {
  std::mutex mutex;
  std::optional<std::string> configured;  // from mrstack_configure
  std::optional<std::string> in_use;      // the spec the built device stacks came from
  std::array<std::atomic<mrstack_stack*>, max_devices> device_stacks{};
};

process_configuration& configuration() {
  // Never destroyed: device stacks must outlive every finalizer that may still run while
  // the process exits (Python runs weakref finalizers at exit), and destroying a pool
  // after the CUDA context is gone would fail anyway.
  static auto* config = new process_configuration;
  return *config;
}

// What a device stack would be built from if none were built yet.
std::string spec_to_use_ignoring_built(process_configuration const& config) {
  if (config.configured) { return *config.configured; }
  if (char const* env = std::getenv("MRSTACK_RESOURCE"); env != nullptr && *env != '\0') { return env; }
  return MRSTACK_DEFAULT_SPEC;
}

std::string spec_to_use(process_configuration const& config) {
  return config.in_use ? *config.in_use : spec_to_use_ignoring_built(config);
}

void check_device(int device) {
  if (device < 0 || device >= max_devices) {
    throw std::invalid_argument("device ordinal " + std::to_string(device) + " is outside [0, " +
                                std::to_string(max_devices) + ")");
  }
}

mrstack_status copy_out(char const* function, std::string const& text, char* buffer, std::size_t capacity,
                        std::size_t* length) {
  if (buffer == nullptr && capacity > 0) {
    // Room promised and none given: copying nothing and succeeding would hide it.
    set_last_error(std::string{function} + ": a capacity of " + std::to_string(capacity) +
                   " bytes, but the buffer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  if (length != nullptr) { *length = text.size(); }
  if (buffer != nullptr && capacity > 0) {
    std::size_t const n = std::min(capacity - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return MRSTACK_SUCCESS;
}

// "{pid}" in a spec's values becomes this process's id, so that every process of a
// multi-process program (pytest-xdist workers, DataLoader workers) can log to a file of its
// own. Parsed first and expanded in the values after: expanded first, a spec error's
// column counted in the longer text, off by the pid's length less 5 for every {pid} before it.
stack_spec parse_expanded(std::string_view text) {
  static constexpr std::string_view pid_field = "{pid}";
  std::string const pid = std::to_string(static_cast<long>(getpid()));
  stack_spec spec = parse_stack_spec(text);
  for (auto& layer : spec.layers) {
    for (auto& argument : layer.arguments) {
      std::string& value = argument.value;
      for (auto at = value.find(pid_field); at != std::string::npos; at = value.find(pid_field, at + pid.size())) {
        value.replace(at, pid_field.size(), pid);
      }
    }
  }
  return spec;
}

mrstack_status invalid(std::string message) {
  set_last_error(message);
  return MRSTACK_ERROR_INVALID_ARGUMENT;
}

// Why `device` can have no stack, or empty when it can. Checked before anything is built:
// past the bound there is no slot for it, and an ordinal past the machine's devices would
// only fail later, as a CUDA error of the first call that makes it current. Where the
// runtime has no device to count (a CPU-only machine), device scopes do nothing and the
// ordinal only labels a stack over host or simulated memory, so any below the bound passes.
std::string device_refusal(char const* function, int device) {
  std::string const who = std::string{function} + ": device ordinal " + std::to_string(device);
  if (device < 0) { return who + " is negative"; }
  if (device >= max_devices) {
    return who + " is outside [0, " + std::to_string(max_devices) + "), the devices that can have a stack";
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // our query's error, not the program's
    return {};
  }
  if (count > 0 && device >= count) {
    return who + " does not exist: this machine has " + std::to_string(count) + " CUDA device" +
           (count == 1 ? " (ordinal 0)" : "s (ordinals 0 to " + std::to_string(count - 1) + ")");
  }
  return {};
}

}  // namespace

namespace {

/// What is left live after the EMM blocks went: mrstack_allocate's blocks, freed through a
/// tracking layer on top when there is one; a sentence on them, or empty when none.
std::string sweep_plain_allocations(mrstack_stack& stack) {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  for (auto const& books : stack.clients) {
    count += books.live_count.load(std::memory_order_relaxed);
    bytes += books.live_bytes.load(std::memory_order_relaxed);
  }
  if (count == 0) { return {}; }
  std::string what = std::to_string(count) + (count == 1 ? " allocation" : " allocations") + " (" +
                     std::to_string(bytes) + " bytes) made with mrstack_allocate " + (count == 1 ? "was" : "were") +
                     " still live: ";
  if (auto* tracking = dynamic_cast<tracking_resource_adaptor*>(stack.top.get())) {
    for (auto const& a : tracking->outstanding()) {
      stack.top->deallocate(a.pointer, a.bytes, stream_view{reinterpret_cast<cudaStream_t>(a.stream)}, a.alignment);
    }
    return what + "freed through the stack's tracking layer";
  }
  for (memory_resource const* layer = stack.top.get(); layer != nullptr; layer = layer->upstream()) {
    auto const name = layer->name();
    if (name == "pool" || name == "arena" || name == "fixed_size" || name == "binning") {
      return what + "their memory goes back with the " + name + " layer's chunks as the stack is destroyed";
    }
    if (name == "simulated" || name == "simulated_vmm") { return what + "nothing to free (a simulated upstream)"; }
  }
  return what + "leaked: no layer of this stack can find them (put tracking on top of the stack to have them freed)";
}

}  // namespace

std::string release_live_allocations(mrstack_stack& stack) {
  // close(), not reset(): a cleanup guard left open would keep EMM blocks queued, the sweep
  // would free them, and the adapter's destructor again.
  std::exception_ptr refused;
  for (auto const& m : stack.emm.close(refused)) { stack.count_free(static_cast<int>(m.tag), m.size); }
  std::string leaks = sweep_plain_allocations(stack);
  if (refused) { std::rethrow_exception(refused); }  // a misuse the caller must hear of first
  return leaks;
}

mrstack_stack* built_device_stack(int device) noexcept {
  if (device < 0 || device >= max_devices) { return nullptr; }
  return configuration().device_stacks[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

mrstack_stack& device_stack(int device) {
  check_device(device);
  auto& config = configuration();
  auto& slot = config.device_stacks[static_cast<std::size_t>(device)];
  if (auto* built = slot.load(std::memory_order_acquire)) { return *built; }
  std::lock_guard lock{config.mutex};
  if (auto* built = slot.load(std::memory_order_acquire)) { return *built; }
  std::string const spec = spec_to_use(config);
  resource_ptr top;
  try {
    // Built with `device` current (upstreams, events, a pool's first chunk belong to it);
    // the caller's context is put back as it was.
    build_options options;
    options.device = device;
    top = build_stack(parse_expanded(spec), options);
  } catch (spec_error const& e) {
    // Say where a spec nobody passed in a call came from.
    if (!config.configured && std::getenv("MRSTACK_RESOURCE") != nullptr) {
      throw spec_error(std::string{"MRSTACK_RESOURCE: "} + e.what(), e.column());
    }
    throw;
  }
  auto stack = std::make_unique<mrstack_stack>(std::move(top), device, /*process_wide=*/true);
  register_stack(stack.get());
  config.in_use = spec;
  slot.store(stack.get(), std::memory_order_release);
  return *stack.release();
}

}  // namespace mrstack::c_api

using mrstack::c_api::invalid;
using mrstack::check_stack_spec;
using mrstack::parse_stack_spec;

extern "C" {

mrstack_status mrstack_configure(const char* spec) {
  std::string conflict;
  auto const status = guarded([&] {
    auto& config = mrstack::c_api::configuration();
    std::lock_guard lock{config.mutex};
    std::optional<std::string> wanted;
    if (spec != nullptr) { wanted = std::string{spec}; }
    if (config.in_use) {
      // Too late to change, but saying the same thing again is fine.
      std::optional<std::string> const previous = std::exchange(config.configured, wanted);
      std::string const effective = mrstack::c_api::spec_to_use_ignoring_built(config);
      config.configured = previous;
      if (effective != *config.in_use) {
        conflict = "mrstack_configure(" + (wanted ? "\"" + *wanted + "\"" : std::string{"NULL"}) +
                   "): the device stacks were already built from \"" + *config.in_use +
                   "\"; configure before the first allocation";
      }
      return;
    }
    // Check the spec now (names, parameters, values: no CUDA, nothing built), so a bad one
    // fails here, where the caller can still fix it, rather than at the first allocation.
    if (wanted) { check_stack_spec(mrstack::c_api::parse_expanded(*wanted)); }
    config.configured = std::move(wanted);
  });
  if (status != MRSTACK_SUCCESS) { return status; }
  if (!conflict.empty()) {
    set_last_error(conflict, 0, MRSTACK_ERROR_STATE);
    return MRSTACK_ERROR_STATE;
  }
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_configured_spec(char* buffer, size_t capacity, size_t* length) {
  std::string spec;
  auto const status = guarded([&] {
    auto& config = mrstack::c_api::configuration();
    std::lock_guard lock{config.mutex};
    spec = mrstack::c_api::spec_to_use(config);
  });
  if (status != MRSTACK_SUCCESS) { return status; }
  return mrstack::c_api::copy_out("mrstack_configured_spec", spec, buffer, capacity, length);
}

mrstack_status mrstack_device_stack(int device, mrstack_stack** out) {
  if (out == nullptr) { return invalid("mrstack_device_stack: the out-pointer is null"); }
  *out = nullptr;
  if (auto* const built = mrstack::c_api::built_device_stack(device)) {  // its device was checked as it was built
    *out = built->handle;
    return MRSTACK_SUCCESS;
  }
  if (auto why = mrstack::c_api::device_refusal("mrstack_device_stack", device); !why.empty()) {
    return invalid(std::move(why));
  }
  return guarded([&] { *out = mrstack::c_api::device_stack(device).handle; });
}

mrstack_stack* mrstack_device_stack_if_built(int device) {
  auto const* stack = mrstack::c_api::built_device_stack(device);
  return stack == nullptr ? nullptr : stack->handle;
}

mrstack_status mrstack_stack_create(const char* spec, int device, mrstack_stack** out) {
  if (out == nullptr) { return invalid("mrstack_stack_create: the out-pointer is null"); }
  *out = nullptr;
  if (spec == nullptr) { return invalid("mrstack_stack_create: the spec is null"); }
  if (auto why = mrstack::c_api::device_refusal("mrstack_stack_create", device); !why.empty()) {
    return invalid(std::move(why));
  }
  return guarded([&] {
    mrstack::build_options options;
    options.device = device;
    auto stack = std::make_unique<mrstack_stack>(
        mrstack::build_stack(mrstack::c_api::parse_expanded(spec), options), device,
        /*process_wide=*/false);
    *out = mrstack::c_api::register_stack(stack.get());
    (void)stack.release();  // the handle table owns it until mrstack_stack_destroy
  });
}

mrstack_status mrstack_stack_destroy(mrstack_stack* handle) {
  if (handle == nullptr) { return MRSTACK_SUCCESS; }
  mrstack_status status = MRSTACK_SUCCESS;
  std::unique_ptr<mrstack_stack> stack{mrstack::c_api::retire_stack(handle, "mrstack_stack_destroy", &status)};
  if (!stack) { return status; }
  std::string leaks;
  // The frees and the layers' destructors (which give memory back and synchronize) run on
  // the stack's device, as its allocations did.
  status = guarded([&] {
    mrstack::detail::device_scope on_device{stack->device};
    leaks = mrstack::c_api::release_live_allocations(*stack);
  });
  auto const destroyed = guarded([&] {
    mrstack::detail::device_scope on_device{stack->device};
    stack.reset();
  });
  if (status == MRSTACK_SUCCESS && !leaks.empty()) {
    set_last_error("mrstack_stack_destroy: " + leaks, 0, MRSTACK_ERROR_LOGIC);
    return MRSTACK_ERROR_LOGIC;
  }
  return status != MRSTACK_SUCCESS ? status : destroyed;
}

mrstack_status mrstack_stack_describe(const mrstack_stack* handle, char* buffer, size_t capacity, size_t* length) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_stack_describe");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  std::string text;
  auto const status = guarded([&] { text = mrstack::describe_stack(*stack->top); });
  if (status != MRSTACK_SUCCESS) { return status; }
  return mrstack::c_api::copy_out("mrstack_stack_describe", text, buffer, capacity, length);
}

mrstack_status mrstack_allocate(mrstack_stack* handle, size_t bytes, void* stream, int client, void** out) {
  if (out == nullptr) { return invalid("mrstack_allocate: the out-pointer is null"); }
  *out = nullptr;
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_allocate");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (!valid_client(client)) { return invalid("mrstack_allocate: unknown client " + std::to_string(client)); }
  return guarded([&] {
    // The stack's device is current for the call (a null stream is its default stream).
    mrstack::detail::device_scope on_device{stack->device};
    stack->emm.check_awake("mrstack_allocate");  // a pool would hand out memory with nothing behind it
    mrstack::stream_view const on{static_cast<cudaStream_t>(stream)};
    void* const block = stack->top->allocate(bytes, on);
    if (block == nullptr) { return; }  // 0 bytes: nothing to free, nothing to book
    auto& shard = stack->plain_shard_of(block);
    try {
      std::lock_guard lock{shard.mutex};
      auto const key = reinterpret_cast<std::uintptr_t>(block);
      mrstack_stack::plain_block const booked{bytes, client};
      if (!shard.live.insert(key, booked)) {  // one probe when the address is new, as it should be
        // The stack handed out an address the books hold live: that block went back behind
        // the C ABI's back (through another handle's layers). The new block lives there now.
        auto* const stale = shard.live.find(key);
        stack->count_free(stale->client, stale->bytes);
        *stale = booked;
      }
    } catch (...) {  // no host memory to book it: a block nobody could free right
      try {
        stack->top->deallocate(block, bytes, on);
      } catch (...) {  // the refusal that matters is the first
      }
      throw;
    }
    stack->count_allocation(client, bytes);
    *out = block;
  });
}

mrstack_status mrstack_deallocate(mrstack_stack* handle, void* ptr, size_t bytes, void* stream, int client) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_deallocate");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  if (!valid_client(client)) { return invalid("mrstack_deallocate: unknown client " + std::to_string(client)); }
  if (ptr == nullptr) {
    if (bytes == 0) { return MRSTACK_SUCCESS; }  // what an allocation of 0 bytes returned
    // A null pointer with a size: the caller lost the pointer it means to free.
    set_last_error("mrstack_deallocate: a null pointer with a size of " + std::to_string(bytes) +
                       " bytes (only an allocation of 0 bytes returns null)",
                   0, MRSTACK_ERROR_LOGIC);
    return MRSTACK_ERROR_LOGIC;
  }
  // The block's own books first: a free that is not exactly its allocation (another size
  // or client, a block of another stack, a second free) is refused before the memory goes
  // back, since the layers take some of those (a pool rounds 1000 and 1024 bytes to one
  // block). The entry leaves the books while the stack frees, so a second free racing this
  // one is refused; its room is kept, so putting it back after a refusal cannot fail.
  auto& shard = stack->plain_shard_of(ptr);
  auto const key = reinterpret_cast<std::uintptr_t>(ptr);
  std::optional<mrstack_stack::plain_block> found;
  {
    std::lock_guard lock{shard.mutex};
    if (auto const* block = shard.live.find(key)) {
      found = *block;
      if (block->bytes == bytes && block->client == client) { shard.live.erase_keeping_room(key); }
    }
  }
  if (!found || found->bytes != bytes || found->client != client) {
    std::string const what = "mrstack_deallocate: a free of " + std::to_string(bytes) + " bytes as client " +
                             mrstack_client_name(client) + " of " + mrstack::format_hex(ptr);
    std::string const why =
        found ? ", which was allocated with " + std::to_string(found->bytes) + " bytes as client " +
                    mrstack_client_name(found->client) + " (free with the size and client it was allocated with)"
              : ", which is not a live allocation of this stack (mrstack_allocate of this stack did not return "
                "it, or it was freed already)";
    set_last_error(what + why + "; nothing was freed", 0, MRSTACK_ERROR_LOGIC);
    return MRSTACK_ERROR_LOGIC;
  }
  auto const status = guarded([&] {
    mrstack::detail::device_scope on_device{stack->device};
    stack->top->deallocate(ptr, bytes, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
  });
  {
    std::lock_guard lock{shard.mutex};
    if (status == MRSTACK_SUCCESS) {
      shard.live.give_up_room();
    } else {
      (void)shard.live.put_back(key, *found);  // the stack kept it: still live, still booked
    }
  }
  if (status == MRSTACK_SUCCESS) { stack->count_free(client, bytes); }
  return status;
}

mrstack_status mrstack_get_statistics(mrstack_stack* handle, mrstack_statistics* out) {
  if (out == nullptr) { return invalid("mrstack_get_statistics: the out-pointer is null"); }
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_get_statistics");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  return guarded([&] {
    mrstack_statistics s{};
    s.live_bytes = stack->live_bytes.load(std::memory_order_relaxed);
    s.peak_bytes = stack->peak_bytes.load(std::memory_order_relaxed);
    s.free_bytes_held = stack->top->free_bytes_held();
    s.emm_outstanding = stack->emm.outstanding_count();
    s.device = stack->device;
    s.deferral_depth = stack->emm.deferral_depth();
    for (std::size_t c = 0; c < stack->clients.size(); ++c) {
      auto const& books = stack->clients[c];
      s.clients[c].live_bytes = books.live_bytes.load(std::memory_order_relaxed);
      s.clients[c].peak_bytes = books.peak_bytes.load(std::memory_order_relaxed);
      s.clients[c].live_count = books.live_count.load(std::memory_order_relaxed);
      s.clients[c].allocations = books.allocations.load(std::memory_order_relaxed);
    }
    *out = s;
  });
}

mrstack_status mrstack_reset_peaks(mrstack_stack* handle) {
  auto const stack = mrstack::c_api::resolve_stack(handle, "mrstack_reset_peaks");
  if (!stack) { return MRSTACK_ERROR_INVALID_ARGUMENT; }
  for (auto& books : stack->clients) {
    books.peak_bytes.store(books.live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  stack->peak_bytes.store(stack->live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return MRSTACK_SUCCESS;
}

}  // extern "C"
