#!/usr/bin/env python3
"""What one Numba `cuda.device_array` allocate+free pair costs under three memory managers,
measured in one run, each manager in its own process:

- builtin: Numba's own manager (cuMemAlloc, frees batched and deferred);
- mrstack: mrstack's EMM plugin over a pool stack (MRSTACK_RESOURCE, default below),
           through the compiled fast path when it is built (`mrstack.fastpath()`; set
           MRSTACK_FASTPATH=1 to make its absence an error);
- mrstack-ctypes: the same plugin forced onto ctypes (MRSTACK_FASTPATH=0), for comparison;
- floor:   a plugin that hands out one preallocated buffer and frees nothing. What it costs
           is Numba's own share (the device array, MemoryPointer and finalizer objects);
           what a real plugin costs beyond it is the plugin's share.

    python3 benchmarks/python/numba_alloc.py [--iterations 20000] [--rounds 3] [--batches 5]

Needs a CUDA device, numba-cuda and a built libmrstack_c.so (found as the mrstack package
finds it). This file is also the floor plugin's module (NUMBA_CUDA_MEMORY_MANAGER=numba_alloc).
Exit status: 0 PASS (mrstack within 1.5 us of the floor), 1 FAIL, 77 under the CUDA
simulator (no manager runs there, so there is nothing to judge).
"""
import argparse
import json
import os
import statistics as stats
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_SPEC = "pool(initial=256MiB) > cuda"
SIZES = (256, 4 << 20)


