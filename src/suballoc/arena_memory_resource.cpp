#include <mrstack/error.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>

#include <cstdio>
#include <limits>

#include <mrstack/detail/virtual_range.hpp>
#include <mrstack/suballoc/stream_sync.hpp>

namespace mrstack {

namespace {

constexpr std::size_t granularity = 256;

detail::arena_core::options core_options(arena_options const& o, std::size_t max_size, memory_resource& upstream) {
  detail::arena_core::options opts;
  opts.superblock_size = o.superblock_size;
  opts.max_small_size = o.max_small_size;
  opts.empty_superblocks_kept = o.empty_superblocks_kept;
  opts.max_size = max_size;
  opts.eager = o.eager;
  opts.max_free_bytes = o.max_free_bytes == arena_options::a_quarter_of_the_size ? max_size / 4 : o.max_free_bytes;
  opts.growth_divisor = o.growth_divisor;
  opts.minimum_growth = o.minimum_growth;
  opts.thread_shards = o.thread_shards;
  opts.shard_after_contentions = o.shard_after_contentions;
  opts.grow_in_place_over = o.grow_in_place && !o.eager ? dynamic_cast<virtual_range*>(&upstream) : nullptr;
  return opts;
}

// Why the current allocate call's growth was refused, on this thread. Not one reason per
// resource: one kept since an earlier call (or another thread's) was named by every later
// out_of_memory, long after the upstream had room again. Nested calls (an arena whose
// upstream is an arena) each have their own, the outer one put back when the inner ends.
struct refusal_note {
  void const* source = nullptr;  // the resource's chunk_source
  std::string reason;
};
thread_local refusal_note* current_refusal = nullptr;

/// The note of one allocate call, current while it lives.
class refusal_scope {
 public:
  explicit refusal_scope(void const* source) : note_{source, {}}, outer_{current_refusal} {
    current_refusal = &note_;
  }
  ~refusal_scope() { current_refusal = outer_; }
  refusal_scope(refusal_scope const&) = delete;
  refusal_scope& operator=(refusal_scope const&) = delete;
  [[nodiscard]] std::string const& reason() const noexcept { return note_.reason; }

 private:
  refusal_note note_;
  refusal_note* outer_;
};

}  // namespace

void arena_memory_resource::chunk_source::refused(std::string const& why) const {
  if (current_refusal != nullptr && current_refusal->source == this) { current_refusal->reason = why; }
}

std::uintptr_t arena_memory_resource::chunk_source::allocate(std::size_t size, detail::stream_ref const& s) {
  void* p = nullptr;
  try {
    p = up_.allocate(size, to_stream_view(s), granularity);
  } catch (out_of_memory const& e) {
    refused(e.what());
    return 0;
  }
  if (!detail::is_aligned(p, granularity)) {
    up_.deallocate(p, size, to_stream_view(s), granularity);
    throw logic_error("arena: upstream " + up_.name() + " returned " + format_hex(p) + ", which is not 256-byte aligned");
  }
  return reinterpret_cast<std::uintptr_t>(p);
}

void arena_memory_resource::chunk_source::deallocate(std::uintptr_t base, std::size_t size,
                                                     detail::stream_ref const& s) noexcept {
  try {
    up_.deallocate(reinterpret_cast<void*>(base), size, to_stream_view(s), granularity);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: arena could not return a chunk to its upstream: %s\n", e.what());
  }
}

arena_memory_resource::arena_memory_resource(resource_ptr upstream, std::size_t arena_size, arena_options options)
    : upstream_{std::move(upstream)}, source_{*(upstream_ ? upstream_ : throw logic_error("arena: the upstream resource is null"))} {
  std::size_t const sb = options.superblock_size;
  if (!detail::is_pow2(sb)) { throw logic_error("arena: superblock size " + std::to_string(sb) + " is not a power of two"); }
  if (arena_size == 0 || arena_size > std::numeric_limits<std::size_t>::max() / 2) {
    throw logic_error("arena: arena size " + std::to_string(arena_size) + " must be positive and sane");
  }
  // A stream arena reserves room for twice this many superblocks: a huge value failed at
  // the first allocation (bad_alloc, "vector::reserve").
  if (options.empty_superblocks_kept > arena_options::max_empty_superblocks_kept) {
    throw logic_error("arena: empty_superblocks_kept " + std::to_string(options.empty_superblocks_kept) +
                      " exceeds " + std::to_string(arena_options::max_empty_superblocks_kept));
  }
  usable_size_ = detail::align_up(arena_size, sb);
  auto sync = options.stream_sync ? options.stream_sync : default_stream_sync(upstream_->kind());
  try {
    // Eager: room to align the region to a superblock (the upstream aligns to 256 only).
    std::size_t const max_size = options.eager ? usable_size_ + sb - granularity : usable_size_;
    core_ = std::make_unique<detail::arena_core>(source_, core_options(options, max_size, *upstream_), sync);
  } catch (std::invalid_argument const& e) {
    throw logic_error(e.what());
  }
  if (!options.eager) { return; }
  std::size_t const region_size = usable_size_ + sb - granularity;
  void* region = upstream_->allocate(region_size, stream_view{}, granularity);
  try {
    // The region is taken on the default stream; waiting for it once makes it usable by
    // every stream without an event.
    sync->synchronize(0);
  } catch (...) {
    upstream_->deallocate(region, region_size, stream_view{}, granularity);
    throw;
  }
  core_->add_eager_region(reinterpret_cast<std::uintptr_t>(region), region_size);  // gives it back if it fails
}

arena_memory_resource::~arena_memory_resource() = default;

void* arena_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  alignment = std::max(alignment, granularity);
  // A block and the padding its alignment may need past the maximum can never be served:
  // refused before the arena grows for it.
  if (bytes > usable_size_ || alignment - granularity > usable_size_ - detail::align_up(bytes, granularity)) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "arena";
    info.limit_bytes = usable_size_;
    info.detail = bytes > usable_size_ ? "larger than the arena's maximum size"
                                       : "alignment " + std::to_string(alignment) +
                                             " too large: the block and its alignment padding exceed the arena's maximum size";
    throw out_of_memory(std::move(info));
  }
  std::size_t const size = detail::align_up(bytes, granularity);
  refusal_scope const refusal{&source_};  // growth refused during this call only
  if (std::uintptr_t const p = core_->allocate(size, alignment, to_stream_ref(stream)); p != 0 && size >= bytes) {
    return reinterpret_cast<void*>(p);
  }
  auto const st = core_->stats();
  allocation_failure info;
  info.requested_bytes = bytes;
  info.resource = "arena";
  info.footprint_bytes = st.held_bytes;
  info.free_bytes = st.global_free_bytes + st.free_bytes_in_arenas;
  info.largest_free_block = st.largest_free_block;
  info.limit_bytes = usable_size_;
  info.detail = core_->is_small(size, alignment) ? "no superblock left for a small block"
                                                  : "no free range large enough in the global arena";
  info.detail += refusal.reason().empty() ? std::string{" (the maximum size is reached)"}
                                          : " (upstream refused: " + refusal.reason() + ")";
  throw out_of_memory(std::move(info));
}

