"""The compiled fast path (mrstack._fastpath) on the CPU, over host-memory stacks: its
allocations and finalizers against the stack's books, finalizers freeing exactly once,
failures raising what the ctypes path raises with the C ABI's message, both paths leaving
the same books after the same sequence (Numba's plugin and CuPy's allocator), and the
choice of path: MRSTACK_FASTPATH, a missing or broken extension falling back to ctypes
with the reason, a library of another C ABI version refused."""
import json
import os
import re
import shutil

import pytest
import standins

import mrstack
from mrstack import _lib

CLIENT_NUMBA, CLIENT_CUPY = _lib.CLIENT_NUMBA, _lib.CLIENT_CUPY


@pytest.fixture
def fast(fastpath_path):
    """The extension, loaded and bound in this process (the path library_path names)."""
    state = _lib.fastpath()
    assert state.active, state
    return state.module


def test_this_process_takes_the_extension_next_to_the_library(fast, fastpath_path):
    state = mrstack.fastpath()
    assert state.active and state.reason == ""
    assert os.path.samefile(state.path, fastpath_path)
    assert fast.bound() and fast.C_API_VERSION == _lib.C_API_VERSION
    assert "fast path" in str(state) and fastpath_path in str(state)


def test_both_paths_tell_a_bool_by_its_type_not_its_class_attribute(fast):
    # An object may answer bool to __class__ (unittest.mock's spec=bool does) and be no bool:
    # the extension looks at its type and took it, the ctypes path's check refused it.
    class Impostor:
        __class__ = property(lambda self: bool)

        def __index__(self):
            return 16

    assert _lib.checked_size(Impostor(), "mrstack.numba: memalloc") == 16
    assert _lib.checked_integer(Impostor(), "n", 0, 16) == 16
    with mrstack.Stack("tracking > system") as stack:
        assert fast.memalloc(stack.handle, Impostor(), CLIENT_NUMBA) is not None
        assert stack.statistics().clients["numba"].allocations == 1


def test_memalloc_and_finalizer_free_exactly_once(fast):
    import ctypes
    with mrstack.Stack("pool(initial=1MiB) > system") as stack:
        f = fast.memalloc(stack.handle, 4096, CLIENT_NUMBA)
        assert isinstance(f, fast.Finalizer) and f.pending
        assert f.ptr != 0 and f.token != 0 and f.token != f.ptr and f.stack == stack.handle
        ctypes.memset(f.ptr, 0x5A, 4096)                 # host memory: it is really there
        books = stack.statistics()
        assert books.clients["numba"].live_bytes == 4096 and books.emm_outstanding == 1

        g = fast.memalloc(stack.handle, 100, CLIENT_NUMBA)
        assert g.token != f.token and g.ptr != f.ptr

        assert f() == 1                                   # freed
        assert not f.pending
        books = stack.statistics()
        assert books.clients["numba"].live_bytes == 100 and books.emm_outstanding == 1
        assert f() == 0 and f() == 0                      # later calls free nothing ...
        books = stack.statistics()
        assert books.clients["numba"].live_bytes == 100   # ... not even g, nor twice f
        assert books.clients["numba"].live_count == 1
        del f                                             # dropping a called finalizer: nothing
        assert stack.statistics().clients["numba"].live_bytes == 100

        del g                                             # dropping an uncalled one frees nothing:
        assert stack.statistics().emm_outstanding == 1    # Numba calls it; reset frees the rest
        z = fast.memalloc(stack.handle, 0, CLIENT_NUMBA)  # zero bytes: null, still a token
        assert z.ptr == 0 and z.token != 0 and z() == 1
        assert stack.statistics().clients["numba"].allocations == 3


def test_stale_finalizer_after_reset_frees_nothing(fast, library_path):
    lib = _lib.library()
    with mrstack.Stack("pool(initial=1MiB) > system") as stack:
        old = fast.memalloc(stack.handle, 512, CLIENT_NUMBA)
        lib.check(lib.dll.mrstack_emm_reset(stack.handle, None))
        assert stack.statistics().clients["numba"].live_bytes == 0
        new = fast.memalloc(stack.handle, 512, CLIENT_NUMBA)    # may reuse old's address
        assert old() == 0                                       # stale token: no-op
        assert stack.statistics().clients["numba"].live_bytes == 512
        assert new() == 1
        assert stack.statistics().clients["numba"].live_bytes == 0


