#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>

#include <cstdio>
#include <limits>

#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack {

namespace {

constexpr std::size_t granularity = 256;

}  // namespace

arena_memory_resource::arena_memory_resource(resource_ptr upstream, std::size_t arena_size, arena_options options)
    : upstream_{std::move(upstream)} {
  if (!upstream_) { throw logic_error("arena: the upstream resource is null"); }
  std::size_t const sb = options.superblock_size;
  if (!detail::is_pow2(sb)) { throw logic_error("arena: superblock size " + std::to_string(sb) + " is not a power of two"); }
  if (arena_size == 0 || arena_size > std::numeric_limits<std::size_t>::max() / 2) {
    throw logic_error("arena: arena size " + std::to_string(arena_size) + " must be positive and sane");
  }
  usable_size_ = detail::align_up(arena_size, sb);
  // The upstream aligns to 256 only: take room to align the region to a superblock.
  region_size_ = usable_size_ + sb - granularity;
  auto sync = options.stream_sync ? options.stream_sync : default_stream_sync(upstream_->kind());
  region_ = upstream_->allocate(region_size_, stream_view{}, granularity);
  try {
    // The region is taken on the default stream; waiting for it once makes it usable by
    // every stream without an event.
    sync->synchronize(0);
    base_ = detail::align_up(reinterpret_cast<std::uintptr_t>(region_), sb);
    detail::arena_core::options opts;
    opts.superblock_size = sb;
    opts.max_small_size = options.max_small_size;
    opts.empty_superblocks_kept = options.empty_superblocks_kept;
    core_ = std::make_unique<detail::arena_core>(base_, usable_size_, opts, std::move(sync));
  } catch (std::invalid_argument const& e) {
    upstream_->deallocate(region_, region_size_, stream_view{}, granularity);
    throw logic_error(e.what());
  } catch (...) {
    upstream_->deallocate(region_, region_size_, stream_view{}, granularity);
    throw;
  }
}

arena_memory_resource::~arena_memory_resource() {
  detail::stream_ref s{};
  try {
    s = core_->return_stream();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: arena destructor could not synchronize: %s\n", e.what());
  }
  core_.reset();
  try {
    upstream_->deallocate(region_, region_size_, to_stream_view(s), granularity);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: arena destructor could not return its region: %s\n", e.what());
  }
}

void* arena_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  alignment = std::max(alignment, granularity);
  std::size_t const size = detail::align_up(bytes, granularity);
  if (std::uintptr_t const p = core_->allocate(size, alignment, to_stream_ref(stream)); p != 0 && size >= bytes) {
    return reinterpret_cast<void*>(p);
  }
  auto const st = core_->stats();
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "arena";
  info.footprint_bytes = usable_size_;
  info.free_bytes = st.global_free_bytes + st.free_bytes_in_arenas;
  info.largest_free_block = st.largest_free_block;
  info.limit_bytes = usable_size_;
  info.detail = core_->is_small(size, alignment) ? "no superblock left for a small block"
                                                  : "no free range large enough in the global arena";
  throw out_of_memory(std::move(info));
}

void arena_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  alignment = std::max(alignment, granularity);
  if (!core_->deallocate(reinterpret_cast<std::uintptr_t>(ptr), detail::align_up(bytes, granularity), alignment,
                         to_stream_ref(stream))) {
    throw logic_error("arena: deallocate of " + format_hex(ptr) + " (" + std::to_string(bytes) +
                      " B), which this arena did not hand out with that size, or has already taken back");
  }
}

std::size_t arena_memory_resource::do_free_bytes_held() const noexcept {
  try {
    auto const st = core_->stats();
    return st.global_free_bytes + st.free_bytes_in_arenas + upstream_->free_bytes_held();
  } catch (...) {
    return upstream_->free_bytes_held();
  }
}

void arena_memory_resource::do_release() {
  core_->reclaim();
  // Free memory several streams hold cannot merge; once the device is idle it can.
  core_->synchronize_everything();
  upstream_->release();
}

}  // namespace mrstack
