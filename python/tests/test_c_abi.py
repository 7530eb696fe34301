"""The C ABI through ctypes, on the CPU: errors come back as statuses with a per-thread
message and become the package's exceptions; spec errors carry the parser's message and
column; the per-client books add up; the process-wide configuration rules hold."""
import ctypes
import os
import re
import threading

import pytest

import mrstack
from mrstack import _lib


@pytest.fixture
def lib(library_path):
    return _lib.library()


def test_import_loads_nothing(run_python):
    run_python("""
        import sys
        import mrstack
        from mrstack import _lib
        assert not _lib.is_loaded()
        assert "numba" not in sys.modules and "cupy" not in sys.modules and "torch" not in sys.modules
        mrstack.statistics()  # first use loads it
        assert _lib.is_loaded()
    """)


def test_bad_spec_raises_spec_error_with_parser_message_and_column(lib):
    with pytest.raises(mrstack.SpecError) as caught:
        mrstack.Stack("system > no_such_layer_qq(size=1)")
    error = caught.value
    assert "no_such_layer_qq" in str(error)
    assert error.column >= 1
    assert error.status == "MRSTACK_ERROR_SPEC"
    assert isinstance(error, ValueError) and isinstance(error, mrstack.MrstackError)


@pytest.mark.parametrize("name", ["x", "\u00e9", "\u65e5\u672c"])
def test_spec_error_column_counts_characters_of_the_str_given(lib, name):
    # The C ABI counts bytes of the UTF-8 text; a non-ASCII file name before the error
    # put the column one or more characters past it.
    spec = f'logging(file="{name}.csv") > bogus'
    with pytest.raises(mrstack.SpecError) as caught:
        mrstack.Stack(spec)
    assert caught.value.column == spec.index("bogus") + 1
    # The message's "at column N" counts the same characters (it had stayed in bytes).
    assert f"at column {spec.index('bogus') + 1}:" in str(caught.value)
    with pytest.raises(mrstack.SpecError) as caught:
        mrstack.configure(spec)
    assert caught.value.column == spec.index("bogus") + 1
    assert f"at column {spec.index('bogus') + 1}:" in str(caught.value)


def test_out_of_memory_and_broken_contracts_become_exceptions(lib):
    with mrstack.Stack("limiting(limit=1MiB) > system") as stack:
        with pytest.raises(mrstack.OutOfMemoryError) as caught:
            stack.allocate(2 << 20)
        assert "limiting" in str(caught.value)
        assert isinstance(caught.value, MemoryError)
        assert stack.statistics().live_bytes == 0
    with mrstack.Stack("simulated") as stack:
        foreign = ctypes.c_int()
        with pytest.raises(mrstack.MrstackError) as caught:
            stack.deallocate(ctypes.addressof(foreign), 256)
        assert caught.value.status == "MRSTACK_ERROR_LOGIC"


def test_null_arguments_are_refused_with_a_message_naming_the_call(lib):
    dll = lib.dll
    out = ctypes.c_void_p()
    assert dll.mrstack_allocate(None, 16, None, 0, ctypes.byref(out)) == _lib.ERROR_INVALID_ARGUMENT
    assert "mrstack_allocate" in lib.last_error()
    assert dll.mrstack_emm_free(None, 5) == -1
    assert "mrstack_emm_free" in lib.last_error()
    assert dll.mrstack_stack_create(None, 0, ctypes.byref(out)) == _lib.ERROR_INVALID_ARGUMENT
    assert dll.mrstack_device_stack(5000, ctypes.byref(out)) == _lib.ERROR_INVALID_ARGUMENT
    assert "5000" in lib.last_error()
    with pytest.raises(mrstack.MrstackError) as caught:
        lib.check(dll.mrstack_device_stack(-2, ctypes.byref(out)))
    assert caught.value.status == "MRSTACK_ERROR_INVALID_ARGUMENT"
    assert isinstance(caught.value, mrstack.InvalidArgumentError) and isinstance(caught.value, ValueError)
    assert "-2" in str(caught.value)