def test_allocation_frees_on_drop_with_its_size_stream_and_client(fast):
    with mrstack.Stack("system") as stack:
        a = fast.allocate(stack.handle, 1000, 0x1000, CLIENT_CUPY)   # `system` ignores the stream
        assert isinstance(a, fast.Allocation)
        assert a.ptr != 0 and a.size == 1000 and a.stream == 0x1000
        b = fast.allocate(stack.handle, 24, None, CLIENT_CUPY)
        assert b.stream == 0
        books = stack.statistics().clients["cupy"]
        assert books.live_bytes == 1024 and books.live_count == 2
        del a
        books = stack.statistics().clients["cupy"]
        assert books.live_bytes == 24 and books.live_count == 1
        del b
        assert stack.statistics().clients["cupy"].live_bytes == 0
        empty = fast.allocate(stack.handle, 0, None, CLIENT_CUPY)   # zero bytes: null, nothing to free
        assert empty.ptr == 0
        del empty
        assert stack.statistics().clients["cupy"].allocations == 2


def test_failures_return_none_and_leave_the_c_abi_message(fast):
    lib = _lib.library()
    with mrstack.Stack("limiting(limit=1MiB) > system") as stack:
        assert fast.memalloc(stack.handle, 2 << 20, CLIENT_NUMBA) is None
        assert lib.dll.mrstack_last_error_status() == _lib.ERROR_OUT_OF_MEMORY
        assert "limiting" in lib.last_error()
        assert fast.allocate(stack.handle, 2 << 20, None, CLIENT_CUPY) is None
        assert lib.dll.mrstack_last_error_status() == _lib.ERROR_OUT_OF_MEMORY
        assert fast.memalloc(stack.handle, 64, 99) is None          # unknown client: the C ABI says so
        assert "client" in lib.last_error()
        assert lib.dll.mrstack_last_error_status() == _lib.ERROR_INVALID_ARGUMENT
        books = stack.statistics()
        assert books.live_bytes == 0 and books.emm_outstanding == 0


def test_bad_calls_raise_type_errors(fast):
    with pytest.raises(TypeError, match="3 arguments"):
        fast.memalloc(1, 2)
    with pytest.raises(TypeError):
        fast.memalloc("not a stack", 16, CLIENT_NUMBA)
    with mrstack.Stack("tracking > system") as stack:
        # A bool is an int to PyNumber_Index: True had allocated 1 byte. Refused, as a float
        # or a str, with the text the ctypes path raises, and nothing allocated.
        for size in (True, False, 1.5, "16", None):
            text = rf"\({re.escape(repr(size))}\): the size must be an int, not {type(size).__name__}$"
            with pytest.raises(TypeError, match="^mrstack.numba: memalloc" + text):
                fast.memalloc(stack.handle, size, CLIENT_NUMBA)
            with pytest.raises(TypeError, match="^mrstack.cupy: allocate" + text):
                fast.allocate(stack.handle, size, None, CLIENT_CUPY)
        assert stack.statistics().clients["numba"].allocations == 0
        assert stack.statistics().clients["cupy"].allocations == 0
    with pytest.raises(TypeError):
        fast.Finalizer()                    # only memalloc makes them: no token from Python
    with pytest.raises(TypeError):
        fast.Allocation()
    with mrstack.Stack("system") as stack:
        f = fast.memalloc(stack.handle, 64, CLIENT_NUMBA)
        with pytest.raises(TypeError, match="no arguments"):
            f(1)
        assert f.pending                    # a refused call did not use it up
        assert f(**{}) == 1                 # weakref.finalize calls with empty kwargs


