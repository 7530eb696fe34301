"""The Numba EMM plugin's contract against numba-cuda, on the CPU: the class Numba expects,
an __init__ that touches neither CUDA nor the library, both ways of installing it, and
the finalizer/reset/defer behaviour over a host-memory (`system`) stack with a stand-in
context — everything that needs no GPU. The allocating tests run twice: through the
compiled fast path and through ctypes (`run_plugin`)."""
import pytest
import standins

numba_cuda = pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")

from numba.cuda.cudadrv import driver as numba_driver  # noqa: E402

import mrstack.numba as plugin  # noqa: E402


def test_class_contract():
    cls = plugin._numba_memory_manager
    assert cls is plugin.MrstackNumbaMemoryManager
    assert issubclass(cls, numba_cuda.HostOnlyCUDAMemoryManager)
    assert issubclass(cls, numba_cuda.BaseCUDAMemoryManager)
    assert isinstance(cls.__dict__["interface_version"], property)
    assert not cls.__abstractmethods__
    for name in ("memalloc", "initialize", "get_memory_info", "get_ipc_handle", "reset", "defer_cleanup"):
        assert name in cls.__dict__, f"{name} is Numba's, not the plugin's"


def test_init_touches_neither_cuda_nor_the_library(run_python):
    # As Numba does in set_memory_manager: an instance with context=None, to read the version.
    run_python("""
        from numba.cuda.cudadrv import driver
        calls = []  # every driver function Numba's driver object is asked for
        original_getattr = driver.Driver.__getattr__
        def spy(self, name):
            calls.append(name)
            return original_getattr(self, name)
        driver.Driver.__getattr__ = spy
        from mrstack import _lib
        import mrstack.numba
        m = mrstack.numba._numba_memory_manager(context=None)
        assert m.interface_version == 1
        assert calls == [], f"__init__ called the CUDA driver: {calls}"
        assert not _lib.is_loaded(), "__init__ loaded the shared library"
    """)


def test_set_memory_manager_accepts_it(run_python):
    run_python("""
        from numba.cuda.cudadrv import driver
        calls = []  # every driver function Numba's driver object is asked for
        original_getattr = driver.Driver.__getattr__
        def spy(self, name):
            calls.append(name)
            return original_getattr(self, name)
        driver.Driver.__getattr__ = spy
        from numba import cuda
        from mrstack import _lib
        import mrstack.numba
        cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)
        assert driver._memory_manager is mrstack.numba.MrstackNumbaMemoryManager
        driver._memory_manager = None
        mrstack.numba.install()
        assert driver._memory_manager is mrstack.numba.MrstackNumbaMemoryManager
        assert calls == [], calls
        assert not _lib.is_loaded()
    """)


def test_environment_variable_selects_it(run_python):
    run_python("""
        from numba.cuda.cudadrv import driver
        calls = []  # every driver function Numba's driver object is asked for
        original_getattr = driver.Driver.__getattr__
        def spy(self, name):
            calls.append(name)
            return original_getattr(self, name)
        driver.Driver.__getattr__ = spy
        driver._ensure_memory_manager()
        import mrstack.numba
        assert driver._memory_manager is mrstack.numba._numba_memory_manager, driver._memory_manager
        assert calls == [], calls
    """, env={"NUMBA_CUDA_MEMORY_MANAGER": "mrstack.numba"})


# A stand-in for Numba's Context: the plugin needs its device's id and identity, and a
# weak reference to it. Runs over a `system` stack, so memory is host memory.
FAKE_CONTEXT = """
    import gc, os, weakref
    import mrstack, mrstack.numba
    from numba import cuda
    from numba.cuda.cudadrv import driver as numba_driver

""" + standins.NUMBA_CONTEXT + """
    mgr = mrstack.numba.MrstackNumbaMemoryManager(context=ctx)
    mgr.initialize()
    mgr.initialize()   # idempotent
    # run_plugin says which path this run must take: check it is the one taken.
    EXPECT_FAST = os.environ.get("MRSTACK_FASTPATH") == "1"
    if "MRSTACK_FASTPATH" in os.environ:
        assert mrstack.fastpath().active == EXPECT_FAST, mrstack.fastpath()
        assert (mgr._fast_memalloc is not None) == EXPECT_FAST

    def numba_books():
        return mrstack.statistics(0).clients["numba"]
"""