def test_a_destroyed_or_foreign_handle_is_refused_not_dereferenced(lib):
    dll = lib.dll
    stack = mrstack.Stack("system")
    handle = stack.handle
    stack.close()
    out = ctypes.c_void_p()
    assert dll.mrstack_allocate(handle, 16, None, 0, ctypes.byref(out)) == _lib.ERROR_INVALID_ARGUMENT
    assert "was destroyed" in lib.last_error()
    assert dll.mrstack_stack_destroy(handle) == _lib.ERROR_INVALID_ARGUMENT
    foreign = ctypes.c_int()
    assert dll.mrstack_allocate(ctypes.addressof(foreign), 16, None, 0, ctypes.byref(out)) == _lib.ERROR_INVALID_ARGUMENT
    assert "is not a stack handle" in lib.last_error()


def test_last_error_is_per_thread(lib):
    dll = lib.dll
    out = ctypes.c_void_p()
    dll.mrstack_stack_create(b"system", -11, ctypes.byref(out))
    mine = lib.last_error()
    seen = {}

    def other():
        seen["before"] = lib.last_error()
        dll.mrstack_stack_create(b"system", -22, ctypes.byref(ctypes.c_void_p()))
        seen["after"] = lib.last_error()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == ""
    assert "-22" in seen["after"]
    assert lib.last_error() == mine and "-11" in mine


def test_per_client_books(lib):
    with mrstack.Stack("system") as stack:
        assert stack.describe() == "system"
        a = stack.allocate(1000, client="cupy")
        b = stack.allocate(3000, client="torch")
        c = stack.allocate(500)
        ctypes.memset(a, 7, 1000)
        s = stack.statistics()
        assert s.live_bytes == 4500 and s.peak_bytes == 4500
        assert s.clients["cupy"].live_bytes == 1000
        assert s.clients["torch"].live_bytes == 3000
        assert s.clients["other"].live_bytes == 500
        assert s.clients["numba"].live_bytes == 0
        stack.deallocate(b, 3000, client="torch")
        s = stack.statistics()
        assert s.clients["torch"].live_bytes == 0 and s.clients["torch"].peak_bytes == 3000
        assert s.live_bytes == 1500 and s.peak_bytes == 4500
        stack.reset_peaks()
        assert stack.statistics().peak_bytes == 1500
        stack.deallocate(a, 1000, client="cupy")
        stack.deallocate(c, 500)
        assert stack.statistics().live_bytes == 0
        assert "cupy" in str(stack.statistics())
        with pytest.raises(ValueError, match="unknown client"):
            stack.allocate(16, client="jax")


def test_a_client_is_a_name_or_any_integer_below_the_client_count(lib):
    from mrstack import _client_id, CLIENTS
    numpy = pytest.importorskip("numpy")
    assert _client_id("torch") == CLIENTS.index("torch")
    assert _client_id(numpy.int64(2)) == 2  # it read as "unknown client 2"
    for bad, says in [(len(CLIENTS), "a client number is 0.."), (-1, "a client number is 0.."),
                      (True, "a client number is 0.."), (1.0, "give a name"), ("jax", "unknown client 'jax'")]:
        with pytest.raises(ValueError, match=says):
            _client_id(bad)


def test_stream_sync_counts_host_stacks_make_no_cuda_calls(lib):
    before = mrstack.stream_sync_counts()
    assert set(before) == {"event_creates", "records", "waits", "stream_synchronizations",
                           "device_synchronizations", "idle_queries", "seconds"}
    with mrstack.Stack("pool > system") as stack:   # host memory: its streams need no events
        ptrs = [stack.allocate(1 << 20, stream=s) for s in (0x100, 0x200, 0x100)]
        for p, s in zip(ptrs, (0x100, 0x200, 0x100)):
            stack.deallocate(p, 1 << 20, stream=s)
        taken = stack.allocate(3 << 20, stream=0x200)   # takes 0x100's memory too
        stack.deallocate(taken, 3 << 20, stream=0x200)
    assert mrstack.stream_sync_counts() == before
    assert lib.dll.mrstack_stream_sync_profile(None) == _lib.ERROR_INVALID_ARGUMENT
    assert "out-pointer is null" in lib.last_error()


