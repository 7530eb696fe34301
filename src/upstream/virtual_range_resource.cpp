#include <mrstack/error.hpp>
#include <mrstack/detail/coalescing_insert.hpp>
#include <mrstack/upstream/virtual_range_resource.hpp>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <vector>

namespace mrstack {

namespace {

// Every live virtual range in the process, so an IPC path can recognise such memory from
// the pointer alone, and so simulated ranges get fake addresses that never overlap.
struct range_registry {
  std::mutex mutex;
  std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;  // (base, bytes), sorted by base

  // Fake ranges live far above any canonical user-space address, so they can never alias
  // real memory (simulated pointers are never dereferenced).
  static constexpr std::uintptr_t fake_floor = 0x4000000000000000ULL;
  static constexpr std::uintptr_t fake_ceiling = 0x7000000000000000ULL;

  std::uintptr_t add(std::uintptr_t base, std::size_t bytes, std::size_t align) {
    std::lock_guard lock{mutex};
    if (base == 0) {
      std::uintptr_t candidate = fake_floor;
      for (auto const& [b, n] : ranges) {
        if (b + n <= candidate) { continue; }
        if (b >= candidate && b - candidate >= bytes) { break; }
        candidate = detail::align_up(b + n, align);
      }
      if (candidate < fake_floor || candidate >= fake_ceiling || fake_ceiling - candidate < bytes) {
        throw logic_error("simulated_vmm: no fake address range of " + format_bytes(bytes) + " left");
      }
      base = candidate;
    }
    auto const at = std::lower_bound(ranges.begin(), ranges.end(), std::make_pair(base, std::size_t{0}));
    ranges.insert(at, {base, bytes});
    return base;
  }
  void remove(std::uintptr_t base) noexcept {
    std::lock_guard lock{mutex};
    auto const at = std::find_if(ranges.begin(), ranges.end(), [&](auto const& r) { return r.first == base; });
    if (at != ranges.end()) { ranges.erase(at); }
  }
  bool contains(std::uintptr_t p) noexcept {
    std::lock_guard lock{mutex};
    auto at = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(p, std::numeric_limits<std::size_t>::max()));
    if (at == ranges.begin()) { return false; }
    --at;
    return p - at->first < at->second;
  }
};

// True when every granule of [first, last) lies in one of the asleep stretches.
bool is_asleep_span(std::map<std::size_t, std::size_t> const& asleep, std::size_t first, std::size_t last) {
  if (first >= last) { return true; }
  auto it = asleep.upper_bound(first);
  if (it == asleep.begin()) { return false; }
  --it;
  // Stretches end at run boundaries (granule_map::committed_stretches), so the span may
  // cover several that follow one another.
  for (std::size_t covered = first; it != asleep.end() && it->first <= covered; ++it) {
    covered = std::max(covered, it->second);
    if (covered >= last) { return true; }
  }
  return false;
}

// A backend's out_of_memory names the physical allocation it could not make (a whole run);
// the caller asked for something else. Rethrown naming the caller's request, and why.
[[noreturn]] void refuse_for_caller(out_of_memory const& e, std::string const& resource, std::size_t bytes,
                                    std::size_t footprint, std::string const& request) {
  allocation_failure info = e.info();
  info.requested_bytes = bytes;
  info.resource = resource;
  info.footprint_bytes = footprint;
  info.detail = request + ": " + e.info().detail;
  throw out_of_memory(std::move(info));
}

range_registry& registry() {
  static range_registry r;  // leaked order-safely: function-local static
  return r;
}

}  // namespace

virtual_range const* find_virtual_range(memory_resource const& top, void const* ptr) noexcept {
  for (memory_resource const* layer = &top; layer != nullptr; layer = layer->upstream()) {
    auto const* range = dynamic_cast<virtual_range const*>(layer);
    if (range != nullptr && range->owns(ptr)) { return range; }
  }
  return nullptr;
}

bool is_virtual_range_address(void const* ptr) noexcept {
  return registry().contains(reinterpret_cast<std::uintptr_t>(ptr));
}

virtual_range_resource* find_virtual_range_resource(memory_resource& top) noexcept {
  for (memory_resource* layer = &top; layer != nullptr; layer = const_cast<memory_resource*>(layer->upstream())) {
    if (auto* range = dynamic_cast<virtual_range_resource*>(layer); range != nullptr) { return range; }
  }
  return nullptr;
}

