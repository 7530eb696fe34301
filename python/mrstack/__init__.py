"""mrstack: one composable CUDA memory stack for Numba, CuPy and PyTorch in one process.

    import mrstack
    mrstack.configure("pool(initial=1GiB) > cuda")  # or MRSTACK_RESOURCE; before first use
    mrstack.cupy.install()                          # CuPy allocates from the device's stack
    mrstack.torch.install()                         # PyTorch too (before it touches CUDA)
    # Numba: NUMBA_CUDA_MEMORY_MANAGER=mrstack.numba, or
    #        numba.cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)
    print(mrstack.statistics())                     # what the stack holds, per client

Importing the package loads nothing and touches no GPU: the shared library
(libmrstack_c.so, found as `mrstack._lib` describes) is loaded on first use.
"""

from dataclasses import dataclass, field
import ctypes
import operator
import threading
import warnings

from . import _lib
from ._lib import (CudaError, FastPath, FreeRefusedWarning, InvalidArgumentError, LibraryNotFoundError, MrstackError,
                   OutOfMemoryError, SpecError, StateError, library_path)

__all__ = [
    "configure", "configured_spec", "statistics", "reset_peaks", "device_stack", "Stack",
    "Statistics", "ClientStatistics", "Fragmentation", "StreamFragmentation", "release", "MrstackError", "SpecError", "OutOfMemoryError",
    "CudaError", "StateError", "InvalidArgumentError", "LibraryNotFoundError", "library_path", "CLIENTS", "fastpath", "FastPath",
    "stream_sync_counts", "FreeRefusedWarning",
]

CLIENTS = _lib.CLIENT_NAMES


# The C ABI keeps the stacks of devices 0 to 63 (src/c_api/stacks.cpp); a size, an address or
# a stream is 64 bits.
_MAX_DEVICES = 64
_U64 = _lib.SIZE_MAX


# One check for every integer argument of the package (_lib.checked_integer): a bool, a
# float or a str is refused with a TypeError naming the argument, never converted.
_integer = _lib.checked_integer


def _device(device, what):
    return _integer(device, f"{what}: device", 0, _MAX_DEVICES - 1)


def _spec_bytes(spec, what):
    """A spec as the C ABI takes it: a str without NUL (C would read only up to the first
    NUL and silently drop the rest), in UTF-8; a file name that is not UTF-8 (held by Python
    as lone surrogates, as os.fsdecode gives it) goes as its own bytes."""
    if not isinstance(spec, str):
        raise TypeError(f"{what}: the spec must be a str, not {type(spec).__name__} ({spec!r:.60})")
    if "\0" in spec:
        raise ValueError(f"{what}: the spec {spec!r:.80} holds a NUL character (at {spec.index(chr(0))}); "
                         "the C ABI would read only what comes before it")
    try:
        return spec.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what}: the spec {spec!r:.80} holds the lone surrogate {spec[e.start]!r} (at {e.start}), "
                         "which is no character and no byte of a file name") from None


def _client_id(client):
    """A client's number: its name, or any integer (numpy's too) below len(CLIENTS)."""
    if isinstance(client, str):
        if client in CLIENTS:
            return CLIENTS.index(client)
        raise ValueError(f"unknown client {client!r}; one of {', '.join(CLIENTS)}")
    try:
        number = operator.index(client)
    except TypeError:
        raise ValueError(f"unknown client {client!r}: give a name ({', '.join(CLIENTS)}) "
                         f"or a number 0..{len(CLIENTS) - 1}") from None
    if isinstance(client, bool) or not 0 <= number < len(CLIENTS):
        raise ValueError(f"unknown client {client!r}: a client number is 0..{len(CLIENTS) - 1} "
                         f"({', '.join(CLIENTS)})")
    return number


def configure(spec):
    """Sets the spec every device's stack is built from (instead of MRSTACK_RESOURCE).

    Call it before the first allocation through mrstack; calling it again later with the
    same spec is fine, with another one raises `StateError`. A malformed spec (unknown
    names, parameters or values) raises `SpecError` here, with the parser's message and
    column; nothing is built and CUDA is not touched until the first allocation. ``None``
    goes back to MRSTACK_RESOURCE or the default.
    """
    encoded = None if spec is None else _spec_bytes(spec, "mrstack.configure")
    lib = _lib.library()
    lib.check(lib.dll.mrstack_configure(encoded), spec=encoded)


def configured_spec():
    """The spec device stacks are (or will be) built from."""
    lib = _lib.library()
    length = ctypes.c_size_t()
    lib.check(lib.dll.mrstack_configured_spec(None, 0, ctypes.byref(length)))
    while True:
        # Another thread may configure a longer spec between two calls: ask again until
        # the text fits, rather than return it cut.
        buffer = ctypes.create_string_buffer(length.value + 1)
        lib.check(lib.dll.mrstack_configured_spec(buffer, len(buffer), ctypes.byref(length)))
        if length.value < len(buffer):
            return buffer.value.decode()


