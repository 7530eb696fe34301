// torch_entry: what one allocate+free pair costs through the entry points PyTorch's
// pluggable allocator calls (mrstack_torch_alloc_raising / mrstack_torch_free), against
// the same device stack through the plain C ABI (mrstack_allocate / mrstack_deallocate),
// and the CUDA queries the entry points make on every allocation. The difference is
// what mrstack adds per tensor beyond its allocator, which a CPU-bound PyTorch loop (the
// two-stream inference loop of torch_train.py) pays in step time.
//
//   bench_torch_entry                      # needs a device; pool > cuda unless MRSTACK_RESOURCE says otherwise
//
// Arguments: bytes, then the stream (0: the legacy default stream, 1: a created
// non-blocking stream, as PyTorch's side streams are).
#include <benchmark/benchmark.h>

#include <allocation_sequence.hpp>

#include <mrstack/c_api.h>

#include <cuda_runtime_api.h>

namespace {

cudaStream_t stream_for(benchmark::State const& state) {
  static cudaStream_t created = [] {
    cudaStream_t s = nullptr;
    (void)cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }();
  return state.range(1) != 0 ? created : nullptr;
}

mrstack_stack* device_stack(benchmark::State& state) {
  if (!mrstack::bench::have_device()) {
    state.SkipWithError("no CUDA device");
    return nullptr;
  }
  mrstack_stack* stack = nullptr;
  if (mrstack_device_stack(0, &stack) != MRSTACK_SUCCESS) {
    state.SkipWithError(mrstack_last_error());
    return nullptr;
  }
  return stack;
}

void BM_torch_entry_pair(benchmark::State& state) {
  if (device_stack(state) == nullptr) { return; }
  auto const bytes = static_cast<std::size_t>(state.range(0));
  cudaStream_t const stream = stream_for(state);
  for (auto _ : state) {
    void* p = mrstack_torch_alloc_raising(bytes, 0, stream);
    benchmark::DoNotOptimize(p);
    mrstack_torch_free(p, bytes, 0, stream);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_c_abi_pair(benchmark::State& state) {
  mrstack_stack* stack = device_stack(state);
  if (stack == nullptr) { return; }
  auto const bytes = static_cast<std::size_t>(state.range(0));
  cudaStream_t const stream = stream_for(state);
  for (auto _ : state) {
    void* p = nullptr;
    (void)mrstack_allocate(stack, bytes, stream, MRSTACK_CLIENT_TORCH, &p);
    benchmark::DoNotOptimize(p);
    (void)mrstack_deallocate(stack, p, bytes, stream, MRSTACK_CLIENT_TORCH);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_stream_is_capturing(benchmark::State& state) {
  if (device_stack(state) == nullptr) { return; }
  cudaStream_t const stream = stream_for(state);
  for (auto _ : state) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    benchmark::DoNotOptimize(cudaStreamIsCapturing(stream, &status));
    benchmark::DoNotOptimize(status);
  }
}

void BM_get_device(benchmark::State& state) {
  if (device_stack(state) == nullptr) { return; }
  for (auto _ : state) {
    int device = -1;
    benchmark::DoNotOptimize(cudaGetDevice(&device));
    benchmark::DoNotOptimize(device);
  }
}

}  // namespace

BENCHMARK(BM_torch_entry_pair)->Args({256, 0})->Args({256, 1})->Args({1 << 20, 0})->Args({1 << 20, 1});
BENCHMARK(BM_c_abi_pair)->Args({256, 0})->Args({256, 1})->Args({1 << 20, 0})->Args({1 << 20, 1});
BENCHMARK(BM_stream_is_capturing)->Args({0, 0})->Args({0, 1});
BENCHMARK(BM_get_device);

BENCHMARK_MAIN();