# One sequence through Numba's plugin (over standins.NUMBA_CONTEXT),
# printing the books after every step; run once per path and compared.
PLUGIN_SEQUENCE = """
    import gc, json, os, sys
    import numpy as np
    import mrstack, mrstack.numba

""" + standins.NUMBA_CONTEXT + """
    mgr = mrstack.numba.MrstackNumbaMemoryManager(context=ctx)
    mgr.initialize()
    state = mrstack.fastpath()
    print("PATH", json.dumps({"active": state.active, "reason": state.reason,
                              "loaded": "mrstack._fastpath" in sys.modules}))

    def step(label):
        gc.collect()
        s = mrstack.statistics(0)
        print("STEP", json.dumps([label, s.live_bytes, s.peak_bytes, s.emm_outstanding,
                                  [list(vars(c).values()) for c in s.clients.values()]]))

    def error(size):
        try:
            mgr.memalloc(size)
        except Exception as e:
            return [type(e).__module__ + "." + type(e).__qualname__, str(e), getattr(e, "status", None)]
        return None

    def token(mem):
        f = mem._finalizer.peek()[1]
        return f.token if hasattr(f, "token") else f.args[1]

    # numpy sizes too: ctypes takes them through __index__, so must the extension
    held = [mgr.memalloc(size) for size in (256, 1000, np.int64(4096), 0, 1 << 20)]
    print("TOKENS", json.dumps([token(m) for m in held]))
    step("allocated")
    del held[1]
    step("one dropped")
    with mgr.defer_cleanup():
        del held[0]
        step("dropped under defer")
        print("ERROR", json.dumps(error(1 << 62)))  # its message shows what the stack holds
    step("after defer")
    print("ERROR", json.dumps(error(1 << 62)))      # the stack refuses
    print("ERROR", json.dumps(error(-1)))           # outside size_t: refused by both paths alike
    for size in (True, 1.5, "16"):                  # True had allocated 1 byte on both paths
        print("ERROR", json.dumps(error(size)))
    step("after refusals")
    mgr.reset()
    step("reset")
    del held
    again = mgr.memalloc(2048)
    step("stale finalizers ran")
    del again
    step("end")
"""


def _sequence_output(run_python, setting, env=None):
    done = run_python(PLUGIN_SEQUENCE, env={"MRSTACK_RESOURCE": "limiting(limit=64MiB) > pool > system",
                                            "MRSTACK_FASTPATH": setting, **(env or {})})
    path = json.loads(next(line[5:] for line in done.stdout.splitlines() if line.startswith("PATH ")))
    rest = [line for line in done.stdout.splitlines() if not line.startswith("PATH ")]
    return path, rest


def test_both_paths_leave_the_same_books_tokens_and_errors(run_python, fastpath_path):
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
    fast_path, fast_lines = _sequence_output(run_python, "1")
    slow_path, slow_lines = _sequence_output(run_python, "0")
    assert fast_path == {"active": True, "reason": "", "loaded": True}
    # MRSTACK_FASTPATH=0 really is ctypes: the extension is not even loaded.
    assert slow_path == {"active": False, "reason": "MRSTACK_FASTPATH=0", "loaded": False}
    assert fast_lines == slow_lines
    errors = [json.loads(line[6:]) for line in fast_lines if line.startswith("ERROR ")]
    assert len(errors) == 6
    for kind, message, status in errors[:2]:
        assert kind == "mrstack._lib.OutOfMemoryError" and status == "MRSTACK_ERROR_OUT_OF_MEMORY"
        assert message.startswith("mrstack.numba: memalloc(") and "limiting could not allocate" in message
    assert errors[2] == ["builtins.ValueError", "mrstack.numba: memalloc(-1): the size is outside [0, 2**64 - 1]", None]
    assert errors[3:] == [["builtins.TypeError", f"mrstack.numba: memalloc({size!r}): the size must be an int, not {kind}",
                           None] for size, kind in ((True, "bool"), (1.5, "float"), ("16", "str"))]
    # Under defer_cleanup the dropped 256 bytes are still in the stack (the limiting layer
    # counts them in use); after it they are back.
    live_after = 4096 + (1 << 20)
    assert f"in use 1.00 MiB ({live_after + 256} B)" in errors[0][1], errors[0][1]
    assert f"in use 1.00 MiB ({live_after} B)" in errors[1][1]
    steps = {json.loads(line[5:])[0]: json.loads(line[5:]) for line in fast_lines if line.startswith("STEP ")}
    numba = 1  # client index
    assert steps["allocated"][4][numba] == [256 + 1000 + live_after, 256 + 1000 + live_after, 5, 5]
    assert steps["after defer"][3] == 3                  # emm_outstanding
    assert steps["reset"][3] == 0 and steps["stale finalizers ran"][4][numba][:3] == [2048, 256 + 1000 + live_after, 1]
    assert steps["end"][1] == 0


