#include <mrstack/error.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>

#include <spdlog/details/os.h>

#include <mrstack/detail/stack_trace.hpp>

namespace mrstack {

namespace {

std::uint64_t hash_frames(void* const* frames, std::size_t n) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ n;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= reinterpret_cast<std::uintptr_t>(frames[i]);
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

tracking_resource_adaptor::tracking_resource_adaptor(resource_ptr upstream, bool capture_stacks, bool report_leaks,
                                                     std::ostream* report_stream)
    : upstream_{std::move(upstream)},
      capture_stacks_{capture_stacks},
      report_leaks_{report_leaks},
      report_stream_{report_stream} {
  if (upstream_ == nullptr) { throw logic_error("tracking: upstream resource is null"); }
}

tracking_resource_adaptor::~tracking_resource_adaptor() {
  if (!report_leaks_ || outstanding_count() == 0) { return; }
  try {
    std::string const text = "mrstack leak report (" + describe_stack(*this) + ")\n" + report();
    if (report_stream_ != nullptr) {
      *report_stream_ << text << std::flush;
    } else {
      std::fputs(text.c_str(), stderr);
      std::fflush(stderr);
    }
  } catch (...) {
    std::fputs("mrstack: tracking adaptor could not write its leak report\n", stderr);
  }
}

namespace {
#ifdef CLOCK_MONOTONIC_COARSE
constexpr clockid_t coarse_clock = CLOCK_MONOTONIC_COARSE;
#else
constexpr clockid_t coarse_clock = CLOCK_MONOTONIC;  // no coarse clock here: the precise one
#endif

std::uint64_t monotonic_now_ns(clockid_t clock) noexcept {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000ULL + static_cast<std::uint64_t>(t.tv_nsec);
}
}  // namespace

std::uint64_t tracking_resource_adaptor::coarse_now_ns() noexcept { return monotonic_now_ns(coarse_clock); }

// The coarse clock's base: never behind it.
std::uint64_t tracking_resource_adaptor::precise_now_ns() noexcept { return monotonic_now_ns(CLOCK_MONOTONIC); }

std::uint32_t tracking_resource_adaptor::intern_current_stack() {
  void* frames[max_stack_frames];
  // Skip this function and do_allocate: the stack starts at whoever called allocate().
  std::size_t const n = detail::capture_stack(frames, max_stack_frames, 2);
  std::uint64_t const h = hash_frames(frames, n);
  std::lock_guard lock{stacks_mutex_};
  auto [first, last] = stack_index_.equal_range(h);
  for (auto it = first; it != last; ++it) {
    auto const& known = stacks_[it->second];
    if (known.size() == n && std::equal(known.begin(), known.end(), frames)) { return it->second; }
  }
  auto const id = static_cast<std::uint32_t>(stacks_.size());
  stacks_.emplace_back(frames, frames + n);
  stack_index_.emplace(h, id);
  return id;
}

void* tracking_resource_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) {
  std::uint32_t const stack_id = capture_stacks_ ? intern_current_stack() : no_stack;
  void* const ptr = upstream_->allocate(bytes, stream, alignment);
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  auto const [index, own] = detail::this_thread_shard_held();
  // A call from a thread_local destructor after this thread's index went back stamps in a
  // borrowed shard, whose last stamp may lag the thread's own shard's (raised past the
  // coarse clock within a tick): the precise clock is past them all, so it still comes
  // after the thread's earlier allocations.
  std::uint64_t const now = (own ? coarse_now_ns() : precise_now_ns()) - start_ns_;
  bool inserted = false;
  try {
    shard& s = shards_[index];
    std::lock_guard lock{s.mutex};
    s.last_stamp = std::max(now, s.last_stamp + 1);  // unique within the shard; the low bits make it unique across
    record const r{bytes, alignment, stream.id(), (s.last_stamp << 6) | index, spdlog::details::os::thread_id(),
                   stack_id};
    inserted = s.records.insert(address, r);
    if (inserted) {
      ++s.count;
      s.bytes += bytes;
    }
  } catch (...) {
    upstream_->deallocate(ptr, bytes, stream, alignment);  // the table could not grow: nothing leaks
    throw;
  }
  if (!inserted) {
    // The upstream handed out a pointer that is still outstanding: a bug below this layer.
    // Leave the memory alone (it may be in use) and say so.
    throw logic_error("tracking: the upstream (" + upstream_->name() + ") handed out " + format_hex(address) +
                      " again while it is still outstanding");
  }
  return ptr;
}

tracking_resource_adaptor::shard* tracking_resource_adaptor::take_record(std::uintptr_t address, std::size_t bytes,
                                                                         std::size_t alignment, record& out) {
  std::size_t const mine = detail::this_thread_shard();
  for (std::size_t k = 0; k < shard_count; ++k) {
    shard& s = shards_[(mine + k) % shard_count];  // this thread's shard first: it usually made the allocation
    std::lock_guard lock{s.mutex};
    record const* r = s.records.find(address);
    if (r == nullptr) { continue; }
    if (r->bytes != bytes || r->alignment != alignment) {
      throw logic_error("tracking: deallocate of " + format_hex(address) + " with size " + std::to_string(bytes) +
                        " B and alignment " + std::to_string(alignment) + ", but it was allocated with size " +
                        std::to_string(r->bytes) + " B and alignment " + std::to_string(r->alignment));
    }
    out = *r;
    s.records.erase_keeping_room(address);  // do_deallocate puts it back or gives the room up
    --s.count;
    s.bytes -= bytes;
    return &s;
  }
  return nullptr;
}

void tracking_resource_adaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment,
                                              stream_view stream) {
  auto const address = reinterpret_cast<std::uintptr_t>(ptr);
  record taken{};
  shard* const s = take_record(address, bytes, alignment, taken);
  if (s == nullptr) {
    throw logic_error("tracking: deallocate of " + format_hex(address) + " (" + std::to_string(bytes) +
                      " B), which this resource never handed out or has already taken back");
  }
  try {
    upstream_->deallocate(ptr, bytes, stream, alignment);
  } catch (...) {
    // Refused below: the allocation is still out, so keep tracking it. The record goes
    // into the room take_record kept: other threads may have filled the shard meanwhile,
    // and an insert that had to grow the table could fail for want of host memory,
    // losing the record of a live block (its later free refused as foreign) and
    // replacing the upstream's error with bad_alloc.
    std::lock_guard lock{s->mutex};
    if (s->records.put_back(address, taken)) {
      ++s->count;
      s->bytes += bytes;
    }
    throw;
  }
  std::lock_guard lock{s->mutex};
  s->records.give_up_room();
}

