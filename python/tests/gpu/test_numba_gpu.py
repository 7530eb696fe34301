"""Numba on mrstack memory, on a real device: kernels compute on arrays from a pool stack,
the books follow the arrays, memory info counts the pool's free memory, IPC handles of
suballocated arrays (at an offset in a pool chunk) open in another process, reset and
defer_cleanup work under Numba, and memory CUDA IPC cannot share is refused clearly."""
import textwrap

import pytest

POOL_SPEC = "pool(initial=256MiB) > cuda"
pytestmark = pytest.mark.usefixtures("cuda_device")

PLUGIN_ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "mrstack.numba", "MRSTACK_RESOURCE": POOL_SPEC}


def test_kernels_compute_on_pool_memory_and_the_books_follow(run_python):
    run_python("""
        import gc
        import numpy as np
        from numba import cuda
        import mrstack, mrstack.numba

        ctx = cuda.current_context()
        assert isinstance(ctx.memory_manager, mrstack.numba.MrstackNumbaMemoryManager)

        @cuda.jit
        def axpy(out, a, x, y):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = a * x[i] + y[i]

        n = 1 << 20
        x = cuda.to_device(np.arange(n, dtype=np.float32))
        y = cuda.to_device(np.ones(n, dtype=np.float32))
        out = cuda.device_array(n, dtype=np.float32)
        axpy.forall(n)(out, 2.0, x, y)
        np.testing.assert_allclose(out.copy_to_host(), 2 * np.arange(n, dtype=np.float32) + 1)

        s = mrstack.statistics(0)
        assert s.stack == "pool > cuda", s.stack
        assert s.clients["numba"].live_bytes >= 3 * n * 4, s
        assert s.emm_outstanding >= 3
        peak = s.clients["numba"].peak_bytes
        del x, y, out
        gc.collect()
        s = mrstack.statistics(0)
        assert s.clients["numba"].live_bytes == 0, s
        assert s.clients["numba"].peak_bytes == peak
        assert s.free_bytes_held >= 3 * n * 4     # back in the pool, not in the driver

        # Memory info: the device's numbers plus what the pool holds free.
        free_driver, total_driver = cuda.cudadrv.driver.driver.cuMemGetInfo()
        info = ctx.get_memory_info()
        assert info.total == total_driver
        assert info.free >= free_driver + s.free_bytes_held - (64 << 20)
        print(s)
    """, env=PLUGIN_ENV)


def test_reset_and_defer_cleanup_under_numba(run_python):
    run_python("""
        import gc
        import numpy as np
        from numba import cuda
        import mrstack

        a = cuda.device_array(1000, dtype=np.float64)
        b = cuda.device_array(1000, dtype=np.float64)
        assert mrstack.statistics(0).emm_outstanding == 2
        cuda.current_context().reset()             # Numba's reset frees what is outstanding
        assert mrstack.statistics(0).emm_outstanding == 0
        assert mrstack.statistics(0).clients["numba"].live_bytes == 0
        c = cuda.device_array(1000, dtype=np.float64)  # may reuse a's address
        del a, b                                       # stale finalizers: no-ops
        gc.collect()
        assert mrstack.statistics(0).emm_outstanding == 1
        c.copy_to_device(np.arange(1000, dtype=np.float64))
        np.testing.assert_array_equal(c.copy_to_host(), np.arange(1000))

        with cuda.defer_cleanup():
            d = cuda.device_array(1 << 20, dtype=np.uint8)
            held = mrstack.statistics(0).free_bytes_held
            del d
            gc.collect()
            assert mrstack.statistics(0).free_bytes_held == held   # held back, not in the pool yet
        assert mrstack.statistics(0).free_bytes_held >= held + (1 << 20)
    """, env=PLUGIN_ENV)


CHILD = '''
import ctypes, sys
import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver, devicearray

def read_ipc(handle_bytes, offset, nbytes):
    """Opens a CUDA IPC handle and reads nbytes at offset (without the binding's
    `reserved` accessor, which some cuda-bindings releases lack)."""
    ctx = cuda.current_context()
    handle = driver.binding.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), handle_bytes, 64)
    mem = ctx.open_ipc_handle(handle, offset + nbytes)
    view = mem.view(offset)
    out = np.empty(nbytes // 8, dtype=np.int64)
    driver.device_to_host(out, view, nbytes)
    # As numba-cuda's IpcHandle.close does: through the module's Driver instance
    # (`driver.driver`); the module itself has no cuIpcCloseMemHandle.
    driver.driver.cuIpcCloseMemHandle(mem.handle)
    return out
'''


def test_ipc_handle_of_a_suballocated_array_opens_in_another_process(run_python):
    run_python(CHILD + textwrap.dedent("""
        import multiprocessing as mp
        import mrstack

        def child(handle_bytes, offset, nbytes, queue):
            queue.put(read_ipc(handle_bytes, offset, nbytes).tolist())

        if __name__ == "__main__":
            pad = cuda.device_array(3000, dtype=np.uint8)           # pushes the next block off the chunk's start
            data = np.arange(100, dtype=np.int64) * 7
            d = cuda.to_device(data)
            ipch = cuda.current_context().get_ipc_handle(d.gpu_data)
            assert ipch.offset > 0, "expected a block inside a pool chunk"
            base, end = driver.device_extents(d.gpu_data)
            assert int(d.gpu_data.device_pointer_value) - base == ipch.offset
            assert ipch.size == data.nbytes
            handle_bytes = ctypes.string_at(ipch.handle.getPtr(), 64)
            queue = mp.get_context("spawn").Queue()
            p = mp.get_context("spawn").Process(target=child, args=(handle_bytes, ipch.offset, data.nbytes, queue))
            p.start()
            got = queue.get(timeout=120)
            p.join()
            assert got == data.tolist()

            # Numba's own route (pickled IpcHandle, offset included) where the binding allows it.
            if hasattr(driver.binding.CUipcMemHandle(), "reserved"):
                import pickle
                again = pickle.loads(pickle.dumps(ipch))
                assert again.offset == ipch.offset
            print("ipc ok, offset", ipch.offset)
    """), env=PLUGIN_ENV)


@pytest.mark.parametrize("spec,reason,says", [("pool > cuda_async", "stream-ordered", "cannot share"),
                                              ("pool > vmm(ipc=none)", "ipc=none", "cannot be shared")])
def test_memory_ipc_cannot_share_is_refused_with_a_clear_message(run_python, spec, reason, says):
    done = run_python("""
        import numpy as np
        from numba import cuda
        import mrstack
        d = cuda.device_array(1000, dtype=np.float32)
        try:
            d.get_ipc_handle()
        except mrstack.MrstackError as e:
            print("REFUSED:", e)
    """, env={**PLUGIN_ENV, "MRSTACK_RESOURCE": spec})
    assert "REFUSED" in done.stdout and says in done.stdout, done.stdout + done.stderr
    assert reason in done.stdout


def test_out_of_memory_is_a_memory_error_naming_the_request(run_python):
    done = run_python("""
        import numpy as np
        from numba import cuda
        import mrstack
        try:
            cuda.device_array(1 << 50, dtype=np.uint8)   # 1 PiB
        except MemoryError as e:
            print("OOM:", type(e).__name__, e)
        a = cuda.device_array(1000)                       # still usable
        print("after", a.shape)
    """, env=PLUGIN_ENV)
    assert "OOM: OutOfMemoryError" in done.stdout, done.stdout + done.stderr
    assert "after (1000,)" in done.stdout
