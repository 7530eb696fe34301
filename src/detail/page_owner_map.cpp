#include <mrstack/detail/page_owner_map.hpp>

#include <stdexcept>

namespace mrstack::detail {

page_owner_map::page_owner_map() : top_{new std::atomic<std::uint16_t*>[std::size_t{1} << top_bits]()} {}

page_owner_map::~page_owner_map() {
  for (std::size_t i = 0; i < (std::size_t{1} << top_bits); ++i) { delete[] top_[i].load(std::memory_order_relaxed); }
}

std::uint16_t* page_owner_map::leaf_for(std::uintptr_t page) {
  std::atomic<std::uint16_t*>& slot = top_[page >> leaf_bits];
  if (std::uint16_t* leaf = slot.load(std::memory_order_acquire)) { return leaf; }
  auto* fresh = new std::uint16_t[std::size_t{1} << leaf_bits]();
  std::uint16_t* expected = nullptr;
  if (slot.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) { return fresh; }
  delete[] fresh;  // another thread made it first
  return expected;
}

void page_owner_map::set(std::uintptr_t base, std::size_t size, std::uint16_t value) {
  std::uintptr_t const first = base >> page_shift;
  std::uintptr_t const end = (base + size) >> page_shift;
  if (end > (std::uintptr_t{1} << (top_bits + leaf_bits)) || end < first) {
    throw std::length_error("page_owner_map: address range past 2^57");
  }
  for (std::uintptr_t p = first; p < end; p = (p | leaf_mask) + 1) { (void)leaf_for(p); }  // all or nothing
  for (std::uintptr_t p = first; p < end; ++p) {
    std::uint16_t* leaf = top_[p >> leaf_bits].load(std::memory_order_relaxed);
    std::atomic_ref<std::uint16_t>{leaf[p & leaf_mask]}.store(value, std::memory_order_release);
  }
}

}  // namespace mrstack::detail
