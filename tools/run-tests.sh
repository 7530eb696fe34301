#!/usr/bin/env bash
# The test command (README and CI): configure with warnings as errors, build, run every
# ctest test (GPU tests report themselves skipped without a device), then each libFuzzer
# target for MRSTACK_FUZZ_SECONDS (default 60; 0 skips them) under ASan+UBSan
# (tools/run-fuzzers.sh; repeatable: a fixed seed and at most MRSTACK_FUZZ_RUNS inputs,
# default 20000), then the allocators' model tests under ASan+UBSan
# (tools/run-sanitized-tests.sh), then the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
cmake --workflow --preset ci
fuzz_seconds="${MRSTACK_FUZZ_SECONDS:-60}"
if [ "$fuzz_seconds" != 0 ]; then
  MRSTACK_FUZZ_RUNS="${MRSTACK_FUZZ_RUNS:-20000}" tools/run-fuzzers.sh "$fuzz_seconds"
fi
# The model tests again under ASan+UBSan, in the fuzzers' tree (MRSTACK_SANITIZED_TESTS=0 skips them).
if [ "${MRSTACK_SANITIZED_TESTS:-1}" != 0 ]; then
  tools/run-sanitized-tests.sh
fi
if [ -d python/tests ]; then
  # The package's tests use the library this build just made (build/ci), and a missing
  # library fails them instead of skipping them.
  # pytest runs from the environment tools/install-deps.sh made (build/venv).
  python=python3
  [ -x build/venv/bin/python ] && python=build/venv/bin/python
  MRSTACK_LIBRARY="$PWD/build/ci/libmrstack_c.so" MRSTACK_REQUIRE_LIBRARY=1 "$python" -m pytest -q python/tests
fi
