"""Numba, CuPy and PyTorch in one process, all allocating from ONE mrstack pool: they
compute on each other's memory, their allocations lie in the same pool chunk, and the
per-client books show each one's live and peak bytes. PyTorch's allocator must be swapped
before PyTorch initializes CUDA, so every scenario runs in a fresh interpreter."""
import pytest

pytestmark = pytest.mark.usefixtures("cuda_device")

POOL_SPEC = "pool(initial=256MiB) > cuda"


@pytest.fixture
def all_three():
    import importlib.util
    for module in ("cupy", "torch"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def test_numba_cupy_torch_share_one_pool(run_python, all_three):
    done = run_python(f"""
        import gc
        import mrstack
        mrstack.configure("{POOL_SPEC}")
        import mrstack.torch
        mrstack.torch.install()                 # before PyTorch touches CUDA
        import numpy as np
        import torch, cupy
        from numba import cuda
        import mrstack.numba, mrstack.cupy
        cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)  # before Numba's context
        mrstack.cupy.install()

        n = 1 << 20
        t = torch.arange(n, dtype=torch.float32, device="cuda")           # PyTorch
        assert abs(float((t * 2).sum()) / (n * (n - 1)) - 1) < 1e-4       # float32 sums round
        c = cupy.arange(n, dtype=cupy.float32)                             # CuPy
        assert abs(float((c * 3).sum()) / (3.0 * n * (n - 1) / 2) - 1) < 1e-4

        @cuda.jit
        def add(out, a, b):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = a[i] + b[i]

        out = cuda.device_array(n, dtype=np.float32)                       # Numba
        torch.cuda.synchronize()
        cupy.cuda.runtime.deviceSynchronize()
        add.forall(n)(out, cuda.as_cuda_array(c), cuda.as_cuda_array(t))  # on the others' memory
        cuda.synchronize()
        np.testing.assert_array_equal(out.copy_to_host(), 2 * np.arange(n, dtype=np.float32))

        # One pool: the three allocations lie in the same upstream (cudaMalloc) allocation.
        from numba.cuda.cudadrv.driver import driver
        bases = {{name: int(driver.cuMemGetAddressRange(ptr)[0])
                 for name, ptr in [("torch", t.data_ptr()), ("cupy", c.data.ptr),
                                   ("numba", out.device_ctypes_pointer.value)]}}
        assert len(set(bases.values())) == 1, bases

        s = mrstack.statistics(0)
        print(s)
        assert s.stack == "pool > cuda"
        for name in ("torch", "cupy", "numba"):
            assert s.clients[name].live_bytes >= 4 * n, (name, s)
            assert s.clients[name].live_count >= 1, (name, s)
        assert s.live_bytes == sum(c_.live_bytes for c_ in s.clients.values())
        torch_live = s.clients["torch"].live_bytes

        del out, c
        gc.collect()
        s = mrstack.statistics(0)
        assert s.clients["numba"].live_bytes == 0, s
        assert s.clients["cupy"].live_bytes == 0, s
        assert s.clients["torch"].live_bytes == torch_live, s          # still holds t
        del t
        torch.cuda.synchronize()
        s = mrstack.statistics(0)
        assert s.clients["torch"].live_bytes <= torch_live - 4 * n, s
        for name in ("torch", "cupy", "numba"):
            assert s.clients[name].peak_bytes >= 4 * n, (name, s)
        assert s.free_bytes_held >= 3 * 4 * n                           # all of it back in the one pool
        print("three clients ok")
    """)
    assert "three clients ok" in done.stdout


def test_cupy_allocates_on_its_current_stream(run_python, all_three):
    run_python(f"""
        import gc
        import mrstack, mrstack.cupy
        import cupy
        mrstack.configure("{POOL_SPEC}")
        mrstack.cupy.install()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            a = cupy.ones(1 << 20, dtype=cupy.float64)
            assert float(a.sum()) == float(1 << 20)
        stream.synchronize()
        s = mrstack.statistics(0)
        assert s.clients["cupy"].live_bytes == 8 << 20, s
        del a
        gc.collect()
        assert mrstack.statistics(0).clients["cupy"].live_bytes == 0
        try:
            cupy.empty(1 << 50, dtype=cupy.uint8)      # 1 PiB
        except cupy.cuda.memory.OutOfMemoryError as e:
            print("OOM", e)
        else:
            raise AssertionError("allocated 1 PiB")
    """)


def test_torch_install_too_late_says_so(run_python, all_three):
    done = run_python("""
        import torch
        torch.zeros(1, device="cuda")
        import mrstack, mrstack.torch
        try:
            mrstack.torch.install()
        except mrstack.MrstackError as e:
            print("REFUSED:", e)
    """)
    assert "REFUSED" in done.stdout and "before" in done.stdout, done.stdout + done.stderr


def test_torch_alone_on_a_pool_with_statistics(run_python, all_three):
    run_python(f"""
        import mrstack, mrstack.torch
        mrstack.configure("{POOL_SPEC}")
        mrstack.torch.install()
        import torch
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        torch.cuda.synchronize()
        s = mrstack.statistics(0)
        assert s.clients["torch"].live_bytes >= 2 * 4 * 1024 * 1024, s
        assert s.clients["numba"].allocations == 0 and s.clients["cupy"].allocations == 0
        del x, y
        torch.cuda.synchronize()
        assert mrstack.statistics(0).clients["torch"].peak_bytes >= 8 << 20
    """)
