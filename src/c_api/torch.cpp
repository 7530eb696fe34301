// What PyTorch's CUDAPluggableAllocator loads by name, and the books behind
// mrstack.torch's memory statistics. They serve the same process-wide device stacks as
// Numba and CuPy, tagged as client torch.
//
// Out of memory: mrstack_torch_alloc returns NULL, which PyTorch does not check (the
// tensor gets a null pointer). mrstack_torch_alloc_raising, which mrstack.torch.install()
// hands to PyTorch, instead throws into PyTorch's C++ caller: a c10::OutOfMemoryError
// (Python: torch.OutOfMemoryError) once mrstack_torch_bind_c10 found libc10's, else
// mrstack::out_of_memory (RuntimeError); either message names the request, the
// footprint, the free bytes and the largest free block. Nothing of the stack changed, so
// the next allocation is served as usual.
//
// Streams: PyTorch gives its pluggable allocator no record_stream hook reachable from
// Python, so mrstack_torch_record_stream is mrstack's own: it records an event on the
// using stream (made on that stream's device, which may be another than the block's),
// and the block's free makes its own stream wait for that event before the block goes
// back to the stack, so the block is not handed out while the using stream may still
// touch it. It refuses (MRSTACK_ERROR_INVALID_ARGUMENT) a pointer that
// is not a live block PyTorch holds, before any CUDA call: see the live-block books below.
#include "c_api_internal.hpp"
#include "../device_scope.hpp"

#include <mrstack/detail/live_block_table.hpp>
#include <mrstack/detail/shard_spin_lock.hpp>

#include <cuda_runtime_api.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <vector>