void arena_memory_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) {
  // No block is larger than the arena (and such a size, rounded up, would saturate to the
  // block pool's "any size", which frees whatever block starts there unchecked); no block
  // was handed out with an alignment that is not a power of two.
  if (bytes <= usable_size_ && detail::is_pow2(alignment) &&
      core_->deallocate(reinterpret_cast<std::uintptr_t>(ptr), detail::align_up(bytes, granularity),
                        std::max(alignment, granularity), to_stream_ref(stream))) {
    return;
  }
  refuse_free(ptr, bytes, alignment);
}

void arena_memory_resource::refuse_free(void* ptr, std::size_t bytes, std::size_t alignment) const {
  auto const p = reinterpret_cast<std::uintptr_t>(ptr);
  std::string const what = "arena: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                           " B (alignment " + std::to_string(alignment) + ")";
  std::size_t const actual = core_->live_size(p);
  if (!detail::is_pow2(alignment)) {
    throw logic_error(what + ", but an alignment must be a power of two" +
                      (actual != 0 ? " (the block there is " + std::to_string(actual) + " B)" : std::string{}) +
                      "; nothing was freed");
  }
  if (actual != 0) {
    std::string const why = bytes > usable_size_ || actual != detail::align_up(bytes, granularity)
                                ? "its block is " + std::to_string(actual) + " B"
                                : "its block was handed out with alignment " +
                                      std::to_string(core_->handed_out_alignment(p));
    throw logic_error(what + ", but " + why + "; nothing was freed");
  }
  throw logic_error(what + ", which this arena did not hand out or has already taken back");
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
  core_->release_free_chunks();
  upstream_->release();
}

fragmentation_info arena_memory_resource::do_fragmentation() const {
  auto const st = core_->stats();
  fragmentation_info f;
  f.resource = "arena";
  f.held_bytes = st.held_bytes;
  f.free_bytes = st.global_free_bytes + st.free_bytes_in_arenas;
  // Not held - free: a superblock's tail its class cannot use, and blocks freed inside a
  // capture, are neither.
  f.live_bytes = st.large_live_bytes + st.small_live_bytes;
  // The stream arenas are read one at a time after the global arena and the depot: a
  // superblock that moved between them meanwhile is seen on both sides (free bytes above
  // the held, seen under a concurrent release()). Such an answer is clamped to what is held.
  f.live_bytes = std::min(f.live_bytes, f.held_bytes);
  f.free_bytes = std::min(f.free_bytes, f.held_bytes - f.live_bytes);
  f.largest_free_block = std::min(std::max(st.largest_free_block, st.largest_free_in_arenas), f.free_bytes);
  f.free_blocks = st.global_free_blocks + st.free_blocks_in_arenas;
  for (auto const& s : st.streams) {
    fragmentation_info::stream_share share;
    share.stream = s.stream.thread_bound ? s.stream.key : s.stream.handle;
    share.thread_bound = s.stream.thread_bound;
    share.free_bytes = s.free_bytes;
    share.largest_free_block = s.largest_free_block;
    share.free_blocks = s.free_blocks;
    f.streams.push_back(share);
  }
  return f;
}

}  // namespace mrstack
