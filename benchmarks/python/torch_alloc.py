#!/usr/bin/env python3
"""What `torch.empty` + free of one tensor costs under PyTorch's allocator and under mrstack,
seen from Python (the entry points, PyTorch's pluggable-allocator glue and the stack
together); each configuration in its own process, since PyTorch's allocator is chosen once.

    python3 benchmarks/python/torch_alloc.py                      # torch and "pool > vmm"
    python3 benchmarks/python/torch_alloc.py --specs "pool > cuda" "pool > vmm"

Prints, per configuration and size, the median and the fastest of --rounds rounds of
--pairs pairs each, in ns per pair. mrstack finds libmrstack_c.so as the package does."""
import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = (256, 1 << 20)


def child(spec, pairs, rounds):
    if spec:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import mrstack
        import mrstack.torch
        mrstack.configure(spec)
        mrstack.torch.install()
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")

    def one_round(n, size):
        started = time.perf_counter()
        for _ in range(n):
            torch.empty(size, device="cuda", dtype=torch.uint8)
        return (time.perf_counter() - started) / n * 1e9

    for size in SIZES:
        one_round(pairs // 10, size)  # warm-up
        times = [one_round(pairs, size) for _ in range(rounds)]
        print(f"{spec or 'torch'} | {size} | {statistics.median(times):.0f} | {min(times):.0f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="*", default=["pool > vmm"], help="mrstack stacks to compare with torch")
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.pairs, args.rounds)
    print("| configuration | bytes | ns per pair, median | fastest |\n|---|---|---|---|", flush=True)
    status = 0
    for spec in [""] + args.specs:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec, "--pairs", str(args.pairs),
                               "--rounds", str(args.rounds)], capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if " | " in line]
        for line in lines:
            print(f"| {line} |")
        if done.returncode != 0 or not lines:
            status = 1
            print(f"{spec or 'torch'}: failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return status


if __name__ == "__main__":
    sys.exit(main())