namespace {

// ---- c10::OutOfMemoryError, made by libc10 itself ----------------------------------------
// PyTorch turns a c10::OutOfMemoryError unwinding out of its allocator into Python's
// torch.OutOfMemoryError, and any other std::exception into RuntimeError. mrstack does not
// link against PyTorch, so mrstack.torch.install() hands over the path of the libc10.so
// PyTorch loaded, and the exception is built by libc10's own code and thrown with
// PyTorch's type_info. Two ways, the first that the build exports:
// - libc10's `OutOfMemoryError(SourceLocation, std::string)` (builds that export it);
// - libc10's `Error(SourceLocation, std::string)`, then the object's vtable pointer set to
//   OutOfMemoryError's (exported with its type_info by libc10_cuda.so and
//   libtorch_python.so, beside libc10.so). OutOfMemoryError adds no member and overrides
//   nothing (`using Error::Error;`), so an Error with its vtable is an OutOfMemoryError
//   in every respect PyTorch looks at (torch 2.11 exports no constructor of it).
// SourceLocation is a plain struct of two pointers and a line (c10/util/StringUtil.h).
struct c10_source_location {
  char const* function;
  char const* file;
  std::uint32_t line;
};
using c10_constructor = void (*)(void* self, c10_source_location where, std::string message);
struct c10_binding {
  c10_constructor construct = nullptr;  // OutOfMemoryError's, or Error's when `vtable` is set
  std::type_info* type = nullptr;       // OutOfMemoryError's
  void* vtable = nullptr;               // OutOfMemoryError's address point, for Error's constructor
};
// More than sizeof(c10::Error) (about 150 bytes: a vtable pointer, three strings, a vector,
// a shared_ptr and a pointer); the object only uses what it needs.
constexpr std::size_t c10_error_storage = 1024;
std::atomic<c10_binding const*> bound_c10{nullptr};

[[noreturn]] void throw_as_c10_out_of_memory(c10_binding const& c10, std::string message) {
  void* storage = __cxxabiv1::__cxa_allocate_exception(c10_error_storage);
  try {
    c10.construct(storage, c10_source_location{"mrstack_torch_alloc_raising", __FILE__, __LINE__},
                  std::move(message));
  } catch (...) {
    __cxxabiv1::__cxa_free_exception(storage);
    throw;
  }
  if (c10.vtable != nullptr) { *static_cast<void**>(storage) = c10.vtable; }
  // c10::Error derives from std::exception first and alone: its virtual destructor ends the object.
  __cxxabiv1::__cxa_throw(storage, c10.type, [](void* object) { static_cast<std::exception*>(object)->~exception(); });
}

constexpr char const* oom_constructor_symbol =
    "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr char const* error_constructor_symbol =
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr char const* oom_type_symbol = "_ZTIN3c1016OutOfMemoryErrorE";
constexpr char const* oom_vtable_symbol = "_ZTVN3c1016OutOfMemoryErrorE";
constexpr char const* error_vtable_symbol = "_ZTVN3c105ErrorE";

template <typename T>
T* symbol(void* library, char const* name) {
  return library != nullptr ? reinterpret_cast<T*>(dlsym(library, name)) : nullptr;
}

/// The size the ELF symbol table gives the object at `address` (0 when unknown).
std::size_t symbol_size(void* address) {
  Dl_info info{};
  void* entry = nullptr;  // an ElfW(Sym) const*
  if (dladdr1(address, &info, &entry, RTLD_DL_SYMENT) == 0 || entry == nullptr) { return 0; }
  return static_cast<ElfW(Sym) const*>(entry)->st_size;
}

/// The second way (see above): libc10's Error constructor, OutOfMemoryError's type_info and
/// vtable from a library PyTorch loaded beside libc10. Refuses unless that vtable names that
/// type_info and is as long as Error's (the same slots, so the object behaves the same).
bool bind_through_error(void* c10, std::string const& directory, c10_binding& binding, std::string& why) {
  void* oom_vtable = nullptr;
  for (char const* name : {"libtorch_python.so", "libc10_cuda.so"}) {
    void* library = dlopen((directory + "/" + name).c_str(), RTLD_NOW | RTLD_NOLOAD);
    binding.type = symbol<std::type_info>(library, oom_type_symbol);
    oom_vtable = symbol<void>(library, oom_vtable_symbol);
    if (binding.type != nullptr && oom_vtable != nullptr) { break; }
  }
  binding.construct = reinterpret_cast<c10_constructor>(dlsym(c10, error_constructor_symbol));
  void* const error_vtable = symbol<void>(c10, error_vtable_symbol);
  if (binding.type == nullptr || oom_vtable == nullptr || binding.construct == nullptr || error_vtable == nullptr) {
    why = "neither libc10 exports c10::OutOfMemoryError's constructor nor do libc10 and the loaded "
          "libtorch_python.so / libc10_cuda.so in " + directory + " export c10::Error's constructor and vtable "
          "and c10::OutOfMemoryError's type_info and vtable";
    return false;
  }
  // A vtable: offset to top, type_info, then the virtual functions (its "address point").
  auto** const slots = static_cast<void**>(oom_vtable);
  std::size_t const oom_size = symbol_size(oom_vtable);
  if (slots[1] != static_cast<void*>(binding.type) || oom_size == 0 || oom_size != symbol_size(error_vtable)) {
    why = "c10::OutOfMemoryError's vtable in this PyTorch does not have c10::Error's shape";
    return false;
  }
  binding.vtable = slots + 2;
  return true;
}

/// Finds how to throw c10::OutOfMemoryError in the PyTorch whose libc10.so is at `path`;
/// null (and `why`) when this build allows neither way. The binding is never freed: a
/// thread may be throwing with it.
c10_binding const* bind_c10_out_of_memory(char const* path, std::string& why) {
  void* c10 = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  // PyTorch has loaded it: finds that copy
  if (c10 == nullptr) { c10 = dlopen(path, RTLD_NOW); }
  if (c10 == nullptr) {
    char const* error = dlerror();
    why = std::string{"cannot load "} + path + ": " + (error != nullptr ? error : "unknown error");
    return nullptr;
  }
  auto binding = std::make_unique<c10_binding>();
  binding->construct = reinterpret_cast<c10_constructor>(dlsym(c10, oom_constructor_symbol));
  binding->type = symbol<std::type_info>(c10, oom_type_symbol);
  if (binding->construct != nullptr && binding->type != nullptr) { return binding.release(); }
  std::string const directory = std::filesystem::path{path}.parent_path().string();
  return bind_through_error(c10, directory, *binding, why) ? binding.release() : nullptr;
}

// ---- the books ---------------------------------------------------------------------------

constexpr int max_torch_devices = 64;

struct torch_books {
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> peak_reserved{0};  // largest footprint seen at a new live peak
  std::atomic<std::uint64_t> live_peak_seen{0};
};

std::array<torch_books, max_torch_devices>& books() {
  static auto* all = new std::array<torch_books, max_torch_devices>;  // outlives every free at exit
  return *all;
}

// The blocks PyTorch holds from mrstack, with the device whose stack served each, and the
// events (mrstack_torch_record_stream) a block's free must wait for. record_stream needs
// to know that a pointer is a live block: an event kept for anything else is never
// consumed (a leak), or is consumed by the free of an unrelated block handed out later at
// that address, which then waits for work that has nothing to do with it. No layer of a
// stack can answer "is this a live block" (the resource interface has no such query, and
// a bare `cuda` layer keeps no books), so these books are kept here, for PyTorch's blocks
// only, as cheaply as they can be: one of 64 shards picked by the address, each a lock and
// an open-addressing table of (address, device) that allocates only when it grows (no
// node per block; detail/live_block_table.hpp), so an allocation and its free each add
// one uncontended lock and a probe or two. The free uses them too: it refuses a pointer they do not hold on that device
// before the stack or the counters are touched, so a block's events also survive a free
// for the wrong device. An address may be live on two devices at once: stacks over
// simulated memory hand out the same addresses (real devices share one address space).
using mrstack::detail::live_block;
using mrstack::detail::live_block_table;

// mrstack_torch_set_event_hooks_for_tests: null in production. Read once per record_stream;
// an event kept for a block remembers the hooks that made it, so that its free hands a
// stand-in to the hooks' destroy (not to CUDA) even after a test unset them.
std::atomic<mrstack_torch_event_hooks const*> event_hooks{nullptr};

struct kept_event {
  cudaEvent_t event;
  mrstack_torch_event_hooks const* hooks;  // null: a CUDA event
};
struct recorded_uses {
  int device;
  std::vector<kept_event> events;
};
using use_map = std::unordered_multimap<void*, recorded_uses>;

void destroy_event(cudaEvent_t event, mrstack_torch_event_hooks const* hooks) noexcept {
  if (hooks != nullptr) {
    hooks->destroy(event);
  } else {
    (void)cudaEventDestroy(event);
  }
}

struct alignas(64) block_shard {
  // A spin lock whose unlock is a plain store: each allocation and each free takes one
  // shard's lock once, and on the H200 hosts' Xeons every locked instruction costs about
  // 20 ns; a std::mutex's lock and unlock are two of them. Holders never wait: a probe,
  // an insert that may grow the table, a few events moved (no CUDA call under it).
  mrstack::detail::shard_spin_lock mutex;
  live_block_table table;
  use_map uses;  // only for blocks record_stream was called on
};

constexpr std::size_t block_shard_count = std::size_t{1} << live_block_table::shard_bits;

block_shard& shard_of(void const* ptr) noexcept {
  static auto* all = new std::array<block_shard, block_shard_count>;  // outlives every free at exit
  return (*all)[live_block_table::hash(ptr) >> (64 - live_block_table::shard_bits)];
}

torch_books* books_of(int device) noexcept {
  return device >= 0 && device < max_torch_devices ? &books()[static_cast<std::size_t>(device)] : nullptr;
}

void raise_to(std::atomic<std::uint64_t>& peak, std::uint64_t now) noexcept {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
}

// After an allocation: when PyTorch's live bytes reach a new peak, sample the footprint
// (the footprint only grows during allocations, and mostly when live bytes do).
void sample_reserved(mrstack_stack& stack, torch_books& b) noexcept {
  std::uint64_t const live_peak = stack.clients[MRSTACK_CLIENT_TORCH].peak_bytes.load(std::memory_order_relaxed);
  if (live_peak <= b.live_peak_seen.load(std::memory_order_relaxed)) { return; }
  raise_to(b.live_peak_seen, live_peak);
  try {
    mrstack::fragmentation_info const info = stack.top->fragmentation();
    raise_to(b.peak_reserved, info.resource.empty() ? live_peak : info.held_bytes);
  } catch (...) {}  // a statistic: never fail an allocation for it
}

// A stream being captured into a CUDA graph: mrstack cannot keep the graph's memory
// private (PyTorch's graph pools have no hooks a pluggable allocator can reach from
// Python), and a pool growing during capture would call cudaMalloc, which capture forbids.
// cudaStreamIsCapturing is the one query capture allows.
void refuse_during_capture(std::size_t size, int device, void* stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t const status = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
  if (status != cudaSuccess) { (void)cudaGetLastError(); }  // no driver, or a legacy-stream query in a capture
  if (capture == cudaStreamCaptureStatusNone && status != cudaErrorStreamCaptureImplicit) { return; }
  throw mrstack::logic_error(
      "mrstack: PyTorch asked for " + std::to_string(size) + " bytes on device " + std::to_string(device) +
      " while its stream is being captured into a CUDA graph; mrstack refuses allocations during capture: it "
      "cannot keep a graph's memory private as PyTorch's own allocator does (a pluggable allocator gets no "
      "graph pool from PyTorch), and growing would call cudaMalloc, which capture forbids. Capture with "
      "PyTorch's allocator (do not call mrstack.torch.install() in that process), or warm up so that the "
      "captured region allocates nothing (see docs/python.md)");
}

// The books could not grow: a bad_alloc (so the C status is MRSTACK_ERROR_OUT_OF_MEMORY,
// and PyTorch raises RuntimeError, not torch.OutOfMemoryError: device memory was there)
// whose message, made without allocating, says which books ran out, not the stack.
using mrstack::c_api::books_out_of_host_memory;

/// The live-block books, for a block the stack served.
books_out_of_host_memory live_books_out_of_host_memory(std::size_t size, int device) noexcept {
  books_out_of_host_memory e;
  std::snprintf(e.text().data(), e.text().size(),
                "mrstack_torch_alloc: out of host memory for the live-block books of device %d, which could not "
                "grow to hold a block of %zu bytes; the block went back to the stack",
                device, size);
  return e;
}

/// The events record_stream keeps for a block, for one more.
books_out_of_host_memory uses_out_of_host_memory(void const* ptr, int device) noexcept {
  books_out_of_host_memory e;
  std::snprintf(e.text().data(), e.text().size(),
                "mrstack_torch_record_stream: out of host memory for the recorded uses of block 0x%llx of "
                "device %d; no event was kept",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(ptr)), device);
  return e;
}

