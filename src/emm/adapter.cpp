#include <mrstack/error.hpp>
#include <mrstack/emm/adapter.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include <cuda.h>            // driver types only: the functions are reached through the runtime
#include <cudaTypedefs.h>    // PFN_* signatures of the driver entry points
#include <unistd.h>

#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/virtual_range.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>
#include <mrstack/upstream/vmm_ipc.hpp>

#include "device_scope.hpp"

namespace mrstack::emm {

namespace {

// The three driver functions get_ipc_handle needs, looked up once through the runtime so
// that mrstack never links libcuda (the runtime finds the driver the process already uses).
struct driver_api {
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_get_attribute = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  std::string failure;  // why a lookup failed, empty when all were found
};

template <class Fn>
void look_up(char const* symbol, unsigned version, Fn& fn, std::string& failure) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cudaError_t const status = cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    if (failure.empty()) {
      failure = std::string{"cudaGetDriverEntryPointByVersion(\""} + symbol + "\", " + std::to_string(version) +
                ") failed: " + (status != cudaSuccess ? cudaGetErrorName(status) : "symbol not found in the driver");
    }
    return;
  }
  fn = reinterpret_cast<Fn>(address);
}

driver_api const& driver() {
  static driver_api const api = [] {
    driver_api a;
    look_up("cuMemGetAddressRange", 3020, a.mem_get_address_range, a.failure);
    look_up("cuPointerGetAttribute", 4000, a.pointer_get_attribute, a.failure);
    look_up("cuGetErrorName", 6000, a.get_error_name, a.failure);
    return a;
  }();
  if (!api.failure.empty()) { throw driver_error("emm::adapter::get_ipc_handle: " + api.failure, -1); }
  return api;
}

[[noreturn]] void throw_driver_error(driver_api const& api, CUresult code, std::string const& call) {
  char const* name = nullptr;
  if (api.get_error_name == nullptr || api.get_error_name(code, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "unknown CUresult";
  }
  throw driver_error("emm::adapter::get_ipc_handle: " + call + " failed: " + name + " (" +
                         std::to_string(static_cast<int>(code)) + ")",
                     static_cast<int>(code));
}

/// A `simulated` or `simulated_vmm` bottom plays a device of its capacity, so it answers as
/// cudaMemGetInfo answers for a real device: total is the capacity, free what the device has
/// not handed out (the capacity less the footprint, or less the mapped bytes). The host's
/// memory, the answer for the other address-only stacks, says nothing about that device (and
/// Numba sizes its batches of deferred frees by the total). Unlimited (no capacity): SIZE_MAX.
std::optional<memory_info> simulated_memory_info(memory_resource& stack) {
  memory_resource& bottom = bottom_of_stack(stack);
  std::size_t capacity = 0;
  std::size_t held = 0;
  if (auto const* sim = dynamic_cast<simulated_memory_resource const*>(&bottom)) {
    capacity = sim->capacity();
    held = sim->footprint();
  } else if (auto const* vmm = dynamic_cast<simulated_vmm_memory_resource const*>(&bottom)) {
    capacity = vmm->capacity();
    held = vmm->mapped_bytes();
  } else {
    return std::nullopt;
  }
  memory_info info;
  info.total = capacity;
  info.free = capacity - std::min(held, capacity);
  return info;
}

memory_info default_memory_info(int device, memory_kind kind) {
  if (kind == memory_kind::device || kind == memory_kind::managed) {
    detail::device_scope scope{device};
    memory_info info;
    MRSTACK_CUDA_TRY(cudaMemGetInfo(&info.free, &info.total));
    return info;
  }
  // Host memory (system, pinned_host) and address-only stacks other than the simulated
  // ones (simulated_memory_info): the host's physical memory.
  long const page = sysconf(_SC_PAGESIZE);
  long const pages = sysconf(_SC_PHYS_PAGES);
  long const available = sysconf(_SC_AVPHYS_PAGES);
  memory_info info;
  if (page > 0 && pages > 0) { info.total = static_cast<std::size_t>(page) * static_cast<std::size_t>(pages); }
  if (page > 0 && available > 0) { info.free = static_cast<std::size_t>(page) * static_cast<std::size_t>(available); }
  return info;
}

}  // namespace