CUPY_MODULE = """
    # A stand-in for the few CuPy names mrstack.cupy uses, so its allocator runs on the CPU.
    import sys, types
    cupy = types.ModuleType("cupy")
    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id
    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset
    class OutOfMemoryError(MemoryError):
        def __init__(self, size, total):
            super().__init__(f"CuPy: out of memory allocating {size} bytes")
    class Stream:
        ptr = 0x1000    # any value: the `system` stack ignores streams
    cupy.cuda = types.SimpleNamespace(
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer, get_current_stream=lambda: Stream,
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError), set_allocator=lambda a: None)
    sys.modules["cupy"] = cupy
"""

CUPY_STAND_IN = CUPY_MODULE + """
    import gc, json
    import mrstack, mrstack.cupy
    def books(label):
        gc.collect()
        c = mrstack.statistics(0).clients["cupy"]
        print("STEP", json.dumps([label, c.live_bytes, c.peak_bytes, c.live_count, c.allocations]))
    held = [mrstack.cupy.allocator(n) for n in (100, 4096, 0)]
    print("PATH", mrstack.fastpath().active, type(held[0].mem.owner).__name__)
    assert held[1].ptr and held[2].ptr == 0
    books("allocated")
    del held[0]
    books("one dropped")
    try:
        mrstack.cupy.allocator(1 << 30)
    except OutOfMemoryError as e:
        cause = e.__cause__
        print("ERROR", json.dumps([type(cause).__name__, str(cause)]))
    for size in (2**64 + 8, -1):     # cut to 64 bits, 2**64 + 8 had allocated 8 bytes
        try:
            mrstack.cupy.allocator(size)
        except ValueError as e:
            print("RANGE", e)
    for size in (True, False, 1.5, "16"):     # True had allocated 1 byte
        try:
            mrstack.cupy.allocator(size)
        except TypeError as e:
            print("TYPE", e)
    books("refused")
    del held
    books("end")
"""


def test_cupy_allocator_takes_either_path_alike(run_python, fastpath_path):
    outputs = {}
    for setting in ("1", "0"):
        done = run_python(CUPY_STAND_IN, env={"MRSTACK_RESOURCE": "limiting(limit=1MiB) > system",
                                              "MRSTACK_FASTPATH": setting})
        lines = done.stdout.splitlines()
        outputs[setting] = [line for line in lines if not line.startswith("PATH ")]
        path = next(line for line in lines if line.startswith("PATH "))
        assert path == ("PATH True Allocation" if setting == "1" else "PATH False _Allocation"), path
    assert outputs["1"] == outputs["0"]
    steps = {json.loads(line[5:])[0]: json.loads(line[5:])[1:] for line in outputs["1"] if line.startswith("STEP ")}
    # [live, peak, live count, count]; a zero-byte request is null and not booked
    assert steps["allocated"] == [4196, 4196, 2, 2]
    assert steps["one dropped"] == [4096, 4196, 1, 2]
    assert steps["end"] == [0, 4196, 0, 2]
    error = json.loads(next(line[6:] for line in outputs["1"] if line.startswith("ERROR ")))
    assert error[0] == "OutOfMemoryError" and error[1].startswith("mrstack.cupy: allocating 1073741824 bytes")
    assert [line for line in outputs["1"] if line.startswith("RANGE ")] == [
        f"RANGE mrstack.cupy: allocate({size}): the size is outside [0, 2**64 - 1]" for size in (2**64 + 8, -1)]
    assert [line for line in outputs["1"] if line.startswith("TYPE ")] == [
        f"TYPE mrstack.cupy: allocate({size!r}): the size must be an int, not {type(size).__name__}"
        for size in (True, False, 1.5, "16")]


