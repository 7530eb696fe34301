#pragma once
/// Inserting a free range into an address-ordered map (begin -> size), merged with the
/// neighbours it touches. Shared by the simulated upstream and the virtual-range address
/// allocator, which hand out addresses rarely enough for a std::map. CUDA-free.
///
/// The node-handle form allocates nothing, so a caller can make the node before it changes
/// anything else and insert it after, with no way left to fail in between. The plain form
/// makes its node first: when that throws, `ranges` is as it was.
#include <cstddef>
#include <iterator>
#include <map>
#include <utility>

namespace mrstack::detail {

template <typename Address>
void insert_coalesced(std::map<Address, std::size_t>& ranges,
                      typename std::map<Address, std::size_t>::node_type node) noexcept {
  Address const begin = node.key();
  std::size_t size = node.mapped();
  auto next = ranges.lower_bound(begin);
  bool const joins_next = next != ranges.end() && begin + size == next->first;
  if (next != ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {  // grows in place: no node needed
      prev->second += size + (joins_next ? next->second : 0);
      if (joins_next) { ranges.erase(next); }
      return;
    }
  }
  if (joins_next) {
    node.mapped() += next->second;
    ranges.erase(next);
  }
  ranges.insert(std::move(node));
}

template <typename Address>
void insert_coalesced(std::map<Address, std::size_t>& ranges, Address begin, std::size_t size) {
  std::map<Address, std::size_t> one;
  one.emplace(begin, size);  // the only allocation, before `ranges` changes
  insert_coalesced(ranges, one.extract(one.begin()));
}

}  // namespace mrstack::detail
