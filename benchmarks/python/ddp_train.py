#!/usr/bin/env python3
"""PyTorch DistributedDataParallel over NCCL, one process per GPU, with PyTorch's own
caching allocator or with mrstack's (`mrstack.torch.install()` in each process): step
time, peak memory per GPU, and where each process's memory lives.

One run of one mode (what torchrun starts in every process):
    torchrun --nproc-per-node 2 benchmarks/python/ddp_train.py --mode mrstack
    torchrun --nproc-per-node 2 benchmarks/python/ddp_train.py --mode torch
Both modes, one after the other, and the comparison:
    python3 benchmarks/python/ddp_train.py --compare [--steps 200] [--spec "pool > cuda"]

Each process trains the same small MLP for `--warmup` + `--steps` steps on random data
and reports: the median step time (synchronized), PyTorch's or mrstack's peak bytes,
and — from NVML when pynvml is installed, else nvidia-smi — how much memory the process
holds on every GPU. A process must hold memory on its own GPU only (and, with mrstack,
no context elsewhere): `--compare` exits 1 when one does not. The issue's targets (step
time within 2 %, peak memory no higher) are printed as met or missed.

Needs torch with CUDA and NCCL, two GPUs, and a built libmrstack_c.so (found as the
mrstack package finds it: MRSTACK_LIBRARY, ...).
"""
import argparse
import json
import os
import statistics as stats
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

RESULT = "DDP_RESULT "


def memory_per_gpu():
    """Bytes this process holds on each GPU, as the driver's tools see it (None: unknown)."""
    pid = os.getpid()
    try:
        import pynvml
        pynvml.nvmlInit()
        used = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mine = [p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid]
            used.append(sum(mine))
        return used
    except Exception:
        pass
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout
        index = {line.split(",")[1].strip(): int(line.split(",")[0]) for line in gpus.splitlines() if "," in line}
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60).stdout
        used = [0] * len(index)
        for line in apps.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 3 and fields[0] == str(pid) and fields[1] in index:
                used[index[fields[1]]] += int(fields[2]) << 20
        return used
    except Exception:
        return None


def contexts():
    """Which GPUs have this process's primary context (cuda.bindings; None: unknown)."""
    try:
        from cuda.bindings import driver as cu
        cu.cuInit(0)
        _, count = cu.cuDeviceGetCount()
        active = []
        for i in range(count):
            _, dev = cu.cuDeviceGet(i)
            _, _, state = cu.cuDevicePrimaryCtxGetState(dev)
            active.append(bool(state))
        return active
    except Exception:
        return None


def train(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.mode == "mrstack":
        import mrstack
        import mrstack.torch
        if args.spec:
            mrstack.configure(args.spec)
        mrstack.torch.install()          # before PyTorch touches CUDA
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(1234 + dist.get_rank())
    width = args.width
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 4 * width), nn.GELU(),
                          nn.Linear(4 * width, width)).to(device)
    ddp = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, width, device=device)
        y = torch.randn(args.batch, width, device=device)
        torch.cuda.synchronize()
        started = time.perf_counter()
        loss = F.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    if args.mode == "mrstack":
        import mrstack
        # Held: the stack's footprint when PyTorch's live bytes peaked, as PyTorch's own
        # max_memory_reserved is its reserve's high-water mark. (The stack's peak plus the
        # free bytes held at the end had counted memory twice: freed after the peak, it was
        # in both.)
        peak, held = mrstack.statistics(local_rank).clients["torch"].peak_bytes, \
            mrstack.torch.max_memory_reserved(local_rank)
    else:
        peak, held = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    mine = {"rank": dist.get_rank(), "local_rank": local_rank, "pid": os.getpid(), "loss": float(loss),
            "step_ms": 1e3 * stats.median(times), "peak_bytes": peak, "held_bytes": held,
            "memory_per_gpu": memory_per_gpu(), "contexts": contexts()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        print(RESULT + json.dumps({"mode": args.mode, "ranks": everyone}), flush=True)
    dist.destroy_process_group()


def strays(ranks, mode):
    """What each process holds off its own GPU: a list of complaints (empty: none)."""
    found = []
    for r in ranks:
        for gpu, used in enumerate(r["memory_per_gpu"] or []):
            if gpu != r["local_rank"] and used > 0:
                found.append(f"{mode}: rank {r['rank']} holds {used >> 20} MiB on GPU {gpu}")
        for gpu, active in enumerate(r["contexts"] or []):
            if gpu != r["local_rank"] and active:
                found.append(f"{mode}: rank {r['rank']} has a context on GPU {gpu}")
    return found


def compare(args):
    results = {}
    for mode in ("torch", "mrstack"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), __file__,
                   "--mode", mode, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--batch", str(args.batch), "--width", str(args.width)] + (["--spec", args.spec] if args.spec else [])
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        lines = [x for x in done.stdout.splitlines() if x.startswith(RESULT)]
        if done.returncode != 0 or not lines:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
            sys.exit(f"ddp_train: the {mode} run failed ({done.returncode})")
        results[mode] = json.loads(lines[-1][len(RESULT):])["ranks"]
    print(f"{'mode':8s} {'rank':>4s} {'step ms':>9s} {'peak MiB':>9s} {'held MiB':>9s}  MiB per GPU (NVML)  contexts")
    for mode, ranks in results.items():
        for r in ranks:
            per_gpu = " ".join(str(b >> 20) for b in (r["memory_per_gpu"] or [])) or "?"
            ctx = "".join("x" if a else "." for a in (r["contexts"] or [])) or "?"
            print(f"{mode:8s} {r['rank']:4d} {r['step_ms']:9.3f} {r['peak_bytes'] / 2**20:9.1f} "
                  f"{r['held_bytes'] / 2**20:9.1f}  {per_gpu:18s}  {ctx}")
    # What PyTorch or NCCL do by themselves in the torch run is not mrstack's: only what the
    # mrstack run adds fails it.
    baseline = {line.split(": ", 1)[1] for line in strays(results["torch"], "torch")}
    for line in sorted(baseline):
        print("note (torch's own allocator too):", line)
    complaints = [line for line in strays(results["mrstack"], "mrstack") if line.split(": ", 1)[1] not in baseline]
    for line in complaints:
        print("FAIL:", line)
    step = {m: max(r["step_ms"] for r in ranks) for m, ranks in results.items()}
    def on_own_gpu(r):  # NVML's view when it sees this process (not across a PID namespace), else the allocator's
        seen = (r["memory_per_gpu"] or [])[r["local_rank"]:r["local_rank"] + 1]
        return seen[0] if seen and seen[0] > 0 else r["held_bytes"]
    peak = {m: max(on_own_gpu(r) for r in ranks) for m, ranks in results.items()}
    ratio = step["mrstack"] / step["torch"]
    print(f"step time: mrstack / torch = {ratio:.4f} (target <= 1.02: {'met' if ratio <= 1.02 else 'missed'})")
    print(f"peak memory per GPU: mrstack {peak['mrstack'] >> 20} MiB, torch {peak['torch'] >> 20} MiB "
          f"(target: no higher: {'met' if peak['mrstack'] <= peak['torch'] else 'missed'})")
    sys.exit(1 if complaints else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("torch", "mrstack"), default="mrstack")
    parser.add_argument("--compare", action="store_true", help="run both modes under torchrun and compare")
    parser.add_argument("--nproc", type=int, default=2, help="processes (GPUs) for --compare")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--spec", default=None, help="mrstack's spec (default: MRSTACK_RESOURCE or mrstack's default)")
    args = parser.parse_args()
    if args.compare:
        compare(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