adapter::adapter(resource_ptr stack) : adapter(std::move(stack), options{}) {}

adapter::adapter(resource_ptr stack, options opts) : stack_{std::move(stack)}, options_{opts} {
  if (!stack_) { throw logic_error("emm::adapter: the stack is null"); }
  if (options_.device < 0) {
    throw logic_error("emm::adapter: device ordinal " + std::to_string(options_.device) + " is negative");
  }
  sleepable_ = find_virtual_range_resource(*stack_);
  // The n-th adapter of the process starts its generations at n * 2^32 / golden ratio:
  // the starts stay far apart however many adapters there are, so tokens of two adapters
  // (two stacks of the C ABI) do not coincide and one's finalizer cannot free the other's.
  static std::atomic<std::uint32_t> adapters_made{0};
  generation_base_ = adapters_made.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B9U;
}

void adapter::check_awake(char const* what) const {
  if (sleepable_ != nullptr && sleepable_->asleep()) {
    throw logic_error(std::string{what} + ": the stack \"" + describe_stack(*stack_) +
                      "\" is asleep (its physical memory was given back by sleep()); call wake() before allocating");
  }
}

adapter::~adapter() {
  try {
    // A guard that outlived the adapter's owner can end nothing now: close() frees what it held.
    std::exception_ptr failed;
    (void)close(failed);
    if (failed) { std::rethrow_exception(failed); }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: emm::adapter: freeing outstanding memory at destruction failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "mrstack: emm::adapter: freeing outstanding memory at destruction failed\n");
  }
}

void adapter::initialize() noexcept { initialized_.store(true, std::memory_order_release); }

bool adapter::initialized() const noexcept { return initialized_.load(std::memory_order_acquire); }

memory_pointer adapter::memalloc(std::size_t size, std::uint32_t tag) {
  check_awake("emm::adapter::memalloc");
  void* const ptr = stack_->allocate(size, options_.stream);
  std::uint32_t index = 0;
  std::uint32_t generation = 0;
  try {
    std::lock_guard lock{mutex_};
    if (free_head_ != no_slot) {
      index = free_head_;
      free_head_ = slots_[index].next_free;
    } else {
      if (slots_.size() >= no_slot) { throw logic_error("emm::adapter: more than 2^32-1 outstanding allocations"); }
      slots_.emplace_back();  // amortized: the table keeps its capacity, so steady state allocates nothing
      slots_.back().generation = generation_base_;
      index = static_cast<std::uint32_t>(slots_.size() - 1);
    }
    slot& s = slots_[index];
    s.generation = s.generation + 1 == 0 ? 1 : s.generation + 1;  // generation 0 never issued: token != 0
    generation = s.generation;
    s.ptr = ptr;
    s.size = size;
    s.tag = tag;
    s.live = true;
    ++outstanding_count_;
    outstanding_bytes_ += size;
    if (options_.on_issued != nullptr) { options_.on_issued(options_.on_issued_context, tag, size); }
  } catch (...) {
    stack_->deallocate(ptr, size, options_.stream);
    throw;
  }
  return memory_pointer{ptr, size, options_.device, (std::uint64_t{generation} << 32) | index, tag};
}

std::optional<memory_pointer> adapter::free(std::uint64_t token) {
  auto const index = static_cast<std::uint32_t>(token & 0xffffffffU);
  auto const generation = static_cast<std::uint32_t>(token >> 32);
  memory_pointer freed;
  {
    std::lock_guard lock{mutex_};
    if (index >= slots_.size()) { return std::nullopt; }
    slot& s = slots_[index];
    if (!s.live || s.generation != generation) { return std::nullopt; }  // freed before, or reset since
    freed = memory_pointer{s.ptr, s.size, options_.device, token, s.tag};
    s.live = false;
    s.ptr = nullptr;
    s.next_free = free_head_;
    free_head_ = index;
    --outstanding_count_;
    outstanding_bytes_ -= freed.size;
    if (deferral_depth_ > 0) {
      deferred_.push_back({freed.ptr, freed.size});
      return freed;
    }
  }
  forward_free(freed.ptr, freed.size);
  return freed;
}

void adapter::refuse_next_frees_for_tests(std::size_t count) noexcept {
  refusals_for_tests_.store(count, std::memory_order_relaxed);
}

