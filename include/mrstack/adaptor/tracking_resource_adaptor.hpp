#pragma once
/// `tracking_resource_adaptor`: remembers every allocation outstanding through it — its
/// size, alignment, stream, thread, order and (with `capture_stacks`) the call stack that
/// made it — and checks every free against that record. It is the checked mode to turn
/// on when debugging memory errors and leaks.
///
/// - Checks: a deallocate of a pointer it never handed out (or already took back) or
///   with a size or alignment other than the allocation's throws `logic_error` naming
///   the pointer and both sizes, and is NOT forwarded: the upstream never sees a bad free.
/// - Reports on demand: `outstanding()` (structured, oldest first), `call_sites()`
///   (outstanding allocations grouped by call stack, most bytes first) and `report()`
///   (the same as text).
/// - Leak report: with `report_leaks`, the destructor writes `report()` to stderr (or the
///   stream given) when anything is still outstanding: count, bytes, top call sites.
/// - Stacks: captured with glibc's backtrace() (a few microseconds per allocation) and
///   symbolized only when a report is made (`detail::describe_frame`: function names from
///   the ELF symbol tables, module+offset for addr2line; no extra runtime library).
///
/// Cost, and scaling with threads: the records live in 64 shards, one per thread (by
/// `detail::this_thread_shard`), each an open-addressing table (`detail::pointer_map`, no
/// allocation per call) behind its own uncontended spin lock (`detail::shard_spin_lock`),
/// with its own count and bytes.
/// An allocation writes only its thread's shard; a free looks in its own thread's shard
/// first (the common case: the thread that allocated frees) and only then in the others,
/// one lock at a time (a free from another thread costs up to 64 lookups). Sequence
/// numbers are timestamps (coarse-clock nanoseconds since the adaptor was made, raised
/// past the shard's last, times 64, plus the shard), so no counter is shared either:
/// unique, in each thread's order (also for an allocation from a thread_local destructor
/// after the thread's shard index went back at its exit: it stamps in a borrowed shard,
/// so it reads the precise clock), and across threads in time order to within the coarse
/// clock's tick (the kernel's: 1-4 ms at HZ 1000-250, 10 ms at HZ 100) — two threads'
/// allocations closer than that may be listed in either order, even when one came after
/// the other. `outstanding_count()`/`outstanding_bytes()` add the shards up under their
/// locks (bytes past SIZE_MAX, from sizes a size-blind upstream accepted, read SIZE_MAX). Plus the capture when stacks are on (interned: each distinct stack is stored once).
///
/// Thread-safe. `name()` is "tracking". `free_bytes_held`/`release` go to the upstream.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <mrstack/detail/shard_spin_lock.hpp>
#include <mrstack/detail/pointer_map.hpp>
#include <mrstack/detail/sharded_counters.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class tracking_resource_adaptor final : public memory_resource {
 public:
  /// One outstanding allocation.
  struct allocation_info {
    void* pointer = nullptr;
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    std::uintptr_t stream = 0;           ///< the cudaStream_t handle it was allocated on
    /// Unique; increasing with time within a thread, and across threads for allocations
    /// more than a tick of the coarse clock apart (above).
    std::uint64_t sequence = 0;
    std::size_t thread = 0;              ///< OS thread id (as the logging adaptor writes it)
    std::vector<std::string> stack;      ///< innermost first; empty without capture_stacks
  };
  /// Outstanding allocations that share one call stack.
  struct call_site {
    std::size_t count = 0;
    std::size_t bytes = 0;
    std::vector<std::string> stack;  ///< innermost first; empty without capture_stacks
  };

  /// Frames kept per stack.
  static constexpr std::size_t max_stack_frames = 32;

  /// `capture_stacks`: record each allocation's call stack. `report_leaks`: write a
  /// report at destruction if anything is outstanding, to `*report_stream` (which must
  /// outlive the adaptor) or, when null, to stderr.
  explicit tracking_resource_adaptor(resource_ptr upstream, bool capture_stacks = false, bool report_leaks = false,
                                     std::ostream* report_stream = nullptr);
  ~tracking_resource_adaptor() override;

  [[nodiscard]] bool captures_stacks() const noexcept { return capture_stacks_; }
  [[nodiscard]] std::size_t outstanding_count() const noexcept;
  [[nodiscard]] std::size_t outstanding_bytes() const noexcept;
  /// Every outstanding allocation, oldest first by sequence (across threads, to within a
  /// tick of the coarse clock: above), stacks symbolized.
  [[nodiscard]] std::vector<allocation_info> outstanding() const;
  /// Outstanding allocations grouped by call stack, most bytes first (one group in all
  /// without capture_stacks).
  [[nodiscard]] std::vector<call_site> call_sites() const;
  /// Text: count and bytes outstanding, the top `max_call_sites` call sites, and the
  /// oldest `max_allocations` allocations.
  [[nodiscard]] std::string report(std::size_t max_call_sites = 10, std::size_t max_allocations = 20) const;
  [[nodiscard]] resource_ptr const& upstream_resource() const noexcept { return upstream_; }

 private:
  struct record {
    std::size_t bytes;
    std::size_t alignment;
    std::uintptr_t stream;
    std::uint64_t sequence;
    std::size_t thread;
    std::uint32_t stack_id;  // index into stacks_, or no_stack
  };
  static constexpr std::uint32_t no_stack = 0xffffffffU;

  struct alignas(64) shard {
    detail::shard_spin_lock mutex;  // held for table operations (an insert may grow it), never across a call
    detail::pointer_map<record> records;
    std::size_t count = 0;
    // 128 bits: sizes a size-blind upstream accepted may sum past 2^64 (two of 2^63 had
    // wrapped to 0); reads clamp the total to SIZE_MAX.
    __extension__ unsigned __int128 bytes = 0;
    std::uint64_t last_stamp = 0;  // coarse-clock nanoseconds of this shard's last sequence number
  };
  static constexpr std::size_t shard_count = detail::counter_shards;
  /// Takes `address`'s record out of whichever shard holds it, keeping its room there (so
  /// it can go back without the table growing); the shard, or null.
  shard* take_record(std::uintptr_t address, std::size_t bytes, std::size_t alignment, record& out);

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_view stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment, stream_view stream) override;
  std::string do_name() const override { return "tracking"; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }

  /// The coarse monotonic clock (a tick of 1-4 ms, 10 ms at HZ 100, read in ~5 ns; the
  /// precise clock costs ~30 ns, a fifth of a tracked allocate+free pair), in nanoseconds.
  static std::uint64_t coarse_now_ns() noexcept;
  /// The precise monotonic clock, the coarse one's base (never behind it), in nanoseconds:
  /// for a call that stamps in a shard not its thread's (see do_allocate).
  static std::uint64_t precise_now_ns() noexcept;
  std::uint32_t intern_current_stack();
  [[nodiscard]] std::vector<std::pair<void*, record>> snapshot() const;
  [[nodiscard]] std::vector<std::string> symbolized(std::uint32_t stack_id) const;

  resource_ptr upstream_;
  bool capture_stacks_;
  bool report_leaks_;
  std::ostream* report_stream_;
  std::uint64_t const start_ns_ = coarse_now_ns();
  mutable std::array<shard, shard_count> shards_;

  // Interned call stacks: each distinct one stored once, looked up by a hash of its frames.
  mutable std::mutex stacks_mutex_;
  std::vector<std::vector<void*>> stacks_;
  std::unordered_multimap<std::uint64_t, std::uint32_t> stack_index_;
};

}  // namespace mrstack
