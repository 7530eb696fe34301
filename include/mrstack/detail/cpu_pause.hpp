#pragma once
/// `cpu_pause()`: the hint a spin-wait loop gives the core between two looks at a lock or
/// flag (x86 `pause`, AArch64 `yield`): it saves power, lets a sibling hyperthread run and
/// keeps the loop from flooding the memory system with speculative loads. CUDA-free.
namespace mrstack::detail {

inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace mrstack::detail
