#include <mrstack/detail/thread_caches.hpp>

#include <mutex>

namespace mrstack::detail {

namespace {

struct registry {
  struct owner_slot {
    std::uint64_t generation = 0;  // 0: free
    thread_cache_owner* owner = nullptr;
  };
  std::mutex mutex;
  std::vector<owner_slot> owners;
  std::vector<std::uint32_t> free_indices;
  std::uint64_t next_generation = 1;
};

// Never destroyed: threads may exit (and hand caches back) during static destruction.
registry& the_registry() {
  static auto* r = new registry();
  return *r;
}

}  // namespace

cache_ticket register_cache_owner(thread_cache_owner* owner) {
  registry& r = the_registry();
  std::lock_guard lock{r.mutex};
  cache_ticket t;
  t.generation = r.next_generation++;
  if (!r.free_indices.empty()) {
    t.index = r.free_indices.back();
    r.free_indices.pop_back();
  } else {
    t.index = static_cast<std::uint32_t>(r.owners.size());
    r.owners.emplace_back();
  }
  r.owners[t.index] = registry::owner_slot{t.generation, owner};
  return t;
}

void unregister_cache_owner(cache_ticket ticket) noexcept {
  registry& r = the_registry();
  std::lock_guard lock{r.mutex};
  if (ticket.index >= r.owners.size() || r.owners[ticket.index].generation != ticket.generation) { return; }
  r.owners[ticket.index] = registry::owner_slot{};
  try {
    r.free_indices.push_back(ticket.index);
  } catch (...) {
    // The index is simply not recycled.
  }
}

namespace {
// Set once the calling thread's table is destroyed (thread exit): a call into a resource
// from a later thread-local destructor then gets a cache that is simply not remembered
// (its blocks are taken back like any other cache's).
thread_local bool table_destroyed = false;
}  // namespace

bool set_this_thread_cache(cache_ticket const& ticket, void* cache) {
  if (table_destroyed) { return false; }
  thread_local thread_cache_table table;
  this_thread_caches = &table;
  auto& entries = table.entries;
  if (ticket.index >= entries.size()) { entries.resize(std::size_t{ticket.index} + 1); }
  entries[ticket.index] = thread_cache_table::entry{ticket.generation, cache};
  return true;
}

thread_cache_table::~thread_cache_table() {
  this_thread_caches = nullptr;
  table_destroyed = true;
  registry& r = the_registry();
  std::lock_guard lock{r.mutex};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    entry const& e = entries[i];
    if (e.generation == 0 || i >= r.owners.size() || r.owners[i].generation != e.generation) { continue; }
    r.owners[i].owner->thread_exiting(e.cache);
  }
}

}  // namespace mrstack::detail
