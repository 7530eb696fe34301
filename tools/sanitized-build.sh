#!/usr/bin/env bash
# Configures build/fuzz, the sanitized tree: clang with ASan and UBSan, the libFuzzer
# targets and the CPU tests (each built only when a script asks for it). Shared by
# tools/run-fuzzers.sh and tools/run-sanitized-tests.sh, so both reuse one instrumented
# library.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DMRSTACK_BUILD_FUZZERS=ON -DMRSTACK_SANITIZE="address;undefined" -DMRSTACK_BUILD_TESTS=ON \
  -DMRSTACK_BUILD_BENCHMARKS=OFF -DMRSTACK_BUILD_TOOLS=OFF -DMRSTACK_BUILD_PYTHON=OFF >/dev/null