void* allocate_for_torch(std::size_t size, int device, void* stream) {
  mrstack_stack* stack = mrstack::c_api::built_device_stack(device);
  if (stack == nullptr) { stack = &mrstack::c_api::device_stack(device); }
  stack->emm.check_awake("mrstack_torch_alloc");  // a pool would hand out memory with nothing behind it
  mrstack::detail::device_scope on_device{device};
  refuse_during_capture(size, device, stream);
  void* ptr = nullptr;
  try {
    ptr = stack->top->allocate(size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
  } catch (mrstack::out_of_memory const&) {
    if (auto* b = books_of(device)) { b->ooms.fetch_add(1, std::memory_order_relaxed); }
    throw;
  }
  if (ptr != nullptr) {
    try {
      block_shard& shard = shard_of(ptr);
      std::lock_guard lock{shard.mutex};
      shard.table.insert(live_block{ptr, device, 0, size});
    } catch (...) {  // out of host memory for the entry (insert throws nothing else): PyTorch does not get the block
      stack->top->deallocate(ptr, size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
      throw live_books_out_of_host_memory(size, device);
    }
    stack->count_allocation(MRSTACK_CLIENT_TORCH, size);
    if (auto* b = books_of(device)) { sample_reserved(*stack, *b); }
  }
  return ptr;
}

/// The events record_stream kept for `ptr`'s block on `device` (under the shard's lock).
use_map::iterator recorded_uses_of(use_map& uses, void* ptr, int device) {
  auto [first, last] = uses.equal_range(ptr);
  while (first != last && first->second.device != device) { ++first; }
  return first == last ? uses.end() : first;
}

/// Keeps `event` for `ptr`'s block on `device` (under the shard's lock). Out of host memory
/// it throws, keeping nothing: a block's first event goes into its vector before a node
/// for them goes into the map, and each step happens whole or not at all (an entry with no
/// event would make the block's free look for uses it never had).
void keep_recorded_use(use_map& uses, void* ptr, int device, kept_event event) {
  try {
    if (auto found = recorded_uses_of(uses, ptr, device); found != uses.end()) {
      found->second.events.push_back(event);
    } else {
      uses.emplace(ptr, recorded_uses{device, std::vector<kept_event>{event}});
    }
  } catch (std::bad_alloc const&) {
    throw uses_out_of_host_memory(ptr, device);
  }
}

// Makes `stream` wait for every use of the block recorded on other streams, and destroys
// the events: each is used once, by this free, whatever the free's outcome. They are taken
// from the books only now, when the free goes ahead: a refused free leaves them where
// they are (putting a node back into an unordered map may allocate, to rehash).
void wait_for_recorded_uses(block_shard& shard, void* ptr, int device, void* stream) noexcept {
  std::vector<kept_event> events;
  {
    std::lock_guard lock{shard.mutex};
    if (auto found = recorded_uses_of(shard.uses, ptr, device); found != shard.uses.end()) {
      events = std::move(found->second.events);
      shard.uses.erase(found);
    }
  }
  for (kept_event const& kept : events) {
    if (kept.hooks == nullptr) { (void)cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), kept.event, 0); }
    destroy_event(kept.event, kept.hooks);  // the wait is enqueued: destroying the event now is allowed
  }
}

