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

#include <string>

namespace {

/// The stream the row names: the legacy one (range(1) == 0) or one created non-blocking
/// stream, shared by the rows. False, after skipping the row, when it cannot be created:
/// measuring the legacy stream under the created one's name would mislead.
bool stream_for(benchmark::State& state, cudaStream_t& stream) {
  static cudaError_t create_error = cudaSuccess;
  static cudaStream_t const created = [] {
    cudaStream_t s = nullptr;
    create_error = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }();
  stream = nullptr;
  if (state.range(1) == 0) { return true; }
  if (create_error != cudaSuccess) {
    state.SkipWithError((std::string{"cudaStreamCreateWithFlags: "} + cudaGetErrorString(create_error)).c_str());
    return false;
  }
  stream = created;
  return true;
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
  cudaStream_t stream = nullptr;
  if (!stream_for(state, stream)) { return; }
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
  cudaStream_t stream = nullptr;
  if (!stream_for(state, stream)) { return; }
  for (auto _ : state) {
    void* p = nullptr;
    // A refused call would time the error path as a fast pair: stop at the first one.
    if (mrstack_allocate(stack, bytes, stream, MRSTACK_CLIENT_TORCH, &p) != MRSTACK_SUCCESS ||
        mrstack_deallocate(stack, p, bytes, stream, MRSTACK_CLIENT_TORCH) != MRSTACK_SUCCESS) {
      state.SkipWithError(mrstack_last_error());
      break;
    }
    benchmark::DoNotOptimize(p);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_stream_is_capturing(benchmark::State& state) {
  if (device_stack(state) == nullptr) { return; }
  cudaStream_t stream = nullptr;
  if (!stream_for(state, stream)) { return; }
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
