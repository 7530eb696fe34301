// block_pool::check_invariants: every structural rule of the pool's bookkeeping, checked
// the slow way (O(blocks)) for the model tests. Off the hot path, so in a file of its own.
#include <mrstack/detail/block_pool.hpp>

#include <string>

namespace mrstack::detail {

std::string block_pool::check_invariants() const {
  invariant_totals t;
  for (chunk_id c = 0; c < chunks_.size(); ++c) {
    if (!chunks_[c].in_use) { continue; }
    if (std::string why = check_chunk(c, t); !why.empty()) { return why; }
  }
  if (t.chunks != chunk_count_) { return "chunk count mismatch"; }
  if (t.total != total_bytes_) { return "total bytes mismatch"; }
  if (t.free != free_bytes_total_) { return "free bytes mismatch"; }
  if (t.live != live_bytes_) { return "live bytes mismatch"; }
  if (t.withdrawn != withdrawn_bytes_) { return "withdrawn bytes mismatch"; }
  if (t.keyed != live_.size()) { return "address map holds stale entries"; }
  if (t.holes != withdrawn_count_) { return "withdrawn block count mismatch"; }
  if (t.free + t.live + t.withdrawn != t.total) { return "bytes do not add up"; }
  std::size_t indexed = 0;
  for (std::size_t o = 0; o < indexes_.size(); ++o) {
    if (!indexes_[o]) { continue; }
    if (std::string why = check_class_index(o, indexed); !why.empty()) { return why; }
  }
  if (indexed != t.free_count) { return "free blocks missing from the indexes"; }
  return {};
}

// One chunk: its blocks tile it in address order with consistent links, no two mergeable
// free neighbours, every live block and hole in the address map, and its counts right.
std::string block_pool::check_chunk(chunk_id c, invariant_totals& t) const {
  chunk_record const& rec = chunks_[c];
  ++t.chunks;
  t.total += rec.size;
  std::uintptr_t expect = rec.base;
  std::uint32_t prev = npos;
  std::size_t live = 0;
  std::size_t withdrawn = 0;
  for (std::uint32_t b = rec.first; b != npos; prev = b, b = at(b).next) {
    block const& n = at(b);
    std::string const where = "chunk " + std::to_string(c) + " block at offset " + std::to_string(addr_of(n) - rec.base);
    if (addr_of(n) != expect) { return where + ": does not start where the previous block ends"; }
    if (size_of(n) == 0 || size_of(n) % granularity != 0) { return where + ": bad size " + std::to_string(size_of(n)); }
    if (n.prev != prev) { return where + ": broken prev link"; }
    if (n.chunk != c) { return where + ": wrong chunk"; }
    expect += size_of(n);
    if (n.state == state_free) {
      t.free += size_of(n);
      ++t.free_count;
      if (prev != npos) {
        block const& p = at(prev);
        if (p.state == state_free && (p.owner == n.owner || sync_mergeable(p.owner, n.owner))) {
          return where + ": mergeable free neighbours left unmerged";
        }
      }
    } else if (n.state == state_live) {
      t.live += size_of(n);
      ++live;
      if (live_.find(addr_of(n), starts_at(addr_of(n))) != b) { return where + ": live block missing from the address map"; }
    } else if (n.state == state_withdrawn) {
      t.withdrawn += size_of(n);
      ++withdrawn;
      if (live_.find(addr_of(n), starts_at(addr_of(n))) != b) { return where + ": hole missing from the address map"; }
    } else {
      return where + ": unused node linked into a chunk";
    }
  }
  if (expect != rec.base + rec.size) { return "chunk " + std::to_string(c) + ": blocks do not tile it"; }
  if (rec.last != prev) { return "chunk " + std::to_string(c) + ": wrong last block"; }
  if (live != rec.live_blocks || withdrawn != rec.withdrawn_blocks) {
    return "chunk " + std::to_string(c) + ": wrong live/withdrawn counts";
  }
  t.keyed += live + withdrawn;
  t.holes += withdrawn;
  return {};
}

// One owner's class index: bitmaps agree with the lists, every entry names a free block of
// that owner in the right class at the recorded position, and the totals add up.
std::string block_pool::check_class_index(std::size_t o, std::size_t& indexed) const {
  class_index const& idx = *indexes_[o];
  std::string const owner = "owner " + std::to_string(o);
  std::size_t bytes = 0;
  std::size_t count = 0;
  for (unsigned cls = 0; cls < class_count; ++cls) {
    bool const bit = ((idx.sl_bitmap[cls / sl_count] >> (cls % sl_count)) & 1U) != 0;
    bool const fl_bit = ((idx.fl_bitmap >> (cls / sl_count)) & 1U) != 0;
    auto const& list = idx.lists[cls];
    if (bit != !list.empty()) { return owner + ": bitmap disagrees with list"; }
    if (bit && !fl_bit) { return owner + ": first-level bit missing"; }
    for (std::size_t pos = 0; pos < list.size(); ++pos) {
      free_entry const e = list[pos];
      if (e.node >= node_count_) { return owner + ": class array names no node"; }
      block const& n = at(e.node);
      if (n.state != state_free || n.owner != o) { return owner + ": foreign node in list"; }
      if (class_of(n.units) != cls) { return owner + ": block in wrong class"; }
      if (n.free_pos != pos) { return owner + ": node's position in its class is wrong"; }
      if (n.free_class != cls) { return owner + ": node records the wrong class"; }
      if (e.units != n.units) { return owner + ": class array holds a stale size"; }
      bytes += size_of(n);
      ++count;
    }
  }
  for (unsigned fl = 0; fl < fl_count; ++fl) {
    if ((((idx.fl_bitmap >> fl) & 1U) != 0) != (idx.sl_bitmap[fl] != 0)) { return owner + ": stale first-level bit"; }
  }
  if (bytes != idx.bytes || count != idx.count) { return owner + ": wrong totals"; }
  indexed += count;
  return {};
}

}  // namespace mrstack::detail