namespace {
virtual_range_resource& sleepable_layer(memory_resource& top, char const* op) {
  virtual_range_resource* const range = find_virtual_range_resource(top);
  if (range == nullptr) {
    throw logic_error(std::string{op} + ": the stack \"" + describe_stack(top) +
                      "\" has no vmm (or simulated_vmm) layer; sleep and wake need one, e.g. pool > vmm");
  }
  return *range;
}
}  // namespace

void sleep_stack(memory_resource& top, bool keep_contents) {
  virtual_range_resource& range = sleepable_layer(top, "sleep");
  if (range.asleep()) { throw logic_error("sleep: the stack \"" + describe_stack(top) + "\" is already asleep"); }
  top.release();  // free granules need neither copying nor mapping back
  range.sleep(keep_contents);
}

void wake_stack(memory_resource& top) { sleepable_layer(top, "wake").wake(); }

bool stack_asleep(memory_resource& top) noexcept {
  virtual_range_resource const* const range = find_virtual_range_resource(top);
  return range != nullptr && range->asleep();
}

// ---- construction ------------------------------------------------------------------------

virtual_range_resource::virtual_range_resource(std::string name, std::uintptr_t base, std::size_t range_bytes,
                                               std::size_t granularity, std::size_t map_granules,
                                               detail::granule_backend& backend)
    : name_{std::move(name)},
      base_{0},
      range_bytes_{range_bytes},
      granularity_{granularity},
      map_granules_{map_granules},
      map_{range_bytes, granularity, map_granules},  // validates the sizes
      backend_{*this, backend} {
  if (!detail::is_pow2(granularity) || granularity < default_alignment) {
    throw logic_error(name_ + ": granularity " + std::to_string(granularity) +
                      " B must be a power of two of at least 256 B");
  }
  if (base % granularity != 0) {
    throw logic_error(name_ + ": reserved range at " + format_hex(base) + " is not aligned to the granularity");
  }
  base_ = registry().add(base, range_bytes, granularity);
  free_addresses_.emplace(0, range_bytes);
}

virtual_range_resource::~virtual_range_resource() {
  if (map_.mapped_granules() != 0) {
    std::fprintf(stderr,
                 "mrstack: %s destroyed with %zu granules still mapped (its destructor must call "
                 "release_everything)\n",
                 name_.c_str(), map_.mapped_granules());
  }
  registry().remove(base_);
}

void virtual_range_resource::release_everything() noexcept {
  std::lock_guard lock{mutex_};
  if (asleep_.load(std::memory_order_relaxed)) {
    asleep_granules_.clear();
    backend_.drop_saved_contents();
    asleep_bytes_.store(0, std::memory_order_relaxed);
    asleep_.store(false, std::memory_order_release);
  }
  try {
    map_.decommit(0, map_.granule_count(), backend_);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: %s could not give back its memory: %s\n", name_.c_str(), e.what());
  }
  sync_counters();
  if (!live_.empty()) {
    std::fprintf(stderr, "mrstack: %s destroyed with %zu allocations outstanding\n", name_.c_str(), live_.size());
  }
}

// ---- counting ----------------------------------------------------------------------------

std::uint64_t virtual_range_resource::counting_backend::map(std::size_t offset, std::size_t bytes) {
  std::uint64_t const handle = inner_.map(offset, bytes);
  owner_.map_calls_.fetch_add(1, std::memory_order_relaxed);
  return handle;
}

void virtual_range_resource::counting_backend::unmap(std::size_t offset, std::size_t bytes, std::uint64_t handle) {
  try {
    inner_.unmap(offset, bytes, handle);
  } catch (detail::unmapped_with_error const&) {
    owner_.unmap_calls_.fetch_add(1, std::memory_order_relaxed);  // the addresses were given back
    throw;
  }
  owner_.unmap_calls_.fetch_add(1, std::memory_order_relaxed);
}

void virtual_range_resource::sync_counters() noexcept {
  std::size_t const mapped = map_.mapped_granules() * granularity_;
  committed_bytes_.store(map_.committed_granules() * granularity_, std::memory_order_relaxed);
  mapped_bytes_.store(mapped, std::memory_order_relaxed);
  if (mapped > peak_mapped_bytes_.load(std::memory_order_relaxed)) {
    peak_mapped_bytes_.store(mapped, std::memory_order_relaxed);
  }
}

