"""vmm stacks on a real device: Numba's IPC API over `pool > vmm` between two processes
(the child reads the parent's pattern and writes back; the parent sees it), and sleep/wake
of a stack under PyTorch (device memory drops, comes back, tensors keep their data, and
training continues with exactly the loss it would have had without the cycle)."""
import textwrap

import pytest

pytestmark = pytest.mark.usefixtures("cuda_device")

VMM_ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "mrstack.numba", "MRSTACK_RESOURCE": "pool > vmm"}


def test_numba_ipc_of_pool_vmm_blocks_between_two_processes(run_python):
    done = run_python(textwrap.dedent("""
        import ctypes, pickle
        import multiprocessing as mp
        import numpy as np
        from numba import cuda
        import mrstack, mrstack.numba

        def child(ipch, raw, size, queue):
            import traceback
            try:
                # Numba's routes, unchanged: the pickled IpcHandle, then the raw bytes.
                ctx = cuda.current_context()
                arr = ipch.open_array(ctx, shape=size // 8, dtype=np.dtype(np.int64))  # a dtype: numba reads .itemsize
                seen = arr.copy_to_host()
                arr.copy_to_device(seen * 2 + 1)   # write back
                cuda.synchronize()
                ipch.close()
                with cuda.open_ipc_array(raw, shape=size // 8, dtype=np.dtype(np.int64)) as again:
                    second = again.copy_to_host()
                queue.put(("ok", seen.tolist(), second.tolist()))
            except BaseException:
                queue.put(("failed", traceback.format_exc(), None))   # the parent says what, at once

        if __name__ == "__main__":
            pad = cuda.device_array(3000, dtype=np.uint8)       # the block sits inside a pool chunk
            data = np.arange(1000, dtype=np.int64) * 7
            d = cuda.to_device(data)
            ipch = d.gpu_data.context.get_ipc_handle(d.gpu_data)
            raw = ctypes.string_at(ipch.handle.getPtr(), 64)
            assert raw.startswith(b"MRSVMM"), raw[:8]
            again = pickle.loads(pickle.dumps(ipch))
            assert again.base is None and again.size == ipch.size
            spawn = mp.get_context("spawn")
            queue = spawn.Queue()
            p = spawn.Process(target=child, args=(again, raw, data.nbytes, queue))
            p.start()
            outcome, seen, second = queue.get(timeout=60)
            assert outcome == "ok", "the opening process failed:\\n" + seen
            p.join(timeout=60)
            assert p.exitcode == 0, p.exitcode
            assert seen == data.tolist()
            assert second == (data * 2 + 1).tolist()
            assert d.copy_to_host().tolist() == (data * 2 + 1).tolist()   # A sees B's writes
            print("vmm ipc ok")
    """), env=VMM_ENV)
    assert "vmm ipc ok" in done.stdout


def test_sleep_and_wake_under_pytorch_keep_tensors_and_training_identical(run_python):
    pytest.importorskip("torch")
    done = run_python(textwrap.dedent("""
        import os
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import mrstack, mrstack.torch
        mrstack.torch.install()
        import torch
        torch.use_deterministic_algorithms(True)
        free_at_start = torch.cuda.mem_get_info()[0]   # before the stack holds anything

        def train(steps, cycle_at=None):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 1024)).cuda()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            x = torch.randn(512, 1024, device="cuda")
            y = torch.randn(512, 1024, device="cuda")
            losses = []
            for step in range(steps):
                if step == cycle_at:
                    torch.cuda.synchronize()
                    stack = mrstack.device_stack(0)
                    before = torch.cuda.mem_get_info()[0]
                    weight = model[0].weight.detach().clone()
                    stack.sleep(keep_contents=True)
                    assert stack.asleep
                    asleep = torch.cuda.mem_get_info()[0]
                    stack.wake()
                    after = torch.cuda.mem_get_info()[0]
                    assert torch.equal(model[0].weight, weight)
                    print("free at start", free_at_start, "before", before, "asleep", asleep, "after", after)
                    assert asleep - before >= 100 << 20, (before, asleep)      # the model's memory went,
                    assert free_at_start - asleep <= 256 << 20, (free_at_start, asleep)  # nearly all of it
                    assert asleep - after >= 100 << 20, (asleep, after)        # and came back
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        plain = train(8)
        cycled = train(8, cycle_at=4)
        assert plain == cycled, (plain, cycled)
        print("torch sleep ok", cycled[-1])
    """), env={"MRSTACK_RESOURCE": "pool > vmm"})
    assert "torch sleep ok" in done.stdout, done.stdout + done.stderr
