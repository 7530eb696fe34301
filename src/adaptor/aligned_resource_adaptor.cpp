#include <mrstack/error.hpp>
#include <mrstack/adaptor/aligned_resource_adaptor.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

namespace mrstack {


aligned_resource_adaptor::aligned_resource_adaptor(resource_ptr upstream, std::size_t alignment,
                                                   std::size_t threshold)
    : upstream_{std::move(upstream)}, alignment_{alignment}, threshold_{threshold} {
  if (upstream_ == nullptr) { throw logic_error("aligned: upstream resource is null"); }
  if (!detail::is_pow2(alignment_)) {
    throw logic_error("aligned: alignment " + std::to_string(alignment_) + " is not a power of two");
  }
  if (alignment_ < default_alignment) { alignment_ = default_alignment; }
}

std::size_t aligned_resource_adaptor::outstanding_over_aligned() const {
  std::size_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard lock{s.mutex};
    n += s.by_aligned.size();
  }
  return n;
}

namespace {
std::string sized(std::size_t bytes, std::size_t alignment) {
  return std::to_string(bytes) + " B, alignment " + std::to_string(alignment);
}
/// 256-byte units, rounded up, without the wrap of align_up near SIZE_MAX.
std::size_t units(std::size_t bytes) { return bytes / 256 + (bytes % 256 != 0 ? 1 : 0); }
}  // namespace

void* aligned_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  std::size_t const align = effective_alignment(bytes, alignment);
  if (align <= default_alignment) { return upstream_->allocate(bytes, stream, alignment); }
  std::size_t const padding = align - default_alignment;
  if (bytes > std::numeric_limits<std::size_t>::max() - padding) {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = "aligned";
    info.detail = "the request plus " + std::to_string(padding) + " B of alignment padding overflows";
    throw out_of_memory(std::move(info));
  }
  void* const raw = upstream_->allocate(bytes + padding, stream, default_alignment);
  auto const original = reinterpret_cast<std::uintptr_t>(raw);
  if (original % default_alignment != 0) {
    // The padding covers the distance to an aligned address only from a 256-aligned start:
    // from a broken upstream's pointer the block handed out would run up to 255 bytes past
    // the upstream's. Give it back and say so rather than hand out memory it does not own.
    upstream_->deallocate(raw, bytes + padding, stream, default_alignment);
    throw logic_error("aligned: the upstream (" + upstream_->name() + ") handed out " + format_hex(original) +
                      " for " + std::to_string(bytes + padding) + " B at alignment 256, which is not 256-aligned; "
                      "nothing was allocated");
  }
  std::uintptr_t const aligned = detail::align_up(original, align);
  try {
    remember(aligned, original, bytes, align);
  } catch (...) {
    upstream_->deallocate(raw, bytes + padding, stream, default_alignment);
    throw;
  }
  return reinterpret_cast<void*>(aligned);
}

void aligned_resource_adaptor::remember(std::uintptr_t aligned, std::uintptr_t original, std::size_t bytes,
                                        std::size_t align) {
  // Set before the block is handed out, so a thread that is given the pointer sees it.
  if (!any_over_aligned_.load(std::memory_order_relaxed)) { any_over_aligned_.store(true, std::memory_order_relaxed); }
  shard& front = shard_for(aligned);
  shard& behind = shard_behind(original);  // the same shard at the configured alignment: one lock
  // Both locks at once so neither table ever holds half an allocation.
  auto const locks = lock_both(front, behind);
  // Only a broken upstream hands out overlapping memory; say so rather than corrupt the tables.
  auto const overlapping = [&] {
    return logic_error("aligned: the upstream handed out " + format_hex(original) + ", whose aligned address " +
                       format_hex(aligned) + " or itself is already outstanding");
  };
  if (!front.by_aligned.insert(aligned, record{original, bytes, align})) { throw overlapping(); }  // may throw: no room
  bool inserted = false;
  try {
    inserted = behind.by_original.insert(original, record{aligned, bytes, align});
  } catch (...) {
    front.by_aligned.erase(aligned);
    throw;
  }
  if (!inserted) {
    front.by_aligned.erase(aligned);
    throw overlapping();
  }
}

void aligned_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment,
                                             stream_view stream) {
  std::size_t const align = effective_alignment(bytes, alignment);
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  if (align <= default_alignment) {
    if (any_over_aligned_.load(std::memory_order_relaxed)) { refuse_if_over_aligned(address, bytes, alignment); }
    upstream_->deallocate(ptr, bytes, stream, alignment);
    return;
  }
  // The upstream gets back exactly what it handed out, whatever rounding the size given had.
  record const r = forget(address, bytes, align);
  try {
    upstream_->deallocate(reinterpret_cast<void*>(r.other), r.bytes + (align - default_alignment), stream,
                          default_alignment);
  } catch (...) {
    // Refused below (a checking layer, a stream error): the block is still live upstream,
    // so it must stay known here, or a retried free would be refused as foreign and a
    // pass-through free of the upstream's pointer behind it let through. forget() kept
    // the tables' room, so this needs no host memory and the upstream's error is the one
    // that propagates.
    put_back(address, r);
    throw;
  }
  give_up_rooms(address, r.other);
}

