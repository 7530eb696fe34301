#pragma once
// Pre-generated random allocation sequences for the suballocator benchmarks, so the timed
// loop does nothing but allocate and free: N allocations of random size in [1, M] with
// random frees (allocate with probability 0.73, otherwise free a random live block), the
// bytes live at once capped, and every block freed by the end.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include <mrstack/resource.hpp>

namespace mrstack::bench {

struct operation {
  std::uint32_t slot;  // which live block (an index into the replay's pointer table)
  bool allocate;
  std::size_t bytes;
};

struct allocation_sequence {
  std::vector<operation> ops;
  std::size_t slots = 0;
  std::size_t allocations = 0;
};

/// `charge(bytes)`: what a block costs against `cap` (its size, or a fixed block size).
template <typename Charge>
allocation_sequence make_sequence(std::size_t n, std::size_t max_bytes, std::size_t cap, Charge charge,
                                  std::uint64_t seed) {
  allocation_sequence seq;
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<std::size_t> size_of{1, max_bytes};
  std::vector<std::uint32_t> live;  // slots in use
  std::vector<std::size_t> bytes_of;
  std::vector<std::uint32_t> free_slots;
  std::size_t usage = 0;
  auto free_one = [&] {
    std::size_t const k = rng() % live.size();
    std::uint32_t const slot = live[k];
    live[k] = live.back();
    live.pop_back();
    seq.ops.push_back({slot, false, bytes_of[slot]});
    usage -= charge(bytes_of[slot]);
    free_slots.push_back(slot);
  };
  seq.ops.reserve(2 * n);
  while (seq.allocations < n) {
    bool const want_allocate = live.empty() || std::uniform_real_distribution<double>{0, 1}(rng) < 0.73;
    std::size_t const bytes = size_of(rng);
    if (want_allocate && usage + charge(bytes) <= cap) {
      std::uint32_t slot = 0;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<std::uint32_t>(bytes_of.size());
        bytes_of.push_back(0);
      }
      bytes_of[slot] = bytes;
      live.push_back(slot);
      usage += charge(bytes);
      seq.ops.push_back({slot, true, bytes});
      ++seq.allocations;
    } else if (!live.empty()) {
      free_one();
    }
  }
  while (!live.empty()) { free_one(); }
  seq.slots = bytes_of.size();
  return seq;
}

/// Replays `seq` once on `stream`; `ptrs` has room for `seq.slots` pointers.
inline void replay(memory_resource& mr, allocation_sequence const& seq, std::vector<void*>& ptrs, stream_view stream) {
  for (auto const& op : seq.ops) {
    if (op.allocate) {
      ptrs[op.slot] = mr.allocate(op.bytes, stream);
    } else {
      mr.deallocate(ptrs[op.slot], op.bytes, stream);
    }
  }
}

inline bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

/// Free device memory at first use (so caps do not shrink as the benchmarks run).
inline std::size_t device_free_memory() {
  static std::size_t const free_bytes = [] {
    std::size_t free_b = 0;
    std::size_t total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::size_t{0};
    }
    return free_b;
  }();
  return free_bytes;
}

}  // namespace mrstack::bench