def test_closed_stack_is_refused(lib):
    stack = mrstack.Stack("system")
    stack.close()
    stack.close()  # twice is fine
    with pytest.raises(mrstack.MrstackError, match="closed"):
        stack.allocate(16)
    # A StateError naming the call: "the stack was closed" said neither what nor where.
    for name, call in (("allocate", lambda: stack.allocate(16)), ("deallocate", lambda: stack.deallocate(1, 16)),
                       ("describe", stack.describe), ("statistics", stack.statistics),
                       ("fragmentation", stack.fragmentation), ("release", stack.release),
                       ("reset_peaks", stack.reset_peaks), ("sleep", stack.sleep), ("wake", stack.wake),
                       ("asleep", lambda: stack.asleep), ("handle", lambda: stack.handle)):
        with pytest.raises(mrstack.StateError, match=rf"^mrstack\.Stack\.{name}: the stack was closed") as caught:
            call()
        assert caught.value.status == "MRSTACK_ERROR_STATE"
    assert repr(stack) == "<mrstack.Stack private device=0: closed>"


def test_repr_of_a_stack_closed_under_it_says_closed(lib):
    # repr() read the handle, then described the stack: closed in between (by another thread,
    # or through a copy of the object), repr itself raised.
    import copy
    stack = mrstack.Stack("system")
    copy.copy(stack).close()
    assert repr(stack) == "<mrstack.Stack private device=0: closed>"


def test_two_threads_closing_one_stack_both_return(lib):
    # The second close must be the no-op a second close is, not a refused double destroy.
    # Reading the handle is made slow, so that both threads read it before either clears it
    # unless close() keeps the read and the clear together.
    import threading
    import time
    slot = mrstack.Stack._handle

    class SlowStack(mrstack.Stack):
        __slots__ = ()

        @property
        def _handle(self):
            value = slot.__get__(self)
            time.sleep(0.02)
            return value

        @_handle.setter
        def _handle(self, value):
            slot.__set__(self, value)

    stack = SlowStack("system")
    failures = []

    def close():
        try:
            stack.close()
        except mrstack.MrstackError as e:
            failures.append(str(e))

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    with pytest.raises(mrstack.MrstackError, match="closed"):
        stack.allocate(16)


def test_configured_spec_is_not_cut_when_it_grows_between_the_two_calls(monkeypatch):
    # configured_spec asks for the length, then for the text: a configure() on another
    # thread in between (a longer spec) must not come back cut to the old length.
    specs = iter(["pool > cuda", "logging(file=\"a.csv\") > pool > cuda"])

    class Dll:
        def mrstack_configured_spec(self, buffer, capacity, length):
            text = next(specs, "logging(file=\"a.csv\") > pool > cuda").encode()
            if length is not None:
                length._obj.value = len(text)
            if buffer is not None and capacity > 0:
                ctypes.memmove(buffer, text[:capacity - 1] + b"\0", min(capacity, len(text) + 1))
            return _lib.SUCCESS

    class Lib:
        dll = Dll()

        def check(self, status, *args, **kwargs):
            assert status == _lib.SUCCESS

    monkeypatch.setattr(_lib, "library", lambda: Lib())
    assert mrstack.configured_spec() == 'logging(file="a.csv") > pool > cuda'


def test_configuration_is_process_wide_and_one_shot(run_python):
    run_python("""
        import mrstack
        assert mrstack.statistics().stack == ""          # nothing built, nothing touched
        try:
            mrstack.configure("pool(initial=12 parsecs) > system")   # checked at once
        except mrstack.SpecError as e:
            assert "parsecs" in str(e) and e.column > 1, (str(e), e.column)
        else:
            raise AssertionError("a bad spec was accepted")
        mrstack.configure("system")
        assert mrstack.configured_spec() == "system"
        stack = mrstack.device_stack(0)
        assert stack.describe() == "system"
        mrstack.configure("system")                      # the same again is fine
        try:
            mrstack.configure("simulated")
        except mrstack.StateError as e:
            assert "already built" in str(e)
        else:
            raise AssertionError("reconfigured a built stack")
        p = stack.allocate(4096, client="numba")
        assert mrstack.statistics(0).clients["numba"].live_bytes == 4096
        stack.deallocate(p, 4096, client="numba")
    """)


def test_a_bad_spec_in_the_environment_names_the_variable(run_python):
    done = run_python("""
        import mrstack
        try:
            mrstack.device_stack(0)
        except mrstack.SpecError as e:
            print("SPEC ERROR:", e)
    """, env={"MRSTACK_RESOURCE": "pool > nonsense_layer_zz"})
    assert "SPEC ERROR: MRSTACK_RESOURCE" in done.stdout and "nonsense_layer_zz" in done.stdout, done.stdout


