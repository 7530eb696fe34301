#include <mrstack/suballoc/binning_memory_resource.hpp>

#include <algorithm>
#include <bit>

#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>

namespace mrstack {

namespace {

/// Whether `r` answers fragmentation() with figures of its own. The library's other layers
/// (the adaptors) answer with their upstream's (memory_resource::do_fragmentation), so a
/// pool behind an adaptor bin and as the large resource is one set of figures, not two.
bool answers_fragmentation(memory_resource const& r) noexcept {
  return dynamic_cast<pool_memory_resource const*>(&r) != nullptr ||
         dynamic_cast<arena_memory_resource const*>(&r) != nullptr ||
         dynamic_cast<fixed_size_memory_resource const*>(&r) != nullptr ||
         dynamic_cast<binning_memory_resource const*>(&r) != nullptr;
}

/// The layer whose figures `r->fragmentation()` gives: `r`, or the first layer under it
/// that answers for itself (the bottom of the stack when none does).
memory_resource const* fragmentation_layer(memory_resource const* r) noexcept {
  while (!answers_fragmentation(*r) && r->upstream() != nullptr) { r = r->upstream(); }
  return r;
}

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
    throw logic_error("binning: a bin of " + std::to_string(size) + " B (bins hold 256 B to " +
                      format_bytes(max_bin_size) + ")");
  }
  // Rounded up, such a size named another bin, which it replaced unseen (a bin of 300 B
  // took the place of the 512 B bin).
  if (size % default_alignment != 0) {
    throw logic_error("binning: a bin of " + std::to_string(size) + " B: bin sizes are multiples of " +
                      std::to_string(default_alignment) + " B (every block is " + std::to_string(default_alignment) +
                      "-byte aligned); nothing was added");
  }
  // Once blocks are out, a bin added or replaced reroutes their frees (a block of the
  // large resource freed to a new bin, refused), and a replaced bin's resource is
  // destroyed with its blocks still in use: their memory went back to the upstream.
  if (allocated_.load(std::memory_order_relaxed)) {
    throw logic_error("binning: a bin of " + std::to_string(size) +
                      " B added after the first allocation: the bins are fixed once allocation starts "
                      "(blocks handed out would be freed to another resource); nothing was added");
  }
  auto const same = std::find_if(bins_.begin(), bins_.end(), [&](bin const& b) { return b.size == size; });
  if (same == bins_.end() && bins_.size() >= 255) { throw logic_error("binning: at most 255 bins"); }
  if (alignment != 0 && !detail::is_pow2(alignment)) {
    throw logic_error("binning: bin alignment " + std::to_string(alignment) + " is not a power of two");
  }
  check_fixed_size_bin(size, resource, alignment);
  for (memory_resource const* below = resource.get(); below != nullptr; below = below->upstream()) {
    // The bin would call back into this resource: every allocation of its size looped forever.
    if (below == this) { throw logic_error("binning: the bin of " + std::to_string(size) + " B is this resource or stacked on it"); }
  }
  if (!resource) {
    auto fixed = std::make_shared<fixed_size_memory_resource>(upstream_, size, blocks_per_chunk(size));
    alignment = fixed->block_alignment();
    resource = std::move(fixed);
  } else if (alignment == 0) {
    alignment = default_alignment;  // all a foreign resource promises
  }
  if (!detail::is_pow2(alignment)) { throw logic_error("binning: bin alignment must be a power of two"); }
  auto it = std::find_if(bins_.begin(), bins_.end(), [&](bin const& b) { return b.size >= size; });
  if (it != bins_.end() && it->size == size) {
    *it = bin{size, alignment, std::move(resource)};
  } else {
    bins_.insert(it, bin{size, alignment, std::move(resource)});
  }
  rebuild_index();
}

void binning_memory_resource::check_fixed_size_bin(std::size_t size, resource_ptr const& resource,
                                                   std::size_t alignment) const {
  // A bin's requests reach its resource unchecked: a fixed_size that cannot serve them
  // refused every one with an error naming only its own block size.
  auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(resource.get());
  if (resource && fixed == nullptr) { return; }  // another kind of resource: its blocks are the caller's promise
  // Null: the fixed_size made here, whose blocks are aligned to the lowest set bit of `size`.
  std::size_t const block = fixed != nullptr ? fixed->block_size() : size;
  std::size_t const aligned = fixed != nullptr ? fixed->block_alignment() : size & (~size + 1);
  std::string const what = "binning: a bin of " + std::to_string(size) + " B";
  if (block < size) {
    throw logic_error(what + " served by a fixed_size of " + std::to_string(block) +
                      " B blocks: its requests would not fit; nothing was added");
  }
  if (alignment > aligned) {
    throw logic_error(what + " aligned to " + std::to_string(alignment) + " B, but its fixed_size blocks are aligned to " +
                      std::to_string(aligned) + " B only; nothing was added");
  }
}