// Creates `event` and records it on `stream`, on the stream's device: CUDA refuses to
// record an event of one device on a stream of another, and the stream may belong to
// another device than the block or the calling thread's current one (PyTorch's own
// allocator takes such a use too). The block's free then makes its own stream wait for
// the event across devices, which cudaStreamWaitEvent allows. A null (legacy) or
// per-thread default stream is the current device's. `event` is left null when it could
// not be created; otherwise the caller owns it, recorded or not (cuda_error). With the
// tests' hooks set, their `record` stands in for all of it.
void record_on_its_device(cudaEvent_t& event, void* ptr, void* stream, mrstack_torch_event_hooks const* hooks) {
  if (hooks != nullptr) {
    event = static_cast<cudaEvent_t>(hooks->record(ptr, stream));
    if (event == nullptr) { throw mrstack::cuda_error(cudaErrorUnknown, "the test's record hook", __FILE__, __LINE__); }
    return;
  }
  int stream_device = -1;
  cudaError_t status = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &stream_device);
  if (status != cudaSuccess) { throw mrstack::cuda_error(status, "cudaStreamGetDevice", __FILE__, __LINE__); }
  mrstack::detail::device_scope on_stream_device{stream_device};
  status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (status != cudaSuccess) {
    event = nullptr;
    throw mrstack::cuda_error(status, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  status = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  if (status != cudaSuccess) { throw mrstack::cuda_error(status, "cudaEventRecord", __FILE__, __LINE__); }
}

}  // namespace