// ---- the virtual_range capability ---------------------------------------------------------

std::size_t virtual_range_resource::offset_of(void const* ptr, std::size_t bytes, char const* op) const {
  auto const p = reinterpret_cast<std::uintptr_t>(ptr);
  if (p < base_ || p - base_ > range_bytes_ || bytes > range_bytes_ - (p - base_)) {
    throw logic_error(name_ + ": " + op + " of [" + format_hex(p) + ", +" + std::to_string(bytes) +
                      " B) is outside its reserved range [" + format_hex(base_) + ", +" + format_bytes(range_bytes_) + ")");
  }
  return p - base_;
}

void virtual_range_resource::claim(std::string_view claimant) {
  std::lock_guard lock{mutex_};
  if (claimed_) {
    throw logic_error(name_ + ": its range is already claimed by " + claimant_ + "; " + std::string{claimant} +
                      " needs a " + name_ + " of its own");
  }
  if (!live_.empty()) {
    throw logic_error(name_ + ": cannot be claimed by " + std::string{claimant} + " while " +
                      std::to_string(live_.size()) + " allocations from it are outstanding");
  }
  claimant_ = claimant;  // first: when copying the name throws, the range stays unclaimed
  claimed_ = true;
}

void virtual_range_resource::unclaim() noexcept {
  std::lock_guard lock{mutex_};
  if (!claimed_) { return; }
  if (asleep_.load(std::memory_order_relaxed)) {  // nothing stays committed, so nothing is left to wake
    (void)forget_asleep(0, map_.granule_count());
    backend_.drop_saved_contents();
    contents_kept_ = false;
    asleep_.store(false, std::memory_order_release);
  }
  try {
    map_.decommit(0, map_.granule_count(), backend_);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "mrstack: %s could not give back what %s committed: %s\n", name_.c_str(), claimant_.c_str(),
                 e.what());
  }
  sync_counters();
  claimed_ = false;
  claimant_.clear();
}

std::size_t virtual_range_resource::commit(void* ptr, std::size_t bytes) {
  std::lock_guard lock{mutex_};
  std::size_t const offset = offset_of(ptr, bytes, "commit");
  if (!claimed_) { throw logic_error(name_ + ": commit without a claim on its range (call claim first)"); }
  refuse_while_asleep("commit");
  if (bytes == 0) { return 0; }
  std::size_t const first = offset / granularity_;
  std::size_t const last = detail::align_up(offset + bytes, granularity_) / granularity_;
  std::size_t newly = 0;
  try {
    newly = map_.commit(first, last, backend_);
  } catch (out_of_memory const& e) {
    sync_counters();
    refuse_for_caller(e, name_, bytes, mapped_bytes(),
                      "committing [" + format_hex(ptr) + ", +" + format_bytes(bytes) + ")");
  } catch (...) {
    sync_counters();
    throw;
  }
  sync_counters();
  return newly * granularity_;
}

std::size_t virtual_range_resource::decommit(void* ptr, std::size_t bytes) {
  std::lock_guard lock{mutex_};
  std::size_t const offset = offset_of(ptr, bytes, "decommit");
  if (!claimed_) { throw logic_error(name_ + ": decommit without a claim on its range (call claim first)"); }
  std::size_t const first = detail::align_up(offset, granularity_) / granularity_;
  std::size_t const last = (offset + bytes) / granularity_;
  if (first >= last) { return 0; }
  if (asleep_.load(std::memory_order_relaxed)) { return forget_asleep(first, last) * granularity_; }
  std::size_t released = 0;
  try {
    released = map_.decommit(first, last, backend_);
  } catch (...) {
    sync_counters();
    throw;
  }
  sync_counters();
  return released * granularity_;
}

bool virtual_range_resource::is_committed(void const* ptr, std::size_t bytes) const {
  std::lock_guard lock{mutex_};
  std::size_t const offset = offset_of(ptr, bytes, "is_committed");
  if (bytes == 0) { return true; }
  return map_.all_committed(offset / granularity_, detail::align_up(offset + bytes, granularity_) / granularity_);
}

