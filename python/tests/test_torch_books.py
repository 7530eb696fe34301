"""mrstack.torch without a GPU: PyTorch's entry points (mrstack_torch_alloc*, _free) on a
device stack over simulated memory, the statistics under PyTorch's key names, empty_cache,
out of memory as c10::OutOfMemoryError (checked against the libc10.so of an installed
PyTorch, which is what becomes torch.OutOfMemoryError in Python), and the refusal during
graph capture. The GPU behaviour is in gpu/test_torch_gpu.py."""
import importlib.util
import os
import shutil
import subprocess
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# What record_stream uses of a torch.Tensor whose storage starts at `ptr` (for snippets).
TENSOR_STAND_IN = """
class Tensor:
    def __init__(self, ptr):
        self.ptr = ptr
    def untyped_storage(self):
        return self
    def data_ptr(self):
        return self.ptr
"""


def test_books_under_pytorch_names(run_python):
    done = run_python("""
        import ctypes
        import mrstack, mrstack.torch as mt
        from mrstack import _lib
        assert mt.memory_stats(0)["allocated_bytes.all.current"] == 0   # nothing built yet
        mrstack.configure("pool(initial=16MiB) > simulated(capacity=64MiB)")
        d = _lib.library().dll
        a = d.mrstack_torch_alloc(3 << 20, 0, None)
        b = d.mrstack_torch_alloc(5 << 20, 0, None)
        s = mt.memory_stats(0)
        assert s["allocated_bytes.all.current"] == 8 << 20 == mt.memory_allocated(0)
        assert s["allocation.all.current"] == 2 and s["allocation.all.allocated"] == 2
        assert s["reserved_bytes.all.current"] >= 8 << 20 == mt.max_memory_allocated(0)
        assert mt.max_memory_reserved(0) >= mt.memory_reserved(0) >= 16 << 20
        d.mrstack_torch_free(b, 5 << 20, 0, None)
        s = mt.memory_stats(0)
        assert s["allocated_bytes.all.current"] == 3 << 20 and s["allocated_bytes.all.peak"] == 8 << 20
        assert s["allocation.all.freed"] == 1
        mt.reset_peak_memory_stats(0)
        assert mt.max_memory_allocated(0) == 3 << 20
        assert mrstack.statistics(0).clients["torch"].live_bytes == 3 << 20
        for key in ("num_alloc_retries", "num_ooms", "active_bytes.all.peak", "requested_bytes.all.current",
                    "mrstack.largest_free_block", "mrstack.free_blocks"):
            assert key in s, key
        # Out of memory: NULL from the C entry, counted, explained, the stack unchanged and serving.
        assert d.mrstack_torch_alloc(1 << 30, 0, None) is None
        message = _lib.library().last_error()
        assert "out of memory" in message and "1.00 GiB" in message, message
        s = mt.memory_stats(0)
        assert s["num_ooms"] == 1 and s["allocated_bytes.all.current"] == 3 << 20
        c = d.mrstack_torch_alloc(1 << 20, 0, None)
        assert c
        d.mrstack_torch_free(c, 1 << 20, 0, None)
        d.mrstack_torch_free(a, 3 << 20, 0, None)
        held = mrstack.statistics(0).free_bytes_held
        mt.empty_cache(0)
        assert mrstack.statistics(0).free_bytes_held <= held
        assert mt.memory_allocated(0) == 0
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_a_device_index_out_of_range_is_refused_not_truncated(run_python):
    # ctypes kept the low 32 bits: memory_stats(2**32) answered for device 0; int() cut 1.9 to 1.
    run_python("""
        import re
        import pytest
        import mrstack, mrstack.torch as mt
        mrstack.configure("simulated")
        stack = mrstack.device_stack(0)
        p = stack.allocate(4096, client="torch")
        assert mt.memory_stats(0)["allocated_bytes.all.current"] == 4096
        for call in (mt.memory_stats, mt.memory_allocated, mt.fragmentation, mt.reset_peak_memory_stats,
                     mt.empty_cache):
            with pytest.raises(ValueError, match=re.escape("mrstack.torch: device is 4294967296, outside [0, 63]")):
                call(2**32)
            with pytest.raises(TypeError, match="mrstack.torch: device must be an int, not float"):
                call(1.9)
            # A bool is an int subclass: memory_stats(True) had answered for device 1.
            with pytest.raises(TypeError, match=re.escape("mrstack.torch: device must be an int, not bool (True)")):
                call(True)
        stack.deallocate(p, 4096, client="torch")
    """)


def test_a_device_may_be_named_as_torch_names_it(run_python):
    # torch.cuda.memory_stats("cuda:1") is PyTorch's; here a str's own .index method was taken
    # for the device ("must be an int, not builtin_function_or_method"), and a CPU device
    # (index None) answered for the current CUDA device.
    run_python("""
        import re
        import pytest
        import mrstack, mrstack.torch as mt
        mrstack.configure("simulated")
        stack = mrstack.device_stack(0)
        p = stack.allocate(4096, client="torch")

        class Device:                      # what mrstack.torch reads of a torch.device
            def __init__(self, type, index):
                self.type, self.index = type, index

        for device in ("cuda:0", Device("cuda", 0)):
            assert mt.memory_allocated(device) == 4096, device
            assert mt.fragmentation(device) == mrstack.statistics(0).fragmentation
        # int() refused an ordinal of 5000 digits with a ValueError that named no argument.
        for call in (mt.memory_stats, mt.fragmentation, mt.empty_cache):
            with pytest.raises(ValueError, match=r"^mrstack.torch: 'cuda:9{25}'\\.\\.\\.: a device ordinal of 5000 digits, outside \\[0, 63\\]"):
                call("cuda:" + "9" * 5000)
        assert mt.memory_allocated("cuda:" + "0" * 30) == 4096
        # Leading zeros are no digits of the ordinal, but int() counted them: 'cuda:' with
        # 5000 zeros ended in its digit-limit ValueError too.
        assert mt.memory_allocated("cuda:" + "0" * 5000) == 4096
        with pytest.raises(ValueError, match=re.escape("mrstack.torch: device is 65, outside [0, 63]")):
            mt.memory_allocated("cuda:" + "0" * 5000 + "65")
        for device in ("cpu", "cuda:x", "cuda:-1", " cuda:0", Device("cpu", None), Device("meta", 0)):
            for call in (mt.memory_stats, mt.fragmentation, mt.reset_peak_memory_stats, mt.empty_cache):
                with pytest.raises(ValueError, match=re.escape(f"mrstack.torch: {device!r} is not a CUDA device")):
                    call(device)
        stack.deallocate(p, 4096, client="torch")
    """)


def test_record_stream_needs_a_pointer(run_python):
    done = run_python("""
        import mrstack
        from mrstack import _lib
        lib = _lib.library()
        assert lib.dll.mrstack_torch_record_stream(None, None) == _lib.ERROR_INVALID_ARGUMENT
        assert "null" in lib.last_error()
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def _libc10():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "lib", "libc10.so")
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the probe")
    out = str(tmp_path_factory.mktemp("probe") / "torch_oom_probe")
    subprocess.run([compiler, "-std=c++17", "-o", out, os.path.join(HERE, "native", "torch_oom_probe.cpp"), "-ldl"],
                   check=True)
    return out


