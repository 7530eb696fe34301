#include <mrstack/detail/page_owner_map.hpp>

namespace mrstack::detail {

page_owner_map::page_owner_map() = default;

page_owner_map::~page_owner_map() {
  for (auto& m : top_) {
    mid_level* mid = m.load(std::memory_order_relaxed);
    if (mid == nullptr) { continue; }
    for (auto& leaf : *mid) { delete[] leaf.load(std::memory_order_relaxed); }
    delete mid;
  }
}

namespace {
// Installs a fresh level made by `make` unless another thread got there first.
template <typename T, typename Make, typename Drop>
T* install(std::atomic<T*>& slot, Make make, Drop drop) {
  if (T* existing = slot.load(std::memory_order_acquire)) { return existing; }
  T* fresh = make();
  T* expected = nullptr;
  if (slot.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) { return fresh; }
  drop(fresh);
  return expected;
}
}  // namespace

std::uint16_t* page_owner_map::leaf_for(std::uintptr_t page) {
  mid_level* mid = install(
      top_[page >> (mid_bits + leaf_bits)], [] { return new mid_level{}; }, [](mid_level* m) { delete m; });
  return install(
      (*mid)[(page >> leaf_bits) & mid_mask], [] { return new std::uint16_t[std::size_t{1} << leaf_bits](); },
      [](std::uint16_t* l) { delete[] l; });
}

void page_owner_map::set(std::uintptr_t base, std::size_t size, std::uint16_t value) {
  std::uintptr_t const first = base >> page_shift;
  std::uintptr_t const last = (base + (size - 1)) >> page_shift;
  for (std::uintptr_t p = first;; p = (p | leaf_mask) + 1) {  // every level first: all or nothing
    (void)leaf_for(p);
    if ((p | leaf_mask) >= last) { break; }
  }
  for (std::uintptr_t p = first; p <= last; ++p) {
    std::atomic_ref<std::uint16_t>{leaf_for(p)[p & leaf_mask]}.store(value, std::memory_order_release);
  }
}

}  // namespace mrstack::detail
