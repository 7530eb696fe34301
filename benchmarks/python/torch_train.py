#!/usr/bin/env python3
"""PyTorch workloads under PyTorch's allocator and under mrstack: step time and peak
device memory, each configuration in its own process, all in one run, one table.

    python3 benchmarks/python/torch_train.py                       # everything (~6 min on an H200)
    python3 benchmarks/python/torch_train.py --workloads resnet50,gpt2 --steps 10 --warmup 2
    python3 benchmarks/python/torch_train.py --configs torch,mrstack-vmm --json out.json

Workloads (random weights and data, nothing downloaded):
  resnet50      ResNet-50 training step (SGD, bf16 autocast), batch --resnet-batch (128)
  gpt2          GPT-2 small training step (AdamW, bf16 autocast), --gpt2-batch (8) x 1024 tokens
  generate      GPT-2 small greedy generation with a KV cache: --generate-tokens (64) new tokens
                for a batch of 4 prompts of 32 tokens; one step is one whole generation (many
                small allocations)
  two-streams   an inference server loop: ResNet-50 forward passes (bf16, batch 32) issued
                alternately on two CUDA streams, inputs made on each stream; one step is one
                batch on each stream
The models are torchvision's resnet50 and transformers' GPT2LMHeadModel(GPT2Config())
when those packages are installed, else equivalent definitions in this file (the table
says which).

Configurations:
  torch          PyTorch's caching allocator
  expandable     PyTorch's allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  mrstack-vmm    mrstack.torch.install() over the stack "pool > vmm"
  mrstack-cuda   mrstack.torch.install() over the stack "pool > cuda"
  NAME           (with --define NAME=SPEC) mrstack.torch.install() over that stack
  mrstack-vmm-one-lock  (only when named) "pool(thread_shards=0) > vmm": training allocates
                 from PyTorch's autograd thread too; this is the pool that never shards

Step time: the median of --steps timed steps after --warmup untimed ones (each step ends
with a device synchronize). With --rounds R every configuration runs R times, rounds
interleaved (each round runs every configuration once, so a host's drift hits all alike),
and the table shows the median of the R step times with their spread; the peak is the
largest of the R. The fastest single step of all rounds is printed too: on shared hosts a
whole process can run 30-85% slow whatever the allocator, and noise only adds time.

Peak device memory: the most device memory in use, from cudaMemGetInfo
(torch.cuda.mem_get_info), sampled every millisecond by a process of its own (a thread
would take the GIL from the measured loop every millisecond) and after every step, minus
what was in use once both CUDA contexts existed: the same measure for every allocator.
--cpus pins every configuration's process to the same CPUs and the sampler to the others
(without it the sampler may share a CPU with the measured process). mrstack finds
libmrstack_c.so as the package does (MRSTACK_LIBRARY, ...).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

WORKLOADS = ("resnet50", "gpt2", "generate", "two-streams")
CONFIGS = {
    "torch": {"env": {}, "spec": None},
    "expandable": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "spec": None},
    "mrstack-vmm": {"env": {}, "spec": "pool > vmm"},
    "mrstack-cuda": {"env": {}, "spec": "pool > cuda"},
    # Not run by default: the pool that never shards (PyTorch's autograd thread allocates
    # too), to compare with the default, which shards only when threads contend.
    "mrstack-vmm-one-lock": {"env": {}, "spec": "pool(thread_shards=0) > vmm"},
}
DEFAULT_CONFIGS = ("torch", "expandable", "mrstack-vmm", "mrstack-cuda")
BUILT_IN_CONFIGS = frozenset(CONFIGS)


# ---- models (used when torchvision / transformers are missing) ---------------------------

def _resnet50(torch):
    try:
        import torchvision
        return torchvision.models.resnet50(weights=None), "torchvision"
    except ImportError:
        pass
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride):
            super().__init__()
            width, out = planes, planes * 4
            self.body = nn.Sequential(
                nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
            self.skip = None
            if stride != 1 or inplanes != out:
                self.skip = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + (x if self.skip is None else self.skip(x)))

    layers, inplanes = [], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * 4
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                          nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    return model, "built-in"


def _gpt2(torch):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config()), "transformers"
    except ImportError:
        pass
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d=768, heads=12):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

        def forward(self, x, cache=None):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            if cache is not None:
                if cache:
                    k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
                cache[:] = [k, v]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or t > 1)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT2(nn.Module):
        def __init__(self, vocab=50257, positions=1024, d=768, layers=12):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, ids, caches=None, start=0):
            x = self.wte(ids) + self.wpe(torch.arange(start, start + ids.shape[1], device=ids.device))
            for i, block in enumerate(self.blocks):
                x = block(x, None if caches is None else caches[i])
            return self.ln(x) @ self.wte.weight.t()

    return GPT2(), "built-in"


# ---- workloads: each returns (step function, source of the model) -------------------------

def _resnet50_train(torch, args):
    model, source = _resnet50(torch)
    model = model.cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.resnet_batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.resnet_batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, source


def _gpt2_train(torch, args):
    model, source = _gpt2(torch)
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (args.gpt2_batch, 1024), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids)
            logits = out.logits if hasattr(out, "logits") else out
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                     ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, source


def _gpt2_generate(torch, args):
    model, source = _gpt2(torch)
    model = model.cuda().eval().to(torch.bfloat16)
    prompt = torch.randint(0, 50257, (4, 32), device="cuda")

    @torch.inference_mode()
    def step():
        if source == "transformers":
            model.generate(prompt, max_new_tokens=args.generate_tokens, min_new_tokens=args.generate_tokens,
                           do_sample=False, use_cache=True, pad_token_id=0)
            return
        caches = [[] for _ in model.blocks]
        logits = model(prompt, caches)
        token, position = logits[:, -1:].argmax(-1), prompt.shape[1]
        for _ in range(args.generate_tokens - 1):
            logits = model(token, caches, position)
            token, position = logits[:, -1:].argmax(-1), position + 1
    return step, source


def _two_streams(torch, args):
    model, source = _resnet50(torch)
    model = model.cuda().eval().to(torch.bfloat16).to(memory_format=torch.channels_last)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    @torch.inference_mode()
    def step():
        outputs = []
        for stream in streams:
            with torch.cuda.stream(stream):
                batch = torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
                outputs.append(model(batch.to(memory_format=torch.channels_last)).argmax(-1))
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
    return step, source


BUILDERS = {"resnet50": _resnet50_train, "gpt2": _gpt2_train, "generate": _gpt2_generate,
            "two-streams": _two_streams}


# ---- one configuration, in this process ----------------------------------------------------

def _sample_device_memory(conn, interval, cpus):
    """The sampler process: device memory in use (cudaMemGetInfo, device-wide) every
    `interval` seconds, from a CUDA context of its own. In the measured process a sampling
    thread would take the GIL from the step every millisecond; here it costs that process
    nothing. Answers "peak" (the most seen since the last "start") and "start"."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    import torch
    torch.cuda.init()

    def used():
        free, total = torch.cuda.mem_get_info()
        return total - free

    peak = used()
    conn.send(peak)
    while True:
        if not conn.poll(interval):
            peak = max(peak, used())
            continue
        request = conn.recv()
        if request == "stop":
            return
        peak = used() if request == "start" else max(peak, used())
        conn.send(peak)


