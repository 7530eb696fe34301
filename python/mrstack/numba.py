"""mrstack as Numba's External Memory Management (EMM) plugin.

    NUMBA_CUDA_MEMORY_MANAGER=mrstack.numba python app.py
    # or, before Numba creates a context:
    mrstack.numba.install()   # numba.cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)

Device memory comes from the device's process-wide mrstack stack (the spec from
`mrstack.configure` or MRSTACK_RESOURCE), the same stack CuPy and PyTorch use through
`mrstack.cupy` and `mrstack.torch`. Pinned and mapped host memory stay Numba's own
(`HostOnlyCUDAMemoryManager`).

The plugin follows Numba's interface (numba-cuda 0.30) to the letter:
- ``__init__`` touches neither CUDA nor the shared library: Numba builds one instance with
  ``context=None`` only to read ``interface_version`` (a property: 1).
- ``initialize`` (Numba calls it every time it pushes the context) binds the device's stack
  once and is cheap afterwards.
- ``memalloc`` returns a ``MemoryPointer`` over a ``cuda.bindings.driver.CUdeviceptr``
  whose finalizer frees by a unique token, never by address: after a ``reset`` the same
  address is handed out again, and an old finalizer running late must not free it. The
  allocation and the finalizer go through the compiled fast path when it is there
  (`mrstack.fastpath()`), else through ctypes; both behave alike. A free the stack
  refuses cannot raise where Numba runs the finalizer (garbage collection): it warns
  `mrstack.FreeRefusedWarning` naming the pointer, the size and the library's message.
- ``get_memory_info`` counts what the stack holds free as free (over a ``simulated`` or
  ``simulated_vmm`` bottom, of the device it plays: its capacity); ``get_ipc_handle``
  returns Numba's ``IpcHandle`` for the upstream allocation containing the memory, with
  the offset into it; ``reset`` frees every outstanding allocation; ``defer_cleanup``
  holds frees back until the outermost block ends.

IPC of ``vmm`` memory (``pool > vmm``): CUDA's legacy IPC refuses memory from cuMemCreate,
so for such memory ``get_ipc_handle`` returns an ``IpcHandle`` whose 64 handle bytes are an
mrstack vmm IPC handle for exactly the block (offset 0). It pickles like any other. The
opening side needs this module imported (``NUMBA_CUDA_MEMORY_MANAGER=mrstack.numba`` in its
environment, which child processes inherit, does it): importing it makes Numba's
``_CudaIpcImpl`` (what ``IpcHandle.open``, ``open_staged`` and ``cuda.open_ipc_array``
use) recognise mrstack handles and open them through mrstack (the block's physical
allocations come from the exporting process over a Unix socket and are mapped at a new
address), and legacy handles exactly as before.
"""

import contextlib
import ctypes
import weakref

from numba import cuda as _cuda
from numba.cuda.cudadrv import driver as _driver

from . import _lib, _vmm

__all__ = ["MrstackNumbaMemoryManager", "_numba_memory_manager", "install"]

_CUdeviceptr = _driver.binding.CUdeviceptr
_CUipcMemHandle = _driver.binding.CUipcMemHandle
_MemoryPointer = _driver.MemoryPointer
_CLIENT_NUMBA = _lib.CLIENT_NUMBA
_SIZE_MAX = _lib.SIZE_MAX


def _device_ordinal(device):
    """The ordinal of a Numba context's device. Numba's own contexts hold a ``Device``
    (``.id``); a ``driver.Context`` built around a primary context a third party retained
    holds the raw ``cuda.bindings.driver.CUdevice``, which has no ``.id`` but converts with
    ``int()`` (Numba's test_context_stack.Test3rdPartyContext does exactly that)."""
    ordinal = getattr(device, "id", None)
    if ordinal is None:
        try:
            ordinal = int(device)
        except (TypeError, ValueError):
            raise TypeError(f"mrstack.numba: cannot tell the device ordinal of the context's device "
                            f"{device!r} (neither .id nor int())") from None
    return int(ordinal)


