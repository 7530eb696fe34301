#!/usr/bin/env python3
"""The Numba plugin's own share of an allocate+free pair, measured on the CPU (no GPU):
`memalloc` + dropping the returned MemoryPointer, for mrstack's plugin through the
compiled fast path (mrstack._fastpath), the same plugin through ctypes, and a floor
plugin that builds the same objects (CUdeviceptr, MemoryPointer, finalizer) and calls
nothing; all with a stand-in Numba context, over a host-memory stack. The difference to
the floor is what mrstack adds: two calls into the library and its stack's allocate+free.

    python3 benchmarks/python/plugin_overhead.py [--spec "pool > system"] [--pairs 200000]

Rounds alternate between the plugins so machine noise hits all alike. Without the
extension (or with MRSTACK_FASTPATH=0) only the ctypes path and the floor are measured.
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
    fast = mrstack.numba.MrstackNumbaMemoryManager(context=ctx)
    slow = mrstack.numba.MrstackNumbaMemoryManager(context=ctx)
    managers = {"fast path": fast, "ctypes": slow, "floor": Floor(context=ctx)}
    for m in managers.values():
        m.initialize()
    # The same plugin made to take its ctypes branch, so both paths run in one process and
    # alternate (MRSTACK_FASTPATH=0 would need a second process, under other noise).
    slow._fast_memalloc = None
    if fast._fast_memalloc is None:
        del managers["fast path"]
    gc.disable()  # the collector's pauses are noise here; the objects are freed by refcount
    print(f"plugin memalloc + free on the CPU, ns per pair; stack: {mrstack.device_stack(0).describe()}; "
          f"{mrstack.fastpath()}; {args.pairs} pairs x {args.rounds} rounds, alternating")
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
        spread = {name: f"{min(t):.0f}-{max(t):.0f}" for name, t in times.items()}
        print(f"  {size:>8d} B, median (min-max over rounds):")
        for name in managers:
            share = "" if name == "floor" else f"   mrstack's share {med[name] - med['floor']:6.0f}"
            print(f"    {name:10s} {med[name]:7.0f} ({spread[name]}){share}")
    # Where mrstack's share goes: the two calls by themselves (no Numba objects) through
    # either path, and an empty ctypes call for scale. The C++ side (bench_emm_adapter) is
    # ~30 ns a pair; the rest is the per-call cost of the path.
    pair, free, stack, client = slow._memalloc_pair, slow._free, slow._stack, mrstack._lib.CLIENT_NUMBA
    version = mrstack._lib.library().dll.mrstack_c_api_version
    def ctypes_calls_only():
        for _ in range(args.pairs):
            free(stack, pair(stack, 256, client).token)
    def empty_call():
        for _ in range(args.pairs):
            version()
    measured = [("memalloc_pair + free through ctypes alone", ctypes_calls_only),
                ("an argument-less ctypes call", empty_call)]
    if "fast path" in managers:
        fast_memalloc = fast._fast_memalloc
        def fast_calls_only():
            for _ in range(args.pairs):
                fast_memalloc(stack, 256, client)()
        measured.insert(0, ("memalloc + finalizer through the fast path alone", fast_calls_only))
    for label, fn in measured:
        runs = []
        for _ in range(args.rounds):
            start = time.perf_counter_ns()
            fn()
            runs.append((time.perf_counter_ns() - start) / args.pairs)
        print(f"  {label}: {statistics.median(runs):.0f}")
    assert mrstack.statistics(0).clients["numba"].live_bytes == 0
    cupy_allocator(args, mrstack)


def cupy_allocator(args, mrstack):
    """mrstack.cupy.allocator + dropping what it returns, through either path. Without CuPy
    (this machine) a stand-in supplies the few names the allocator uses, as Python classes:
    they cost more than CuPy's Cython ones, but the same for both paths."""
    try:
        import cupy  # noqa: F401
        kind = "CuPy's"
    except ImportError:
        sys.modules["cupy"] = cupy_stand_in()
        kind = "stand-in"
    import mrstack.cupy as plugin
    allocator = plugin.allocator
    allocator(256)  # binds the device's stack and picks the path
    fast = plugin._fast_allocate
    paths = {"fast path": fast, "ctypes": None} if fast is not None else {"ctypes": None}
    times = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            plugin._fast_allocate = fn
            start = time.perf_counter_ns()
            for _ in range(args.pairs):
                p = allocator(256)
                del p
            times[name].append((time.perf_counter_ns() - start) / args.pairs)
    plugin._fast_allocate = fast
    print(f"  CuPy allocator + free, 256 B ({kind} objects), median (min-max over rounds):")
    for name, t in times.items():
        print(f"    {name:10s} {statistics.median(t):7.0f} ({min(t):.0f}-{max(t):.0f})")
    assert mrstack.statistics(0).clients["cupy"].live_bytes == 0


def cupy_stand_in():
    import types

    class UnownedMemory:
        __slots__ = ("ptr", "size", "owner", "device_id")

        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        __slots__ = ("mem", "ptr")

        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    stream = types.SimpleNamespace(ptr=0)
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer, get_current_stream=lambda: stream,
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return module


if __name__ == "__main__":
    main()