class SamplerFailed(RuntimeError):
    """The memory sampler process could not start or stopped answering."""


class PeakSampler:
    """The most device memory in use (cudaMemGetInfo) while the steps run, sampled every
    `interval` seconds by another process and by the measured one after every step."""

    def __init__(self, torch, interval=0.001, cpus=None, timeout=120):
        import multiprocessing
        self.torch, self.peak, self._timeout = torch, 0, timeout
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_sample_device_memory, args=(theirs, interval, cpus), daemon=True)
        self._process.start()
        theirs.close()                             # its end only: a sampler that dies reads as EOF here
        self._answer()                             # its CUDA context exists: part of every baseline

    def _answer(self):
        try:
            if self._conn.poll(self._timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            pass
        self._process.join(timeout=1)
        raise SamplerFailed(f"the memory sampler process stopped (exit code {self._process.exitcode}); "
                            "its error is above" if self._process.exitcode not in (None, 0) else
                            f"the memory sampler process did not answer within {self._timeout} s")

    def in_use(self):
        free, total = self.torch.cuda.mem_get_info()
        return total - free

    def sample(self):
        self.peak = max(self.peak, self.in_use())

    def __enter__(self):
        self._conn.send("start")
        self.peak = max(self.peak, self._answer())
        return self

    def __exit__(self, *exc):
        self.sample()
        self._conn.send("peak")
        self.peak = max(self.peak, self._answer())
        self._conn.send("stop")
        self._process.join(timeout=30)


def parse_cpus(text):
    """'2-9,12' -> [2, 3, ..., 9, 12]; '' -> []. A malformed list raises ValueError."""
    cpus = []
    for part in text.split(",") if text else []:
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or a range like 2-9")
        if dash and int(last) < int(first):
            raise ValueError(f"{part!r} runs backwards")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def cpu_choice(text, allowed=None):
    """--cpus: the CPUs every configuration runs on, and those left to the sampler.
    Each must be one this process may run on, and at least one must be left."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    try:
        mine = set(parse_cpus(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not mine:
        return text
    if not mine <= allowed:
        raise argparse.ArgumentTypeError(f"CPUs {sorted(mine - allowed)} are not among those this process may "
                                         f"use ({format_cpus(allowed)})")
    if mine == allowed:
        raise argparse.ArgumentTypeError(f"{text!r} is every CPU this process may use: leave at least one for "
                                         f"the memory sampler")
    return text


def format_cpus(cpus):
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs, cpus = [], sorted(cpus)
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def run_child(args):
    config = CONFIGS[args.config]
    args.sampler_cpus = None
    if args.cpus:
        # Every configuration's threads on the same CPUs (a process placed on a busier or
        # slower core would otherwise be a different measurement); the sampler elsewhere.
        mine = set(parse_cpus(args.cpus))
        args.sampler_cpus = sorted(set(os.sched_getaffinity(0)) - mine)  # checked non-empty by cpu_choice
        os.sched_setaffinity(0, mine)
    if config["spec"] is not None:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import mrstack
        import mrstack.torch
        mrstack.configure(config["spec"])
        mrstack.torch.install()                    # before PyTorch touches CUDA
    import torch
    # cuDNN's autotuner (cudnn.benchmark=True) asks the allocator for cacheInfo, which
    # PyTorch's pluggable-allocator route does not provide (pytorch/pytorch#98481): every
    # configuration runs with PyTorch's default (False), so all are measured alike.
    torch.backends.cudnn.benchmark = False
    torch.cuda.init()
    torch.cuda.synchronize()
    sampler = PeakSampler(torch, cpus=args.sampler_cpus)
    baseline = sampler.in_use()                    # both contexts, before any allocation
    step, source = BUILDERS[args.workload](torch, args)
    times = []
    sync_counts = None
    with sampler:
        for i in range(args.warmup + args.steps):
            if i == args.warmup and config["spec"] is not None:
                sync_counts = mrstack.stream_sync_counts()
            torch.cuda.synchronize()
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - started)
            sampler.sample()
    result = {"workload": args.workload, "config": args.config, "model": source,
              "step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times),
              "peak_bytes": sampler.peak - baseline, "steps": args.steps, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(), "cpus": args.cpus or "any"}
    if config["spec"] is not None:
        import mrstack.torch
        stats = mrstack.torch.memory_stats()
        result["mrstack_peak_allocated"] = stats["allocated_bytes.all.peak"]
        result["mrstack_reserved"] = stats["reserved_bytes.all.current"]
        # What ordering memory between streams cost per timed step (CUDA event records and
        # stream waits, and the time inside them).
        after = mrstack.stream_sync_counts()
        for key in ("records", "waits", "seconds"):
            result[f"stream_sync_{key}_per_step"] = (after[key] - sync_counts[key]) / args.steps
    else:
        result["torch_peak_allocated"] = torch.cuda.max_memory_allocated()
        result["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
    print("RESULT " + json.dumps(result), flush=True)


# ---- the run: every configuration in its own process ------------------------------------------

def child_command(args, workload, config):
    return [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload, "--config", config,
            "--steps", str(args.steps), "--warmup", str(args.warmup if workload != "generate" else
                                                          min(args.warmup, 1)),
            "--resnet-batch", str(args.resnet_batch), "--gpt2-batch", str(args.gpt2_batch),
            "--generate-tokens", str(args.generate_tokens), "--cpus", args.cpus] + \
        [f"--define={d}" for d in args.define]


def run_one(args, workload, config):
    env = dict(os.environ, **CONFIGS[config]["env"])
    env.setdefault("PYTHONUNBUFFERED", "1")
    steps = args.generate_steps if workload == "generate" else args.steps
    command = child_command(args, workload, config)
    command[command.index("--steps") + 1] = str(steps)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "config": config, "error": f"timed out after {args.timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"workload": workload, "config": config, "error": f"exit {done.returncode}: {tail}"}


def combine_rounds(runs, workloads, configs):
    """One result per (workload, config): the median step time of its rounds, the largest peak."""
    combined = []
    for workload in workloads:
        for config in configs:
            mine = [r for r in runs if r["workload"] == workload and r["config"] == config]
            good = [r for r in mine if "error" not in r]
            if len(good) < len(mine) or not good:
                combined.append(next(r for r in mine if "error" in r))
                continue
            result = dict(good[0])
            result.pop("round", None)
            if len(good) > 1:
                result["step_ms_rounds"] = [r["step_ms"] for r in good]
                result["step_ms"] = statistics.median(result["step_ms_rounds"])
                result["step_ms_min"] = min(r["step_ms_min"] for r in good)
                result["peak_bytes"] = max(r["peak_bytes"] for r in good)
            combined.append(result)
    return combined


def format_table(results, workloads, configs):
    """The table: one row per workload, 'step ms / peak GiB' per configuration."""
    by_key = {(r["workload"], r["config"]): r for r in results}
    head = "| workload | " + " | ".join(configs) + " |"
    lines = [head, "|---" * (len(configs) + 1) + "|"]
    for workload in workloads:
        cells = []
        for config in configs:
            r = by_key.get((workload, config))
            if r is None:
                cells.append("–")
            elif "error" in r:
                cells.append("failed")
            else:
                cells.append(f"{r['step_ms']:.1f} / {r['peak_bytes'] / 2**30:.2f}")
        model = next((by_key[(workload, c)].get("model") for c in configs
                      if "model" in by_key.get((workload, c), {})), "")
        lines.append(f"| {workload}{f' ({model})' if model else ''} | " + " | ".join(cells) + " |")
    errors = [f"{r['workload']} / {r['config']}: {r['error']}" for r in results if "error" in r]
    return "\n".join(lines + ([""] + errors if errors else []))


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated, of {', '.join(CONFIGS)} (default: {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--generate-steps", type=int, default=5, help="timed generations (default 5)")
    parser.add_argument("--generate-tokens", type=int, default=64)
    parser.add_argument("--resnet-batch", type=int, default=128)
    parser.add_argument("--gpt2-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every configuration, interleaved; the table shows their median (default 1)")
    parser.add_argument("--cpus", default="", type=cpu_choice,
                        help="run every configuration's process on these CPUs only, e.g. 2-9 (default: "
                             "anywhere); the memory sampler then runs on the others")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per configuration (default 300)")
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--define", action="append", default=[], metavar="NAME=SPEC",
                        help="one more mrstack configuration, a stack spec under a name of its own "
                             "(repeatable; then name it in --configs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    args.define_names = set()
    for definition in args.define:
        name, equals, spec = definition.partition("=")
        if not equals or not name or not spec.strip():
            parser.error(f"--define {definition!r}: expected NAME=SPEC, e.g. park64='pool(park_divisor=64) > vmm'")
        if name in BUILT_IN_CONFIGS or name in args.define_names or "," in name:
            parser.error(f"--define {definition!r}: {name!r} is a built-in configuration, defined twice or holds "
                         f"a comma; pick another name")
        args.define_names.add(name)
        CONFIGS[name] = {"env": {}, "spec": spec}
    if args.child:
        return run_child(args)
    workloads = [w for w in args.workloads.split(",") if w]
    configs = [c for c in args.configs.split(",") if c]
    unknown = [w for w in workloads if w not in WORKLOADS] + [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown workloads or configs: {', '.join(unknown)}")
    runs = []
    started = time.perf_counter()
    for round_index in range(max(args.rounds, 1)):
        for workload in workloads:
            for config in configs:
                result = run_one(args, workload, config)
                result["round"] = round_index + 1
                runs.append(result)
                shown = result.get("error") or f"{result['step_ms']:.1f} ms/step, peak {result['peak_bytes'] / 2**30:.2f} GiB"
                if "stream_sync_records_per_step" in result:
                    shown += (f", {result['stream_sync_records_per_step']:.0f} records + "
                              f"{result['stream_sync_waits_per_step']:.0f} waits a step "
                              f"({1e6 * result['stream_sync_seconds_per_step']:.0f} us)")
                print(f"{workload:12s} {config:13s} {shown}" + (f"  (round {round_index + 1})" if args.rounds > 1 else ""),
                      flush=True)
    results = combine_rounds(runs, workloads, configs)
    device = next((r["device"] for r in results if "device" in r), "unknown device")
    version = next((r["torch"] for r in results if "torch" in r), "?")
    print(f"\nstep ms (median) / peak device GiB (cudaMemGetInfo) on {device}, PyTorch {version}, "
          f"{args.steps} steps after {args.warmup} warm-up ({time.perf_counter() - started:.0f} s in all)\n")
    print(format_table(results, workloads, configs))
    if args.rounds > 1:
        print("\nstep ms per round (min-max): " + "; ".join(
            f"{r['workload']}/{r['config']} {min(r['step_ms_rounds']):.1f}-{max(r['step_ms_rounds']):.1f}"
            for r in results if "step_ms_rounds" in r))
    # Noise only ever adds time: on shared hosts a whole process can run 30-85% slow, so
    # the fastest step is the steadiest measure of what the allocator itself costs.
    fastest = [f"{r['workload']}/{r['config']} {r['step_ms_min']:.2f}" for r in results if "step_ms_min" in r]
    if fastest:
        print("\nfastest step of all rounds (ms): " + "; ".join(fastest))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"combined": results, "runs": runs} if args.rounds > 1 else results, f, indent=1)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