# A free the stack refuses when CuPy drops the memory: the owner's pointer freed before,
# through the C ABI, so the books no longer cover it. Warnings and unraisable exceptions are
# printed with the address as PTR (each process has its own).
CUPY_REFUSED_FREE = CUPY_MODULE + """
    import gc, json, warnings
    import mrstack, mrstack.cupy
    stack = mrstack.device_stack(0)
    print("PATH", mrstack.fastpath().active)

    def show(text, ptr):
        return text.replace(f"{ptr:#x}", "PTR")

    held = mrstack.cupy.allocator(4096)
    ptr = held.ptr
    stack.deallocate(ptr, 4096, client="cupy")     # behind its owner's back
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del held
        gc.collect()
    print("WARNINGS", json.dumps([[w.category.__name__, show(str(w.message), ptr)] for w in caught]))
    c = mrstack.statistics(0).clients["cupy"]
    print("BOOKS", json.dumps([c.live_bytes, c.live_count, c.allocations]))

    # Warnings as errors: the destructor cannot raise it, so Python reports it as unraisable.
    held = mrstack.cupy.allocator(100)
    ptr = held.ptr
    stack.deallocate(ptr, 100, client="cupy")
    unraisable = []
    sys.unraisablehook = lambda u: unraisable.append([u.exc_type.__name__, show(str(u.exc_value), ptr)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del held
        gc.collect()
    sys.unraisablehook = sys.__unraisablehook__
    print("UNRAISABLE", json.dumps(unraisable))
    held = mrstack.cupy.allocator(64)              # the stack still serves
    del held
    c = mrstack.statistics(0).clients["cupy"]
    print("BOOKS", json.dumps([c.live_bytes, c.live_count, c.allocations]))
"""


def test_a_free_refused_when_cupy_drops_memory_warns_alike_on_both_paths(run_python, fastpath_path):
    # It vanished: the status of the owner's free was dropped on both paths.
    outputs = {}
    for setting in ("1", "0"):
        done = run_python(CUPY_REFUSED_FREE, env={"MRSTACK_RESOURCE": "system", "MRSTACK_FASTPATH": setting})
        lines = done.stdout.splitlines()
        assert lines[0] == f"PATH {setting == '1'}", lines[0]
        outputs[setting] = lines[1:]
        assert "Traceback" not in done.stderr, done.stderr
    assert outputs["1"] == outputs["0"]
    said = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in outputs["1"] if " " in line}
    refusal = ("({size} bytes) was refused (MRSTACK_ERROR_LOGIC): mrstack_deallocate: a free of {size} bytes as "
               "client cupy of PTR, which is not a live allocation of this stack")
    [[category, text]] = said["WARNINGS"]
    assert category == "FreeRefusedWarning"
    assert text.startswith("mrstack.cupy: the free of PTR " + refusal.format(size=4096)), text
    assert text.endswith("nothing was freed"), text
    [[category, text]] = said["UNRAISABLE"]
    assert category == "FreeRefusedWarning" and refusal.format(size=100) in text, text
    books = [json.loads(line[6:]) for line in outputs["1"] if line.startswith("BOOKS ")]
    assert books == [[0, 0, 1], [0, 0, 3]]        # the refusals changed nothing; the stack serves


# ---- choosing the path -------------------------------------------------------------------

CHOICE = """
    import mrstack
    try:
        state = mrstack.fastpath()
    except mrstack.MrstackError as e:
        print("RAISED", e)
    else:
        print("ACTIVE", state.active)
        print("REASON", state.reason)
"""


def _library_copy(tmp_path, library_path):
    """A folder holding a copy of the library and no extension next to it."""
    shutil.copy2(library_path, tmp_path / _lib.LIBRARY_NAME)
    return str(tmp_path / _lib.LIBRARY_NAME)


def test_a_relative_library_path_finds_the_extension_beside_it(run_python, fastpath_path, library_path):
    # MRSTACK_LIBRARY relative to the working directory: the extension next to the library
    # must still be found (it was looked for only beside absolute paths), and the path the
    # package keeps (what mrstack.torch hands PyTorch to dlopen) must survive a chdir.
    relative = os.path.relpath(os.path.abspath(library_path))
    done = run_python(CHOICE + """
    import os
    from mrstack import _lib
    print("PATH", _lib.library().path)
    """, env={"MRSTACK_LIBRARY": relative, "MRSTACK_FASTPATH": "1"})
    assert "ACTIVE True" in done.stdout, done.stdout + done.stderr
    assert f"PATH {os.path.abspath(library_path)}" in done.stdout, done.stdout


