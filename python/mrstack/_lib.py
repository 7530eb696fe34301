"""Finds and loads libmrstack_c.so (mrstack's C ABI) with ctypes, lazily.

Nothing here runs at import time: the library is looked for and loaded on the first call
of `library()`, so `import mrstack` works on a machine without the library or a GPU.

Where the library is looked for, in order:

1. ``MRSTACK_LIBRARY``: the path of the library file, or a folder holding it;
2. the package's own folder (``pip install`` copies a built library there);
3. the repository's build folders, ``<repo>/build/*/libmrstack_c.so`` (the most recently
   built first), when the package runs from a checkout;
4. the dynamic loader's search path (``LD_LIBRARY_PATH``, the system's folders).

The hot path (Numba's memalloc and finalizer, CuPy's allocate and free) goes through the
optional extension ``_fastpath.abi3.so`` when there is one (see `fastpath()`), and through
ctypes otherwise.
"""

import ctypes
import glob
import importlib.machinery
import importlib.util
import operator
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field

LIBRARY_NAME = "libmrstack_c.so"
FASTPATH_NAME = "_fastpath.abi3.so"
# METH_FASTCALL joined the limited API in 3.10, the version the extension is built for.
FASTPATH_MIN_PYTHON = (3, 10)
SIZE_MAX = 2**64 - 1  # the largest size_t: ctypes passes only the low 64 bits of a larger int

# mrstack_status (c_api.h)
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_SPEC = 2
ERROR_OUT_OF_MEMORY = 3
ERROR_CUDA = 4
ERROR_LOGIC = 5
ERROR_STATE = 6
ERROR_UNKNOWN = 7

# mrstack_client (c_api.h)
CLIENT_OTHER = 0
CLIENT_NUMBA = 1
CLIENT_CUPY = 2
CLIENT_TORCH = 3
CLIENT_NAMES = ("other", "numba", "cupy", "torch")
C_API_VERSION = 1
IPC_HANDLE_BYTES = 64


def index(value, what):
    """`value` as an int, through ``__index__`` (numpy's integers pass), else TypeError naming
    `what`. A bool is refused though it is an int: ``allocate(True)`` had asked for 1 byte
    and ``device=True`` had meant device 1. A float or a str has no ``__index__``; ctypes
    would cut the one and pass the other's address. The type, not ``__class__``, which an
    object may fake (unittest.mock's spec=bool): the compiled fast path and ctypes see the type."""
    if type(value) is not bool:
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what} must be an int, not {type(value).__name__} ({value!r:.60})")


def checked_integer(value, what, low, high):
    """`value` as an int in [low, high], else TypeError (see `index`) or ValueError naming
    `what`: ctypes would pass it on silently changed (the low bits of 2**64 bytes are 0, of
    device 2**32 device 0)."""
    number = index(value, what)
    if not low <= number <= high:
        raise ValueError(f"{what} is {number}, outside [{low}, {high}]")
    return number


def checked_size(value, what):
    """The size of an allocation on the hot path (Numba's memalloc, CuPy's allocator), with
    the texts the compiled fast path raises (src/python/fastpath.c, size_argument), so that
    both paths refuse alike: "<what>(<size>): ...". Callers test ``size.__class__ is int``
    and the range inline first and call this only for anything else, passing on the int
    it returns."""
    try:
        number = index(value, what)
    except TypeError:
        raise TypeError(f"{what}({value!r}): the size must be an int, not {type(value).__name__}") from None
    if not 0 <= number <= SIZE_MAX:
        raise ValueError(f"{what}({value!r}): the size is outside [0, 2**64 - 1]")
    return number


class MrstackError(RuntimeError):
    """A call into mrstack failed. ``status`` is the C ABI's status name."""

    def __init__(self, message, status="MRSTACK_ERROR_UNKNOWN"):
        super().__init__(message)
        self.status = status


class LibraryNotFoundError(MrstackError, OSError):
    """libmrstack_c.so was not found or could not be loaded."""


class SpecError(MrstackError, ValueError):
    """A stack spec does not parse or names what does not exist. ``column`` is the 1-based
    column the parser points at (0 when unknown)."""

    def __init__(self, message, column=0):
        super().__init__(message, "MRSTACK_ERROR_SPEC")
        self.column = column


class OutOfMemoryError(MrstackError, MemoryError):
    """The stack could not satisfy a request; the message names sizes and free memory."""


