#!/usr/bin/env bash
# Runs mrstack's GPU checks from a bundle made by ../shared/tools/gpu-bundle (a Release build
# copied with the shared libraries it needs), on a GPU host without the toolchain:
#   tools/gpu/run-cpp-checks.sh BUNDLE OUTDIR [quick]
# Writes OUTDIR/gpu_tests.log, OUTDIR/replay.log (+ replay.json) and OUTDIR/bench_*.log.
# Prints a one-line summary per GPU test. Exit status: 0 when every GPU test passed or
# skipped for want of more than this host has (a second GPU), both replays exited 0 and
# (without `quick`) every benchmark program exited 0 with no benchmark reporting an error;
# a test that finds no device fails it. 2: bad arguments.
set -u
usage="usage: run-cpp-checks.sh BUNDLE OUTDIR [quick]"
if [ $# -lt 1 ] || [ ! -d "$1" ] || [ ! -f "$1/env.sh" ]; then
  echo "run-cpp-checks: ${1:-(no BUNDLE)} is not a bundle folder with an env.sh; $usage" >&2
  exit 2
fi
if [ $# -lt 2 ] || [ -z "$2" ]; then echo "run-cpp-checks: no OUTDIR; $usage" >&2; exit 2; fi
if [ $# -gt 3 ] || { [ $# -eq 3 ] && [ "$3" != quick ]; }; then
  echo "run-cpp-checks: the third argument may only be 'quick', not '${3:-}'; $usage" >&2
  exit 2
fi
bundle="$(cd "$1" && pwd)"
out="$2"
quick="${3:-}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if ! mkdir -p "$out" 2>/dev/null || [ ! -d "$out" ]; then echo "run-cpp-checks: cannot make OUTDIR $out" >&2; exit 2; fi
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
[ -f "$log" ] || log="$repo/data/torch_resnet50_train.csv.gz"
if [ ! -f "$log" ]; then echo "run-cpp-checks: no sample log at $log" >&2; exit 2; fi
export MRSTACK_SAMPLE_LOG="$(cd "$(dirname "$log")" && pwd)/$(basename "$log")"  # for gpu_test_replay
export MRSTACK_DATA_DIR="$(dirname "$MRSTACK_SAMPLE_LOG")"  # for bench_vmm's replay rows
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
# run LOG COMMAND...: runs it with its output in LOG, notes its exit status there, and
# fails the run when it is not 0 or (a benchmark program, which exits 0 regardless) when a
# benchmark reported an error.
run() {
  local log="$1"; shift
  "$@" >"$log" 2>&1
  local rc=$?
  echo "rc=$rc" >>"$log"
  if [ "$rc" -ne 0 ] || grep -q 'ERROR OCCURRED' "$log"; then
    status=1
    echo "FAILED (rc=$rc): $(basename "$log")" | tee -a "$out/gpu_tests.log"
  fi
}
run "$out/replay.log" "$bundle/tools/mrstack-replay" "$log" --repeat 5 --json "$out/replay.json"
run "$out/replay_warm.log" "$bundle/tools/mrstack-replay" "$log" --repeat 5 --warmup
[ "$quick" = quick ] && exit $status
b="$bundle/benchmarks"
mt=--benchmark_min_time=0.2
# Suballocators: median of 3 (the hosts are shared and noisy). Raw cudaMalloc /
# cudaMallocAsync run once per size (GiB sizes take milliseconds a call); `upstreams`
# leaves them out when another call runs them (RUN_CPP_UPSTREAMS=0).
run "$out/bench_random_allocations.log" "$b/bench_random_allocations" $mt --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_filter='random_allocations/(pool|binning|arena|fixed_size)/cuda'
if [ "${RUN_CPP_UPSTREAMS:-1}" = 1 ]; then
  run "$out/bench_random_allocations_upstreams.log" "$b/bench_random_allocations" \
    --benchmark_filter='random_allocations/cuda_async/cuda|random_allocations/cuda/cuda/N:1000/'
fi
run "$out/bench_multithreaded.log" "$b/bench_multithreaded" $mt
MRSTACK_BENCH_DEVICE=1 run "$out/bench_adaptors.log" "$b/bench_adaptors" $mt
run "$out/bench_vmm.log" "$b/bench_vmm" $mt
run "$out/bench_upstreams.log" "$b/bench_upstreams" $mt
exit $status