def test_a_bad_spec_in_the_environment_counts_characters_too(run_python):
    # As for configure and Stack: the column (and the message's "at column N") count
    # characters of the variable's value, not the bytes of its UTF-8 text.
    spec = 'logging(file="\u65e5\u672c.csv") > bogus'
    done = run_python("""
        import mrstack
        try:
            mrstack.device_stack(0)
        except mrstack.SpecError as e:
            print("COLUMN", e.column)
            print("MESSAGE", str(e).splitlines()[0])
    """, env={"MRSTACK_RESOURCE": spec})
    column = spec.index("bogus") + 1
    assert f"COLUMN {column}" in done.stdout, done.stdout + done.stderr
    assert f"MESSAGE MRSTACK_RESOURCE: bad stack spec at column {column}:" in done.stdout, done.stdout


def test_environment_variable_names_the_spec(run_python):
    done = run_python("""
        import mrstack
        print(mrstack.configured_spec())
        print(mrstack.device_stack(0).describe())
    """, env={"MRSTACK_RESOURCE": "simulated"})
    assert done.stdout.split() == ["simulated", "simulated"]


def test_missing_library_is_a_clear_error(run_python, tmp_path):
    done = run_python("""
        import mrstack
        try:
            mrstack.statistics()
        except mrstack.LibraryNotFoundError as e:
            print("ERROR", e)
    """, env={"MRSTACK_LIBRARY": str(tmp_path / "nowhere.so")})
    assert "ERROR" in done.stdout and "nowhere.so" in done.stdout


def test_a_library_that_is_not_mrstacks_is_a_clear_error(run_python):
    # Another shared library (here Python's own _ctypes module) at MRSTACK_LIBRARY: it loads,
    # but has none of the C ABI. A bare AttributeError had come out of the declarations.
    import _ctypes
    done = run_python("""
        import mrstack
        try:
            mrstack.statistics()
        except mrstack.LibraryNotFoundError as e:
            print("ERROR", e)
    """, env={"MRSTACK_LIBRARY": _ctypes.__file__})
    assert "ERROR" in done.stdout and "is not mrstack's C library" in done.stdout, done.stdout + done.stderr


def test_library_search_order(tmp_path, monkeypatch, library_path):
    monkeypatch.setenv("MRSTACK_LIBRARY", str(tmp_path))
    paths = _lib.candidate_paths()
    assert paths[0] == str(tmp_path / _lib.LIBRARY_NAME)          # a folder: the file in it
    assert paths[1].endswith("mrstack/" + _lib.LIBRARY_NAME)        # then the package folder
    assert all("/build/" in p for p in paths[2:])                  # then the build folders
    with pytest.raises(mrstack.LibraryNotFoundError, match="MRSTACK_LIBRARY"):
        _lib.library_path()
    monkeypatch.setenv("MRSTACK_LIBRARY", library_path)
    assert _lib.library_path() == library_path


def test_a_spec_must_be_a_str_without_nul(lib):
    # C reads a spec up to its first NUL: "simulated\0 > nonsense" built "simulated", silently.
    with pytest.raises(ValueError, match=r"mrstack.Stack: the spec .* holds a NUL character \(at 9\)"):
        mrstack.Stack("simulated\0 > nonsense_layer")
    with pytest.raises(ValueError, match="mrstack.configure: the spec .* holds a NUL character"):
        mrstack.configure("simulated\0junk")
    # str() of another object made a spec of its repr: b'system' or None read as layer names.
    for wrong in (b"system", None, 7):
        with pytest.raises(TypeError, match=f"mrstack.Stack: the spec must be a str, not {type(wrong).__name__}"):
            mrstack.Stack(wrong)
    with pytest.raises(TypeError, match="mrstack.configure: the spec must be a str, not bytes"):
        mrstack.configure(b"system")