void virtual_range_resource::with_runs_backing(void const* ptr, std::size_t bytes,
                                               std::function<void(std::vector<mapped_run> const&)> const& use) const {
  std::lock_guard lock{mutex_};
  std::size_t const offset = offset_of(ptr, bytes, "IPC export");
  refuse_while_asleep("IPC export");
  std::size_t const first = offset / granularity_;
  std::size_t const last = detail::align_up(offset + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  if (!map_.all_committed(first, last)) {
    throw logic_error(name_ + ": IPC export of [" + format_hex(ptr) + ", +" + std::to_string(bytes) +
                      " B), which is not all committed (not a live block of this range)");
  }
  std::vector<mapped_run> runs;
  map_.for_each_run([&](std::size_t run_first, detail::granule_map::run const& r) {
    if (run_first + r.count > first && run_first < last) {
      runs.push_back({run_first * granularity_, r.count * granularity_, r.handle});
    }
  });
  use(runs);
}

std::string virtual_range_resource::claimant() const {
  std::lock_guard lock{mutex_};
  return claimant_;
}

void virtual_range_resource::check_invariants() const {
  std::lock_guard lock{mutex_};
  map_.check_invariants();
  std::size_t live_granules = 0;
  for (auto const& [offset, block] : live_) {
    std::size_t const span = detail::align_up(block.bytes, granularity_);
    bool const backed = asleep_.load(std::memory_order_relaxed)
                            ? is_asleep_span(asleep_granules_, offset / granularity_, (offset + span) / granularity_)
                            : map_.all_committed(offset / granularity_, (offset + span) / granularity_);
    if (!backed) {
      throw std::logic_error(name_ + ": a live allocation at offset " + std::to_string(offset) + " is not committed");
    }
    live_granules += span / granularity_;
  }
  std::size_t asleep_granules = 0;
  for (auto const& [first, last] : asleep_granules_) { asleep_granules += last - first; }
  if (asleep_granules * granularity_ != asleep_bytes()) {
    throw std::logic_error(name_ + ": asleep_bytes disagrees with the granules asleep");
  }
  if (asleep_.load(std::memory_order_relaxed) && map_.committed_granules() != 0) {
    throw std::logic_error(name_ + ": granules committed while asleep");
  }
  if (!claimed_ && live_granules != map_.committed_granules() + asleep_granules) {
    throw std::logic_error(name_ + ": committed granules (" + std::to_string(map_.committed_granules()) +
                           ") differ from those of live allocations (" + std::to_string(live_granules) + ")");
  }
  if (committed_bytes() != map_.committed_granules() * granularity_ ||
      mapped_bytes() != map_.mapped_granules() * granularity_) {
    throw std::logic_error(name_ + ": byte counters disagree with the granule map");
  }
}

// ---- the plain-upstream path ---------------------------------------------------------------

void* virtual_range_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream_view) {
  std::size_t const align = std::max(alignment, granularity_);
  std::lock_guard lock{mutex_};
  if (claimed_) {
    throw logic_error(name_ + ": allocate while its range is claimed by " + claimant_ + "; allocate from " +
                      claimant_ + " instead");
  }
  refuse_while_asleep("allocate");
  std::string const request = "the request (alignment " + std::to_string(alignment) + ")";
  auto refuse = [&](std::string const& why) -> void* {
    allocation_failure info;
    info.requested_bytes = bytes;
    info.resource = name_;
    info.footprint_bytes = mapped_bytes();
    info.detail = request + " " + why;
    throw out_of_memory(std::move(info));
  };
  if (bytes > range_bytes_) {
    return refuse("is larger than its reserved range of " + format_bytes(range_bytes_) + " (raise reserve=)");
  }
  std::size_t const span = detail::align_up(bytes, granularity_);
  // The lowest offset of the range aligned to `align`: no address past it can be either.
  std::size_t const first_aligned = (align - base_ % align) % align;
  if (first_aligned > range_bytes_ - span) {
    return refuse("cannot be met: no address of its reserved range [" + format_hex(base_) + ", +" +
                  format_bytes(range_bytes_) + ") aligned to " + std::to_string(align) + " B leaves room for " +
                  format_bytes(span) + " (ask for a smaller alignment)");
  }
  // First fit in address order: allocations here are few and large; first fit keeps the
  // used part of the range compact.
  for (auto it = free_addresses_.begin(); it != free_addresses_.end(); ++it) {
    std::size_t const misaligned = (base_ + it->first) % align;
    std::size_t const lead = misaligned == 0 ? 0 : align - misaligned;
    if (lead > it->second || it->second - lead < span) { continue; }
    std::size_t const start = it->first + lead;
    std::size_t const tail = it->second - lead - span;
    // Every node this needs is made before anything changes, and the free stretch is
    // split only once the granules are committed: a failure anywhere (the heap, the
    // backend) leaves the books as they were, with no addresses lost and no granules
    // committed for a block nobody holds.
    decltype(free_addresses_) remainders;
    if (lead > 0) { remainders.emplace(it->first, lead); }
    if (tail > 0) { remainders.emplace(start + span, tail); }
    auto const block = live_.emplace(start, live_block{bytes, std::max(alignment, default_alignment)}).first;
    try {
      map_.commit(start / granularity_, (start + span) / granularity_, backend_);
    } catch (out_of_memory const& e) {
      live_.erase(block);
      sync_counters();
      refuse_for_caller(e, name_, bytes, mapped_bytes(), "mapping " + format_bytes(span) + " for " + request);
    } catch (...) {
      live_.erase(block);
      sync_counters();
      throw;
    }
    free_addresses_.erase(it);
    free_addresses_.merge(remainders);
    sync_counters();
    return reinterpret_cast<void*>(base_ + start);
  }
  return refuse("found no free stretch of " + format_bytes(span) + " aligned to " + std::to_string(align) +
                " B left in its reserved range of " + format_bytes(range_bytes_) + " (raise reserve=)");
}

