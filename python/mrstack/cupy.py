"""mrstack as CuPy's allocator.

    import mrstack.cupy
    mrstack.cupy.install()        # cupy.cuda.set_allocator(mrstack.cupy.allocator)

Every CuPy allocation then comes from the current device's process-wide mrstack stack (the
one Numba and PyTorch share through `mrstack.numba` and `mrstack.torch`), ordered on
CuPy's current stream: the memory is usable on that stream at once and goes back to the
stack on the same stream when CuPy drops its last reference. The books count it under the
client "cupy" (`mrstack.statistics()`). The allocation and its free go through the compiled
fast path when it is there (`mrstack.fastpath()`), else through ctypes; both behave alike,
also when the stack refuses the free: it cannot raise there, so it warns
`mrstack.FreeRefusedWarning` naming the pointer, the size and the library's message.
"""

import ctypes

import cupy as _cupy

from . import _lib

__all__ = ["allocator", "install", "uninstall"]

_stacks = {}  # device ordinal -> mrstack_stack* (device stacks live as long as the process)
# mrstack._fastpath.allocate once the first stack is bound, when the fast path is active:
# it returns the owner object itself (freeing on its stream when it dies) or None.
_fast_allocate = None
_UnownedMemory = _cupy.cuda.UnownedMemory
_MemoryPointer = _cupy.cuda.MemoryPointer
_get_current_stream = _cupy.cuda.get_current_stream
_get_device_id = _cupy.cuda.runtime.getDevice
_CLIENT_CUPY = _lib.CLIENT_CUPY
_SIZE_MAX = _lib.SIZE_MAX


class _Allocation:
    """Owns one allocation: CuPy keeps it alive as the memory's owner and drops it when the
    array dies, which returns the memory to the stack on the stream it was allocated on."""

    __slots__ = ("ptr", "size", "stream", "stack", "deallocate")
    # Class attributes: still there while the interpreter exits.
    client = _lib.CLIENT_CUPY
    report = staticmethod(_lib.report_refused_free)

    def __init__(self, ptr, size, stream, stack, deallocate):
        self.ptr, self.size, self.stream, self.stack, self.deallocate = ptr, size, stream, stack, deallocate

    def __del__(self):
        # A refused free cannot raise from here: it is said (mrstack.FreeRefusedWarning), as
        # the fast path's Allocation says it, not dropped.
        if self.ptr and self.deallocate(self.stack, self.ptr, self.size, self.stream, self.client):
            self.report(self.client, self.ptr, self.size)


def _stack_of(device):
    global _fast_allocate
    stack = _stacks.get(device)
    if stack is None:
        lib = _lib.library()
        handle = ctypes.c_void_p()
        lib.check(lib.dll.mrstack_device_stack(device, ctypes.byref(handle)))
        fast = _lib.fastpath()
        _fast_allocate = fast.module.allocate if fast.active else None
        stack = _stacks[device] = handle.value
    return stack


def _raise_refusal(lib, status, nbytes, device):
    error = lib.error(status, f"mrstack.cupy: allocating {nbytes} bytes on device {device}")
    if status == _lib.ERROR_OUT_OF_MEMORY:
        # CuPy's callers expect its own OutOfMemoryError (a MemoryError) on a refusal.
        raise _cupy.cuda.memory.OutOfMemoryError(nbytes, -1) from error
    raise error


def allocator(nbytes):
    """A ``cupy.cuda.set_allocator`` allocator: `nbytes` from the current device's stack on
    CuPy's current stream."""
    device = _get_device_id()
    stack = _stack_of(device)
    stream = _get_current_stream().ptr
    fast_allocate = _fast_allocate
    if fast_allocate is not None:
        owner = fast_allocate(stack, nbytes, stream, _CLIENT_CUPY)  # frees on `stream` when it dies
        if owner is None:
            lib = _lib.library()
            _raise_refusal(lib, lib.dll.mrstack_last_error_status(), nbytes, device)
        return _MemoryPointer(_UnownedMemory(owner.ptr, nbytes, owner, device), 0)
    # ctypes would pass the low 64 bits of a larger int (2**64 + 8 as 8) and True as 1:
    # anything but an int in range goes through the full check (numpy's integers pass it).
    if nbytes.__class__ is not int or not 0 <= nbytes <= _SIZE_MAX:
        nbytes = _lib.checked_size(nbytes, "mrstack.cupy: allocate")  # the int checked is the one passed on
    lib = _lib.library()
    out = ctypes.c_void_p()
    status = lib.dll.mrstack_allocate(stack, nbytes, stream or None, _CLIENT_CUPY, ctypes.byref(out))
    if status != _lib.SUCCESS:
        _raise_refusal(lib, status, nbytes, device)
    ptr = out.value or 0
    owner = _Allocation(ptr, nbytes, stream, stack, lib.dll.mrstack_deallocate)
    return _MemoryPointer(_UnownedMemory(ptr, nbytes, owner, device), 0)


def install():
    """Makes CuPy allocate from mrstack (for every device)."""
    _cupy.cuda.set_allocator(allocator)


def uninstall():
    """Gives CuPy back its default memory pool. Memory CuPy holds from mrstack stays valid
    and returns to mrstack when freed."""
    _cupy.cuda.set_allocator(_cupy.get_default_memory_pool().malloc)
