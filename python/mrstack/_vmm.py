"""The C ABI of vmm stacks (sleep and wake, IPC of vmm memory) through ctypes: the
functions' signatures, declared once per loaded library."""

import ctypes
import threading

from . import _lib

IPC_HANDLE_VMM = 1  # MRSTACK_IPC_HANDLE_VMM: mrstack_ipc_handle.reserved for a vmm IPC handle
_MAGIC = b"MRSVMM\x01\x00"  # the first bytes of every vmm IPC handle (src/upstream/vmm_ipc_wire.hpp)

_declared = set()
_lock = threading.Lock()


def library():
    """The loaded library with the vmm functions declared."""
    lib = _lib.library()
    if id(lib) not in _declared:
        with _lock:
            if id(lib) not in _declared:
                d = lib.dll
                c_void, c_int, c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
                for name, restype, argtypes in (
                    ("mrstack_emm_get_ipc_handle_sized", c_int,
                     [c_void, c_void, c_size, ctypes.POINTER(_lib.IpcHandleInfo)]),
                    ("mrstack_ipc_is_vmm_handle", c_int, [ctypes.c_char_p]),
                    ("mrstack_ipc_open", c_int, [ctypes.c_char_p, c_int, ctypes.POINTER(c_void)]),
                    ("mrstack_ipc_close", c_int, [c_void]),
                    ("mrstack_stack_sleep", c_int, [c_void, c_int]),
                    ("mrstack_stack_wake", c_int, [c_void]),
                    ("mrstack_stack_is_asleep", c_int, [c_void]),
                ):
                    fn = getattr(d, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
                _declared.add(id(lib))
    return lib


def is_vmm_handle(raw):
    """True when the 64 bytes `raw` are an mrstack vmm IPC handle (checked without the library)."""
    return bytes(raw[:len(_MAGIC)]) == _MAGIC


def sleep(stack_handle, keep_contents):
    lib = library()
    lib.check(lib.dll.mrstack_stack_sleep(stack_handle, 1 if keep_contents else 0), "mrstack: sleep")


def wake(stack_handle):
    lib = library()
    lib.check(lib.dll.mrstack_stack_wake(stack_handle), "mrstack: wake")


def is_asleep(stack_handle):
    return bool(library().dll.mrstack_stack_is_asleep(stack_handle))


def ipc_open(raw, device):
    """Maps the block a vmm IPC handle (its 64 bytes) names on `device`; returns its address."""
    raw = bytes(raw)
    if len(raw) != _lib.IPC_HANDLE_BYTES:
        # The C ABI reads exactly that many bytes from the pointer: fewer would be read past
        # the buffer's end.
        raise ValueError(f"mrstack: opening a vmm IPC handle: the handle is {len(raw)} bytes, "
                         f"not {_lib.IPC_HANDLE_BYTES}")
    lib = library()
    out = ctypes.c_void_p()
    lib.check(lib.dll.mrstack_ipc_open(raw, int(device), ctypes.byref(out)),
              "mrstack: opening a vmm IPC handle")
    return out.value


def ipc_close(address):
    lib = library()
    lib.check(lib.dll.mrstack_ipc_close(address), "mrstack: closing a vmm IPC handle")
