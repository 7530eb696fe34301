#include <mrstack/suballoc/binning_memory_resource.hpp>

#include <algorithm>
#include <bit>

#include <mrstack/suballoc/fixed_size_memory_resource.hpp>

namespace mrstack {

namespace {

/// Blocks per chunk for a default bin: at least 128, and chunks of at least 2 MiB, so
/// small bins do not call the upstream for every few kilobytes.
std::size_t blocks_per_chunk(std::size_t size) {
  constexpr std::size_t chunk = std::size_t{2} << 20;
  return std::max<std::size_t>(128, chunk / size);
}

}  // namespace

binning_memory_resource::binning_memory_resource(resource_ptr upstream, resource_ptr large)
    : upstream_{std::move(upstream)}, large_owner_{std::move(large)} {
  if (!upstream_) { throw logic_error("binning: the upstream resource is null"); }
  large_ = large_owner_ ? large_owner_.get() : upstream_.get();
  rebuild_index();
}

binning_memory_resource::binning_memory_resource(resource_ptr upstream, std::size_t min_size, std::size_t max_size,
                                                 resource_ptr large)
    : binning_memory_resource(std::move(upstream), std::move(large)) {
  if (max_size == 0) { return; }
  // Checked before any rounding: std::bit_ceil of a value above 2^63 is undefined.
  if (max_size > max_bin_size) {
    throw logic_error("binning: max size " + std::to_string(max_size) + " B exceeds the largest bin size, " +
                      format_bytes(max_bin_size));
  }
  if (min_size > max_size) {
    throw logic_error("binning: min size " + std::to_string(min_size) + " B is above max size " +
                      std::to_string(max_size) + " B");
  }
  std::size_t const lo = std::bit_ceil(std::max<std::size_t>(min_size, default_alignment));
  std::size_t const hi = std::max(lo, std::bit_ceil(max_size));  // a max below 256 B still gets the 256 B bin
  for (std::size_t size = lo; size <= hi; size *= 2) { add_bin(size); }
}

void binning_memory_resource::add_bin(std::size_t size, resource_ptr resource, std::size_t alignment) {
  if (size == 0 || size > max_bin_size) {
    throw logic_error("binning: a bin of " + std::to_string(size) + " B (bins hold 1 B to " + format_bytes(max_bin_size) +
                      ")");
  }
  if (bins_.size() >= 255) { throw logic_error("binning: at most 255 bins"); }
  if (alignment != 0 && !detail::is_pow2(alignment)) {
    throw logic_error("binning: bin alignment " + std::to_string(alignment) + " is not a power of two");
  }
  std::size_t const rounded = detail::align_up(size, default_alignment);
  if (!resource) {
    auto fixed = std::make_shared<fixed_size_memory_resource>(upstream_, rounded, blocks_per_chunk(rounded));
    alignment = fixed->block_alignment();
    resource = std::move(fixed);
  } else if (alignment == 0) {
    alignment = default_alignment;  // all a foreign resource promises
  }
  if (!detail::is_pow2(alignment)) { throw logic_error("binning: bin alignment must be a power of two"); }
  auto it = std::find_if(bins_.begin(), bins_.end(), [&](bin const& b) { return b.size >= rounded; });
  if (it != bins_.end() && it->size == rounded) {
    *it = bin{rounded, alignment, std::move(resource)};
  } else {
    bins_.insert(it, bin{rounded, alignment, std::move(resource)});
  }
  rebuild_index();
}

void binning_memory_resource::explain_bad_free(void const* ptr, std::size_t bytes, std::size_t alignment,
                                               memory_resource const& routed_to) const {
  // Only reached after the resource that (bytes, alignment) routes to refused the free:
  // when another bin holds that block live, the size (or alignment) given is wrong.
  for (auto const& b : bins_) {
    auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(b.resource.get());
    if (fixed == nullptr || fixed == &routed_to || !fixed->holds_live_block(ptr)) { continue; }
    std::string const routed = &routed_to == large_ ? "the large-allocation resource (" + large_->name() + ")"
                                                    : "a bin of other blocks";
    throw logic_error("binning: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                      " B (alignment " + std::to_string(alignment) + "): it was allocated from the " +
                      std::to_string(b.size) + " B bin (requests of up to " + std::to_string(b.size) +
                      " B), but that size goes to " + routed + ", which refused it; nothing was changed");
  }
}

fragmentation_info binning_memory_resource::do_fragmentation() const {
  fragmentation_info info;
  info.resource = "binning";
  auto add = [&info](fragmentation_info const& part) {
    info.held_bytes += part.held_bytes;
    info.live_bytes += part.live_bytes;
    info.free_bytes += part.free_bytes;
    info.free_blocks += part.free_blocks;
    info.largest_free_block = std::max(info.largest_free_block, part.largest_free_block);
    for (auto const& share : part.streams) {
      auto same = [&](fragmentation_info::stream_share const& x) {
        return x.stream == share.stream && x.thread_bound == share.thread_bound;
      };
      auto it = std::find_if(info.streams.begin(), info.streams.end(), same);
      if (it == info.streams.end()) {
        info.streams.push_back(share);
        continue;
      }
      it->free_bytes += share.free_bytes;
      it->free_blocks += share.free_blocks;
      it->largest_free_block = std::max(it->largest_free_block, share.largest_free_block);
    }
  };
  for (auto const& b : bins_) {
    if (b.resource.get() != upstream_.get()) { add(b.resource->fragmentation()); }
  }
  // The large resource counts when it is a suballocator of its own (not the upstream,
  // whose fragmentation is not this layer's).
  if (large_ != upstream_.get()) { add(large_->fragmentation()); }
  return info;
}

void binning_memory_resource::rebuild_index() {
  largest_bin_ = bins_.empty() ? 0 : bins_.back().size;
  for (unsigned log = 0; log < first_bin_.size(); ++log) {
    // Requests of ceil_log2 == log are > 2^(log-1): the first candidate is the first bin above that.
    std::size_t const above = log == 0 ? 0 : std::size_t{1} << (log - 1);
    std::size_t i = 0;
    while (i < bins_.size() && bins_[i].size <= above) { ++i; }
    first_bin_[log] = static_cast<std::uint8_t>(i);
  }
}

namespace {
/// Whether `below` is `r` or a layer under it: then r's free_bytes_held() includes below's.
bool stacks_on(memory_resource const* r, memory_resource const* below) noexcept {
  for (; r != nullptr; r = r->upstream()) {
    if (r == below) { return true; }
  }
  return false;
}
}  // namespace

std::size_t binning_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  std::size_t includes_upstream = 0;  // how many of the figures added include the upstream's
  auto add_layer = [&](memory_resource const* r) {
    held += r->free_bytes_held();
    if (stacks_on(r, upstream_.get())) { ++includes_upstream; }
  };
  for (auto const& b : bins_) {
    if (auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(b.resource.get())) {
      try {
        held += fixed->free_bytes();
      } catch (...) {
      }
    } else if (b.resource.get() != upstream_.get()) {
      add_layer(b.resource.get());
    }
  }
  if (large_ != upstream_.get()) { add_layer(large_); }
  // A layer over the upstream (a pool as the large resource, the usual setup) counts the
  // upstream's free bytes in its own figure: the upstream is counted once, not once more
  // for each such layer plus once here.
  std::size_t const upstream_free = upstream_->free_bytes_held();
  if (includes_upstream == 0) { return held + upstream_free; }
  std::size_t const extra = (includes_upstream - 1) * upstream_free;
  return held > extra ? held - extra : 0;  // figures read one after another may disagree
}

void binning_memory_resource::do_release() {
  for (auto const& b : bins_) { b.resource->release(); }
  if (large_ != upstream_.get()) { large_->release(); }
  upstream_->release();
}

}  // namespace mrstack