def test_memalloc_and_finalizer_exactly_once(run_plugin):
    run_plugin(FAKE_CONTEXT + """
    import ctypes
    import cuda.bindings.driver as binding
    mem = mgr.memalloc(4096)
    assert isinstance(mem, cuda.MemoryPointer)
    assert isinstance(mem.device_pointer, binding.CUdeviceptr)
    assert mem.size == 4096 and mem.device_pointer_value
    ctypes.memset(mem.device_pointer_value, 0x5a, 4096)     # host memory under `system`
    assert numba_books().live_bytes == 4096 and numba_books().live_count == 1

    # The finalizer frees by token, exactly once.
    callback = mem._finalizer.peek()[1]        # (object, func, args, kwargs)
    if EXPECT_FAST:                             # the extension's Finalizer, carrying its token
        assert type(callback).__name__ == "Finalizer", callback
        token, again = callback.token, callback
    else:                                       # an object calling the ctypes free function
        assert type(callback).__name__ == "_Finalizer", callback
        token, again = callback.token, callback
    assert token != 0 and token != mem.device_pointer_value
    mem.free()
    assert numba_books().live_bytes == 0
    assert again() == 0                         # a second run does nothing
    assert numba_books().live_count == 0

    # Dropping the last reference finalizes, too.
    for size in (256, 1000, 1 << 20):
        m = mgr.memalloc(size)
        assert numba_books().live_bytes == size
        del m
        gc.collect()
        assert numba_books().live_bytes == 0
    assert mrstack.statistics(0).clients["numba"].allocations == 4

    # Zero bytes: a null pointer, and nothing to free.
    z = mgr.memalloc(0)
    assert z.device_pointer_value is None
    del z
    """)


def test_a_free_refused_at_garbage_collection_warns_naming_pointer_size_and_reason(run_plugin):
    # The finalizer's -1 vanished on both paths: Numba ignores what a finalizer returns.
    # The C ABI's test hook refuses the free as a stack would (no right free is refused
    # without a driver to fail); the stack keeps the memory.
    run_plugin(FAKE_CONTEXT + """
    import sys, warnings
    from mrstack import _lib
    stack = mrstack.device_stack(0)
    refuse_next_free = lambda: _lib.library().dll.mrstack_emm_refuse_next_frees_for_tests(stack.handle, 1)
    mem = mgr.memalloc(4096)
    ptr = mem.device_pointer_value
    assert refuse_next_free() == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del mem
        gc.collect()
    assert [w.category.__name__ for w in caught] == ["FreeRefusedWarning"], caught
    text = str(caught[0].message)
    assert text.startswith(f"mrstack.numba: the free of {ptr:#x} (4096 bytes) was refused (MRSTACK_ERROR_"), text
    assert "refuse_next_frees_for_tests" in text, text  # the library's own message follows
    assert mrstack.statistics(0).emm_outstanding == 0  # the token is spent all the same

    # Warnings as errors: weakref.finalize cannot raise it, so Python reports it as unraisable.
    mem = mgr.memalloc(512)
    assert refuse_next_free() == 0
    unraisable = []
    sys.unraisablehook = unraisable.append
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del mem
        gc.collect()
    sys.unraisablehook = sys.__unraisablehook__
    assert [u.exc_type.__name__ for u in unraisable] == ["FreeRefusedWarning"], unraisable
    assert "(512 bytes) was refused" in str(unraisable[0].exc_value)
    again = mgr.memalloc(256)                          # the stack still serves
    del again
    gc.collect()
    # The refused blocks stay the stack's, and Numba's in the books.
    assert numba_books().live_bytes == 4096 + 512 and mrstack.statistics(0).emm_outstanding == 0
    """, env={"MRSTACK_RESOURCE": "pool(initial=1MiB) > system"})


def test_reset_frees_everything_and_stale_finalizers_are_noops(run_plugin):
    run_plugin(FAKE_CONTEXT + """
    before = [mgr.memalloc(512) for _ in range(3)]
    assert numba_books().live_count == 3
    mgr.reset()
    assert numba_books().live_count == 0 and numba_books().live_bytes == 0
    # A new allocation may reuse an address a stale pointer still names; the stale
    # finalizers must not free it.
    after = mgr.memalloc(512)
    del before
    gc.collect()
    assert numba_books().live_count == 1 and numba_books().live_bytes == 512
    del after
    gc.collect()
    assert numba_books().live_count == 0
    assert mrstack.statistics(0).emm_outstanding == 0
    """)


def test_defer_cleanup_nests(run_plugin):
    run_plugin(FAKE_CONTEXT + """
    assert mrstack.statistics(0).emm_outstanding == 0
    with mgr.defer_cleanup():
        m = mgr.memalloc(256)
        with mgr.defer_cleanup():
            assert mrstack.statistics(0).emm_outstanding == 1
            del m
            gc.collect()
            assert mrstack.device_stack(0).statistics().emm_outstanding == 0
        assert mgr.deallocations.is_disabled   # Numba's own host frees wait too
    assert not mgr.deallocations.is_disabled
    assert mrstack.statistics(0).emm_outstanding == 0
    """)


def test_memory_info_and_ipc_refusal_on_host_memory(run_plugin):
    run_plugin(FAKE_CONTEXT + """
    info = mgr.get_memory_info()
    assert isinstance(info, cuda.MemoryInfo)
    assert 0 < info.free <= info.total
    mem = mgr.memalloc(1024)
    try:
        mgr.get_ipc_handle(mem)
    except mrstack.MrstackError as e:
        assert "CUDA IPC" in str(e) and "host memory" in str(e), e
    else:
        raise AssertionError("an IPC handle for host memory")
    """)


