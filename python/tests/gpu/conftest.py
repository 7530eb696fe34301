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