@dataclass(frozen=True)
class ClientStatistics:
    live_bytes: int = 0    #: bytes this client holds now
    peak_bytes: int = 0    #: the most it held at once
    live_count: int = 0    #: allocations it holds now
    allocations: int = 0   #: allocations it ever made


@dataclass(frozen=True)
class StreamFragmentation:
    stream: int                 #: the cudaStream_t as an int (0: the legacy default stream), or a thread key
    free_bytes: int
    largest_free_block: int
    free_blocks: int
    thread_bound: bool = False  #: a per-thread default stream (`stream` is then a thread key)


@dataclass(frozen=True)
class Fragmentation:
    """How fragmented the free memory a stack holds is, answered by its topmost
    suballocator in one query. ``resource`` is "" when no layer keeps such books (a plain
    upstream); every number is then 0. Otherwise ``live_bytes + free_bytes <= held_bytes``
    (the rest is held but neither handed out nor free to hand out: the tail of an arena
    superblock its size class cannot use, a chunk's alignment slack) and
    ``largest_free_block <= free_bytes``."""
    resource: str = ""          #: the layer that answered: "pool", "arena", ...
    held_bytes: int = 0         #: bytes it holds from its upstream (its footprint)
    live_bytes: int = 0         #: bytes handed out and not yet freed
    free_bytes: int = 0         #: held and free to hand out
    largest_free_block: int = 0 #: the largest request it could serve without growing
    free_blocks: int = 0        #: number of free blocks (runs of free bytes)
    streams: tuple = ()         #: StreamFragmentation per stream, where free blocks are per stream

    def as_dict(self):
        from dataclasses import asdict
        return asdict(self)


@dataclass(frozen=True)
class Statistics:
    device: int
    stack: str              #: the layers, "pool > cuda"; "" when the stack is not built yet
    live_bytes: int         #: all clients together
    peak_bytes: int
    free_bytes_held: int    #: what the stack holds free (a pool's free blocks)
    emm_outstanding: int    #: Numba allocations not yet finalized
    clients: dict = field(default_factory=dict)  #: client name -> ClientStatistics
    fragmentation: Fragmentation = field(default_factory=Fragmentation)  #: see `Fragmentation`

    def __str__(self):
        def mib(n):
            return f"{n / 2**20:10.2f} MiB"
        lines = [f"mrstack device {self.device}: {self.stack or '(not built yet)'}",
                 f"  live {mib(self.live_bytes)}   peak {mib(self.peak_bytes)}   "
                 f"held free {mib(self.free_bytes_held)}",
                 f"  {'client':8s} {'live':>14s} {'peak':>14s} {'live allocs':>12s} {'allocs ever':>12s}"]
        for name, c in self.clients.items():
            lines.append(f"  {name:8s} {mib(c.live_bytes):>14s} {mib(c.peak_bytes):>14s} "
                         f"{c.live_count:12d} {c.allocations:12d}")
        f = self.fragmentation
        if f.resource:
            lines.append(f"  {f.resource}: held {mib(f.held_bytes)}   free {mib(f.free_bytes)} in "
                         f"{f.free_blocks} blocks   largest free block {mib(f.largest_free_block)}")
        return "\n".join(lines)


_closing = threading.Lock()