def test_a_spec_naming_a_file_whose_name_is_not_utf8_reaches_that_file(lib, tmp_path):
    # Python holds such a name (os.listdir, os.fsdecode) with its bytes as lone surrogates,
    # which str.encode() refused with a UnicodeEncodeError naming no mrstack call.
    name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/log-\xff.csv")
    with mrstack.Stack(f'logging(file="{name}") > system') as stack:
        stack.deallocate(stack.allocate(64), 64)
    assert os.listdir(tmp_path) == ["log-\udcff.csv"]
    assert (tmp_path / "log-\udcff.csv").read_text().startswith("Thread,Time,Action")
    # A spec error's column counts such a name's bytes as the str's characters: a cut UTF-8
    # sequence is two surrogates, which decoding with "replace" had counted as one.
    spec = 'logging(file="/tmp/\udce2\udc82") > nonsense_layer'
    with pytest.raises(mrstack.SpecError) as caught:
        mrstack.Stack(spec)
    assert caught.value.column == spec.index("nonsense_layer") + 1
    assert f"at column {spec.index('nonsense_layer') + 1}:" in str(caught.value)
    # A surrogate no file name holds is refused, naming the call and where it is.
    with pytest.raises(ValueError, match=r"mrstack.Stack: the spec .* holds the lone surrogate '\\ud800' \(at 6\)"):
        mrstack.Stack("system\ud800")


def test_integers_out_of_range_or_of_other_types_are_refused_not_wrapped(lib):
    # ctypes keeps the low bits of an int and converts a float or a str as it comes: 2**64
    # bytes became a successful allocation of 0 bytes, device 2**32 built on device 0.
    with mrstack.Stack("tracking > simulated") as stack:
        for nbytes, error, text in ((2**64, ValueError, "nbytes is 18446744073709551616, outside"),
                                    (-1, ValueError, "nbytes is -1, outside"),
                                    (1.5, TypeError, "nbytes must be an int, not float"),
                                    ("16", TypeError, "nbytes must be an int, not str")):
            with pytest.raises(error, match=f"mrstack.Stack.allocate: {text}"):
                stack.allocate(nbytes)
        with pytest.raises(TypeError, match="mrstack.Stack.allocate: stream must be an int, not str"):
            stack.allocate(16, stream="s")
        with pytest.raises(ValueError, match="mrstack.Stack.allocate: stream is -1"):
            stack.allocate(16, stream=-1)
        p = stack.allocate(16)
        with pytest.raises(ValueError, match="mrstack.Stack.deallocate: ptr is"):
            stack.deallocate(p + 2**64, 16)
        with pytest.raises(ValueError, match="mrstack.Stack.deallocate: nbytes is"):
            stack.deallocate(p, 16 + 2**64)
        assert stack.statistics().live_bytes == 16
        stack.deallocate(p, 16)
    with pytest.raises(ValueError, match=r"mrstack.Stack: device is 4294967296, outside \[0, 2147483647\]"):
        mrstack.Stack("simulated", device=2**32)
    with pytest.raises(ValueError, match="mrstack.device_stack: device is 4294967296"):
        mrstack.device_stack(2**32)


def test_a_device_that_can_have_no_stack_is_refused_not_reported_empty(lib):
    # statistics(-1) answered "device -1: nothing built", reset_peaks and release did nothing.
    for call, name in ((mrstack.statistics, "statistics"), (mrstack.reset_peaks, "reset_peaks"),
                       (mrstack.release, "release")):
        for device in (-1, 64, 2**32):
            with pytest.raises(ValueError, match=rf"mrstack.{name}: device is {device}, outside \[0, 63\]"):
                call(device)
        with pytest.raises(TypeError, match=f"mrstack.{name}: device must be an int, not str"):
            call("0")


def test_a_bool_is_refused_wherever_an_integer_is_taken(lib):
    # A bool is an int subclass: allocate(True) had been a 1-byte allocation, device=True
    # device 1, stream=False the default stream; refused, naming the argument, and nothing
    # allocated or built.
    with mrstack.Stack("tracking > simulated") as stack:
        for value in (True, False):
            with pytest.raises(TypeError, match=rf"^mrstack.Stack.allocate: nbytes must be an int, not bool \({value}\)"):
                stack.allocate(value)
            with pytest.raises(TypeError, match="^mrstack.Stack.allocate: stream must be an int, not bool"):
                stack.allocate(16, stream=value)
        p = stack.allocate(16)
        with pytest.raises(TypeError, match="^mrstack.Stack.deallocate: nbytes must be an int, not bool"):
            stack.deallocate(p, True)
        with pytest.raises(TypeError, match="^mrstack.Stack.deallocate: ptr must be an int, not bool"):
            stack.deallocate(True, 16)
        with pytest.raises(TypeError, match="^mrstack.Stack.deallocate: stream must be an int, not bool"):
            stack.deallocate(p, 16, stream=False)
        assert stack.statistics().live_bytes == 16 and stack.statistics().clients["other"].allocations == 1
        stack.deallocate(p, 16, stream=None)  # None is still the default stream
    with pytest.raises(TypeError, match=r"^mrstack.Stack: device must be an int, not bool \(True\)"):
        mrstack.Stack("simulated", device=True)
    for call, name in ((mrstack.device_stack, "device_stack"), (mrstack.statistics, "statistics"),
                       (mrstack.reset_peaks, "reset_peaks"), (mrstack.release, "release")):
        with pytest.raises(TypeError, match=f"^mrstack.{name}: device must be an int, not bool"):
            call(True)