void adapter::forward_free(void* ptr, std::size_t size) {
  if (refusals_for_tests_.load(std::memory_order_relaxed) != 0) {
    std::size_t left = refusals_for_tests_.load(std::memory_order_relaxed);
    while (left != 0 && !refusals_for_tests_.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {}
    if (left != 0) {
      char where[24];
      std::snprintf(where, sizeof where, "%p", ptr);
      throw logic_error(std::string{"emm::adapter: the free of "} + where + " (" + std::to_string(size) +
                        " bytes) was refused as refuse_next_frees_for_tests asked; the stack keeps the memory");
    }
  }
  stack_->deallocate(ptr, size, options_.stream);
}

bool adapter::issued(std::uint64_t token) const {
  auto const index = static_cast<std::uint32_t>(token & 0xffffffffU);
  auto const generation = static_cast<std::uint32_t>(token >> 32);
  std::lock_guard lock{mutex_};
  if (token == 0 || index >= slots_.size()) { return false; }
  // Generations of a slot run from generation_base_ + 1 up to its current one (mod 2^32).
  std::uint32_t const age = generation - generation_base_;
  return age != 0 && age <= static_cast<std::uint32_t>(slots_[index].generation - generation_base_);
}

memory_info adapter::get_memory_info() const {
  memory_kind const kind = stack_->kind();
  std::optional<memory_info> simulated;
  if (options_.query_memory == nullptr) { simulated = simulated_memory_info(*stack_); }
  memory_info info = options_.query_memory != nullptr ? options_.query_memory(options_.device, kind)
                     : simulated                      ? *simulated
                                                      : default_memory_info(options_.device, kind);
  // What the stack holds free is free to whoever asks through this stack, though the
  // driver counts it as used.
  std::size_t const held = stack_->free_bytes_held();
  info.free = std::min(info.total, info.free + std::min(held, info.total));
  return info;
}

ipc_handle adapter::get_ipc_handle(void const* ptr, std::size_t size) const {
  if (ptr != nullptr && find_virtual_range(*stack_, ptr) != nullptr) {
    if (size == 0) {
      throw logic_error("emm::adapter::get_ipc_handle: " + format_hex(ptr) + " lies in a virtual-memory (vmm) layer "
                        "of \"" + describe_stack(*stack_) + "\": its IPC handle names the block's bytes, so the "
                        "block's size is needed (mrstack_emm_get_ipc_handle_sized)");
    }
    ipc_handle out;
    vmm_ipc::handle const h = vmm_ipc::export_block(*stack_, ptr, size);
    static_assert(sizeof out.handle == vmm_ipc::handle_bytes);
    std::memcpy(&out.handle, h.data(), h.size());
    out.base = const_cast<void*>(ptr);
    out.base_size = size;
    out.offset = 0;
    out.device = options_.device;
    out.vmm = true;
    return out;
  }
  memory_kind const kind = stack_->kind();
  if (kind != memory_kind::device) {
    // A simulated stack's kind is "none": "serves none memory" read as a typo.
    std::string const serves = kind == memory_kind::none ? std::string{"addresses with no memory behind them"}
                                                          : std::string{to_string(kind)} + " memory";
    throw logic_error("emm::adapter::get_ipc_handle: the stack \"" + describe_stack(*stack_) + "\" serves " +
                      serves + "; CUDA IPC shares device memory from cudaMalloc only");
  }
  if (ptr == nullptr) { throw logic_error("emm::adapter::get_ipc_handle: the pointer is null"); }
  driver_api const& api = driver();
  detail::device_scope scope{options_.device};
  auto const address = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr));
  int capable = 0;
  if (CUresult const r = api.pointer_get_attribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, address);
      r != CUDA_SUCCESS) {
    throw_driver_error(api, r, "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE, " + format_hex(ptr) + ")");
  }
  if (capable == 0) {
    throw logic_error("emm::adapter::get_ipc_handle: " + format_hex(ptr) + " (from \"" + describe_stack(*stack_) +
                      "\") lies in memory CUDA IPC cannot share: memory from a virtual-memory (vmm) or "
                      "stream-ordered (cuda_async) upstream has no legacy IPC handle; share memory from a "
                      "stack over the cuda upstream instead");
  }
  CUdeviceptr base = 0;
  std::size_t base_size = 0;
  if (CUresult const r = api.mem_get_address_range(&base, &base_size, address); r != CUDA_SUCCESS) {
    throw_driver_error(api, r, "cuMemGetAddressRange(" + format_hex(ptr) + ")");
  }
  ipc_handle out;
  out.base = reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
  out.base_size = base_size;
  out.offset = static_cast<std::size_t>(address - base);
  out.device = options_.device;
  MRSTACK_CUDA_TRY(cudaIpcGetMemHandle(&out.handle, out.base));
  return out;
}

