#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, and runs each for
# SECONDS (default 60) over its seed corpus, tests/fuzz/corpus/<target>/. New inputs go to
# build/fuzz/corpus/<target>/ (the seeds are never written); a crash, a sanitizer report, a
# leak or a broken invariant stops that target, leaves the input in build/fuzz/artifacts/
# and makes the script fail. Any further arguments name the targets to run
# (allocation_log, spec, c_api; default all three, one after another).
#   tools/run-fuzzers.sh 600 c_api
#   MRSTACK_FUZZ_MISUSE=all tools/run-fuzzers.sh 60 c_api   # misuse on every stack
set -euo pipefail
seconds="${1:-60}"
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  # libFuzzer reads a word as 0 seconds, which means no limit at all.
  echo "run-fuzzers: SECONDS must be a whole number above 0, not '$seconds'" >&2
  echo "usage: tools/run-fuzzers.sh [SECONDS] [allocation_log|spec|c_api ...]" >&2
  exit 2
fi
shift || true
targets=("$@")
((${#targets[@]})) || targets=(allocation_log spec c_api)
cd "$(dirname "$0")/.."
build=build/fuzz
tools/sanitized-build.sh
cmake --build "$build" --target "${targets[@]/#/fuzz_}"
# allocator_may_return_null: a fuzzed size may ask the host heap for exabytes, which is an
# out-of-memory error to report, not a sanitizer abort.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/artifacts"
  echo "run-fuzzers: fuzz_$t for ${seconds}s"
  # MRSTACK_FUZZ_RUNS (CI sets it) makes a run repeatable: a fixed seed, at most that many
  # inputs, and no corpus of earlier runs, so CI replays the same inputs every time (a
  # shorter run, on a slower machine, replays a prefix of them).
  extra=()
  if [ -n "${MRSTACK_FUZZ_RUNS:-}" ]; then
    extra=(-seed=1 -runs="$MRSTACK_FUZZ_RUNS")
    rm -rf "${build:?}/corpus/$t" && mkdir -p "$build/corpus/$t"
  fi
  if ! "$build/tests/fuzz/fuzz_$t" "${extra[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$t" "tests/fuzz/corpus/$t" \
      >"$build/fuzz_$t.log" 2>&1; then
    echo "run-fuzzers: fuzz_$t FOUND A PROBLEM (input in $build/artifacts/):" >&2
    grep -E "ERROR|invariant|fuzz_c_api:|fuzz_spec:|runtime error|SUMMARY" "$build/fuzz_$t.log" | head -20 >&2 || true
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+ *DONE" "$build/fuzz_$t.log" || true
  echo "run-fuzzers: fuzz_$t corpus: $(ls "$build/corpus/$t" | wc -l) new inputs, $(ls "tests/fuzz/corpus/$t" | wc -l) seeds"
done
exit $status