std::pair<std::unique_lock<std::mutex>, std::unique_lock<std::mutex>> aligned_resource_adaptor::lock_both(
    shard& a, shard& b) {
  // In address order, so two threads taking the same two never deadlock.
  std::unique_lock first{&a < &b ? a.mutex : b.mutex};
  std::unique_lock second{&a < &b ? b.mutex : a.mutex, std::defer_lock};
  if (&a != &b) { second.lock(); }
  return {std::move(first), std::move(second)};
}

void aligned_resource_adaptor::put_back(std::uintptr_t aligned, record const& r) {
  auto const locks = lock_both(shard_for(aligned), shard_behind(r.other));
  shard_for(aligned).by_aligned.put_back(aligned, r);
  shard_behind(r.other).by_original.put_back(r.other, record{aligned, r.bytes, r.alignment});
}

void aligned_resource_adaptor::give_up_rooms(std::uintptr_t aligned, std::uintptr_t original) {
  auto const locks = lock_both(shard_for(aligned), shard_behind(original));
  shard_for(aligned).by_aligned.give_up_room();
  shard_behind(original).by_original.give_up_room();
}

aligned_resource_adaptor::record aligned_resource_adaptor::forget(std::uintptr_t aligned, std::size_t bytes,
                                                                  std::size_t align) {
  shard& front = shard_for(aligned);
  std::unique_lock lock{front.mutex};
  record found{};
  {
    record const* r = front.by_aligned.find(aligned);
    if (r == nullptr) {
      // Blocks that were not over-aligned went to the upstream unrecorded: such a block
      // freed with an over-aligning size or alignment is live, not foreign, and is freed
      // with the size and alignment it was allocated with.
      bool const some_pass_through = threshold_ > 0 || alignment_ <= default_alignment;
      std::string const under = threshold_ > 0 ? "a size under " + std::to_string(threshold_) + " B and " : "";
      throw logic_error("aligned: deallocate of " + format_hex(aligned) + " (" + sized(bytes, align) +
                        "), which is no over-aligned block of this adaptor: it did not hand out this pointer, or "
                        "it was already freed" +
                        (some_pass_through ? ", or it was allocated without over-alignment (" + under +
                                                 "an alignment of at most " + std::to_string(default_alignment) +
                                                 " B: the upstream's block, freed with the size and alignment it "
                                                 "was allocated with)"
                                           : std::string{}) +
                        "; nothing was freed");
    }
    // Sizes compare as the pool's do (rounded to 256), here, before anything is forgotten.
    if (r->alignment != align || units(r->bytes) != units(bytes)) {
      throw logic_error("aligned: deallocate of " + format_hex(aligned) + " with " + sized(bytes, align) +
                        ", but it was allocated with " + sized(r->bytes, r->alignment) + "; nothing was freed");
    }
    found = *r;
  }
  // Rooms kept (no allocation to put it back if the upstream refuses the free), until
  // do_deallocate puts the block back or releases them.
  front.by_aligned.erase_keeping_room(aligned);
  shard& behind = shard_behind(found.other);
  if (&behind != &front) {
    lock.unlock();  // one lock at a time: remember() takes two only in address order
    lock = std::unique_lock{behind.mutex};
  }
  behind.by_original.erase_keeping_room(found.other);
  return found;
}

void aligned_resource_adaptor::refuse_if_over_aligned(std::uintptr_t ptr, std::size_t bytes,
                                                      std::size_t alignment) const {
  // The pointer as an over-aligned block's own address (freed with too small a size or
  // alignment to be recognised as one), or as the upstream's pointer behind one.
  std::optional<record> own;
  std::optional<record> behind;
  {
    shard& front = shard_for(ptr);
    shard& back = shard_behind(ptr);
    auto const locks = lock_both(front, back);
    if (record const* r = front.by_aligned.find(ptr)) { own = *r; }
    if (record const* r = back.by_original.find(ptr)) { behind = *r; }
  }
  if (!own && !behind) { return; }
  std::string const given = "aligned: deallocate of " + format_hex(ptr) + " (" +
                            sized(bytes, std::max(alignment, default_alignment)) + "), but ";
  if (own) { throw logic_error(given + "it was allocated with " + sized(own->bytes, own->alignment) + "; nothing was freed"); }
  throw logic_error(given + "it is not a block this adaptor handed out: it is the start of the upstream block "
                    "behind the live allocation " + format_hex(behind->other) + " (" +
                    sized(behind->bytes, behind->alignment) + "), a stale or foreign pointer; nothing was freed");
}

}  // namespace mrstack