void virtual_range_resource::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view) {
  auto const p = reinterpret_cast<std::uintptr_t>(ptr);
  std::size_t const align = std::max(alignment, default_alignment);
  std::lock_guard lock{mutex_};
  auto const it = p >= base_ ? live_.find(p - base_) : live_.end();
  if (it == live_.end()) {
    throw logic_error(name_ + ": deallocate of " + format_hex(p) + " (" + std::to_string(bytes) +
                      " B), which it did not hand out or was already freed");
  }
  if (it->second.bytes != bytes || it->second.alignment != align) {
    throw logic_error(name_ + ": deallocate of " + format_hex(p) + " with size " + std::to_string(bytes) +
                      " B and alignment " + std::to_string(align) + ", but it was allocated with " +
                      std::to_string(it->second.bytes) + " B and alignment " + std::to_string(it->second.alignment) +
                      " (nothing was freed)");
  }
  std::size_t const offset = it->first;
  std::size_t const span = detail::align_up(bytes, granularity_);
  // The addresses' node is made first: once the granules are gone, giving the addresses
  // back cannot fail (were it made after, a full heap lost them for the resource's life).
  auto addresses = free_node(offset, span);
  if (asleep_.load(std::memory_order_relaxed)) {
    (void)forget_asleep(offset / granularity_, (offset + span) / granularity_);
    live_.erase(it);
    detail::insert_coalesced(free_addresses_, std::move(addresses));
    return;
  }
  try {
    map_.decommit(offset / granularity_, (offset + span) / granularity_, backend_);
  } catch (...) {
    // Every granule is decommitted; a run that could not be unmapped stays recorded as
    // mapped, and the next commit over it reuses it. So the addresses go back like any
    // free's (kept out, they were lost for the resource's life, unmapped granules too).
    live_.erase(it);
    detail::insert_coalesced(free_addresses_, std::move(addresses));
    sync_counters();
    throw;
  }
  live_.erase(it);
  sync_counters();
  detail::insert_coalesced(free_addresses_, std::move(addresses));
}

std::map<std::size_t, std::size_t>::node_type virtual_range_resource::free_node(std::size_t offset, std::size_t bytes) {
  std::map<std::size_t, std::size_t> one;
  one.emplace(offset, bytes);
  return one.extract(one.begin());
}

// ---- sleep and wake ------------------------------------------------------------------------

void virtual_range_resource::refuse_while_asleep(char const* op) const {
  if (asleep_.load(std::memory_order_relaxed)) {
    throw logic_error(name_ + ": " + op + " while asleep (its physical memory was given back by sleep(); call wake() "
                      "first)");
  }
}

bool virtual_range_resource::keeps_contents() const noexcept {
  std::lock_guard lock{mutex_};
  return asleep_.load(std::memory_order_relaxed) && contents_kept_;
}