extern "C" {

void* mrstack_torch_alloc(size_t size, int device, void* stream) {
  try {
    return allocate_for_torch(size, device, stream);
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    // PyTorch does not check for NULL: say why here, where it can still be seen.
    std::fprintf(stderr, "mrstack: PyTorch's allocation of %zu bytes on device %d failed: %s\n", size, device,
                 mrstack_last_error());
    return nullptr;
  }
}

void* mrstack_torch_alloc_raising(size_t size, int device, void* stream) {
  try {
    return allocate_for_torch(size, device, stream);
  } catch (mrstack::out_of_memory const& e) {
    (void)mrstack::c_api::status_from_current_exception();  // also this thread's last error
    if (c10_binding const* c10 = bound_c10.load(std::memory_order_acquire)) {
      throw_as_c10_out_of_memory(*c10, std::string{"mrstack: "} + e.what());
    }
    throw;  // into PyTorch's C++ caller, which raises RuntimeError with the message
  } catch (...) {
    (void)mrstack::c_api::status_from_current_exception();
    throw;
  }
}

mrstack_status mrstack_torch_bind_c10(const char* libc10_path) {
  if (libc10_path == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_bind_c10: the path is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  std::string why;
  c10_binding const* binding = bind_c10_out_of_memory(libc10_path, why);
  if (binding == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_bind_c10: " + why + "; out-of-memory stays a RuntimeError", 0,
                                   MRSTACK_ERROR_STATE);
    return MRSTACK_ERROR_STATE;
  }
  bound_c10.store(binding, std::memory_order_release);
  return MRSTACK_SUCCESS;
}

namespace {
/// A free mrstack_torch_free does not make: its caller cannot be told (it returns
/// nothing), so the reason goes to the last error and to stderr.
void refuse_torch_free(std::string const& message) {
  mrstack::c_api::set_last_error(message, 0, MRSTACK_ERROR_LOGIC);
  std::fprintf(stderr, "mrstack: %s\n", mrstack_last_error());
}
}  // namespace

void mrstack_torch_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) { return; }
  mrstack_stack* const stack = mrstack::c_api::built_device_stack(device);
  if (stack == nullptr) {
    refuse_torch_free("mrstack_torch_free: device " + std::to_string(device) +
                      " has no stack, so this pointer did not come from mrstack");
    return;
  }
  // The block leaves the live books first, so a record_stream racing this free finds it
  // gone. A free refused below puts it back (`put_back` needs no host memory), its events
  // untouched: only a free that goes ahead takes them.
  block_shard& shard = shard_of(ptr);
  bool held = false;
  live_block taken{};     // its entry, generation and all: a refused free puts the same block back
  bool recorded = false;  // record_stream kept events for it
  int held_by = -1;       // not held on `device`: a device whose stack holds a block there, for the message
  {
    std::lock_guard lock{shard.mutex};
    if (std::size_t const slot = shard.table.find(ptr, device); slot != live_block_table::npos) {
      held = true;
      taken = shard.table[slot];
      shard.table.erase(slot);
      recorded = !shard.uses.empty() && recorded_uses_of(shard.uses, ptr, device) != shard.uses.end();
    } else if (std::size_t const other = shard.table.find(ptr, -1); other != live_block_table::npos) {
      held_by = shard.table[other].device;
    }
  }
  auto keep = [&]() noexcept {
    std::lock_guard lock{shard.mutex};
    try {
      shard.table.put_back(taken);
    } catch (...) {  // more refused frees at once than half a table, and no host memory
      std::fprintf(stderr, "mrstack: mrstack_torch_free: no host memory to keep %p (device %d) in the books: "
                   "its right free will be refused\n", ptr, device);
    }
  };
  if (!held) {
    std::string const elsewhere =
        held_by >= 0 ? "; it is a live block of device " + std::to_string(held_by) + "'s stack" : std::string{};
    refuse_torch_free("mrstack_torch_free: " + mrstack::format_hex(ptr) + " (" +
                      std::to_string(size) + " bytes) is not a block PyTorch holds from device " +
                      std::to_string(device) + "'s stack (never handed out there, or already " +
                      "freed)" + elsewhere + "; nothing was freed");
    return;
  }
  // The books know the block's size, so the counters below cannot be taken past zero: a
  // free of another size is refused here (a layer below may take it back all the same).
  if (taken.size != size) {
    keep();
    refuse_torch_free("mrstack_torch_free: " + mrstack::format_hex(ptr) + " on device " +
                      std::to_string(device) + " was allocated with " + std::to_string(taken.size) +
                      " bytes, not the " + std::to_string(size) + " this free names; nothing was freed");
    return;
  }
  try {
    mrstack::detail::device_scope on_device{device};
    if (recorded) { wait_for_recorded_uses(shard, ptr, device, stream); }
    stack->top->deallocate(ptr, size, mrstack::stream_view{static_cast<cudaStream_t>(stream)});
    stack->count_free(MRSTACK_CLIENT_TORCH, size);  // as mrstack_deallocate: once the stack has it
  } catch (...) {
    // Still PyTorch's block, still counted. Its events were waited for and destroyed, or (the device could
    // not be made current) are still in the books for the free that succeeds.
    keep();
    (void)mrstack::c_api::status_from_current_exception();
    std::fprintf(stderr, "mrstack: PyTorch's free of %p (%zu bytes) on device %d failed: %s\n", ptr, size, device,
                 mrstack_last_error());
  }
}

