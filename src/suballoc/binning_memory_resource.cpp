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
  std::size_t const lo = std::bit_ceil(std::max<std::size_t>(min_size, default_alignment));
  std::size_t const hi = std::bit_ceil(max_size);
  if (hi < lo) {
    throw logic_error("binning: max size " + format_bytes(max_size) + " is below min size " + format_bytes(min_size));
  }
  if (hi > (std::size_t{1} << 40)) { throw logic_error("binning: max size " + format_bytes(max_size) + " is not sane"); }
  for (std::size_t size = lo; size <= hi; size *= 2) { add_bin(size); }
}

void binning_memory_resource::add_bin(std::size_t size, resource_ptr resource, std::size_t alignment) {
  if (size == 0) { throw logic_error("binning: a bin of 0 bytes"); }
  if (bins_.size() >= 255) { throw logic_error("binning: at most 255 bins"); }
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

std::size_t binning_memory_resource::do_free_bytes_held() const noexcept {
  std::size_t held = 0;
  for (auto const& b : bins_) {
    if (auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(b.resource.get())) {
      try {
        held += fixed->free_bytes();
      } catch (...) {
      }
    } else if (b.resource.get() != upstream_.get()) {
      held += b.resource->free_bytes_held();
    }
  }
  if (large_ != upstream_.get()) { held += large_->free_bytes_held(); }
  return held + upstream_->free_bytes_held();
}

void binning_memory_resource::do_release() {
  for (auto const& b : bins_) { b.resource->release(); }
  if (large_ != upstream_.get()) { large_->release(); }
  upstream_->release();
}

}  // namespace mrstack