class _Finalizer:
    """The ctypes path's finalizer: frees one allocation by its token (mrstack_emm_free
    frees a token once; later calls and stale tokens do nothing and return 0). A free the
    stack refuses (-1) cannot raise where Numba runs it, at garbage collection: it is said
    (mrstack.FreeRefusedWarning), as the fast path's Finalizer says it, not dropped."""

    __slots__ = ("free", "stack", "token", "ptr", "size")
    # Class attributes: still there while the interpreter exits.
    client = _lib.CLIENT_NUMBA
    report = staticmethod(_lib.report_refused_free)

    def __init__(self, free, stack, token, ptr, size):
        self.free, self.stack, self.token, self.ptr, self.size = free, stack, token, ptr, size

    def __call__(self):
        freed = self.free(self.stack, self.token)
        if freed < 0:
            self.report(self.client, self.ptr, self.size)
        return freed


class MrstackNumbaMemoryManager(_cuda.HostOnlyCUDAMemoryManager):
    """Numba EMM plugin serving device memory from mrstack's per-device stack."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Bound by initialize(); nothing here may load the library or touch CUDA.
        self._stack = None
        self._fast_memalloc = None

    @property
    def interface_version(self):
        return 1

    def initialize(self):
        if self._stack is not None:
            return
        lib = _lib.library()
        device = _device_ordinal(self.context.device)
        handle = ctypes.c_void_p()
        lib.check(lib.dll.mrstack_device_stack(device, ctypes.byref(handle)))
        lib.check(lib.dll.mrstack_emm_initialize(handle.value))
        self._lib = lib
        self._device = device
        self._ctx = weakref.proxy(self.context)
        # The hot path's pieces, looked up once. Through the extension: one C call returns
        # the finalizer object, carrying the pointer. Through ctypes: one foreign call,
        # and the finalizer a small object calling the foreign free function.
        fast = _lib.fastpath()
        self._fast_memalloc = fast.module.memalloc if fast.active else None
        self._memalloc_pair = lib.dll.mrstack_emm_memalloc_pair
        self._free = lib.dll.mrstack_emm_free
        self._stack = handle.value  # last: memalloc takes a bound stack to mean initialized
        # As Numba's own manager does: pinned and mapped host frees are batched against the
        # device's size.
        if self.deallocations.memory_capacity == _driver._SizeNotSet:
            self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        stack = self._stack
        if stack is None:
            self.initialize()
            stack = self._stack
        fast_memalloc = self._fast_memalloc
        if fast_memalloc is not None:
            finalizer = fast_memalloc(stack, size, _CLIENT_NUMBA)  # frees by token, once
            if finalizer is None:
                raise self._allocation_error(size)
            return _MemoryPointer(self._ctx, _CUdeviceptr(finalizer.ptr), size, finalizer=finalizer)
        # ctypes would pass the low 64 bits of a larger int (2**64 + 8 as 8) and True as 1:
        # anything but an int in range goes through the full check (numpy's integers pass it).
        if size.__class__ is not int or not 0 <= size <= _SIZE_MAX:
            size = _lib.checked_size(size, "mrstack.numba: memalloc")  # the int checked is the one passed on
        allocation = self._memalloc_pair(stack, size, _CLIENT_NUMBA)
        token = allocation.token
        if not token:
            raise self._allocation_error(size)
        return _MemoryPointer(self._ctx, _CUdeviceptr(allocation.ptr), size,
                              finalizer=_Finalizer(self._free, stack, token, allocation.ptr, size))

    def _allocation_error(self, size):
        lib = self._lib
        return lib.error(lib.dll.mrstack_last_error_status(), f"mrstack.numba: memalloc({size})")

    def get_memory_info(self):
        self.initialize()
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        self._lib.check(self._lib.dll.mrstack_emm_get_memory_info(self._stack, ctypes.byref(free),
                                                                   ctypes.byref(total)))
        return _cuda.MemoryInfo(free=free.value, total=total.value)

    def get_ipc_handle(self, memory):
        self.initialize()
        ptr = memory.device_pointer_value or 0
        info = _lib.IpcHandleInfo()
        lib = _vmm.library()
        lib.check(lib.dll.mrstack_emm_get_ipc_handle_sized(self._stack, ptr, memory.size, ctypes.byref(info)),
                  "mrstack.numba: get_ipc_handle")
        handle = _CUipcMemHandle()
        # Copy the 64 opaque bytes into the binding's struct through its address: the
        # field's Python accessor is not present in every cuda-bindings release.
        ctypes.memmove(handle.getPtr(), ctypes.addressof(info.handle), _lib.IPC_HANDLE_BYTES)
        device = self.context.device
        if not hasattr(device, "get_device_identity"):  # a raw CUdevice: see _device_ordinal
            device = _driver.driver.get_device(self._device)
        source_info = device.get_device_identity()
        return _cuda.IpcHandle(memory, handle, memory.size, source_info, offset=info.offset)

    def reset(self):
        super().reset()  # Numba's own host allocations
        if self._stack is not None:
            self._lib.check(self._lib.dll.mrstack_emm_reset(self._stack, None), "mrstack.numba: reset")

    @contextlib.contextmanager
    def defer_cleanup(self):
        self.initialize()
        lib, stack = self._lib, self._stack
        lib.check(lib.dll.mrstack_emm_defer_begin(stack))
        try:
            with super().defer_cleanup():  # Numba's own host frees wait too
                yield
        finally:
            lib.check(lib.dll.mrstack_emm_defer_end(stack), "mrstack.numba: end of defer_cleanup")


def _handle_bytes(handle):
    """The 64 bytes of a ``cuda.bindings`` CUipcMemHandle, read through its address (the
    field's Python accessor is not present in every cuda-bindings release)."""
    return ctypes.string_at(handle.getPtr(), _lib.IPC_HANDLE_BYTES)


_NumbaCudaIpcImpl = _driver._CudaIpcImpl


class _VmmAwareIpcImpl(_NumbaCudaIpcImpl):
    """Numba's ``_CudaIpcImpl``, opening mrstack vmm IPC handles through mrstack (see the
    module's doc) and legacy CUDA IPC handles as Numba does. Same errors as Numba's."""

    def __init__(self, parent):
        super().__init__(parent)
        self._vmm_address = None

    def open(self, context):
        if not _vmm.is_vmm_handle(_handle_bytes(self.handle)):
            return super().open(context)
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self._opened_mem is not None:
            raise ValueError("IpcHandle is already opened")
        address = _vmm.ipc_open(_handle_bytes(self.handle), _device_ordinal(context.device))
        mem = _MemoryPointer(weakref.proxy(context), _CUdeviceptr(address), self.offset + self.size)
        self._opened_mem = mem
        self._vmm_address = address
        return mem.own().view(self.offset)

    def close(self):
        if self._vmm_address is None:
            return super().close()
        if self._opened_mem is None:
            raise ValueError("IpcHandle not opened")
        address, self._vmm_address = self._vmm_address, None
        self._opened_mem = None
        _vmm.ipc_close(address)


# IpcHandle.open_direct and _StagedIpcImpl look the class up by this name when they run.
if not issubclass(_driver._CudaIpcImpl, _VmmAwareIpcImpl):
    _driver._CudaIpcImpl = _VmmAwareIpcImpl


# The name Numba looks for in the module NUMBA_CUDA_MEMORY_MANAGER names.
_numba_memory_manager = MrstackNumbaMemoryManager


def install():
    """``numba.cuda.set_memory_manager(MrstackNumbaMemoryManager)``: call it before Numba
    creates its CUDA context (its first CUDA call); contexts made earlier keep their manager."""
    _cuda.set_memory_manager(MrstackNumbaMemoryManager)