class Stack:
    """A stack: `Stack(spec)` builds a private one (closed with `close()` or `with`);
    `device_stack(device)` gives the process-wide stack Numba, CuPy and PyTorch share."""

    __slots__ = ("_lib", "_handle", "_owned", "device")

    def __init__(self, spec, device=0):
        encoded, device = _spec_bytes(spec, "mrstack.Stack"), _integer(device, "mrstack.Stack: device", 0, 2**31 - 1)
        lib = _lib.library()
        handle = ctypes.c_void_p()
        lib.check(lib.dll.mrstack_stack_create(encoded, device, ctypes.byref(handle)), spec=encoded)
        self._lib, self._handle, self._owned, self.device = lib, handle.value, True, device

    @classmethod
    def _wrap(cls, lib, handle, device):
        self = cls.__new__(cls)
        self._lib, self._handle, self._owned, self.device = lib, handle, False, device
        return self

    @property
    def handle(self):
        """The C ABI's `mrstack_stack*`, as an int."""
        return self._live("handle")

    def _live(self, what):
        handle = self._handle
        if handle is None:
            raise StateError(f"mrstack.Stack.{what}: the stack was closed (Stack.close)", "MRSTACK_ERROR_STATE")
        return handle

    def describe(self):
        """The layers as a spec names them: "pool > cuda"."""
        lib = self._lib
        length = ctypes.c_size_t()
        lib.check(lib.dll.mrstack_stack_describe(self._live("describe"), None, 0, ctypes.byref(length)))
        buffer = ctypes.create_string_buffer(length.value + 1)
        lib.check(lib.dll.mrstack_stack_describe(self._live("describe"), buffer, len(buffer), None))
        return buffer.value.decode()

    def allocate(self, nbytes, stream=0, client="other"):
        """Allocates `nbytes` usable on `stream` (a cudaStream_t as an int); returns the address."""
        nbytes = _integer(nbytes, "mrstack.Stack.allocate: nbytes", 0, _U64)
        stream = _integer(0 if stream is None else stream, "mrstack.Stack.allocate: stream", 0, _U64)
        out = ctypes.c_void_p()
        self._lib.check(self._lib.dll.mrstack_allocate(self._live("allocate"), nbytes, stream or None,
                                                       _client_id(client), ctypes.byref(out)))
        return out.value or 0

    def deallocate(self, ptr, nbytes, stream=0, client="other"):
        """Frees what `allocate` returned, with the same size and client."""
        ptr = _integer(0 if ptr is None else ptr, "mrstack.Stack.deallocate: ptr", 0, _U64)
        nbytes = _integer(nbytes, "mrstack.Stack.deallocate: nbytes", 0, _U64)
        stream = _integer(0 if stream is None else stream, "mrstack.Stack.deallocate: stream", 0, _U64)
        self._lib.check(self._lib.dll.mrstack_deallocate(self._live("deallocate"), ptr or None, nbytes, stream or None,
                                                         _client_id(client)))

    def statistics(self):
        raw = _lib._Statistics()
        self._lib.check(self._lib.dll.mrstack_get_statistics(self._live("statistics"), ctypes.byref(raw)))
        return _statistics_from(raw, self.describe(), self.fragmentation())

    def fragmentation(self):
        """A `Fragmentation`: held, live and free bytes, the largest free block, the number
        of free blocks and the per-stream shares, all from one query of the stack."""
        lib, raw = self._lib, _lib._Fragmentation()
        lib.check(lib.dll.mrstack_get_fragmentation(self._live("fragmentation"), ctypes.byref(raw), None, 0))
        streams = ()
        while raw.stream_count:
            # The shares can change between two queries: ask again until they fit.
            capacity = int(raw.stream_count) + 4
            shares = (_lib._FragmentationStream * capacity)()
            lib.check(lib.dll.mrstack_get_fragmentation(self._live("fragmentation"), ctypes.byref(raw), shares, capacity))
            if raw.stream_count <= capacity:
                streams = tuple(StreamFragmentation(s.stream, s.free_bytes, s.largest_free_block, s.free_blocks,
                                                    bool(s.thread_bound)) for s in shares[:raw.stream_count])
                break
        return Fragmentation(raw.resource.decode("utf-8", "replace"), raw.held_bytes, raw.live_bytes,
                             raw.free_bytes, raw.largest_free_block, raw.free_blocks, streams)

    def release(self):
        """Gives the free memory the stack holds back to the device where its layers can
        (a pool's free chunks), as `torch.cuda.empty_cache()` does for PyTorch's allocator."""
        self._lib.check(self._lib.dll.mrstack_stack_release(self._live("release")))

    def reset_peaks(self):
        self._lib.check(self._lib.dll.mrstack_reset_peaks(self._live("reset_peaks")))

    def sleep(self, keep_contents=True):
        """Gives back the physical memory of the stack's vmm layer, keeping every address
        (pointers held by Numba, CuPy or PyTorch stay valid for after `wake`). With
        `keep_contents` the bytes are copied to pinned host memory first and restored by
        `wake`. Until `wake`, allocating from the stack raises, frees work, and nothing may
        touch its memory. A stack without a vmm layer raises. See docs/vmm.md."""
        from . import _vmm
        # Checked: its truth had been taken, so keep_contents="no" (or None) was read as yes (or no).
        if keep_contents not in (True, False):  # numpy's bools, 0 and 1 pass
            raise TypeError(f"mrstack.Stack.sleep: keep_contents must be True or False, not "
                            f"{type(keep_contents).__name__} ({keep_contents!r:.60})")
        _vmm.sleep(self._live("sleep"), bool(keep_contents))

    def wake(self):
        """Maps physical memory back behind every address `sleep` kept (contents restored
        if kept)."""
        from . import _vmm
        _vmm.wake(self._live("wake"))

    @property
    def asleep(self):
        """True between `sleep` and `wake`."""
        from . import _vmm
        return _vmm.is_asleep(self._live("asleep"))

    def close(self):
        """Destroys a private stack (freeing what Numba-style allocations it still holds).
        Closing a closed stack does nothing, also when two threads close it at once."""
        with _closing:  # one thread takes the handle; the read and the clear are two steps
            handle = self._handle if self._owned else None
            self._handle = None if self._owned else self._handle
        if handle is not None:  # destroyed even when the call reports live allocations
            self._lib.check(self._lib.dll.mrstack_stack_destroy(handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A private stack never closed holds its memory, and whatever its pool took from
        # the device, for the process's life. Destroying it here could free blocks whose
        # addresses the program still uses, so it is said instead, as Python says of a
        # file never closed (shown under `python -X dev`, `-W default` and pytest).
        if getattr(self, "_owned", False) and getattr(self, "_handle", None) is not None:
            try:
                warnings.warn(f"mrstack.Stack: a private stack (device {self.device}) was never closed: it keeps "
                              "its memory until the process ends (close it, or use `with`)", ResourceWarning,
                              source=self)
            except Exception:  # interpreter shutdown: the warnings machinery may be gone
                pass

    def __repr__(self):
        kind = "private" if self._owned else "device"
        try:
            state = self.describe()
        except MrstackError:  # closed, here or by another thread since, or by another wrapper
            state = "closed"
        return f"<mrstack.Stack {kind} device={self.device}: {state}>"


def _statistics_from(raw, description, fragmentation=None):
    clients = {name: ClientStatistics(c.live_bytes, c.peak_bytes, c.live_count, c.allocations)
               for name, c in zip(CLIENTS, raw.clients)}
    return Statistics(device=raw.device, stack=description, live_bytes=raw.live_bytes,
                      peak_bytes=raw.peak_bytes, free_bytes_held=raw.free_bytes_held,
                      emm_outstanding=raw.emm_outstanding, clients=clients,
                      fragmentation=fragmentation if fragmentation is not None else Fragmentation())


def device_stack(device=0):
    """The process-wide stack of `device`, built from the configured spec on first use."""
    device = _device(device, "mrstack.device_stack")
    lib = _lib.library()
    handle = ctypes.c_void_p()
    lib.check(lib.dll.mrstack_device_stack(device, ctypes.byref(handle)))
    return Stack._wrap(lib, handle.value, device)


def statistics(device=0):
    """What `device`'s stack holds and, per client (numba, cupy, torch, other), how many
    bytes each holds now and held at peak, with the stack's `Fragmentation` (held, live
    and free bytes, the largest free block, free blocks). Builds nothing: before the stack
    exists every number is 0."""
    device = _device(device, "mrstack.statistics")  # a device that can have no stack is not one with nothing
    lib = _lib.library()
    handle = lib.dll.mrstack_device_stack_if_built(device)
    if not handle:
        return Statistics(device=device, stack="", live_bytes=0, peak_bytes=0, free_bytes_held=0,
                          emm_outstanding=0, clients={name: ClientStatistics() for name in CLIENTS})
    return Stack._wrap(lib, handle, device).statistics()


def reset_peaks(device=0):
    """Sets every client's peak on `device` to what it holds now."""
    device = _device(device, "mrstack.reset_peaks")
    lib = _lib.library()
    handle = lib.dll.mrstack_device_stack_if_built(device)
    if handle:
        lib.check(lib.dll.mrstack_reset_peaks(handle))


def release(device=0):
    """Gives the free memory `device`'s stack holds back to the device (see
    `Stack.release`); nothing when the stack is not built yet."""
    device = _device(device, "mrstack.release")
    lib = _lib.library()
    handle = lib.dll.mrstack_device_stack_if_built(device)
    if handle:
        lib.check(lib.dll.mrstack_stack_release(handle))


def stream_sync_counts():
    """The CUDA calls mrstack's suballocators have made in this process to order memory
    between streams (event creates, records, stream waits, stream and device
    synchronizations, queries whether a stream is idle) and the seconds spent in them,
    as a dict. Read it before and after
    a region (a training step) and subtract: that is what the region's stream ordering
    cost. One stream makes none."""
    lib = _lib.library()
    raw = _lib._StreamSyncCounts()
    lib.check(lib.dll.mrstack_stream_sync_profile(ctypes.byref(raw)))
    counts = {name: int(getattr(raw, name)) for name, _ in raw._fields_ if name != "nanoseconds"}
    counts["seconds"] = raw.nanoseconds * 1e-9
    return counts


def fastpath():
    """Which path Numba's memalloc/free and CuPy's allocate/free take in this process: a
    `FastPath` whose ``active`` says the compiled extension (``path``) is in use, else
    ctypes, with the ``reason``. Loads the library; decided once per process.
    ``MRSTACK_FASTPATH=0`` forces ctypes, ``MRSTACK_FASTPATH=1`` requires the extension."""
    return _lib.fastpath()


def __getattr__(name):
    # `mrstack.numba`, `mrstack.cupy`, `mrstack.torch`, `mrstack.dask` import on first access,
    # so that `import mrstack` never imports Numba, CuPy, PyTorch or Dask.
    if name in ("numba", "cupy", "torch", "dask"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