def test_memory_info_over_a_simulated_device_is_that_device_not_the_host(run_plugin):
    # It was the host's physical memory: a 1 GiB simulated device reported the machine's RAM,
    # and Numba sized its batches of deferred frees by it.
    run_plugin(FAKE_CONTEXT + """
    GIB, MIB = 1 << 30, 1 << 20
    info = mgr.get_memory_info()
    assert info == cuda.MemoryInfo(free=GIB, total=GIB), info   # the pool's chunk is held free
    assert mgr.deallocations.memory_capacity == GIB
    mem = mgr.memalloc(MIB)
    assert mgr.get_memory_info() == cuda.MemoryInfo(free=GIB - MIB, total=GIB)
    del mem
    gc.collect()
    assert mgr.get_memory_info().free == GIB
    """, env={"MRSTACK_RESOURCE": "pool(initial=4MiB) > simulated(capacity=1GiB)"})


def test_bad_spec_in_environment_raises_spec_error_at_initialize(run_python):
    done = run_python(FAKE_CONTEXT.replace("mgr.initialize()\n    mgr.initialize()   # idempotent", "") + """
    try:
        mgr.initialize()
    except mrstack.SpecError as e:
        print("SPEC ERROR:", e)
    """, env={"MRSTACK_RESOURCE": "system > nonsense_layer_zz"})
    assert "SPEC ERROR" in done.stdout and "nonsense_layer_zz" in done.stdout


@pytest.fixture
def run_python(run_python):
    # These tests run over host memory: a `system` stack unless a test says otherwise.
    def run(code, env=None, check=True):
        return run_python(code, env={"MRSTACK_RESOURCE": "system", **(env or {})}, check=check)
    return run


def test_a_size_outside_size_t_is_refused_not_cut_to_its_low_64_bits(run_plugin):
    # Converted as ctypes converts a c_size_t, 2**64 + 8 asked the stack for 8 bytes and
    # Numba got a MemoryPointer of 2**64 + 8 (2**64: a null pointer of 2**64 bytes), as
    # cuda.device_array(2**61 + 1, np.float64) does, with no error.
    run_plugin(FAKE_CONTEXT + """
    import numpy as np
    for size in (2**64, 2**64 + 8, 2**65 + 4096, -1, -(2**64) + 8, np.int64(-8)):
        try:
            mem = mgr.memalloc(size)
        except ValueError as e:
            assert str(e) == f"mrstack.numba: memalloc({size!r}): the size is outside [0, 2**64 - 1]", e
        else:
            raise AssertionError(f"memalloc({size}) gave {mem.device_pointer_value} of {mem.size} bytes")
    assert numba_books().allocations == 0 and mrstack.statistics(0).emm_outstanding == 0
    assert mgr.memalloc(np.uint64(4096)).size == 4096   # numpy sizes still go
    """, env={"MRSTACK_RESOURCE": "system"})


@pytest.fixture(params=["fast path", "ctypes"])
def run_plugin(request, run_python):
    """run_python, once requiring the compiled fast path (MRSTACK_FASTPATH=1) and once
    forbidding it (=0): the plugin must behave the same either way."""
    if request.param == "fast path":
        request.getfixturevalue("fastpath_path")  # skips (or fails in CI) when not built
    setting = "1" if request.param == "fast path" else "0"

    def run(code, env=None, check=True):
        return run_python(code, env={"MRSTACK_FASTPATH": setting, **(env or {})}, check=check)
    return run


def test_context_around_a_third_party_primary_context_holds_a_raw_cudevice(run_python):
    # numba's Test3rdPartyContext builds driver.Context(CUdevice(0), hctx): its `device` is
    # the binding's CUdevice, which has no `.id`. initialize() must still find the ordinal.
    run_python("""
    import gc, weakref
    import cuda.bindings.driver as binding
    import mrstack, mrstack.numba
    from mrstack.numba import _device_ordinal

    assert _device_ordinal(binding.CUdevice(3)) == 3
    class WithId:
        id = 2
    assert _device_ordinal(WithId()) == 2
    try:
        _device_ordinal(object())
    except TypeError as e:
        assert "device ordinal" in str(e), e
    else:
        raise AssertionError("an object with no ordinal was accepted")

    class Context:
        device = binding.CUdevice(0)
    ctx = Context()
    mgr = mrstack.numba.MrstackNumbaMemoryManager(context=ctx)
    mgr.initialize()
    m = mgr.memalloc(4096)
    assert mrstack.statistics(0).clients["numba"].live_bytes == 4096
    del m
    gc.collect()
    assert mrstack.statistics(0).clients["numba"].live_bytes == 0
    """)