def test_missing_extension_falls_back_to_ctypes_with_the_reason(run_python, library_path, tmp_path):
    package_copy = os.path.join(os.path.dirname(os.path.abspath(_lib.__file__)), _lib.FASTPATH_NAME)
    if os.path.exists(package_copy):
        pytest.skip(f"{package_copy} exists: the package folder would supply the extension")
    library = _library_copy(tmp_path, library_path)
    done = run_python(CHOICE, env={"MRSTACK_LIBRARY": library})
    assert "ACTIVE False" in done.stdout
    assert f"no {_lib.FASTPATH_NAME} in {tmp_path}" in done.stdout, done.stdout
    assert "mrstack_fastpath" in done.stdout                   # says what to build
    # ... and with MRSTACK_FASTPATH=1 that is an error, not a fallback.
    done = run_python(CHOICE, env={"MRSTACK_LIBRARY": library, "MRSTACK_FASTPATH": "1"})
    assert "RAISED MRSTACK_FASTPATH=1" in done.stdout and _lib.FASTPATH_NAME in done.stdout


def test_missing_extension_leaves_numba_plugin_working(run_python, library_path, tmp_path):
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
    package_copy = os.path.join(os.path.dirname(os.path.abspath(_lib.__file__)), _lib.FASTPATH_NAME)
    if os.path.exists(package_copy):
        pytest.skip(f"{package_copy} exists: the package folder would supply the extension")
    library = _library_copy(tmp_path, library_path)
    _, lines = _sequence_output(run_python, "", env={"MRSTACK_LIBRARY": library})
    _, reference = _sequence_output(run_python, "0")
    assert lines == reference


def test_broken_extension_falls_back_with_the_import_error(run_python, library_path, tmp_path):
    library = _library_copy(tmp_path, library_path)
    (tmp_path / _lib.FASTPATH_NAME).write_bytes(b"not an ELF file")
    done = run_python(CHOICE, env={"MRSTACK_LIBRARY": library})
    assert "ACTIVE False" in done.stdout
    assert str(tmp_path / _lib.FASTPATH_NAME) in done.stdout and "ImportError" in done.stdout, done.stdout


def test_fastpath_setting_is_checked(run_python):
    done = run_python(CHOICE, env={"MRSTACK_FASTPATH": "yes"})
    assert "RAISED MRSTACK_FASTPATH='yes'" in done.stdout


def test_bind_checks_the_c_abi_version_and_refuses_a_second_library(run_python, fastpath_path):
    run_python(f"""
        import ctypes, importlib.machinery, importlib.util
        from mrstack import _lib
        loader = importlib.machinery.ExtensionFileLoader("mrstack._fastpath", {fastpath_path!r})
        fast = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(fast)
        d = _lib.library().dll
        address = _lib._address
        functions = [address(getattr(d, "mrstack_" + n)) for n in
                     ("c_api_version", "emm_memalloc_pair", "emm_free", "allocate", "deallocate")]
        report = _lib.report_refused_free   # told of a refused free

        try:
            fast.memalloc(1, 16, 1)
        except RuntimeError as e:
            assert "bind()" in str(e), e
        else:
            raise AssertionError("memalloc before bind")

        other_version = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 99)
        try:
            fast.bind(address(other_version), *functions[1:], report)
        except RuntimeError as e:
            assert "C ABI version" in str(e) and "99" in str(e), e
        else:
            raise AssertionError("a library of another C ABI version was bound")
        assert not fast.bound()
        try:
            fast.bind(0, *functions[1:], report)
        except ValueError as e:
            assert "0" in str(e)
        else:
            raise AssertionError("a null address was bound")
        try:
            fast.bind(*functions, None)
        except TypeError as e:
            assert "report must be callable" in str(e), e
        else:
            raise AssertionError("a reporter that cannot be called was bound")
        assert not fast.bound()

        fast.bind(*functions, report)
        fast.bind(*functions, report)    # the same library again: fine
        assert fast.bound()
        try:
            fast.bind(*functions[:2], address(d.mrstack_emm_defer_end), *functions[3:], report)
        except RuntimeError as e:
            assert "another copy" in str(e), e
        else:
            raise AssertionError("rebound to other functions")
    """)