void binning_memory_resource::explain_bad_free(void const* ptr, std::size_t bytes, std::size_t alignment,
                                               memory_resource const& routed_to, char const* refusal) const {
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
  if (&routed_to == large_) { return; }
  // A bin refused it and no bin holds it live: a double free, a foreign pointer, or a
  // block of the large resource freed with a bin's size. The bin cannot tell which; say
  // where the free went and what the large resource's blocks are freed with.
  auto const bin = std::find_if(bins_.begin(), bins_.end(), [&](auto const& b) { return b.resource.get() == &routed_to; });
  if (bin == bins_.end()) { return; }
  // Only a fixed_size bin can be asked whether it holds the block; with another kind of
  // bin the block may be that bin's.
  bool const all_asked = std::all_of(bins_.begin(), bins_.end(), [](auto const& b) {
    return dynamic_cast<fixed_size_memory_resource const*>(b.resource.get()) != nullptr;
  });
  throw logic_error("binning: deallocate of " + format_hex(ptr) + " with size " + std::to_string(bytes) +
                    " B (alignment " + std::to_string(alignment) + ") went to the " + std::to_string(bin->size) +
                    " B bin, which refused it (" + refusal + "); " +
                    (all_asked ? "no bin holds it live" : "no fixed_size bin holds it live (other bins cannot tell)") +
                    ". A block of the large-allocation resource (" + large_->name() +
                    ") is freed with the size it was allocated with, over " + std::to_string(largest_bin_) + " B");
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
  // Each suballocator is added once, whichever of its stacks reach it (several bins, bins
  // and the large requests, an adaptor in front of it); the upstream's figures are not
  // this layer's, nor are those of an adaptor in front of it.
  std::vector<memory_resource const*> seen{fragmentation_layer(upstream_.get())};
  auto add_once = [&](memory_resource const* r) {
    memory_resource const* const layer = fragmentation_layer(r);
    if (std::find(seen.begin(), seen.end(), layer) != seen.end()) { return; }
    seen.push_back(layer);
    add(layer->fragmentation());
  };
  for (auto const& b : bins_) { add_once(b.resource.get()); }
  add_once(large_);
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

/// Free bytes `r` holds itself, not those of the layers under it.
std::size_t own_free_bytes(memory_resource const& r) noexcept {
  if (auto const* fixed = dynamic_cast<fixed_size_memory_resource const*>(&r)) {
    try {
      return fixed->free_bytes();  // exact, and no second read of the layers under it
    } catch (...) {
      return 0;  // a statistic: no lock could be had (out of memory)
    }
  }
  std::size_t const all = r.free_bytes_held();
  std::size_t const below = r.upstream() != nullptr ? r.upstream()->free_bytes_held() : 0;
  return all > below ? all - below : 0;  // figures read one after another may disagree
}
}  // namespace

std::size_t binning_memory_resource::do_free_bytes_held() const noexcept {
  // The stacks this layer draws on (the upstream, the large resource, every bin) may
  // share layers: the upstream, or a pool under several bins or under a bin and the large
  // resource (or the same resource in several places). Adding up each stack's
  // free_bytes_held() counted such a layer once per stack on it, and a fixed_size bin
  // over a layer other than the upstream not at all. So every layer is counted once,
  // with its own free bytes: each stack is walked down to the first layer that an
  // earlier stack reached (that one and everything under it are counted already).
  auto stack = [this](std::size_t i) -> memory_resource const* {
    return i == 0 ? upstream_.get() : i == 1 ? large_ : bins_[i - 2].resource.get();
  };
  auto reached_before = [&](memory_resource const* r, std::size_t i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (stacks_on(stack(j), r)) { return true; }
    }
    return false;
  };
  std::size_t held = 0;
  for (std::size_t i = 0; i < bins_.size() + 2; ++i) {
    for (memory_resource const* r = stack(i); r != nullptr && !reached_before(r, i); r = r->upstream()) {
      held += own_free_bytes(*r);
    }
  }
  return held;
}

void binning_memory_resource::do_release() {
  for (auto const& b : bins_) { b.resource->release(); }
  if (large_ != upstream_.get()) { large_->release(); }
  upstream_->release();
}

}  // namespace mrstack
