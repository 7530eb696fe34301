#pragma once
/// Per-thread caches for resources that keep one (fixed_size): which cache the calling
/// thread has for a resource, found in O(1) with no lock, and a hand-back when the thread
/// exits. CUDA-free.
///
/// A resource registers once and gets a ticket: a small index (recycled) and a generation
/// (never reused). Each thread keeps a table indexed by ticket index holding (generation,
/// cache); an entry counts only while its generation matches the resource's, so a stale
/// entry left by a destroyed resource is never used. When a thread exits, each of its
/// live entries goes back to its resource through `thread_cache_owner::thread_exiting`,
/// under the registry's lock — and `unregister` takes that lock too, so a resource being
/// destroyed never gets a call after `unregister` returns.
#include <cstdint>
#include <vector>

namespace mrstack::detail {

class thread_cache_owner {
 public:
  /// The thread that used `cache` is exiting: take its contents back (the owner's locks
  /// only; never the registry's).
  virtual void thread_exiting(void* cache) noexcept = 0;

 protected:
  ~thread_cache_owner() = default;
};

struct cache_ticket {
  std::uint32_t index = 0;
  std::uint64_t generation = 0;
};

cache_ticket register_cache_owner(thread_cache_owner* owner);
void unregister_cache_owner(cache_ticket ticket) noexcept;

/// The calling thread's table of caches. Reached through a plain thread-local pointer
/// (constant-initialized: no guard on the hot path); the object itself lives in a
/// thread-local with a destructor, touched only when a cache is first recorded.
struct thread_cache_table {
  struct entry {
    std::uint64_t generation = 0;
    void* cache = nullptr;
  };
  std::vector<entry> entries;
  thread_cache_table() = default;
  thread_cache_table(thread_cache_table const&) = delete;
  thread_cache_table& operator=(thread_cache_table const&) = delete;
  ~thread_cache_table();
};
inline thread_local thread_cache_table* this_thread_caches = nullptr;

/// The calling thread's cache for the resource holding `ticket`, or null.
inline void* this_thread_cache(cache_ticket const& ticket) noexcept {
  thread_cache_table const* table = this_thread_caches;
  if (table == nullptr || ticket.index >= table->entries.size()) { return nullptr; }
  auto const& e = table->entries[ticket.index];
  return e.generation == ticket.generation ? e.cache : nullptr;
}
/// Records `cache` as the calling thread's cache for that resource. False when the thread
/// is past the destruction of its table (exiting): then it must use no cache.
bool set_this_thread_cache(cache_ticket const& ticket, void* cache);

}  // namespace mrstack::detail
