#pragma once
// The steps of the multi-stream benchmarks (bench_multistream, bench_multistream_designs):
// each stream's thread takes 20,000 random steps — allocate 1 B to 64 MiB (uniform) or free
// a random live block of its own, with equal odds — under a cap on its live bytes (an
// allocation that would pass it frees instead), then frees what it still holds. Generated
// before timing.
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace mrstack::bench {

inline constexpr std::size_t live_cap = std::size_t{8} << 30;  // all streams together
inline constexpr std::size_t steps_per_thread = 20000;
inline constexpr std::size_t largest_block = std::size_t{64} << 20;

struct step {
  std::uint32_t slot;  // which live block: an index into the thread's pointer table
  bool allocate;
  std::size_t bytes;
};

/// One thread's steps under `cap` live bytes; ends with every block freed. `slots`: the
/// size its pointer table needs.
inline std::vector<step> make_steps(std::size_t cap, std::uint64_t seed, std::size_t& slots) {
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<std::size_t> size_of{1, largest_block};
  std::vector<step> steps;
  std::vector<std::pair<std::uint32_t, std::size_t>> live;
  std::vector<std::uint32_t> free_slots;
  std::size_t usage = 0;
  slots = 0;
  auto free_one = [&] {
    std::size_t const k = rng() % live.size();
    steps.push_back({live[k].first, false, live[k].second});
    usage -= live[k].second;
    free_slots.push_back(live[k].first);
    live[k] = live.back();
    live.pop_back();
  };
  for (std::size_t i = 0; i < steps_per_thread; ++i) {
    std::size_t const bytes = size_of(rng);
    if (live.empty() || (rng() % 2 == 0 && usage + bytes <= cap)) {
      if (usage + bytes > cap) { continue; }  // nothing to free and it does not fit: skip
      std::uint32_t slot = 0;
      if (free_slots.empty()) {
        slot = static_cast<std::uint32_t>(slots++);
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      steps.push_back({slot, true, bytes});
      live.emplace_back(slot, bytes);
      usage += bytes;
    } else {
      free_one();
    }
  }
  while (!live.empty()) { free_one(); }
  return steps;
}

}  // namespace mrstack::bench