std::vector<memory_pointer> adapter::reset() {
  std::exception_ptr failed;
  auto released = take_out_all(false, failed);
  if (failed) { std::rethrow_exception(failed); }
  return released;
}

std::vector<memory_pointer> adapter::reset(std::exception_ptr& first_error) { return take_out_all(false, first_error); }

std::vector<memory_pointer> adapter::close(std::exception_ptr& first_error) { return take_out_all(true, first_error); }

std::vector<memory_pointer> adapter::take_out_all(bool end_deferrals, std::exception_ptr& first_error) {
  std::vector<memory_pointer> released;
  std::vector<deferred_free> batch;
  bool release_now = false;
  {
    std::lock_guard lock{mutex_};
    released.reserve(outstanding_count_);
    for (std::uint32_t index = 0; index < slots_.size(); ++index) {
      slot& s = slots_[index];
      if (!s.live) { continue; }
      released.push_back({s.ptr, s.size, options_.device, (std::uint64_t{s.generation} << 32) | index, s.tag});
      deferred_.push_back({s.ptr, s.size});
      // Retire the slot: its generation moves on, so the token just reported is stale.
      s.live = false;
      s.ptr = nullptr;
      s.generation = s.generation + 1 == 0 ? 1 : s.generation + 1;
      s.next_free = free_head_;
      free_head_ = index;
    }
    outstanding_count_ = 0;
    outstanding_bytes_ = 0;
    if (end_deferrals) { deferral_depth_ = 0; }
    release_now = deferral_depth_ == 0;
    if (release_now) { batch.swap(deferred_); }
  }
  std::vector<void*> refused;
  first_error = free_all(batch, &refused);
  std::erase_if(released, [&](memory_pointer const& m) {
    return std::find(refused.begin(), refused.end(), m.ptr) != refused.end();
  });
  if (release_now && !first_error) {
    try {
      stack_->release();
    } catch (...) {
      first_error = std::current_exception();
    }
  }
  return released;
}

void adapter::begin_deferral() noexcept {
  std::lock_guard lock{mutex_};
  ++deferral_depth_;
}

void adapter::end_deferral() {
  std::vector<deferred_free> batch;
  {
    std::lock_guard lock{mutex_};
    if (deferral_depth_ == 0) { throw logic_error("emm::adapter: end of a cleanup deferral that was never begun"); }
    if (--deferral_depth_ == 0) { batch.swap(deferred_); }
  }
  if (auto const failed = free_all(batch)) { std::rethrow_exception(failed); }
}

void adapter::end_deferral_noexcept() noexcept {
  try {
    end_deferral();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: emm::adapter: freeing deferred memory failed: %s\n", e.what());
  }
}

std::exception_ptr adapter::free_all(std::vector<deferred_free>& batch, std::vector<void*>* refused) noexcept {
  std::exception_ptr first_error;
  for (auto const& f : batch) {
    try {
      forward_free(f.ptr, f.size);
    } catch (...) {
      if (!first_error) { first_error = std::current_exception(); }
      if (refused == nullptr) { continue; }
      try {
        refused->push_back(f.ptr);
      } catch (...) {
        // no memory to say which: the books then close for it as if it went back
      }
    }
  }
  batch.clear();
  return first_error;
}

std::size_t adapter::outstanding_count() const {
  std::lock_guard lock{mutex_};
  return outstanding_count_;
}

std::size_t adapter::outstanding_bytes() const {
  std::lock_guard lock{mutex_};
  return outstanding_bytes_;
}

std::size_t adapter::deferred_count() const {
  std::lock_guard lock{mutex_};
  return deferred_.size();
}

int adapter::deferral_depth() const {
  std::lock_guard lock{mutex_};
  return deferral_depth_;
}

}  // namespace mrstack::emm
