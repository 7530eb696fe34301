"""Sleep/wake and the IPC surface of vmm stacks through the C ABI and the Python package,
on the CPU (over `pool > simulated_vmm`, vmm's twin: the same bookkeeping, no GPU)."""
import ctypes

import pytest

import mrstack
from mrstack import _lib, _vmm

SPEC = "pool > simulated_vmm(capacity=1GiB)"


@pytest.fixture
def lib(library_path):
    return _vmm.library()


@pytest.mark.parametrize("keep", ["no", "false", None, 2, [], 0.5])
def test_sleep_refuses_a_keep_contents_that_is_not_a_bool_and_stays_awake(lib, keep):
    # Its truth had been taken: "no" and "false" kept the contents, None dropped them.
    with mrstack.Stack(SPEC) as stack:
        with pytest.raises(TypeError, match=r"^mrstack\.Stack\.sleep: keep_contents must be True or False, "
                                            f"not {type(keep).__name__}"):
            stack.sleep(keep_contents=keep)
        assert not stack.asleep


def test_sleep_keeps_addresses_refuses_allocation_and_wakes(lib):
    with mrstack.Stack(SPEC) as stack:
        blocks = [(stack.allocate(n), n) for n in (1 << 20, 3 << 20, 5000, 64 << 20)]
        assert not stack.asleep
        stack.sleep(keep_contents=True)
        assert stack.asleep
        with pytest.raises(mrstack.MrstackError, match="asleep"):
            stack.allocate(1 << 20)
        # Numba's path refuses too: a token of 0 and the reason as the last error.
        pair = lib.dll.mrstack_emm_memalloc_pair(stack.handle, 4096, _lib.CLIENT_NUMBA)
        assert pair.token == 0
        assert "asleep" in lib.last_error()
        with pytest.raises(mrstack.MrstackError, match="already asleep"):
            stack.sleep()
        ptr, n = blocks.pop()
        stack.deallocate(ptr, n)  # frees work while asleep
        stack.wake()
        assert not stack.asleep
        with pytest.raises(mrstack.MrstackError, match="wake while awake"):
            stack.wake()
        again = stack.allocate(1 << 20)
        stack.deallocate(again, 1 << 20)
        for ptr, n in blocks:  # the same addresses are still this stack's blocks
            stack.deallocate(ptr, n)


def test_sleep_without_a_vmm_layer_says_so(lib):
    with mrstack.Stack("pool > simulated") as stack:
        assert not stack.asleep
        with pytest.raises(mrstack.MrstackError, match="no vmm"):
            stack.sleep(keep_contents=False)


def test_ipc_surface_refuses_what_it_cannot_share_with_reasons(lib):
    assert lib.dll.mrstack_ipc_is_vmm_handle(bytes(64)) == 0
    assert _vmm.is_vmm_handle(b"MRSVMM\x01\x00" + bytes(56))
    with pytest.raises(mrstack.MrstackError, match="not an mrstack vmm IPC handle"):
        _vmm.ipc_open(bytes(64), 0)
    with pytest.raises(mrstack.MrstackError, match="did not return"):
        _vmm.ipc_close(0x1234)
    with mrstack.Stack(SPEC) as stack:
        ptr = stack.allocate(1 << 20)
        info = _lib.IpcHandleInfo()
        status = lib.dll.mrstack_emm_get_ipc_handle_sized(stack.handle, ptr, 1 << 20, ctypes.byref(info))
        assert status == _lib.ERROR_LOGIC
        assert "simulated_vmm memory cannot be shared" in lib.last_error()
        # Without the size, a vmm block cannot be described.
        status = lib.dll.mrstack_emm_get_ipc_handle(stack.handle, ptr, ctypes.byref(info))
        assert status == _lib.ERROR_LOGIC
        assert "size is needed" in lib.last_error()
        stack.deallocate(ptr, 1 << 20)


def test_ipc_open_refuses_a_handle_that_is_not_64_bytes(lib):
    # The C ABI reads MRSTACK_IPC_HANDLE_BYTES from the pointer it is given: a shorter
    # buffer would be read past its end, a longer one cut silently.
    for raw in (b"MRSVMM\x01\x00", b"MRSVMM\x01\x00" + bytes(60), bytearray(10)):
        with pytest.raises(ValueError, match=f"is {len(raw)} bytes.*64"):
            _vmm.ipc_open(raw, 0)


def test_numba_opens_vmm_handles_through_mrstack_and_legacy_ones_as_before(lib):
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
    from numba.cuda.cudadrv import driver as numba_driver
    import mrstack.numba as plugin

    assert numba_driver._CudaIpcImpl is plugin._VmmAwareIpcImpl

    class Parent:
        def __init__(self, raw, base=None):
            self.base = base
            self.handle = numba_driver.binding.CUipcMemHandle()
            ctypes.memmove(self.handle.getPtr(), raw, 64)
            self.size = 80
            self.offset = 0

    class Device:
        id = 0

    class Context:
        device = Device()

        def __init__(self):
            self.legacy_opens = []

        def open_ipc_handle(self, handle, size):
            self.legacy_opens.append(size)
            raise RuntimeError("legacy route taken")

    ctx = Context()
    with pytest.raises(RuntimeError, match="legacy route taken"):
        plugin._VmmAwareIpcImpl(Parent(bytes(64))).open(ctx)
    assert ctx.legacy_opens == [80]

    # An mrstack handle whose exporter (pid 1, a nonce nobody has) cannot be reached.
    raw = bytearray(b"MRSVMM\x01\x00" + bytes(56))
    raw[8:12] = (1).to_bytes(4, "little")
    with pytest.raises(mrstack.MrstackError, match="cannot reach the exporting process 1"):
        plugin._VmmAwareIpcImpl(Parent(bytes(raw))).open(ctx)
    with pytest.raises(ValueError, match="opening IpcHandle from original process"):
        plugin._VmmAwareIpcImpl(Parent(bytes(raw), base=object())).open(ctx)
    assert ctx.legacy_opens == [80]
