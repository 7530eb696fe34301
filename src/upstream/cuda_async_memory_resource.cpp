#include <mrstack/upstream/cuda_async_memory_resource.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>

#include "cuda_util.hpp"
#include "device_scope.hpp"

namespace mrstack {

cuda_async_memory_resource::cuda_async_memory_resource(std::size_t initial_pool_size,
                                                       std::optional<std::size_t> release_threshold, int device,
                                                       bool peer_access) {
  device = detail::checked_device(device, "cuda_async");
  if (device < 0) { MRSTACK_CUDA_TRY(cudaGetDevice(&device)); }  // no runtime: say why
  device_ = device;
  detail::device_scope on_device{device_};
  int supported = 0;
  MRSTACK_CUDA_TRY(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device_));
  if (supported == 0) {
    throw logic_error("cuda_async: device " + std::to_string(device_) +
                      " does not support stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported is 0)");
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  MRSTACK_CUDA_TRY(cudaMemPoolCreate(&pool_, &props));
  // A constructor that throws runs no destructor: a later step that fails gives the pool
  // (and a warm-up block not yet freed) back here before rethrowing.
  void* warm = nullptr;
  try {
    // Keep freed memory in the pool unless told otherwise: the driver would otherwise hand it
    // back to the OS at every synchronization and each allocation would pay to map it again.
    std::uint64_t threshold = release_threshold.value_or(std::numeric_limits<std::uint64_t>::max());
    MRSTACK_CUDA_TRY(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
    if (peer_access) {
      peers_ = detail::peers_of(device_);
      std::vector<cudaMemAccessDesc> access(peers_.size());
      for (std::size_t i = 0; i < peers_.size(); ++i) {
        access[i].location.type = cudaMemLocationTypeDevice;
        access[i].location.id = peers_[i];
        access[i].flags = cudaMemAccessFlagsProtReadWrite;
      }
      if (!access.empty()) { MRSTACK_CUDA_TRY(cudaMemPoolSetAccess(pool_, access.data(), access.size())); }
    }
    if (initial_pool_size > 0) {
      MRSTACK_ALLOC_TRY(cudaMallocFromPoolAsync(&warm, initial_pool_size, pool_, cudaStreamLegacy), initial_pool_size,
                        "cuda_async");
      MRSTACK_CUDA_TRY(cudaFreeAsync(warm, cudaStreamLegacy));
      warm = nullptr;
      MRSTACK_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    }
  } catch (...) {
    if (warm != nullptr) { (void)cudaFreeAsync(warm, cudaStreamLegacy); }
    // Allowed with frees still in flight: the driver destroys the pool once they complete.
    (void)cudaMemPoolDestroy(pool_);
    pool_ = nullptr;
    throw;
  }
}

cuda_async_memory_resource::~cuda_async_memory_resource() {
  // Frees may still be in flight on streams; the pool must outlive them.
  try {
    detail::device_scope on_device{device_};
    MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaDeviceSynchronize());
    MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaMemPoolDestroy(pool_));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: cuda_async on device %d: %s\n", device_, e.what());
  }
}

void* cuda_async_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  detail::require_upstream_alignment(alignment, default_alignment, "cuda_async");
  detail::device_scope on_device{device_};
  void* ptr = nullptr;
  MRSTACK_ALLOC_TRY(cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream.value()), bytes, "cuda_async");
  return ptr;
}

void cuda_async_memory_resource::do_deallocate(void* ptr, std::size_t, std::size_t, stream_view stream) {
  detail::device_scope on_device{device_};
  MRSTACK_CUDA_ASSERT_NOEXCEPT(cudaFreeAsync(ptr, stream.value()));
}

namespace {
std::size_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  std::uint64_t value = 0;
  MRSTACK_CUDA_TRY(cudaMemPoolGetAttribute(pool, attr, &value));
  return static_cast<std::size_t>(value);
}
}  // namespace

std::size_t cuda_async_memory_resource::reserved_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrReservedMemCurrent);
}
std::size_t cuda_async_memory_resource::used_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrUsedMemCurrent);
}
std::size_t cuda_async_memory_resource::peak_reserved_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrReservedMemHigh);
}
void cuda_async_memory_resource::reset_peak_reserved_bytes() {
  std::uint64_t zero = 0;  // the driver takes 0 as "reset the high-water mark to the current value"
  MRSTACK_CUDA_TRY(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
}

std::size_t cuda_async_memory_resource::do_free_bytes_held() const noexcept {
  try {
    std::size_t const reserved = reserved_bytes();
    std::size_t const used = used_bytes();
    return reserved > used ? reserved - used : 0;
  } catch (...) {
    return 0;
  }
}

void cuda_async_memory_resource::do_release() {
  detail::device_scope on_device{device_};
  MRSTACK_CUDA_TRY(cudaDeviceSynchronize());
  MRSTACK_CUDA_TRY(cudaMemPoolTrimTo(pool_, 0));
}

}  // namespace mrstack
