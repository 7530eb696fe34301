#!/usr/bin/env bash
# Builds the CPU model tests of the allocation algorithms in the sanitized tree (build/fuzz,
# tools/sanitized-build.sh: clang, ASan, UBSan) and runs each: every randomized model test,
# misuse test and threaded test of the suballocators, with every out-of-bounds access, use
# after free, leak and undefined operation a failure. About three minutes of tests on a
# 2-core machine (docs/reliability.md), after the build (the library is shared with the fuzzers).
#   tools/run-sanitized-tests.sh            # all of them
#   tools/run-sanitized-tests.sh pool_streams misuse
set -euo pipefail
cd "$(dirname "$0")/.."
tests=("$@")
((${#tests[@]})) || tests=(block_pool pool_memory_resource pool_streams pool_threads arena_memory_resource arena_growth
                           fixed_size_memory_resource fixed_size_threads binning_memory_resource misuse
                           suballocators_threads metadata_memory pool_idle_streams pool_capture capture_fixed_size_arena arena_vmm pool_vmm suballocators_threads_misuse suballocators_review_cases arena_depot arena_depot_review
                           pool_stream_fragments stream_ordering_review pool_capture_shards arena_thread_exit pool_sync_under_lock
                           pool_stream_fragments_model binning_adaptor_bins arena_thread_shards arena_thread_shards_review pool_shard_give_back)
tools/sanitized-build.sh
cmake --build build/fuzz --target "${tests[@]/#/test_}"
# allocator_may_return_null: tests ask the host heap for impossible sizes on purpose, an
# out-of-memory error to check, not a sanitizer abort.
export ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
passed=0
failed=0
for t in "${tests[@]}"; do
  start=$(date +%s)
  if build/fuzz/tests/test_"$t" >"build/fuzz/test_$t.log" 2>&1; then
    passed=$((passed + 1))
    echo "run-sanitized-tests: test_$t passed ($(( $(date +%s) - start )) s)"
  else
    failed=$((failed + 1))
    echo "run-sanitized-tests: test_$t FAILED under ASan/UBSan (build/fuzz/test_$t.log):" >&2
    grep -E "ERROR|runtime error|FAILED|SUMMARY" "build/fuzz/test_$t.log" | head -20 >&2 || true
  fi
done
echo "sanitized: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
