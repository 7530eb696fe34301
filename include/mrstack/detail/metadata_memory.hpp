#pragma once
/// Host memory for the suballocators' large, randomly read metadata: the pool's block
/// nodes and its address table. CUDA-free.
///
/// Why: at 1e5 live blocks a pool's metadata is a few MiB, and every call reads a few
/// random places in it (an address-table slot, a node, its neighbours). With 4 KiB pages
/// those few MiB span about a thousand pages, more than the CPU's TLB holds, so most of
/// those reads also miss the TLB — and in a virtual machine (the GPU hosts here run in
/// one) a TLB miss walks two sets of page tables. Regions of 2 MiB and more are therefore
/// mapped at 2 MiB alignment and marked `MADV_HUGEPAGE`, so a kernel with transparent huge
/// pages in `madvise` or `always` mode backs each with one 2 MiB page. Smaller requests
/// come from the C++ heap: a small pool does not commit 2 MiB per structure. (Regions from
/// 1 MiB up are mapped too, rounded up to 2 MiB: a structure that big loses more to TLB
/// misses than the rounding costs.)
///
/// `MRSTACK_HUGE_PAGES=0` in the environment (read once) marks the regions
/// `MADV_NOHUGEPAGE` instead, to measure what huge pages bring.
#include <cstddef>
#include <utility>

namespace mrstack::detail {

inline constexpr std::size_t huge_page_size = std::size_t{2} << 20;
/// Requests of at least this many bytes are mapped as huge-page regions.
inline constexpr std::size_t huge_page_threshold = std::size_t{1} << 20;

/// `bytes` of uninitialized host memory aligned to at least 64 bytes; throws
/// std::bad_alloc when the system has none.
[[nodiscard]] void* allocate_metadata(std::size_t bytes);
/// Returns memory from `allocate_metadata(bytes)` (the same `bytes`).
void deallocate_metadata(void* p, std::size_t bytes) noexcept;
/// False when `MRSTACK_HUGE_PAGES=0` turned huge pages off for this process.
[[nodiscard]] bool metadata_huge_pages_enabled() noexcept;

/// An owning array of trivially copyable `T` in metadata memory (no constructors run).
template <typename T>
class metadata_array {
 public:
  metadata_array() = default;
  explicit metadata_array(std::size_t count)
      : data_{static_cast<T*>(allocate_metadata(count * sizeof(T)))}, count_{count} {}
  ~metadata_array() { reset(); }
  metadata_array(metadata_array&& other) noexcept
      : data_{std::exchange(other.data_, nullptr)}, count_{std::exchange(other.count_, 0)} {}
  metadata_array& operator=(metadata_array&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  metadata_array(metadata_array const&) = delete;
  metadata_array& operator=(metadata_array const&) = delete;

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  void reset() noexcept {
    if (data_ != nullptr) { deallocate_metadata(data_, count_ * sizeof(T)); }
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// Address space reserved up front (no memory behind it) and committed from its start as
/// it is needed: what lives there never moves, so a growing array in it can be indexed
/// as one flat array and keeps its elements' addresses. Committed memory is zeroed; once
/// 2 MiB or more is committed it is advised onto huge pages, as above.
class metadata_reservation {
 public:
  metadata_reservation() = default;
  /// Reserves `max_bytes`, or half as much while the system refuses, down to `min_bytes`
  /// (a process under a small address-space limit); throws std::bad_alloc below that.
  /// Both are rounded up to whole 2 MiB pages.
  metadata_reservation(std::size_t max_bytes, std::size_t min_bytes);
  ~metadata_reservation();
  metadata_reservation(metadata_reservation const&) = delete;
  metadata_reservation& operator=(metadata_reservation const&) = delete;

  [[nodiscard]] void* data() const noexcept { return base_; }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t committed_bytes() const noexcept { return committed_; }
  /// Makes at least the first `bytes` usable (`bytes` <= reserved_bytes()). Commits in
  /// doubling steps up to 2 MiB, then in whole 2 MiB pages. Throws std::bad_alloc when the
  /// system has no memory for it.
  void commit(std::size_t bytes);
  /// What `commit(bytes)` would leave committed (a caller can make room for it first).
  [[nodiscard]] std::size_t commit_target(std::size_t bytes) const noexcept;

 private:
  void* base_ = nullptr;
  std::size_t reserved_ = 0;
  std::size_t committed_ = 0;
};

}  // namespace mrstack::detail
