#pragma once
/// Inserting a free range into an address-ordered map (begin -> size), merged with the
/// neighbours it touches. Shared by the simulated upstream and the virtual-range address
/// allocator, which hand out addresses rarely enough for a std::map. CUDA-free.
#include <cstddef>
#include <iterator>
#include <map>

namespace mrstack::detail {

template <typename Address>
void insert_coalesced(std::map<Address, std::size_t>& ranges, Address begin, std::size_t size) {
  auto next = ranges.lower_bound(begin);
  if (next != ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      ranges.erase(prev);
    }
  }
  if (next != ranges.end() && begin + size == next->first) {
    size += next->second;
    ranges.erase(next);
  }
  ranges.emplace(begin, size);
}

}  // namespace mrstack::detail
