#!/usr/bin/env python3
"""The Numba plugin's own share of an allocate+free pair, measured on the CPU (no GPU):
`memalloc` + dropping the returned MemoryPointer, for mrstack's plugin and for a floor
plugin that builds the same objects (CUdeviceptr, MemoryPointer, finalizer) and calls
nothing; both with a stand-in Numba context, over a host-memory stack. The difference is
what mrstack adds: two foreign calls and its stack's allocate+free.

    python3 benchmarks/python/plugin_overhead.py [--spec "pool > system"] [--pairs 200000]

Rounds alternate between the two plugins so machine noise hits both alike.
"""
import argparse
import gc
import os
import statistics
import sys
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="pool > system")
    parser.add_argument("--pairs", type=int, default=200000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ["MRSTACK_RESOURCE"] = args.spec

    from numba import cuda
    from numba.cuda.cudadrv import driver
    import mrstack
    import mrstack.numba

    class Device:
        id = 0

        def get_device_identity(self):
            return {"pci_domain_id": 0, "pci_bus_id": 0, "pci_device_id": 0}

    class Context:
        device = Device()

    def nothing():
        pass

    class Floor(cuda.HostOnlyCUDAMemoryManager):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._ctx = weakref.proxy(self.context)

        def memalloc(self, size):
            return driver.MemoryPointer(self._ctx, driver.binding.CUdeviceptr(1 << 40), size, finalizer=nothing)

        def initialize(self):
            pass

        def get_memory_info(self):
            return cuda.MemoryInfo(0, 0)

        def get_ipc_handle(self, memory):
            raise NotImplementedError

        @property
        def interface_version(self):
            return 1

    ctx = Context()
    managers = {"mrstack": mrstack.numba.MrstackNumbaMemoryManager(context=ctx), "floor": Floor(context=ctx)}
    for m in managers.values():
        m.initialize()
    gc.disable()  # the collector's pauses are noise here; the objects are freed by refcount
    print(f"plugin memalloc + free on the CPU, ns per pair; stack: {mrstack.device_stack(0).describe()}; "
          f"{args.pairs} pairs x {args.rounds} rounds, alternating")
    for size in (256, 4 << 20):
        times = {name: [] for name in managers}
        for _ in range(args.rounds):
            for name, m in managers.items():
                memalloc = m.memalloc
                for _ in range(1000):
                    p = memalloc(size)
                    del p
                start = time.perf_counter_ns()
                for _ in range(args.pairs):
                    p = memalloc(size)
                    del p
                times[name].append((time.perf_counter_ns() - start) / args.pairs)
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"  {size:>8d} B: mrstack {med['mrstack']:7.0f}  floor {med['floor']:7.0f}  "
              f"mrstack's share {med['mrstack'] - med['floor']:6.0f}")
    # Where mrstack's share goes: the two foreign calls by themselves (memalloc_pair and
    # free through ctypes, no Numba objects), and an empty ctypes call for scale. The C++
    # side (bench_emm_adapter) is ~30 ns a pair; the rest is ctypes' per-call cost.
    m = managers["mrstack"]
    pair, free, stack, client = m._memalloc_pair, m._free, m._stack, mrstack._lib.CLIENT_NUMBA
    version = mrstack._lib.library().dll.mrstack_c_api_version
    def calls_only():
        for _ in range(args.pairs):
            free(stack, pair(stack, 256, client).token)
    def empty_call():
        for _ in range(args.pairs):
            version()
    for label, fn in (("memalloc_pair + free through ctypes alone", calls_only),
                      ("an argument-less ctypes call", empty_call)):
        runs = []
        for _ in range(args.rounds):
            start = time.perf_counter_ns()
            fn()
            runs.append((time.perf_counter_ns() - start) / args.pairs)
        print(f"  {label}: {statistics.median(runs):.0f}")
    assert mrstack.statistics(0).clients["numba"].live_bytes == 0


if __name__ == "__main__":
    main()
