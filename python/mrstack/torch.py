"""mrstack as PyTorch's CUDA allocator.

    import mrstack.torch
    mrstack.torch.install()   # before PyTorch touches CUDA

PyTorch then allocates through `torch.cuda.memory.CUDAPluggableAllocator`, loading
``mrstack_torch_alloc_raising`` and ``mrstack_torch_free`` from the same libmrstack_c.so
this package uses, so its tensors come from the same per-device stacks as Numba's and
CuPy's arrays, ordered on PyTorch's current stream, and count under the client "torch"
(`mrstack.statistics()`).

What PyTorch's pluggable-allocator route loses, and what this module gives back:

- Out of memory raises ``torch.OutOfMemoryError`` whose message is mrstack's (the
  request, the stack's footprint, its free bytes, its largest free block); the stack is
  unchanged and keeps serving. (PyTorch itself does not check what a pluggable allocator
  returns.)
- ``torch.cuda.memory_stats()``, ``max_memory_allocated()`` and friends refuse to work
  with a pluggable allocator; the functions of the same names here answer from mrstack's
  books, with PyTorch's key names: change ``torch.cuda.`` to ``mrstack.torch.``.
- ``Tensor.record_stream`` does nothing with a pluggable allocator; `record_stream` here
  does what it does for PyTorch's allocator.
- Allocation while a stream is captured into a CUDA graph is refused with a clear
  error (mrstack cannot keep graph memory private); see docs/python.md.

PyTorch can swap its allocator only before it initializes CUDA; `install()` says so
clearly when it is too late.
"""

import contextlib
import ctypes
import os
import re

from . import _lib
from ._lib import MrstackError

__all__ = ["install", "installed", "raises_torch_out_of_memory", "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated", "empty_cache",
           "record_stream", "fragmentation", "out_of_memory_as_torch_error"]

_installed = None
_raises_torch_oom = False
_why_not_torch_oom = "install() has not run"


def installed():
    """True once `install()` succeeded in this process."""
    return _installed is not None


def raises_torch_out_of_memory():
    """True when a refusal reaches Python as ``torch.OutOfMemoryError`` (install() found how
    to build a c10::OutOfMemoryError with PyTorch's own libraries: docs/python.md); False
    before install() or where it did not, and PyTorch then raises RuntimeError with the
    same message (see `out_of_memory_as_torch_error`)."""
    return _raises_torch_oom


def _bind_c10(lib, torch):
    """Lets mrstack throw c10::OutOfMemoryError (torch.OutOfMemoryError) on refusals;
    returns whether it could (when not, `_why_not_torch_oom` says why)."""
    global _why_not_torch_oom
    libc10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    if not os.path.isfile(libc10):
        _why_not_torch_oom = f"{libc10} does not exist"
        return False
    if lib.dll.mrstack_torch_bind_c10(libc10.encode()) != _lib.SUCCESS:
        _why_not_torch_oom = lib.last_error()
        return False
    _why_not_torch_oom = ""
    return True


def install():
    """Makes PyTorch allocate CUDA memory from mrstack. Idempotent."""
    global _installed, _raises_torch_oom
    if _installed is not None:
        return _installed
    import torch

    lib = _lib.library()
    path = lib.path  # the very file this package loaded: one set of stacks per process
    if torch.cuda.is_initialized():
        raise MrstackError(
            "mrstack.torch.install(): PyTorch has already initialized CUDA and with it its own "
            "allocator, which it cannot swap any more; call install() before the first CUDA "
            "tensor or torch.cuda call (for example right after `import torch`)", "MRSTACK_ERROR_STATE")
    _raises_torch_oom = _bind_c10(lib, torch)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "mrstack_torch_alloc_raising", "mrstack_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise MrstackError(
            f"mrstack.torch.install(): PyTorch refused to change its allocator ({e}); call install() "
            "before PyTorch allocates CUDA memory", "MRSTACK_ERROR_STATE") from e
    _installed = allocator
    return allocator