mrstack_status mrstack_torch_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_record_stream: the pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  // The pointer is checked before any CUDA call, and again when the event is stored: the
  // event is made and recorded outside the lock, so that allocations meeting this shard
  // do not wait for the driver, and a free in between must not leave it behind. The
  // second look wants the very entry of the first, by its generation: a block handed out
  // at the same address meanwhile (a free and an allocation on other threads) is another
  // block, whose free must not wait for work recorded for the first.
  block_shard& shard = shard_of(ptr);
  auto refuse = [&](std::string why) {
    mrstack::c_api::set_last_error("mrstack_torch_record_stream: " + mrstack::format_hex(ptr) + " " + why +
                                   "; no event was kept");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  };
  auto refuse_unless_one_block = [&](std::size_t live) {
    if (live == 0) {
      return refuse("is not a block PyTorch holds from mrstack: a pointer mrstack_torch_alloc never handed out, "
                    "one into a block (a view's data pointer: pass its storage's base), or a block already freed");
    }
    return refuse("is a live block of " + std::to_string(live) + " devices' stacks at once (stacks over simulated "
                  "memory share addresses), so which block's free should wait is unknown");
  };
  live_block seen{};
  {
    std::lock_guard lock{shard.mutex};
    if (std::size_t const live = shard.table.count(ptr); live != 1) { return refuse_unless_one_block(live); }
    seen = shard.table[shard.table.find(ptr, -1)];
  }
  mrstack_torch_event_hooks const* const hooks = event_hooks.load(std::memory_order_relaxed);
  cudaEvent_t event = nullptr;
  mrstack_status recorded = MRSTACK_SUCCESS;
  try {
    record_on_its_device(event, ptr, stream, hooks);
    std::lock_guard lock{shard.mutex};
    std::size_t const slot = shard.table.find(ptr, seen.device);
    if (slot != live_block_table::npos && shard.table[slot].generation == seen.generation) {
      keep_recorded_use(shard.uses, ptr, seen.device, kept_event{event, hooks});
      event = nullptr;  // the block's free destroys it
    }  // else refused below, with the lock released
  } catch (...) {
    recorded = mrstack::c_api::status_from_current_exception();
  }
  if (event == nullptr) { return recorded; }
  destroy_event(event, hooks);  // not kept: recording failed, no host memory to keep it, or the block is gone
  return recorded != MRSTACK_SUCCESS ? recorded : refuse("was freed while its event was recorded");
}