def test_refusal_unwinds_as_mrstacks_exception_without_pytorch(probe, library_path):
    done = subprocess.run([probe, library_path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "type N7mrstack13out_of_memoryE" in done.stdout
    assert "could not allocate 1.00 MiB" in done.stdout
    assert "served again 1" in done.stdout


def test_refusal_unwinds_as_c10_out_of_memory_error(probe, library_path):
    libc10 = _libc10()
    if libc10 is None:
        pytest.skip("PyTorch is not installed: no libc10.so to bind")
    done = subprocess.run([probe, library_path, libc10], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "bind 0" in done.stdout
    assert "type N3c1016OutOfMemoryErrorE" in done.stdout   # PyTorch raises it as torch.OutOfMemoryError
    assert "mrstack: out of memory: limiting could not allocate 1.00 MiB" in done.stdout
    assert "served again 1" in done.stdout


def test_bind_refuses_a_library_without_the_symbol(run_python):
    done = run_python("""
        import mrstack
        from mrstack import _lib
        lib = _lib.library()
        assert lib.dll.mrstack_torch_bind_c10(lib.path.encode()) == _lib.ERROR_STATE
        assert "c10::OutOfMemoryError" in lib.last_error()
        assert lib.dll.mrstack_torch_bind_c10(b"/nonexistent/libc10.so") == _lib.ERROR_STATE
        assert "cannot load" in lib.last_error()
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_install_resolves_the_entry_points_and_binds_c10(run_python):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    done = run_python("""
        import mrstack.torch as mt
        assert not mt.raises_torch_out_of_memory() and not mt.installed()
        allocator = mt.install()            # loads mrstack_torch_alloc_raising and mrstack_torch_free by name
        assert mt.install() is allocator and mt.installed()
        assert mt.raises_torch_out_of_memory()   # libc10's OutOfMemoryError was found
        import torch
        with __import__("pytest").raises(torch.OutOfMemoryError, match="out of memory: pool"):
            with mt.out_of_memory_as_torch_error():
                raise RuntimeError("mrstack: out of memory: pool could not allocate 1.00 GiB")
        with __import__("pytest").raises(RuntimeError, match="unrelated"):
            with mt.out_of_memory_as_torch_error():
                raise RuntimeError("unrelated")
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_record_stream_refuses_what_is_not_a_live_block_before_any_cuda_call(run_python):
    # It took any pointer: the event of a foreign, interior or freed pointer sat in the map
    # forever, or made the free of a later block at that address wait for unrelated work.
    # Checked before the CUDA calls, so without a device the refusal is this, not a CUDA error.
    done = run_python("""
        import mrstack
        from mrstack import _lib
        mrstack.configure("pool(initial=4MiB) > simulated(capacity=64MiB)")
        lib = _lib.library()
        d = lib.dll
        a = d.mrstack_torch_alloc(1 << 20, 0, None)
        assert a
        for bad, named in ((0x1000, "0x1000"), (a + 256, hex(a + 256))):
            assert d.mrstack_torch_record_stream(bad, None) == _lib.ERROR_INVALID_ARGUMENT, named
            message = lib.last_error()
            assert message.startswith("mrstack_torch_record_stream: " + named + " is not a block PyTorch holds"), message
            assert "no event was kept" in message, message
        # A live block gets past the check: recorded with a driver, a CUDA error without one.
        status = d.mrstack_torch_record_stream(a, None)
        assert status in (_lib.SUCCESS, _lib.ERROR_CUDA), (status, lib.last_error())
        d.mrstack_torch_free(a, 1 << 20, 0, None)
        assert mrstack.statistics(0).clients["torch"].live_bytes == 0
        assert d.mrstack_torch_record_stream(a, None) == _lib.ERROR_INVALID_ARGUMENT   # after its free
        assert hex(a) + " is not a block PyTorch holds" in lib.last_error()
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_record_stream_knows_every_live_block_through_many_allocations_and_frees(run_python):
    # The live-block books grow, and lose entries in any order; each free must forget its
    # block and no other.
    done = run_python("""
        import random
        import mrstack
        from mrstack import _lib
        mrstack.configure("pool(initial=64MiB) > simulated(capacity=256MiB)")
        lib = _lib.library()
        d = lib.dll
        rng = random.Random(7)
        sizes = {}
        for _ in range(3):
            for _ in range(700):
                size = 256 * rng.randint(1, 64)
                sizes[d.mrstack_torch_alloc(size, 0, None)] = size
            for ptr in rng.sample(sorted(sizes), len(sizes) // 2):
                d.mrstack_torch_free(ptr, sizes.pop(ptr), 0, None)
                assert d.mrstack_torch_record_stream(ptr, None) == _lib.ERROR_INVALID_ARGUMENT, hex(ptr)
                for live in rng.sample(sorted(sizes), 3):
                    assert d.mrstack_torch_record_stream(live, None) != _lib.ERROR_INVALID_ARGUMENT, hex(live)
        assert mrstack.statistics(0).clients["torch"].live_bytes == sum(sizes.values())
        for ptr, size in sizes.items():
            d.mrstack_torch_free(ptr, size, 0, None)
        assert mrstack.statistics(0).clients["torch"].live_bytes == 0
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_a_free_of_what_pytorch_does_not_hold_changes_nothing(run_python):
    # A pointer torch_alloc never handed out, one into a block, or a block freed for another
    # device than its own is refused before the books or the stack are touched, keeping the
    # block's recorded events for its right free, which still works.
    done = run_python("""
        import mrstack
        from mrstack import _lib
        mrstack.configure("pool(initial=4MiB) > simulated(capacity=64MiB)")
        lib = _lib.library()
        d = lib.dll
        first = d.mrstack_torch_alloc(1 << 20, 0, None)
        a = d.mrstack_torch_alloc(1 << 20, 0, None)
        other = mrstack.device_stack(0).allocate(1 << 20, client="torch")   # not through PyTorch's entry
        refusals = [(a + 256, 0), (other, 0)]
        # Device 1's stack (simulated: it needs no second device, but a machine with one real
        # device refuses to make device 1 current) hands out its first block where device 0's
        # first is, not where `a` is.
        b = d.mrstack_torch_alloc(2 << 20, 1, None)
        if b:
            refusals.append((a, 1))
        for ptr, device in refusals:
            d.mrstack_torch_free(ptr, 1 << 20, device, None)
            message = lib.last_error()
            assert hex(ptr) in message and f"not a block PyTorch holds from device {device}" in message, message
        assert mrstack.statistics(0).clients["torch"].live_bytes == 3 << 20
        for ptr in (first, a):
            d.mrstack_torch_free(ptr, 1 << 20, 0, None)
        mrstack.device_stack(0).deallocate(other, 1 << 20, client="torch")
        assert mrstack.statistics(0).clients["torch"].live_bytes == 0
        if b:
            assert mrstack.statistics(1).clients["torch"].live_bytes == 2 << 20
            d.mrstack_torch_free(b, 2 << 20, 1, None)
            assert mrstack.statistics(1).clients["torch"].live_bytes == 0
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_a_refused_free_names_the_pointer_and_where_the_block_is(run_python):
    # The counters' refusal named the size and the device but not the pointer; a free for the
    # wrong device did not say which device's stack holds the block.
    done = run_python("""
        import mrstack
        from mrstack import _lib
        mrstack.configure("pool(initial=4MiB) > simulated(capacity=64MiB)")
        lib = _lib.library()
        d = lib.dll
        a = d.mrstack_torch_alloc(1 << 20, 0, None)
        d.mrstack_torch_free(a, 3 << 20, 0, None)   # another size than the block's: the books refuse
        message = lib.last_error()
        assert message.startswith(f"mrstack_torch_free: {hex(a)} on device 0 was allocated with 1048576 bytes, "
                                  "not the 3145728 this free names"), message
        assert mrstack.device_stack(2) is not None
        d.mrstack_torch_free(a, 1 << 20, 2, None)   # device 2's stack holds nothing
        message = lib.last_error()
        assert f"{hex(a)} (1048576 bytes) is not a block PyTorch holds from device 2's stack" in message, message
        assert "it is a live block of device 0's" in message, message
        d.mrstack_torch_free(a, 1 << 20, 0, None)
        assert mrstack.statistics(0).clients["torch"].live_bytes == 0
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_a_refused_free_keeps_the_block_in_the_books(run_python):
    # The free takes the block out of the books before the stack has it; refused (here by
    # the books: another size than the block's, which the pool below would have taken back
    # as its block of 1 MiB), the block is PyTorch's still.
    done = run_python("""
        import mrstack
        from mrstack import _lib
        mrstack.configure("pool(initial=4MiB) > simulated(capacity=64MiB)")
        lib = _lib.library()
        d = lib.dll
        a = d.mrstack_torch_alloc(1 << 20, 0, None)
        b = d.mrstack_torch_alloc(1 << 20, 0, None)
        d.mrstack_torch_free(a, (1 << 20) - 100, 0, None)   # another size than the block's: the books refuse it
        assert "was allocated with 1048576 bytes, not the 1048476" in lib.last_error(), lib.last_error()
        assert mrstack.statistics(0).clients["torch"].live_bytes == 2 << 20
        assert d.mrstack_torch_record_stream(a, None) in (_lib.SUCCESS, _lib.ERROR_CUDA), lib.last_error()
        for p in (a, b):
            d.mrstack_torch_free(p, 1 << 20, 0, None)
        assert mrstack.statistics(0).clients["torch"].live_bytes == 0
        assert d.mrstack_torch_record_stream(a, None) == _lib.ERROR_INVALID_ARGUMENT
        print("ok")
    """)
    assert done.stdout.split() == ["ok"]


def test_record_stream_reaches_the_library_and_fails_clearly_without_a_device(run_python):
    done = run_python("""
        import mrstack, mrstack.torch as mt

        mrstack.configure("simulated")
        from mrstack import _lib
        block = _lib.library().dll.mrstack_torch_alloc(4096, 0, None)

        class Storage:
            def data_ptr(self):
                return block

        class Tensor:                      # what record_stream uses of a torch.Tensor
            def untyped_storage(self):
                return Storage()

        class Stream:
            cuda_stream = 0                # the legacy default stream

        class CpuTensor(Tensor):
            class device:
                type = "cpu"
                def __str__(self):
                    return "cpu"
            device = device()

        try:
            mt.record_stream(CpuTensor(), Stream())
        except ValueError as e:
            assert "the tensor is on cpu, not a CUDA device" in str(e), e
        else:
            raise AssertionError("a CPU tensor's record_stream was taken")
        try:
            mt.record_stream(Tensor(), Stream())
        except mrstack.MrstackError as e:
            # The stream's device is asked first: the event is made there.
            assert "cudaStreamGetDevice" in str(e) and "record_stream" in str(e), e
            print("refused")
        else:
            print("recorded")              # a machine with a driver records the event
    """)
    assert done.stdout.split()[-1] in ("refused", "recorded")


def test_record_stream_refuses_a_stream_or_pointer_that_is_no_integer(run_python):
    # ctypes' c_void_p passed a str's own address as the stream handle (a CUDA call on a
    # stream that is no stream), True as stream 1 and 2**64 + 1 as 1.
    done = run_python(TENSOR_STAND_IN + textwrap.dedent("""
        import re
        import pytest
        import mrstack, mrstack.torch as mt
        mrstack.configure("simulated")
        from mrstack import _lib
        block = _lib.library().dll.mrstack_torch_alloc(4096, 0, None)

        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle

        for stream in ("abc", b"abc", True, 1.5, Stream("abc"), Stream(False)):
            handle = getattr(stream, "cuda_stream", stream)
            with pytest.raises(TypeError, match=f"^mrstack.torch.record_stream: stream must be an int, not "
                                                f"{type(handle).__name__}"):
                mt.record_stream(Tensor(block), stream)
        for stream in (-1, 2**64 + 1, Stream(-1)):
            with pytest.raises(ValueError, match=r"^mrstack.torch.record_stream: stream is .*, outside \\[0, "):
                mt.record_stream(Tensor(block), stream)
        with pytest.raises(TypeError, match=r"^mrstack.torch.record_stream: the tensor's data_ptr\\(\\) must be an int, "
                                            "not str"):
            mt.record_stream(Tensor("0x1000"), None)
        print("ok")
    """))
    assert done.stdout.split() == ["ok"]


def test_record_stream_of_a_tensor_mrstack_did_not_allocate_raises_a_value_error(run_python):
    done = run_python(TENSOR_STAND_IN + textwrap.dedent("""
        import pytest
        import mrstack, mrstack.torch as mt
        mrstack.configure("simulated")

        with pytest.raises(mrstack.InvalidArgumentError) as caught:
            mt.record_stream(Tensor(0x1000), None)
        assert isinstance(caught.value, ValueError) and caught.value.status == "MRSTACK_ERROR_INVALID_ARGUMENT"
        message = str(caught.value)
        assert message.startswith("mrstack.torch.record_stream: mrstack_torch_record_stream: 0x1000 is not a block"), message
        print("ok")
    """))
    assert done.stdout.split() == ["ok"]