# ---- out of memory ------------------------------------------------------------------------

class out_of_memory_as_torch_error:
    """A context manager (and decorator) for the PyTorch builds whose libc10 mrstack cannot
    bind (see `install`): turns the RuntimeError PyTorch raises for mrstack's refusal into
    ``torch.OutOfMemoryError`` with the same message. Where install() bound libc10, PyTorch
    raises torch.OutOfMemoryError itself and this changes nothing."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None or not isinstance(error, (RuntimeError, MemoryError)):
            return False
        import torch
        if isinstance(error, torch.OutOfMemoryError) or "out of memory:" not in str(error):
            return False
        raise torch.OutOfMemoryError(str(error)) from error

    def __call__(self, function):
        import functools

        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            with out_of_memory_as_torch_error():
                return function(*args, **kwargs)
        return wrapped


# ---- statistics with PyTorch's names --------------------------------------------------------

def _device_index(device):
    if device is None:
        import torch
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, str):  # "cuda" or "cuda:1", as torch.cuda's functions take it
        match = re.fullmatch(r"cuda(?::([0-9]+))?", device)
        if match is None:
            raise ValueError(f"mrstack.torch: {device!r} is not a CUDA device (\"cuda\" or \"cuda:N\")")
        digits = None if match[1] is None else match[1].lstrip("0") or "0"
        if digits is not None and len(digits) > 20:
            # int() refuses past 4300 digits with a ValueError naming no argument; an ordinal
            # of more than 20 digits is out of range whatever it is.
            raise ValueError(f"mrstack.torch: {device[:30]!r}...: a device ordinal of {len(match[1])} digits, "
                             "outside [0, 63]")
        # The digits without their leading zeros: int() counts those too against its limit.
        device = None if digits is None else int(digits)
    elif getattr(device, "type", "cuda") != "cuda":  # a torch.device of another kind: not mrstack's memory
        raise ValueError(f"mrstack.torch: {device!r} is not a CUDA device")
    index = getattr(device, "index", device)  # torch.device("cuda:1") or 1
    if index is None:
        import torch
        return torch.cuda.current_device()
    import mrstack
    # Checked, not int(): ctypes would keep the low 32 bits (2**32 answered for device 0).
    return mrstack._device(index, "mrstack.torch")


def _stack(device):
    lib = _lib.library()
    handle = lib.dll.mrstack_device_stack_if_built(device)
    return lib, handle


def fragmentation(device=None):
    """`mrstack.Fragmentation` of the device's stack (empty before it is built)."""
    import mrstack
    device = _device_index(device)
    lib, handle = _stack(device)
    if not handle:
        return mrstack.Fragmentation()
    return mrstack.Stack._wrap(lib, handle, device).fragmentation()


