#include <mrstack/detail/metadata_memory.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include <mrstack/detail/align.hpp>

namespace mrstack::detail {

bool metadata_huge_pages_enabled() noexcept {
  static bool const enabled = [] {
    char const* v = std::getenv("MRSTACK_HUGE_PAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

namespace {

// Mapped regions are rounded up to whole huge pages; this is the length actually mapped.
std::size_t mapped_length(std::size_t bytes) noexcept { return align_up(bytes, huge_page_size); }

// Maps `length` bytes (a whole number of huge pages) starting on a 2 MiB boundary — the
// kernel places only aligned 2 MiB ranges on huge pages — by over-mapping one huge page
// and trimming. Null when the system refuses.
void* map_huge_aligned(std::size_t length, int prot, int flags) noexcept {
  std::size_t const span = length + huge_page_size;
  void* raw = ::mmap(nullptr, span, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  if (raw == MAP_FAILED) { return nullptr; }
  auto const start = reinterpret_cast<std::uintptr_t>(raw);
  std::uintptr_t const aligned = align_up(start, huge_page_size);
  if (aligned > start) { ::munmap(raw, aligned - start); }
  std::uintptr_t const end = aligned + length;
  if (start + span > end) { ::munmap(reinterpret_cast<void*>(end), start + span - end); }
  return reinterpret_cast<void*>(aligned);
}

// Advice only: a kernel without transparent huge pages refuses it, and 4 KiB pages serve.
void advise_huge_pages(void* p, std::size_t length) noexcept {
  (void)::madvise(p, length, metadata_huge_pages_enabled() ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

}  // namespace

void* allocate_metadata(std::size_t bytes) {
  if (bytes < huge_page_threshold) { return ::operator new(bytes, std::align_val_t{64}); }
  std::size_t const length = mapped_length(bytes);
  if (length == static_cast<std::size_t>(-1) || length > static_cast<std::size_t>(-1) - huge_page_size) {
    throw std::bad_alloc{};
  }
  void* p = map_huge_aligned(length, PROT_READ | PROT_WRITE, 0);
  if (p == nullptr) { throw std::bad_alloc{}; }
  advise_huge_pages(p, length);
  return p;
}

void deallocate_metadata(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) { return; }
  if (bytes < huge_page_threshold) {
    ::operator delete(p, std::align_val_t{64});
    return;
  }
  ::munmap(p, mapped_length(bytes));
}

metadata_reservation::metadata_reservation(std::size_t max_bytes, std::size_t min_bytes) {
  // Whole huge pages throughout: commit() rounds up to them and must stay inside.
  std::size_t bytes = align_up(max_bytes, huge_page_size);
  if (bytes > static_cast<std::size_t>(-1) - 2 * huge_page_size) { throw std::bad_alloc{}; }
  std::size_t const floor = std::max(align_up(min_bytes, huge_page_size), huge_page_size);
  for (;;) {
    // PROT_NONE: address space only, charged to no commit limit and backed by nothing.
    if (void* p = map_huge_aligned(bytes, PROT_NONE, MAP_NORESERVE)) {
      base_ = p;
      reserved_ = bytes;
      return;
    }
    std::size_t const half = align_down(bytes / 2, huge_page_size);
    if (half < floor) { throw std::bad_alloc{}; }
    bytes = half;
  }
}

std::size_t metadata_reservation::commit_target(std::size_t bytes) const noexcept {
  if (bytes <= committed_) { return committed_; }
  // Doubling from 64 KiB while under one huge page (a small pool commits little), then
  // whole huge pages; never past the reservation (a whole number of huge pages).
  std::size_t target = 0;
  if (bytes <= huge_page_size) {
    target = std::max<std::size_t>(committed_ * 2, 64 * 1024);
    while (target < bytes) { target *= 2; }
    target = std::min(target, huge_page_size);
  } else {
    target = align_up(bytes, huge_page_size);
  }
  return std::min(target, reserved_);
}

metadata_reservation::~metadata_reservation() {
  if (base_ != nullptr) { ::munmap(base_, reserved_); }
}

void metadata_reservation::commit(std::size_t bytes) {
  if (bytes <= committed_) { return; }
  if (bytes > reserved_) { throw std::bad_alloc{}; }
  std::size_t const target = commit_target(bytes);
  auto* const from = static_cast<char*>(base_) + committed_;
  if (::mprotect(from, target - committed_, PROT_READ | PROT_WRITE) != 0) { throw std::bad_alloc{}; }
  if (target >= huge_page_size) { advise_huge_pages(base_, target); }  // the range grew: advise it all
  committed_ = target;
}

}  // namespace mrstack::detail