# ---- the floor plugin ----------------------------------------------------------------
def _make_floor_manager():
    import weakref
    from numba import cuda
    from numba.cuda.cudadrv import driver

    def _nothing():
        pass

    class FloorMemoryManager(cuda.HostOnlyCUDAMemoryManager):
        """Hands out one preallocated buffer to every request and frees nothing."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._buffer = None

        @property
        def interface_version(self):
            return 1

        def initialize(self):
            if self._buffer is None:
                self._buffer = int(driver.driver.cuMemAlloc(max(SIZES)))
                self._ctx = weakref.proxy(self.context)

        def memalloc(self, size):
            # The per-allocation work any plugin has to do, and nothing else.
            return driver.MemoryPointer(self._ctx, driver.binding.CUdeviceptr(self._buffer), size,
                                        finalizer=_nothing)

        def get_memory_info(self):
            free, total = driver.driver.cuMemGetInfo()
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):
            raise NotImplementedError("the floor plugin shares nothing")

    return FloorMemoryManager


if __name__ != "__main__" and os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == __name__:
    _numba_memory_manager = _make_floor_manager()


# ---- one manager, in its own process --------------------------------------------------
def measure(iterations, rounds):
    import numpy as np
    from numba import cuda

    device_array = cuda.device_array
    uint8 = np.uint8
    for size in SIZES:
        for _ in range(1000):  # warm: context, pool chunk, code paths
            a = device_array(size, dtype=uint8)
            del a
    # Sizes alternate within each round, so a slow spell of the host (they last seconds on
    # a shared machine) falls on both sizes alike instead of on whichever ran then.
    results = {size: [] for size in SIZES}
    for _ in range(rounds):
        for size in SIZES:
            start = time.perf_counter_ns()
            for _ in range(iterations):
                a = device_array(size, dtype=uint8)
                del a
            results[size].append((time.perf_counter_ns() - start) / iterations / 1000.0)
    # (getattr: the CUDA simulator, which can dry-run this script, has no memory manager)
    manager = type(getattr(cuda.current_context(), "memory_manager", None)).__name__
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    mrstack = sys.modules.get("mrstack")  # loaded only by the plugin's process
    return {"manager": manager, "device": name.decode() if isinstance(name, bytes) else str(name),
            "path": str(mrstack.fastpath()) if mrstack is not None and mrstack._lib.is_loaded() else "",
            "us_per_pair": {str(k): v for k, v in results.items()}}


def run_child(name, env_extra, iterations, rounds):
    env = dict(os.environ)
    env.update(env_extra)
    path = [HERE, os.path.join(REPO, "python")]
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, __file__, "--child", "--iterations", str(iterations),
                           "--rounds", str(rounds)], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the measuring process failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20000, help="pairs per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per process")
    parser.add_argument("--batches", type=int, default=5,
                        help="times every manager's process runs, in turn (paired: see below)")
    parser.add_argument("--spec", default=os.environ.get("MRSTACK_BENCH_SPEC", DEFAULT_SPEC),
                        help="the mrstack stack (default: %(default)s)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--no-ctypes", action="store_true", help="skip the mrstack-ctypes comparison run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.iterations, args.rounds)))
        return 0

    plugin = {"NUMBA_CUDA_MEMORY_MANAGER": "mrstack.numba", "MRSTACK_RESOURCE": args.spec}
    managers = {"builtin": {"NUMBA_CUDA_MEMORY_MANAGER": "default"}, "mrstack": plugin}
    if not args.no_ctypes:
        managers["mrstack-ctypes"] = {**plugin, "MRSTACK_FASTPATH": "0"}
    managers["floor"] = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_alloc"}
    # The managers take turns, batch after batch, so each batch of mrstack rounds has a
    # floor batch measured seconds away: the verdict is on those paired differences,
    # which a slow spell of the host shifts far less than it shifts a whole process.
    runs = {}
    paired = {str(size): [] for size in SIZES}
    for _ in range(args.batches):
        batch = {name: run_child(name, env, args.iterations, args.rounds) for name, env in managers.items()}
        for name, run in batch.items():
            if name not in runs:
                runs[name] = run
            else:
                for size, rounds in run["us_per_pair"].items():
                    runs[name]["us_per_pair"][size].extend(rounds)
        for size in paired:
            paired[size].append(stats.median(batch["mrstack"]["us_per_pair"][size]) -
                                stats.median(batch["floor"]["us_per_pair"][size]))
    device = runs["builtin"]["device"]
    expected = {"builtin": "NumbaCUDAMemoryManager", "mrstack": "MrstackNumbaMemoryManager",
                "mrstack-ctypes": "MrstackNumbaMemoryManager", "floor": "FloorMemoryManager"}
    expected = {name: expected[name] for name in runs}
    used = {name: run["manager"] for name, run in runs.items()}
    if device != "CUDA simulator" and used != expected:
        raise SystemExit(f"numba_alloc: a process did not use the manager it was meant to: {used}")
    print(f"Numba cuda.device_array allocate+free, microseconds per pair ({args.iterations} pairs per round; "
          f"{args.batches} batches of {args.rounds} rounds, every manager in its own process, in turn)")
    print(f"device: {device}; mrstack stack: {args.spec}; managers: "
          + ", ".join(f"{k}={v}" for k, v in used.items()))
    print(f"mrstack's path: {runs['mrstack']['path'] or '?'}"
          + (f"; mrstack-ctypes: {runs['mrstack-ctypes']['path'] or '?'}" if "mrstack-ctypes" in runs else ""))
    header = f"{'manager':34s}" + "".join(f"{_size_name(s):>24s}" for s in SIZES)
    print(header)
    print("-" * len(header))
    for name, label in (("builtin", "Numba built-in manager"), ("mrstack", "mrstack.numba (pool)"),
                        ("mrstack-ctypes", "mrstack.numba, ctypes path"),
                        ("floor", "floor (one buffer, frees nothing)")):
        if name not in runs:
            continue
        cells = []
        for size in SIZES:
            rounds = runs[name]["us_per_pair"][str(size)]
            cells.append(f"{stats.median(rounds):7.2f} ({min(rounds):.2f}-{max(rounds):.2f})")
        print(f"{label:34s}" + "".join(f"{c:>24s}" for c in cells))
    deltas = [stats.median(paired[str(size)]) for size in SIZES]
    print(f"{'mrstack - floor, paired (<= 1.5)':34s}" +
          "".join(f"{f'{d:.2f} ({min(paired[str(s)]):.2f}-{max(paired[str(s)]):.2f})':>24s}"
                  for d, s in zip(deltas, SIZES)))
    if device == "CUDA simulator":
        # No memory manager runs under the simulator: the numbers time Python, not a manager.
        print("numba_alloc: dry run on the CUDA simulator: no manager measured, no verdict")
        return 77
    verdict = "PASS" if all(d <= 1.5 for d in deltas) else "FAIL"
    print(f"numba_alloc: mrstack within {max(deltas):.2f} us of the floor (median of {args.batches} paired "
          f"batches): {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": args.spec, "runs": runs, "paired_mrstack_minus_floor_us": paired,
                       "mrstack_minus_floor_us": dict(zip(map(str, SIZES), deltas))}, f, indent=2)
    return 0 if verdict == "PASS" else 1


def _size_name(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"


if __name__ == "__main__":
    sys.exit(main())
