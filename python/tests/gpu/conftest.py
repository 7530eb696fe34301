"""GPU tests: each runs its scenario in a fresh interpreter (mrstack's device stacks and
PyTorch's allocator are process-wide and one-shot). Without a CUDA device, or without the
library a scenario needs, they skip and say why."""
import importlib.util
import subprocess
import sys

import pytest

def have_cuda_device():
    """True when a CUDA device can be used (asked through Numba's driver, in a subprocess so
    the test process itself never initializes CUDA)."""
    code = "from numba import cuda; import sys; sys.exit(0 if cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def cuda_device():
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba-cuda is not installed")
    if not have_cuda_device():
        pytest.skip("no CUDA device")


def device_count():
    """How many CUDA devices Numba sees (asked in a subprocess, as above)."""
    code = "from numba import cuda; print(len(cuda.gpus))"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return int(done.stdout.strip() or 0)
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


@pytest.fixture(scope="module")
def two_devices():
    count = device_count()
    if count < 2:
        pytest.skip(f"needs two CUDA devices; this machine has {count}")