std::size_t tracking_resource_adaptor::outstanding_count() const noexcept {
  std::size_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard lock{s.mutex};
    n += s.count;
  }
  return n;
}

std::size_t tracking_resource_adaptor::outstanding_bytes() const noexcept {
  __extension__ unsigned __int128 n = 0;  // wrapping would take 2^64 outstanding allocations
  for (auto& s : shards_) {
    std::lock_guard lock{s.mutex};
    n += s.bytes;
  }
  return n > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                       : static_cast<std::size_t>(n);
}

std::vector<std::pair<void*, tracking_resource_adaptor::record>> tracking_resource_adaptor::snapshot() const {
  std::vector<std::pair<void*, record>> all;
  for (auto& s : shards_) {
    std::lock_guard lock{s.mutex};
    s.records.for_each([&](std::uintptr_t address, record const& r) {
      all.emplace_back(reinterpret_cast<void*>(address), r);
    });
  }
  std::sort(all.begin(), all.end(), [](auto const& a, auto const& b) { return a.second.sequence < b.second.sequence; });
  return all;
}

std::vector<std::string> tracking_resource_adaptor::symbolized(std::uint32_t stack_id) const {
  std::vector<std::string> out;
  if (stack_id == no_stack) { return out; }
  std::vector<void*> frames;
  {
    std::lock_guard lock{stacks_mutex_};
    frames = stacks_[stack_id];
  }
  out.reserve(frames.size());
  for (void* f : frames) { out.push_back(detail::describe_frame(f)); }
  return out;
}

std::vector<tracking_resource_adaptor::allocation_info> tracking_resource_adaptor::outstanding() const {
  auto const all = snapshot();
  std::map<std::uint32_t, std::vector<std::string>> stacks;  // symbolize each distinct stack once
  std::vector<allocation_info> out;
  out.reserve(all.size());
  for (auto const& [ptr, r] : all) {
    allocation_info info{ptr, r.bytes, r.alignment, r.stream, r.sequence, r.thread, {}};
    if (r.stack_id != no_stack) {
      auto it = stacks.find(r.stack_id);
      if (it == stacks.end()) { it = stacks.emplace(r.stack_id, symbolized(r.stack_id)).first; }
      info.stack = it->second;
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<tracking_resource_adaptor::call_site> tracking_resource_adaptor::call_sites() const {
  std::map<std::uint32_t, call_site> by_stack;
  for (auto const& [ptr, r] : snapshot()) {
    auto& site = by_stack[r.stack_id];
    ++site.count;
    site.bytes = detail::saturating_add_size(site.bytes, r.bytes);
  }
  std::vector<call_site> out;
  out.reserve(by_stack.size());
  for (auto& [id, site] : by_stack) {
    site.stack = symbolized(id);
    out.push_back(std::move(site));
  }
  std::stable_sort(out.begin(), out.end(), [](call_site const& a, call_site const& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.count > b.count;
  });
  return out;
}

std::string tracking_resource_adaptor::report(std::size_t max_call_sites, std::size_t max_allocations) const {
  auto const all = outstanding();
  std::size_t bytes = 0;
  for (auto const& a : all) { bytes = detail::saturating_add_size(bytes, a.bytes); }
  std::ostringstream os;
  os << "tracking: " << all.size() << " allocation" << (all.size() == 1 ? "" : "s") << " outstanding, "
     << format_bytes(bytes) << "\n";
  if (all.empty()) { return os.str(); }
  auto const sites = call_sites();
  if (!capture_stacks_) {
    os << "call sites: not captured (construct the tracking adaptor with capture_stacks = true)\n";
  } else {
    std::size_t const shown = std::min(max_call_sites, sites.size());
    os << "top " << shown << " of " << sites.size() << " call site" << (sites.size() == 1 ? "" : "s")
       << " by bytes outstanding:\n";
    for (std::size_t i = 0; i < shown; ++i) {
      os << "  #" << i + 1 << ": " << sites[i].count << " allocation" << (sites[i].count == 1 ? "" : "s") << ", "
         << format_bytes(sites[i].bytes) << "\n";
      for (auto const& frame : sites[i].stack) { os << "      at " << frame << "\n"; }
    }
  }
  std::size_t const listed = std::min(max_allocations, all.size());
  os << "oldest " << listed << " of " << all.size() << " outstanding allocation" << (all.size() == 1 ? "" : "s")
     << ":\n";
  for (std::size_t i = 0; i < listed; ++i) {
    auto const& a = all[i];
    os << "  " << format_hex(reinterpret_cast<std::uintptr_t>(a.pointer)) << " " << a.bytes << " B, alignment "
       << a.alignment << ", stream " << (a.stream == 0 ? std::string{"0"} : format_hex(a.stream)) << ", thread " << a.thread
       << ", allocation #" << a.sequence << "\n";
  }
  return os.str();
}

}  // namespace mrstack