void mrstack_torch_set_event_hooks_for_tests(mrstack_torch_event_hooks const* hooks) {
  event_hooks.store(hooks, std::memory_order_relaxed);
}

mrstack_status mrstack_torch_statistics(int device, mrstack_torch_stats* out) {
  torch_books* const b = books_of(device);
  if (b == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_statistics: device " + std::to_string(device) +
                                   " is outside [0, 64)");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  if (out == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_statistics: the out-pointer is null");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  out->num_ooms = b->ooms.load(std::memory_order_relaxed);
  out->peak_reserved_bytes = b->peak_reserved.load(std::memory_order_relaxed);
  return MRSTACK_SUCCESS;
}

mrstack_status mrstack_torch_reset_peak(int device, uint64_t reserved_now) {
  torch_books* const b = books_of(device);
  if (b == nullptr) {
    mrstack::c_api::set_last_error("mrstack_torch_reset_peak: device " + std::to_string(device) +
                                   " is outside [0, 64)");
    return MRSTACK_ERROR_INVALID_ARGUMENT;
  }
  b->peak_reserved.store(reserved_now, std::memory_order_relaxed);
  mrstack_stack* const stack = mrstack::c_api::built_device_stack(device);
  std::uint64_t const live = stack == nullptr ? 0 : stack->clients[MRSTACK_CLIENT_TORCH].live_bytes.load();
  b->live_peak_seen.store(live, std::memory_order_relaxed);
  return MRSTACK_SUCCESS;
}

}  // extern "C"
