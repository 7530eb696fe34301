#!/usr/bin/env bash
# Runs mrstack's GPU checks from a bundle made by ../shared/tools/gpu-bundle (a Release build
# copied with the shared libraries it needs), on a GPU host without the toolchain:
#   tools/gpu/run-cpp-checks.sh BUNDLE OUTDIR [quick]
# Writes OUTDIR/gpu_tests.log, OUTDIR/replay.log (+ replay.json) and OUTDIR/bench_*.log.
# Prints a one-line summary per GPU test. Exit status: 0 when every GPU test passed or
# skipped for want of more than this host has (a second GPU); a test that finds no device
# fails it.
set -u
bundle="$(cd "${1:?usage: run-cpp-checks.sh BUNDLE OUTDIR [quick]}" && pwd)"
out="${2:?usage: run-cpp-checks.sh BUNDLE OUTDIR [quick]}"
quick="${3:-}"
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
# Hosts of the same GPU kind differ (seen: 2x in the pool's ns per call): name the CPU.
{ grep -m1 'model name' /proc/cpuinfo; grep -m1 'cpu MHz' /proc/cpuinfo; nproc;
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"; uptime; } | tee -a "$out/device.txt"
status=0
# A test still running after this long writes every thread's stack to its log
# (tests/support/hang_dump.hpp), before the 300 s timeout below ends it.
export MRSTACK_TEST_HANG_SECONDS="${MRSTACK_TEST_HANG_SECONDS:-240}"
log="$bundle/../../data/torch_resnet50_train.csv.gz"
[ -f "$log" ] || log="data/torch_resnet50_train.csv.gz"
export MRSTACK_SAMPLE_LOG="$(cd "$(dirname "$log")" && pwd)/$(basename "$log")"  # for gpu_test_replay
: >"$out/gpu_tests.log"
for t in "$bundle"/tests/gpu_test_*; do
  name="$(basename "$t")"
  start=$(date +%s)
  timeout 300 "$t" >"$out/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary="$(grep -E '^(All tests passed|test cases:|SKIPPED)' "$out/$name.log" | tail -1)"
  printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$secs" "$summary" | tee -a "$out/gpu_tests.log"
  # A test that skips because this host lacks what it needs beyond one device (a second
  # GPU) is a skip, not a failure; one that finds no device at all fails the run: these
  # checks are for GPU hosts.
  if [ "$rc" -eq 77 ] && ! grep -q '^SKIPPED: no CUDA device' "$out/$name.log"; then continue; fi
  [ "$rc" -eq 0 ] || { status=1; tail -40 "$out/$name.log" >>"$out/gpu_tests.log"; }
done
"$bundle/tools/mrstack-replay" "$log" --repeat 5 --json "$out/replay.json" >"$out/replay.log" 2>&1
echo "replay rc=$?" >>"$out/replay.log"
"$bundle/tools/mrstack-replay" "$log" --repeat 5 --warmup >"$out/replay_warm.log" 2>&1
echo "replay (warm) rc=$?" >>"$out/replay_warm.log"
[ "$quick" = quick ] && exit $status
b="$bundle/benchmarks"
mt=--benchmark_min_time=0.2
# Suballocators: median of 3 (the hosts are shared and noisy). Raw cudaMalloc /
# cudaMallocAsync run once per size (GiB sizes take milliseconds a call); `upstreams`
# leaves them out when another call runs them (RUN_CPP_UPSTREAMS=0).
"$b/bench_random_allocations" $mt --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_filter='random_allocations/(pool|binning|arena|fixed_size)/cuda' \
  >"$out/bench_random_allocations.log" 2>&1
if [ "${RUN_CPP_UPSTREAMS:-1}" = 1 ]; then
  "$b/bench_random_allocations" --benchmark_filter='random_allocations/cuda_async/cuda|random_allocations/cuda/cuda/N:1000/' \
    >"$out/bench_random_allocations_upstreams.log" 2>&1
fi
"$b/bench_multithreaded" $mt >"$out/bench_multithreaded.log" 2>&1
MRSTACK_BENCH_DEVICE=1 "$b/bench_adaptors" $mt >"$out/bench_adaptors.log" 2>&1
"$b/bench_vmm" $mt >"$out/bench_vmm.log" 2>&1
"$b/bench_upstreams" $mt >"$out/bench_upstreams.log" 2>&1
exit $status