def test_the_shared_integer_check_takes_numpy_integers_and_refuses_the_rest():
    np = pytest.importorskip("numpy")
    assert _lib.checked_integer(np.int64(7), "n", 0, 10) == 7 and type(_lib.checked_integer(np.int64(7), "n", 0, 10)) is int
    assert _lib.checked_size(np.uint64(2**64 - 1), "f") == 2**64 - 1
    for value in (True, np.bool_(True), 1.0, np.float64(1.0), "1", None, b"1"):
        with pytest.raises(TypeError, match=f"^n must be an int, not {type(value).__name__}"):
            _lib.checked_integer(value, "n", 0, 10)
        with pytest.raises(TypeError, match=rf"^f\({re.escape(repr(value))}\): the size must be an int, not {type(value).__name__}$"):
            _lib.checked_size(value, "f")
    with pytest.raises(ValueError, match=r"^f\(-1\): the size is outside \[0, 2\*\*64 - 1\]$"):
        _lib.checked_size(-1, "f")


def test_a_private_stack_never_closed_says_so_when_collected(lib):
    # It kept its memory for the process's life without a word.
    import gc
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stack = mrstack.Stack("system")
        del stack
        gc.collect()
        with mrstack.Stack("system"):    # closed: nothing said
            pass
        mrstack.Stack("system").close()
        gc.collect()
        mrstack.device_stack(0)          # the process's own: never the caller's to close
        gc.collect()
    said = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "was never closed" in str(said[0].message)


SHUTDOWN_REFUSAL = """
    import os
    import mrstack
    from mrstack import _lib

    stack = mrstack.device_stack(0)
    state = mrstack.fastpath()
    dll = _lib.library().dll

    class Buffer:
        # Frees when it dies, as Numba's and CuPy's memory does, through the path this run takes.
        client, free, report = _lib.CLIENT_NUMBA, dll.mrstack_emm_free, staticmethod(_lib.report_refused_free)

        def __init__(self):
            self.stack, self.finalizer = stack.handle, None
            if state.active:
                self.finalizer = state.module.memalloc(self.stack, 4096, self.client)
            else:
                a = dll.mrstack_emm_memalloc_pair(self.stack, 4096, self.client)
                self.token, self.ptr = a.token, a.ptr

        def __del__(self):
            if self.finalizer is not None:
                self.finalizer()
            elif self.free(self.stack, self.token) < 0:
                self.report(self.client, self.ptr, 4096)

    # Kept in a global of a module imported before mrstack: emptied after mrstack's own globals.
    os.mrstack_buffer = Buffer()
    assert dll.mrstack_emm_refuse_next_frees_for_tests(stack.handle, 1) == 0
    print("PATH", state.active)
"""


@pytest.mark.parametrize("setting", ["0", "1"])
def test_a_free_refused_while_the_interpreter_exits_is_one_warning_line_or_nothing(run_python, library_path, setting):
    # The reporter looked up the library and the names in its module's globals, which Python
    # had set to None by then: "Exception ignored ... 'NoneType' object is not callable".
    if setting == "1" and not os.path.isfile(os.path.join(os.path.dirname(library_path), _lib.FASTPATH_NAME)):
        pytest.skip("the fast path is not built")
    for warnings_setting in ("default", "error"):
        done = run_python(SHUTDOWN_REFUSAL, env={"MRSTACK_RESOURCE": "system", "MRSTACK_FASTPATH": setting,
                                                 "PYTHONWARNINGS": warnings_setting})
        assert done.stdout == f"PATH {setting == '1'}\n", done.stdout
        assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) <= 1, lines
        for line in lines:
            assert line.startswith("FreeRefusedWarning: mrstack.numba: the free of 0x"), line
            assert "(4096 bytes) was refused (MRSTACK_ERROR_LOGIC)" in line, line
