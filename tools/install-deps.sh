#!/usr/bin/env bash
# Installs what mrstack builds with, from Debian's packages (idempotent: installed
# packages are skipped). The CUDA toolkit itself (nvcc, cudart, CCCL) must already be at
# /usr/local/cuda or on PATH. Also installs the Python test dependencies
# (python/requirements-test.txt) with pip into a virtual environment of the checkout's own,
# build/venv, so the system's Python is left alone; tools/run-tests.sh runs pytest from it.
# chromium: the report test renders the HTML report headless and checks the screenshot.
# python3-dev: the headers the optional Python extension (mrstack._fastpath) is built with,
# for Debian's python3 (a pyenv or other self-built Python carries its own headers).
set -euo pipefail
cd "$(dirname "$0")/.."  # the checks below name the checkout's own paths
# clang + libclang-rt-14-dev: the libFuzzer targets (tools/run-fuzzers.sh; libFuzzer and the
# sanitizer runtimes for clang are in libclang-rt-14-dev).
packages=(cmake ninja-build g++ libspdlog-dev catch2 libbenchmark-dev zlib1g-dev libbackward-cpp-dev libdw-dev
          python3-dev python3-venv chromium clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: no CUDA toolkit found (looked for nvcc on PATH and in /usr/local/cuda)" >&2
  exit 1
fi
if [ -f python/requirements-test.txt ]; then
  [ -x build/venv/bin/python ] || python3 -m venv build/venv
  build/venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
  echo "install-deps: Python test packages in build/venv"
fi
