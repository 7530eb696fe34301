"""Two devices in one process: Numba, CuPy and PyTorch allocate each device's memory from
that device's mrstack stack, `mrstack.statistics(d)` counts per device, and a process that
only uses device 1 creates no context (and so takes no memory) on device 0. Each scenario
runs in a fresh interpreter; all skip without two CUDA devices."""
import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("cuda_device")


def _need(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


# Shared by the snippets: where a pointer lives and whether a device has a context, asked
# of the driver itself through ctypes (neither creates a context). CUDA numbers devices in
# PCI bus order here, as NVML does, so "device 1" is the same GPU for both.
DRIVER_HELPERS = """
import ctypes, os
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
_cu = ctypes.CDLL("libcuda.so.1")
assert _cu.cuInit(0) == 0
def device_of(ptr):
    ordinal = ctypes.c_int(-1)
    err = _cu.cuPointerGetAttribute(ctypes.byref(ordinal), 9, ctypes.c_uint64(int(ptr)))  # 9: DEVICE_ORDINAL
    assert err == 0, f"cuPointerGetAttribute({int(ptr):#x}) failed: CUresult {err}"
    return ordinal.value
def has_context(device):
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert _cu.cuDeviceGet(ctypes.byref(dev), device) == 0
    assert _cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)
def check_device(ptr, expected, what):
    got = device_of(ptr)
    assert got == expected, f"{what} at {int(ptr):#x} is on device {got}, expected device {expected}"
"""

SPEC = "pool(initial=64MiB) > cuda"
MIB = 1 << 20


def test_numba_on_two_devices(run_python, two_devices):
    run_python(DRIVER_HELPERS + f"""
import numpy as np
import mrstack, mrstack.numba
from numba import cuda
mrstack.configure("{SPEC}")
cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)
arrays = {{}}
for device, mib in ((0, 96), (1, 48)):
    with cuda.gpus[device]:
        a = cuda.to_device(np.full(mib * {MIB} // 4, device + 1, dtype=np.float32))
        check_device(a.device_ctypes_pointer.value, device, "Numba's array")
        assert float(a.copy_to_host().sum()) == (device + 1) * mib * {MIB} // 4
        arrays[device] = a
for device, mib in ((0, 96), (1, 48)):
    s = mrstack.statistics(device)
    assert s.device == device and s.stack, s
    assert mib * {MIB} <= s.clients["numba"].live_bytes < (mib + 8) * {MIB}, (device, s)
""")


def test_cupy_on_two_devices(run_python, two_devices):
    _need("cupy")
    run_python(DRIVER_HELPERS + f"""
import cupy, mrstack, mrstack.cupy
mrstack.configure("{SPEC}")
mrstack.cupy.install()
kept = []
for device, mib in ((1, 40), (0, 72)):
    with cupy.cuda.Device(device):
        a = cupy.ones(mib * {MIB} // 4, dtype=cupy.float32)
        check_device(a.data.ptr, device, "CuPy's array")
        assert float(a.sum()) == mib * {MIB} // 4
        kept.append(a)
    assert cupy.cuda.runtime.getDevice() == 0  # what the thread had, left as it was
for device, mib in ((0, 72), (1, 40)):
    live = mrstack.statistics(device).clients["cupy"].live_bytes
    assert mib * {MIB} <= live < (mib + 8) * {MIB}, mrstack.statistics(device)
del kept, a   # `a` still named the last array
import gc; gc.collect()
assert mrstack.statistics(0).clients["cupy"].live_bytes == 0, mrstack.statistics(0)
assert mrstack.statistics(1).clients["cupy"].live_bytes == 0
""")


def test_torch_on_two_devices(run_python, two_devices):
    _need("torch")
    run_python(DRIVER_HELPERS + f"""
import mrstack, mrstack.torch
mrstack.configure("{SPEC}")
mrstack.torch.install()
import torch
x = torch.ones(24 * {MIB} // 4, device="cuda:1")
y = torch.ones(56 * {MIB} // 4, device="cuda:0")
check_device(x.data_ptr(), 1, "x")
check_device(y.data_ptr(), 0, "y")
assert float(x.sum()) == 24 * {MIB} // 4 and float(y.sum()) == 56 * {MIB} // 4
z = x.to("cuda:0") + y[: x.numel()]       # a cross-device copy, then math on device 0
assert float(z.sum()) == 2 * x.numel()
t0 = mrstack.statistics(0).clients["torch"]
t1 = mrstack.statistics(1).clients["torch"]
assert t1.live_bytes >= 24 * {MIB} and t1.live_bytes < 56 * {MIB}, t1
assert t0.live_bytes >= 56 * {MIB} + 24 * {MIB}, t0
""")


# ---- a process that uses only device 1 --------------------------------------------------------

SCENARIOS = {
    "c_abi": """
import mrstack
mrstack.configure("pool > cuda")
s = mrstack.device_stack(1)
p = s.allocate(1 << 30)
check_device(p, 1, "device 1's block")
s.deallocate(p, 1 << 30)
p = s.allocate(1 << 30)   # held while the memory is measured
""",
    "numba": """
import numpy as np, mrstack, mrstack.numba
from numba import cuda
USE_MRSTACK and cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)
cuda.select_device(1)
a = cuda.device_array(64 << 20, dtype=np.float32)
check_device(a.device_ctypes_pointer.value, 1, "Numba's array")
""",
    "cupy": """
import cupy, mrstack, mrstack.cupy
USE_MRSTACK and mrstack.cupy.install()
with cupy.cuda.Device(1):
    a = cupy.ones(64 << 20, dtype=cupy.float32)
    check_device(a.data.ptr, 1, "CuPy's array")
""",
    "torch": """
import mrstack, mrstack.torch
USE_MRSTACK and mrstack.torch.install()
import torch
a = torch.ones(64 << 20, device="cuda:1")
check_device(a.data_ptr(), 1, "the tensor")
""",
}

REPORT = """
import json, os, subprocess
report = {"context": [has_context(0), has_context(1)], "nvml": None}
try:
    import pynvml
    pynvml.nvmlInit()
    report["nvml"] = []
    for d in (0, 1):
        h = pynvml.nvmlDeviceGetHandleByIndex(d)
        mine = [p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == os.getpid()]
        report["nvml"].append(sum(mine) if mine else 0)
except Exception:
    try:
        uuids = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60).stdout.split("\\n")
        index = {u.split(",")[1].strip(): int(u.split(",")[0]) for u in uuids if "," in u}
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60).stdout
        used = [0, 0]
        for line in apps.splitlines():
            pid, uuid, mib = [f.strip() for f in line.split(",")]
            if int(pid) == os.getpid() and index.get(uuid, 9) < 2:
                used[index[uuid]] += int(mib) << 20
        report["nvml"] = used
    except Exception:
        pass
print("REPORT " + json.dumps(report))
"""


def _device1_only(run_python, scenario, use_mrstack):
    code = f"USE_MRSTACK = {use_mrstack}\n" + DRIVER_HELPERS + SCENARIOS[scenario] + REPORT
    done = run_python(code)
    line = [x for x in done.stdout.splitlines() if x.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_process_using_only_device_1_leaves_device_0_alone(run_python, two_devices, scenario):
    if scenario != "c_abi":
        _need(scenario)
    plain = None if scenario == "c_abi" else _device1_only(run_python, scenario, False)
    with_mrstack = _device1_only(run_python, scenario, True)
    assert with_mrstack["context"][1], with_mrstack
    if plain is not None and plain["context"][0]:
        pytest.skip(f"{scenario} itself creates a context on device 0 without mrstack: {plain}")
    assert not with_mrstack["context"][0], f"mrstack created a context on device 0: {with_mrstack}"
    if with_mrstack["nvml"] is not None:
        assert with_mrstack["nvml"][0] == 0, with_mrstack
        assert with_mrstack["nvml"][1] > 0, with_mrstack
