#!/usr/bin/env bash
# The Python package's proof on a CUDA machine, in one run (about 6-8 minutes on an H200):
#   1. the C++ GPU tests of the EMM adapter (if built),
#   2. the GPU pytest scenarios (Numba kernels on pool memory, IPC, Numba + CuPy + PyTorch
#      sharing one pool with per-client books),
#   3. Numba-CUDA's own test suite with the plugin, over a pool stack and then over a
#      logging > pool stack (numba-suite; the built-in manager runs once, as the baseline),
#   4. the allocate+free benchmark (built-in manager vs mrstack vs the floor plugin).
#
#   scripts/gpu-python.sh [OUTDIR]
#
# Needs python3 with numba-cuda, pytest, pytest-xdist (cupy and torch for the three-client
# test), and a built libmrstack_c.so: MRSTACK_LIBRARY, else MRSTACK_BUNDLE/libmrstack_c.so
# (a bundle made by shared/tools/gpu-bundle from a release build; its tests/ are used too),
# else the newest build/*/libmrstack_c.so.
# NUMBA_SUITE names the numba-suite folder (default: shared/tools/numba-suite in the
# checkout); its sitecustomize (numpy >= 2.5 shim) goes on PYTHONPATH.
# GPU_PYTHON_STEPS picks steps (default "cpp pytest suite bench"), to split the run over
# two calls of at most 10 minutes each: for example "cpp pytest bench" (about 3 minutes)
# and "suite" (about 4-5 minutes).
# Exit status: 0 only when every step passed. Each step's last lines are printed; full logs
# go to OUTDIR (default: $OUT if set, else ./gpu-python-out).
set -u
if [ $# -gt 1 ]; then
  echo "gpu-python: one argument at most (OUTDIR), not $#: $*" >&2
  exit 2
fi
# Paths given relative are the caller's: made absolute before the cd into the checkout.
absolute() { case "$1" in ""|/*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
out_given="$(absolute "${1:-${OUT:-}}")"
MRSTACK_BUNDLE="$(absolute "${MRSTACK_BUNDLE:-}")"
NUMBA_SUITE="$(absolute "${NUMBA_SUITE:-}")"
[ -n "${MRSTACK_LIBRARY:-}" ] && MRSTACK_LIBRARY="$(absolute "$MRSTACK_LIBRARY")"
cd "$(dirname "$0")/.."
repo="$PWD"
out="${out_given:-$repo/gpu-python-out}"
mkdir -p "$out"
status=0
steps=" ${GPU_PYTHON_STEPS:-cpp pytest suite bench} "
for s in $steps; do
  case "$s" in cpp|pytest|suite|bench) ;; *) echo "gpu-python: unknown step '$s' in GPU_PYTHON_STEPS (cpp pytest suite bench)" >&2; exit 2 ;; esac
done
if [ -z "${steps// /}" ]; then echo "gpu-python: GPU_PYTHON_STEPS names no step" >&2; exit 2; fi

bundle="${MRSTACK_BUNDLE:-}"
if [ -n "$bundle" ]; then
  if [ ! -d "$bundle" ]; then echo "gpu-python: MRSTACK_BUNDLE '$bundle' is not a folder" >&2; exit 2; fi
  bundle="$(cd "$bundle" && pwd)"
  # shellcheck disable=SC1091
  [ -f "$bundle/env.sh" ] && source "$bundle/env.sh"
fi
if [ -z "${MRSTACK_LIBRARY:-}" ]; then
  if [ -n "$bundle" ]; then MRSTACK_LIBRARY="$bundle/libmrstack_c.so"
  else MRSTACK_LIBRARY="$(ls -t build/*/libmrstack_c.so 2>/dev/null | head -1)"; fi
fi
if [ -z "$MRSTACK_LIBRARY" ] || [ ! -f "$MRSTACK_LIBRARY" ]; then
  echo "gpu-python: no libmrstack_c.so (build it, or set MRSTACK_LIBRARY)" >&2
  exit 2
fi
export MRSTACK_LIBRARY="$(cd "$(dirname "$MRSTACK_LIBRARY")" && pwd)/$(basename "$MRSTACK_LIBRARY")"
suite="${NUMBA_SUITE:-}"
if [ -n "$suite" ] && [ ! -x "$suite/run" ]; then
  echo "gpu-python: NUMBA_SUITE '$suite' has no executable 'run'" >&2; exit 2
fi
for candidate in "$suite" shared/tools/numba-suite; do
  if [ -n "$candidate" ] && [ -x "$candidate/run" ]; then suite="$(cd "$candidate" && pwd)"; break; fi
done
export PYTHONPATH="$repo/python${suite:+:$suite}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
pool_spec="${MRSTACK_SUITE_POOL:-pool(initial=256MiB) > cuda}"
# {pid}: each of the suite's worker processes writes its own log.
default_logging_spec="logging(file=\"$out/alloc-logs/alloc-{pid}.csv\") > pool(initial=256MiB) > cuda"
logging_spec="${MRSTACK_SUITE_LOGGING:-$default_logging_spec}"

wants() { [[ "$steps" == *" $1 "* ]]; }
step() { echo; echo "=== $*"; }
record() {  # name, exit status
  if [ "$2" -eq 0 ]; then echo "--- $1: PASS"
  elif [ "$2" -eq 77 ]; then echo "--- $1: SKIPPED (no CUDA device: counts as a failure here)"; status=1
  else echo "--- $1: FAIL ($2)"; status=1; fi
}

step "environment"
echo "library: $MRSTACK_LIBRARY"
ldd "$MRSTACK_LIBRARY" | sed 's/^/  /'
nvidia-smi -L 2>/dev/null || true
python3 - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("numba_cuda", "numpy", "cupy", "torch", "cuda.bindings", "pytest", "xdist"):
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"  {m}: not available ({type(e).__name__})")
try:
    import mrstack
    print("mrstack hot path:", mrstack.fastpath())  # the compiled extension, or ctypes and why