void virtual_range_resource::sleep(bool keep_contents) {
  std::lock_guard lock{mutex_};
  refuse_while_asleep("sleep");
  auto const granule_stretches = map_.committed_stretches();
  detail::granule_backend::stretches byte_stretches;
  std::size_t granules = 0;
  for (auto const& [first, last] : granule_stretches) {
    byte_stretches.emplace_back(first * granularity_, (last - first) * granularity_);
    granules += last - first;
  }
  // Made before the contents are saved: made after, a full heap left some stretches
  // recorded as asleep while awake, and the saved contents to no sleep (on vmm a pinned
  // buffer the next sleep replaced without freeing).
  std::map<std::size_t, std::size_t> asleep(granule_stretches.begin(), granule_stretches.end());
  if (keep_contents) { backend_.save_contents(byte_stretches); }  // all or nothing: still awake if it throws
  asleep_granules_.swap(asleep);
  contents_kept_ = keep_contents;
  asleep_bytes_.store(granules * granularity_, std::memory_order_relaxed);
  asleep_.store(true, std::memory_order_release);
  // From here the resource is asleep whatever happens: a run the backend fails to unmap
  // stays recorded as mapped and uncommitted, and wake() revives it like any stranded granule.
  try {
    map_.decommit(0, map_.granule_count(), backend_);
  } catch (...) {
    sync_counters();
    throw;
  }
  sync_counters();
}

void virtual_range_resource::wake() {
  std::lock_guard lock{mutex_};
  if (!asleep_.load(std::memory_order_relaxed)) { throw logic_error(name_ + ": wake while awake (sleep() first)"); }
  detail::granule_backend::stretches byte_stretches;
  std::size_t done = 0;
  try {
    for (auto const& [first, last] : asleep_granules_) {
      map_.commit(first, last, backend_);
      ++done;
      byte_stretches.emplace_back(first * granularity_, (last - first) * granularity_);
    }
    if (contents_kept_) { backend_.restore_contents(byte_stretches); }
  } catch (...) {
    // Stay asleep, contents kept: give back what this wake mapped so a retry starts clean.
    // Every stretch is tried (one whose unmap fails is still decommitted, its run left
    // mapped for the next wake to revive); the first error is the one to report.
    auto it = asleep_granules_.begin();
    for (std::size_t i = 0; i < done; ++i, ++it) {
      try {
        map_.decommit(it->first, it->second, backend_);
      } catch (...) {
      }
    }
    sync_counters();
    throw;
  }
  backend_.drop_saved_contents();
  asleep_granules_.clear();
  contents_kept_ = false;
  asleep_bytes_.store(0, std::memory_order_relaxed);
  asleep_.store(false, std::memory_order_release);
  sync_counters();
}

std::size_t virtual_range_resource::forget_asleep(std::size_t first, std::size_t last) {
  auto it = asleep_granules_.upper_bound(first);
  if (it != asleep_granules_.begin()) { --it; }
  // Only a stretch reaching past [first, last) on both sides needs one record more (its
  // two remainders); it is made before anything changes. Every other case edits records
  // in place: a full heap midway had forgotten granules still committed for their owner.
  if (it != asleep_granules_.end() && it->first < first && last < it->second) {
    asleep_granules_.emplace(last, it->second);
    it->second = first;
    asleep_bytes_.fetch_sub((last - first) * granularity_, std::memory_order_relaxed);
    return last - first;
  }
  std::size_t forgotten = 0;
  while (it != asleep_granules_.end() && it->first < last) {
    std::size_t const lo = std::max(first, it->first);
    std::size_t const hi = std::min(last, it->second);
    if (lo >= hi) {
      ++it;
      continue;
    }
    forgotten += hi - lo;
    if (it->first < lo) {  // keeps its head
      it->second = lo;
      ++it;
    } else if (hi < it->second) {  // keeps its tail: the record moves there (the last one touched)
      auto tail = asleep_granules_.extract(it);
      tail.key() = hi;
      asleep_granules_.insert(std::move(tail));
      break;
    } else {
      it = asleep_granules_.erase(it);
    }
  }
  asleep_bytes_.fetch_sub(forgotten * granularity_, std::memory_order_relaxed);
  return forgotten;
}

}  // namespace mrstack