def memory_stats(device=None):
    """``torch.cuda.memory_stats()`` from mrstack's books: PyTorch's key names for what
    mrstack counts. ``allocated_bytes``, ``active_bytes`` and ``requested_bytes`` are the
    bytes PyTorch holds now and at peak (mrstack hands out what PyTorch asks, and a freed
    block is free at once, so the three agree); ``reserved_bytes`` is the footprint of the
    device's stack, which Numba and CuPy share (its peak is sampled when PyTorch's live
    bytes peak: a lower bound). ``num_ooms`` counts refusals; mrstack never frees its cache
    and retries, so ``num_alloc_retries`` is 0. The ``mrstack.*`` keys add what PyTorch's
    allocator does not report: free bytes held, the largest free block, free blocks."""
    import mrstack
    device = _device_index(device)
    lib, handle = _stack(device)
    torch_raw = _lib._TorchStats()
    lib.check(lib.dll.mrstack_torch_statistics(device, ctypes.byref(torch_raw)))
    if handle:
        stack = mrstack.Stack._wrap(lib, handle, device)
        stats = stack.statistics()
        books = stats.clients["torch"]
        frag = stats.fragmentation
        reserved = frag.held_bytes if frag.resource else stats.live_bytes + stats.free_bytes_held
    else:
        books, frag, reserved = mrstack.ClientStatistics(), mrstack.Fragmentation(), 0
    result = {}
    for name in ("allocated_bytes", "active_bytes", "requested_bytes"):
        result[f"{name}.all.current"] = books.live_bytes
        result[f"{name}.all.peak"] = books.peak_bytes
    result["allocation.all.current"] = books.live_count
    result["allocation.all.allocated"] = books.allocations
    result["allocation.all.freed"] = books.allocations - books.live_count
    result["active.all.current"] = books.live_count
    result["reserved_bytes.all.current"] = reserved
    result["reserved_bytes.all.peak"] = max(reserved, torch_raw.peak_reserved_bytes)
    result["num_alloc_retries"] = 0
    result["num_ooms"] = torch_raw.num_ooms
    result["num_sync_all_streams"] = 0
    result["mrstack.free_bytes"] = frag.free_bytes if frag.resource else (stats.free_bytes_held if handle else 0)
    result["mrstack.largest_free_block"] = frag.largest_free_block
    result["mrstack.free_blocks"] = frag.free_blocks
    result["mrstack.resource"] = frag.resource
    return dict(sorted(result.items()))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """Peaks start over from now: allocated (every client's of the device's stack) and reserved."""
    import mrstack
    device = _device_index(device)
    lib = _lib.library()
    reserved = memory_stats(device)["reserved_bytes.all.current"]
    mrstack.reset_peaks(device)
    lib.check(lib.dll.mrstack_torch_reset_peak(device, reserved))


reset_max_memory_allocated = reset_peak_memory_stats


def empty_cache(device=None):
    """``torch.cuda.empty_cache()`` for mrstack: the stack gives its free memory back to the
    device where its layers can (`mrstack.Stack.release`)."""
    import mrstack
    mrstack.release(_device_index(device))


def record_stream(tensor, stream):
    """``tensor.record_stream(stream)`` for mrstack (PyTorch's does nothing with a pluggable
    allocator): the block under `tensor` is not reused before the work enqueued on
    `stream` up to now is done. Its free makes the freeing stream wait for that work.
    A tensor not on a CUDA device is refused (ValueError): its memory is not mrstack's,
    so no free would ever consume the event kept for it. So is one whose storage is not a
    block PyTorch holds from mrstack now (`mrstack.InvalidArgumentError`, a ValueError,
    naming the pointer): allocated before `install()` or by another allocator, or freed.
    Recording twice is fine: the free waits for both. `stream` may be on another device
    than the tensor: the event is made on the stream's device."""
    device = getattr(tensor, "device", None)
    kind = getattr(device, "type", "cuda")
    if kind != "cuda":
        raise ValueError(f"mrstack.torch.record_stream: the tensor is on {device}, not a CUDA device; "
                         "only CUDA tensors allocated through mrstack have a block whose free can wait")
    ptr = _lib.checked_integer(tensor.untyped_storage().data_ptr(), "mrstack.torch.record_stream: the tensor's data_ptr()",
                               0, _lib.SIZE_MAX)
    handle = getattr(stream, "cuda_stream", stream)
    # Checked, not left to ctypes: its c_void_p passes a str's or bytes' own address as the
    # stream handle (a CUDA call on a stream that is no stream), True as 1 and 2**64 cut.
    handle = _lib.checked_integer(0 if handle is None else handle, "mrstack.torch.record_stream: stream", 0,
                                  _lib.SIZE_MAX)
    lib = _lib.library()
    # A torch.cuda.Stream's device is made current for the call: the library reads a default
    # stream's handle (0 on every device) as the current device's. A raw handle is taken as is.
    on_stream_device = contextlib.nullcontext()
    if getattr(stream, "device_index", None) is not None:
        import torch
        on_stream_device = torch.cuda.device(stream.device_index)
    with on_stream_device:
        lib.check(lib.dll.mrstack_torch_record_stream(ptr or None, handle or None), "mrstack.torch.record_stream")