except Exception as e:
    print(f"mrstack hot path: undecided ({type(e).__name__}: {e})")
PY

if wants cpp; then
step "C++ GPU tests of the EMM adapter"
if [ -n "$bundle" ]; then gpu_test="$bundle/tests/gpu_test_emm_adapter"; [ -x "$gpu_test" ] || gpu_test=""
else gpu_test="$(ls -t build/*/tests/gpu_test_emm_adapter 2>/dev/null | head -1)"; fi
if [ -n "$gpu_test" ]; then
  timeout 120 "$gpu_test" >"$out/gpu_test_emm_adapter.log" 2>&1; rc=$?
  tail -3 "$out/gpu_test_emm_adapter.log"
  record gpu_test_emm_adapter $rc
else
  echo "(not built; skipped)"
fi
fi

if wants pytest; then
step "GPU pytest scenarios"
timeout 300 python3 -m pytest -q -rs python/tests/gpu >"$out/pytest-gpu.log" 2>&1; rc=$?
tail -15 "$out/pytest-gpu.log"
record pytest-gpu $rc
fi

if ! wants suite; then
  :
elif [ -n "$suite" ]; then
  step "numba-suite: mrstack.numba over '$pool_spec' (and the built-in manager as baseline)"
  MRSTACK_RESOURCE="$pool_spec" "$suite/run" mrstack.numba "$repo/python${suite:+:$suite}" "$out/numba-suite-pool" \
    >"$out/numba-suite-pool.txt" 2>&1; rc=$?
  tail -25 "$out/numba-suite-pool.txt"
  record numba-suite-pool $rc

  step "numba-suite: mrstack.numba over '$logging_spec'"
  mkdir -p "$out/numba-suite-logging" "$out/alloc-logs"
  cp "$out/numba-suite-pool/default.xml" "$out/numba-suite-logging/" 2>/dev/null
  NUMBA_SUITE_SKIP_DEFAULT=1 MRSTACK_RESOURCE="$logging_spec" \
    "$suite/run" mrstack.numba "$repo/python${suite:+:$suite}" "$out/numba-suite-logging" \
    >"$out/numba-suite-logging.txt" 2>&1; rc=$?
  tail -25 "$out/numba-suite-logging.txt"
  echo "allocation logs: $(ls "$out/alloc-logs" 2>/dev/null | wc -l) files, $(cat "$out"/alloc-logs/*.csv 2>/dev/null | wc -l) lines"
  record numba-suite-logging $rc
  # Keep only a few logs: they can be large.
  ls "$out"/alloc-logs/*.csv 2>/dev/null | tail -n +4 | xargs -r rm -f
else
  echo "numba-suite not found (set NUMBA_SUITE); skipped"; status=1
fi

if wants bench; then
step "benchmark: Numba allocate+free per pair"
timeout 300 python3 benchmarks/python/numba_alloc.py --json "$out/numba_alloc.json" >"$out/numba_alloc.txt" 2>&1; rc=$?
tail -12 "$out/numba_alloc.txt"
record numba_alloc $rc
fi

echo
echo "gpu-python: $([ $status -eq 0 ] && echo ALL PASSED || echo SOMETHING FAILED); logs in $out"
exit $status
