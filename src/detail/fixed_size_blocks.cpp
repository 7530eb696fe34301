#include <mrstack/detail/fixed_size_blocks.hpp>

#include <algorithm>

namespace mrstack::detail {

namespace {
/// Room for one more element, growing geometrically (reserve(size + 1) copied the whole
/// vector on every push).
template <typename V>
void room_for_one(V& v) {
  if (v.size() == v.capacity()) { v.reserve(std::max<std::size_t>(8, 2 * v.size())); }
}
}  // namespace

chunk_snapshot::chunk_snapshot(std::vector<chunk_ref> chunks, std::size_t block_size, unsigned page_shift)
    : chunks_{std::move(chunks)}, block_size_{block_size}, page_shift_{page_shift} {
  block_shift_ = std::has_single_bit(block_size) ? static_cast<unsigned>(std::countr_zero(block_size)) : 0;
  // Past 64 chunks a chunk is 1/8 of the blocks held, far above the standard chunk: with
  // pages of a standard chunk it took a slot per page, one per block for chunks of one
  // block (1e6 blocks of 256 B: 256 MB of slots per snapshot, and 14x slower growth).
  // Pages of at least 1/256 of the largest chunk keep every chunk to 257 pages at most
  // (a resource of standard chunks never gets there); chunks much smaller than such a
  // page crowd it and are found by the binary search.
  std::size_t largest = 0;
  for (auto const& c : chunks_) { largest = std::max<std::size_t>(largest, c.end - c.first_block); }
  // The smallest power of two at least 1/256 of it: rounding down took up to 512 pages.
  std::size_t const page_wanted = (largest + max_pages_per_chunk - 1) / max_pages_per_chunk;
  if (page_wanted > (std::size_t{1} << page_shift_)) {
    page_shift_ = static_cast<unsigned>(std::countr_zero(std::bit_ceil(page_wanted)));
  }
  std::sort(chunks_.begin(), chunks_.end(), [](chunk_ref const& a, chunk_ref const& b) { return a.first_block < b.first_block; });
  std::size_t pages = 0;
  for (auto const& c : chunks_) { pages += ((c.end - 1) >> page_shift_) - (c.first_block >> page_shift_) + 1; }
  // At most half full: lookups take ~1.5 probes.
  std::size_t const capacity = std::bit_ceil(std::max<std::size_t>(16, pages * 2));
  slots_.resize(capacity);
  mask_ = capacity - 1;
  hash_shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
  for (auto const& c : chunks_) {
    for (std::uintptr_t page = c.first_block >> page_shift_; page <= (c.end - 1) >> page_shift_; ++page) {
      index(page, c);
    }
  }
}

void chunk_snapshot::index(std::uintptr_t page, chunk_ref const& chunk) {
  std::size_t i = home(page);
  while (slots_[i].page != page && slots_[i].page != empty_page) { i = (i + 1) & mask_; }
  slot& s = slots_[i];
  s.page = page;
  if (s.used < slots_per_page) {
    s.chunks[s.used++] = chunk;
  } else {
    s.crowded = true;
  }
}

block_state* chunk_snapshot::find_ordered(std::uintptr_t a) const noexcept {
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), a,
                             [](std::uintptr_t x, chunk_ref const& c) { return x < c.first_block; });
  if (it == chunks_.begin()) { return nullptr; }
  return locate(*std::prev(it), a);
}

fixed_size_chunks::fixed_size_chunks(std::size_t block_size, std::size_t standard_blocks) : block_size_{block_size} {
  std::size_t const standard = standard_blocks > max_bytes / block_size ? max_bytes : standard_blocks * block_size;
  page_shift_ = static_cast<unsigned>(std::bit_width(standard) - 1);
  publish({});
}

fixed_size_chunks::~fixed_size_chunks() {
  collect();
  delete current_.load(std::memory_order_relaxed);
}

block_state* fixed_size_chunks::add(std::uintptr_t first, std::size_t blocks) {
  auto states = std::make_unique<block_state[]>(blocks);
  for (std::size_t i = 0; i < blocks; ++i) { states[i].store(free_state, std::memory_order_relaxed); }
  block_state* const raw = states.get();
  std::vector<chunk_snapshot::chunk_ref> chunks = current().chunks();
  chunks.push_back(chunk_snapshot::chunk_ref{first, first + blocks * block_size_, raw});
  // Room first: a snapshot published over states not kept (or kept but not published)
  // left a chunk half recorded when host memory ran out.
  room_for_one(states_);
  publish(std::move(chunks));
  states_.push_back(std::move(states));  // cannot fail: room was made
  return raw;
}

void fixed_size_chunks::clear() {
  retired_states_.reserve(retired_states_.size() + states_.size());
  publish({});
  for (auto& s : states_) { retired_states_.push_back(std::move(s)); }  // cannot fail: room was made
  states_.clear();
}

void fixed_size_chunks::publish(std::vector<chunk_snapshot::chunk_ref> chunks) {
  // Everything that can fail comes before the exchange: once a snapshot is published, the
  // one it replaced must be kept for collect() (a failed push leaked it, and the caller,
  // seeing an error, took the new snapshot for one never published).
  room_for_one(retired_);
  auto const* next = new chunk_snapshot(std::move(chunks), block_size_, page_shift_);
  if (auto const* old = current_.exchange(next, std::memory_order_acq_rel)) { retired_.push_back(old); }
}

void fixed_size_chunks::collect() noexcept {
  for (auto const* s : retired_) { delete s; }
  retired_.clear();
  retired_states_.clear();
}

}  // namespace mrstack::detail