class InvalidArgumentError(MrstackError, ValueError):
    """An argument the C ABI refused (MRSTACK_ERROR_INVALID_ARGUMENT): a null or foreign
    pointer, a device out of range; the message names the argument and why."""


class CudaError(MrstackError):
    """A CUDA call failed inside mrstack."""


class StateError(MrstackError):
    """The call came at the wrong time (configure after the first allocation)."""


class FreeRefusedWarning(RuntimeWarning):
    """The stack refused a free where nothing can raise: CuPy's memory owner dying, a Numba
    finalizer. The message names the client, the pointer, the size and the library's
    reason; what the refusal left (the books, the memory) is what the library's message
    says. ``-W error::mrstack.FreeRefusedWarning`` turns it into an exception, which Python
    then reports as unraisable (``sys.unraisablehook``)."""


class _MemoryPointer(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("token", ctypes.c_uint64),
                ("device", ctypes.c_int32), ("client", ctypes.c_int32)]


class EmmAllocation(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("token", ctypes.c_uint64)]


class IpcHandleInfo(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_ubyte * IPC_HANDLE_BYTES), ("base", ctypes.c_uint64),
                ("base_size", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("device", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class _ClientStatistics(ctypes.Structure):
    _fields_ = [("live_bytes", ctypes.c_uint64), ("peak_bytes", ctypes.c_uint64),
                ("live_count", ctypes.c_uint64), ("allocations", ctypes.c_uint64)]


class _Statistics(ctypes.Structure):
    _fields_ = [("live_bytes", ctypes.c_uint64), ("peak_bytes", ctypes.c_uint64),
                ("free_bytes_held", ctypes.c_uint64), ("emm_outstanding", ctypes.c_uint64),
                ("device", ctypes.c_int32), ("deferral_depth", ctypes.c_int32),
                ("clients", _ClientStatistics * len(CLIENT_NAMES))]


class _FragmentationStream(ctypes.Structure):
    _fields_ = [("stream", ctypes.c_uint64), ("free_bytes", ctypes.c_uint64),
                ("largest_free_block", ctypes.c_uint64), ("free_blocks", ctypes.c_uint64),
                ("thread_bound", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class _Fragmentation(ctypes.Structure):
    _fields_ = [("resource", ctypes.c_char * 32), ("held_bytes", ctypes.c_uint64),
                ("live_bytes", ctypes.c_uint64), ("free_bytes", ctypes.c_uint64),
                ("largest_free_block", ctypes.c_uint64), ("free_blocks", ctypes.c_uint64),
                ("stream_count", ctypes.c_uint64), ("device", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class _TorchStats(ctypes.Structure):
    _fields_ = [("num_ooms", ctypes.c_uint64), ("peak_reserved_bytes", ctypes.c_uint64)]


class _StreamSyncCounts(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "event_creates", "records", "waits", "stream_synchronizations", "device_synchronizations", "nanoseconds",
        "idle_queries")]


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def candidate_paths():
    """Every place the library is looked for, in order (see the module's doc)."""
    paths = []
    env = os.environ.get("MRSTACK_LIBRARY")
    if env:
        paths.append(os.path.join(env, LIBRARY_NAME) if os.path.isdir(env) else env)
    package = _package_dir()
    paths.append(os.path.join(package, LIBRARY_NAME))
    repo = os.path.dirname(os.path.dirname(package))  # <repo>/python/mrstack -> <repo>
    built = glob.glob(os.path.join(repo, "build", "*", LIBRARY_NAME))
    built.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    paths.extend(built)
    return paths


def library_path():
    """The absolute path of the library `library()` loads (or would load), or None when
    only the dynamic loader's search path is left. Absolute, though MRSTACK_LIBRARY may be
    relative: the extension is looked for beside it, and mrstack.torch hands the path to
    PyTorch's dlopen, which a later chdir must not send to another file."""
    env = os.environ.get("MRSTACK_LIBRARY")
    for path in candidate_paths():
        if os.path.isfile(path):
            return os.path.abspath(path)
        if env and path in (env, os.path.join(env, LIBRARY_NAME)):
            # An explicit MRSTACK_LIBRARY that does not exist is an error, not a hint.
            raise LibraryNotFoundError(f"MRSTACK_LIBRARY={env!r}: no {LIBRARY_NAME} there")
    return None


_STATUS_NAMES = {
    SUCCESS: "MRSTACK_SUCCESS", ERROR_INVALID_ARGUMENT: "MRSTACK_ERROR_INVALID_ARGUMENT",
    ERROR_SPEC: "MRSTACK_ERROR_SPEC", ERROR_OUT_OF_MEMORY: "MRSTACK_ERROR_OUT_OF_MEMORY",
    ERROR_CUDA: "MRSTACK_ERROR_CUDA", ERROR_LOGIC: "MRSTACK_ERROR_LOGIC",
    ERROR_STATE: "MRSTACK_ERROR_STATE", ERROR_UNKNOWN: "MRSTACK_ERROR_UNKNOWN",
}
# How the C ABI starts a spec error of a device stack built from the environment.
_ENVIRONMENT_SPEC_PREFIX = "MRSTACK_RESOURCE: "
_STATUS_CLASSES = {ERROR_INVALID_ARGUMENT: InvalidArgumentError, ERROR_OUT_OF_MEMORY: OutOfMemoryError, ERROR_CUDA: CudaError, ERROR_STATE: StateError}


class Library:
    """The loaded C ABI: ctypes function objects with their signatures, and the error check."""

    def __init__(self, path):
        self.path = path
        try:
            # CDLL releases the GIL around every call: a free may synchronize the device
            # (cudaFree), and a pending host callback may need the GIL to finish.
            self.dll = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryNotFoundError(f"cannot load {path}: {e}") from e
        # The version first: a library of another version may lack a function declared below.
        try:
            version_fn = self.dll.mrstack_c_api_version
        except AttributeError:
            raise LibraryNotFoundError(
                f"{path} is not mrstack's C library (it has no mrstack_c_api_version)") from None
        version_fn.restype, version_fn.argtypes = ctypes.c_int, []
        version = version_fn()
        if version != C_API_VERSION:
            raise LibraryNotFoundError(
                f"{path} implements C ABI version {version}; this package needs {C_API_VERSION}")
        try:
            self._declare()
        except AttributeError as e:
            raise LibraryNotFoundError(f"{path} says C ABI version {version} but lacks a function of it: {e}") from None

    def _declare(self):
        d = self.dll
        c_size, c_void, c_int, c_u64 = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
        p_stack = ctypes.POINTER(ctypes.c_void_p)
        status = ctypes.c_int

        def sig(name, restype, *argtypes):
            fn = getattr(d, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
            return fn

        sig("mrstack_c_api_version", c_int)
        sig("mrstack_last_error", ctypes.c_char_p)
        sig("mrstack_last_error_column", c_size)
        sig("mrstack_last_error_status", c_int)
        sig("mrstack_emm_interface_version", c_int)
        sig("mrstack_configure", status, ctypes.c_char_p)
        sig("mrstack_configured_spec", status, ctypes.c_char_p, c_size, ctypes.POINTER(c_size))
        sig("mrstack_device_stack", status, c_int, p_stack)
        sig("mrstack_device_stack_if_built", c_void, c_int)
        sig("mrstack_stack_create", status, ctypes.c_char_p, c_int, p_stack)
        sig("mrstack_stack_destroy", status, c_void)
        sig("mrstack_stack_describe", status, c_void, ctypes.c_char_p, c_size, ctypes.POINTER(c_size))
        sig("mrstack_allocate", status, c_void, c_size, c_void, c_int, ctypes.POINTER(c_void))
        sig("mrstack_deallocate", status, c_void, c_void, c_size, c_void, c_int)
        sig("mrstack_emm_initialize", status, c_void)
        sig("mrstack_emm_memalloc", status, c_void, c_size, c_int, ctypes.POINTER(_MemoryPointer))
        sig("mrstack_emm_memalloc_token", c_u64, c_void, c_size, c_int, ctypes.POINTER(c_u64))
        sig("mrstack_emm_memalloc_pair", EmmAllocation, c_void, c_size, c_int)
        sig("mrstack_emm_free", c_int, c_void, c_u64)
        sig("mrstack_emm_get_memory_info", status, c_void, ctypes.POINTER(c_size), ctypes.POINTER(c_size))
        sig("mrstack_emm_get_ipc_handle", status, c_void, c_void, ctypes.POINTER(IpcHandleInfo))
        sig("mrstack_emm_reset", status, c_void, ctypes.POINTER(c_size))
        sig("mrstack_emm_refuse_next_frees_for_tests", status, c_void, c_size)
        sig("mrstack_emm_defer_begin", status, c_void)
        sig("mrstack_emm_defer_end", status, c_void)
        sig("mrstack_get_statistics", status, c_void, ctypes.POINTER(_Statistics))
        sig("mrstack_reset_peaks", status, c_void)
        sig("mrstack_torch_alloc", c_void, c_size, c_int, c_void)
        sig("mrstack_torch_free", None, c_void, c_size, c_int, c_void)
        sig("mrstack_get_fragmentation", status, c_void, ctypes.POINTER(_Fragmentation),
            ctypes.POINTER(_FragmentationStream), c_size)
        sig("mrstack_stack_release", status, c_void)
        sig("mrstack_torch_alloc_raising", c_void, c_size, c_int, c_void)
        sig("mrstack_torch_record_stream", status, c_void, c_void)
        sig("mrstack_torch_statistics", status, c_int, ctypes.POINTER(_TorchStats))
        sig("mrstack_torch_reset_peak", status, c_int, c_u64)
        sig("mrstack_stream_sync_profile", status, ctypes.POINTER(_StreamSyncCounts))

    def last_error(self):
        return self.dll.mrstack_last_error().decode("utf-8", "replace")

    def error(self, status, what="", spec=None):
        """The exception for a failed call's status, carrying this thread's last error.
        `spec`: the UTF-8 bytes of the spec the call was given, so that a SpecError's
        column counts characters of the str the caller passed (the C ABI counts bytes)."""
        message = self.last_error()
        if status == ERROR_SPEC and spec is None and message.startswith(_ENVIRONMENT_SPEC_PREFIX):
            # A device stack built from MRSTACK_RESOURCE: the spec is the variable's value
            # (the bytes getenv read), so its column counts characters like any other.
            spec = os.environb.get(b"MRSTACK_RESOURCE") if os.supports_bytes_environ else None
        if what:
            message = f"{what}: {message}" if message else what
        name = _STATUS_NAMES.get(status, f"status {status}")
        if status == ERROR_SPEC:
            column = int(self.dll.mrstack_last_error_column())
            if spec is not None and column > 0:
                byte_column = column
                past_end = max(0, byte_column - 1 - len(spec))
                # surrogateescape: each byte that is not UTF-8 is one character of the str, as
                # Python holds a file name (or an environment variable) that is not UTF-8.
                column = len(spec[:byte_column - 1].decode("utf-8", "surrogateescape")) + past_end + 1
                # The message says the column too: in the same characters, or the two disagree.
                message = message.replace(f"at column {byte_column}:", f"at column {column}:", 1)
            return SpecError(message, column)
        return _STATUS_CLASSES.get(status, MrstackError)(message, name)

    def check(self, status, what="", spec=None):
        if status != SUCCESS:
            raise self.error(status, what, spec)


_lock = threading.Lock()
_library = None
_loaded = []  # the library once loaded, for report_refused_free while the interpreter exits


def library():
    """The loaded library (loaded on the first call)."""
    global _library
    lib = _library
    if lib is not None:
        return lib
    with _lock:
        if _library is None:
            path = library_path()
            if path is None:
                try:
                    _library = Library(LIBRARY_NAME)  # the dynamic loader's search path
                except LibraryNotFoundError:
                    looked = "\n  ".join(candidate_paths()) or "(nowhere)"
                    raise LibraryNotFoundError(
                        f"{LIBRARY_NAME} not found. Looked in:\n  {looked}\n  and the dynamic loader's "
                        "path. Build it (cmake --preset release && cmake --build --preset release "
                        "--target mrstack_c) or set MRSTACK_LIBRARY to its path.") from None
            else:
                _library = Library(path)
            _loaded.append(_library)
        return _library


def report_refused_free(client, ptr, size, *, _loaded=_loaded, _names=CLIENT_NAMES, _statuses=_STATUS_NAMES,
                        _category=FreeRefusedWarning, _warn=warnings.warn, _sys=sys):
    """Warns FreeRefusedWarning for the free of `ptr` (`size` bytes, client number `client`)
    the library just refused on this thread: its last error is still that free's. Both
    paths call it, ctypes from CuPy's ``__del__`` and Numba's finalizer and the compiled
    fast path from C, so a refusal reads the same whichever path took it. One warning
    location for all of them: the ``default`` filter then shows each distinct refusal once.

    What it uses is bound as defaults: as the interpreter exits, Python sets modules'
    globals to None before the last objects die, and a free refused then (memory kept in
    another module's global) printed "Exception ignored ... 'NoneType' object is not
    callable" instead. A warning that cannot be shown then is written as one line."""
    lib = _loaded[0] if _loaded else library()
    status = lib.dll.mrstack_last_error_status()
    name = _names[client] if 0 <= client < len(_names) else f"client {client}"
    message = (f"mrstack.{name}: the free of {ptr:#x} ({size} bytes) was refused "
               f"({_statuses.get(status, f'status {status}')}): {lib.last_error()}")
    if not _sys.is_finalizing():
        _warn(message, _category)  # a filter of "error" raises it: the caller's unraisable
        return
    try:
        _warn(message, _category)
    except Exception:  # the warnings machinery is being torn down, or a filter says "error"
        stream = _sys.stderr if _sys.stderr is not None else _sys.__stderr__
        try:
            stream.write(f"{_category.__name__}: {message}\n")
            stream.flush()
        except Exception:  # no stream left to say it on: nothing can be said
            pass


def is_loaded():
    """True once the library was loaded (tests check that import alone does not load it)."""
    return _library is not None


# ---- the fast path: mrstack._fastpath, optional ------------------------------------------

@dataclass(frozen=True)
class FastPath:
    """Which path the hot calls take. ``active``: through the extension at ``path``; else
    through ctypes, and ``reason`` says why."""
    active: bool
    path: str = ""
    reason: str = ""
    module: object = field(default=None, repr=False, compare=False)

    def __str__(self):
        return f"fast path ({self.path})" if self.active else f"ctypes ({self.reason})"


_fastpath = None


def fastpath_candidates(lib):
    """Where the extension is looked for: next to the library `lib` was loaded from (the
    same build, so the same C ABI), then the package's own folder (``pip install``)."""
    folders = []
    if os.path.isabs(lib.path):
        folders.append(os.path.dirname(lib.path))
    if _package_dir() not in folders:
        folders.append(_package_dir())
    return [os.path.join(folder, FASTPATH_NAME) for folder in folders]


def _address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def _load_fastpath(lib):
    """The FastPath for this process: the extension loaded and bound to `lib`'s functions,
    or why not."""
    setting = os.environ.get("MRSTACK_FASTPATH", "")
    if setting not in ("", "0", "1"):
        raise MrstackError(f"MRSTACK_FASTPATH={setting!r}: 1 requires the fast path, 0 forbids it, "
                           "unset uses it when present")
    if setting == "0":
        return FastPath(False, reason="MRSTACK_FASTPATH=0")
    state = _try_fastpath(lib)
    if setting == "1" and not state.active:
        raise MrstackError(f"MRSTACK_FASTPATH=1, but the fast path cannot be used: {state.reason}")
    return state


def _try_fastpath(lib):
    if sys.version_info < FASTPATH_MIN_PYTHON:
        return FastPath(False, reason=f"Python {sys.version_info[0]}.{sys.version_info[1]}: the extension "
                                      f"needs {FASTPATH_MIN_PYTHON[0]}.{FASTPATH_MIN_PYTHON[1]} or newer")
    if ".abi3.so" not in importlib.machinery.EXTENSION_SUFFIXES:
        # A free-threaded build, for one, loads no limited-API extension.
        return FastPath(False, reason="this Python does not load abi3 extensions")
    candidates = fastpath_candidates(lib)
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        return FastPath(False, reason=f"no {FASTPATH_NAME} in {', '.join(os.path.dirname(p) for p in candidates)} "
                                      "(build the target mrstack_fastpath; it needs Python's headers)")
    try:
        loader = importlib.machinery.ExtensionFileLoader(f"{__package__}._fastpath", path)
        spec = importlib.util.spec_from_file_location(loader.name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        d = lib.dll
        module.bind(_address(d.mrstack_c_api_version), _address(d.mrstack_emm_memalloc_pair),
                    _address(d.mrstack_emm_free), _address(d.mrstack_allocate), _address(d.mrstack_deallocate),
                    report_refused_free)
    except Exception as e:  # a broken or foreign file: the package still works, through ctypes
        return FastPath(False, reason=f"{path}: {type(e).__name__}: {e}")
    sys.modules[loader.name] = module
    return FastPath(True, path=path, module=module)


def fastpath():
    """The path the hot calls take in this process, decided once (loading the library):
    the extension when it loads and binds, ctypes otherwise. ``MRSTACK_FASTPATH=0`` forces
    ctypes; ``MRSTACK_FASTPATH=1`` makes its absence an error instead of a fallback."""
    global _fastpath
    state = _fastpath
    if state is not None:
        return state
    lib = library()  # before the lock: library() takes it too
    with _lock:
        if _fastpath is None:
            _fastpath = _load_fastpath(lib)
        return _fastpath
