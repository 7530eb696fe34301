"""The measuring parts of benchmarks/python/torch_train.py, on the CPU: CPU lists, how
rounds combine, the child's command line, and the peak sampler process.

The sampler tests run a fresh interpreter whose `torch` is a stand-in device: the bytes in
use are a file's number plus 50 for every process that called `torch.cuda.init()` (its
"context"), so the measured process and the sampler process see one device. (A real torch
another test imported is never replaced.)"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "python"))
import torch_train  # noqa: E402


def test_cpu_lists():
    assert torch_train.parse_cpus("2-5,9") == [2, 3, 4, 5, 9]
    assert torch_train.parse_cpus("7") == [7]
    assert torch_train.parse_cpus("") == []
    for bad in ("x", "2-", "-3", "5-2", ",", "1,,2"):
        with pytest.raises(ValueError):
            torch_train.parse_cpus(bad)
    assert torch_train.format_cpus([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_cpu_choice_refuses_what_cannot_run():
    import argparse
    allowed = {0, 1, 2, 3}
    assert torch_train.cpu_choice("1-2", allowed) == "1-2"
    assert torch_train.cpu_choice("", allowed) == ""
    with pytest.raises(argparse.ArgumentTypeError, match=r"\[7\] are not among .*0-3"):
        torch_train.cpu_choice("3,7", allowed)
    with pytest.raises(argparse.ArgumentTypeError, match="leave at least one"):
        torch_train.cpu_choice("0-3", allowed)
    with pytest.raises(argparse.ArgumentTypeError, match="not a CPU number"):
        torch_train.cpu_choice("x", allowed)


@pytest.mark.parametrize("cpus", ["", "0"])
def test_the_child_gets_every_measuring_option(cpus):
    parser = torch_train.make_parser()
    args = parser.parse_args(["--cpus", cpus, "--steps", "7", "--warmup", "2"] if len(os.sched_getaffinity(0)) > 1
                             else ["--steps", "7", "--warmup", "2"])
    args.define = []
    command = torch_train.child_command(args, "resnet50", "torch")
    child = parser.parse_args(command[2:])
    assert child.child and child.workload == "resnet50" and child.config == "torch"
    assert (child.cpus, child.steps, child.warmup) == (args.cpus, 7, 2)


def test_rounds_combine_to_median_fastest_step_and_largest_peak():
    runs = [{"workload": "w", "config": "c", "step_ms": ms, "step_ms_min": fastest, "peak_bytes": peak, "round": i}
            for i, (ms, fastest, peak) in enumerate([(10.0, 9.0, 5), (30.0, 8.5, 7), (12.0, 11.0, 6)])]
    (result,) = torch_train.combine_rounds(runs, ["w"], ["c"])
    assert result["step_ms"] == 12.0 and result["step_ms_min"] == 8.5 and result["peak_bytes"] == 7
    assert result["step_ms_rounds"] == [10.0, 30.0, 12.0] and "round" not in result


def test_a_failed_round_fails_the_configuration():
    runs = [{"workload": "w", "config": "c", "step_ms": 1.0, "step_ms_min": 1.0, "peak_bytes": 1},
            {"workload": "w", "config": "c", "error": "exit 1: boom"}]
    (result,) = torch_train.combine_rounds(runs, ["w"], ["c"])
    assert result["error"] == "exit 1: boom"


FAKE_TORCH = """
import os
__version__ = "fake"

def _write(path, text):      # whole or not at all: the other process polls the file
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)

class backends:
    class cudnn:
        benchmark = True

class cuda:
    @staticmethod
    def init():
        if os.environ.get("FAKE_INIT_FAILS") and os.getpid() != int(os.environ["FAKE_MEASURED_PID"]):
            raise RuntimeError("no second context on this device")
        _write(os.path.join(DEVICE, f"context-{os.getpid()}"), repr(sorted(os.sched_getaffinity(0))))

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def mem_get_info():
        contexts = [n for n in os.listdir(DEVICE) if n.startswith("context-") and not n.endswith(".tmp")]
        return 10000 - int(open(os.path.join(DEVICE, "used")).read()) - 50 * len(contexts), 10000

    @staticmethod
    def get_device_name():
        return "fake device"

    @staticmethod
    def max_memory_allocated():
        return 0

    max_memory_reserved = max_memory_allocated
"""


def run_with_fake_device(tmp_path, body, env=None):
    device = tmp_path / "device"
    device.mkdir()
    (device / "used").write_text("100")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(f"DEVICE = {str(device)!r}\n" + FAKE_TORCH)
    script = tmp_path / "measure.py"
    script.write_text(textwrap.dedent(f"""
        import os, time, torch, torch_train
        def set_used(n):
            torch._write(os.path.join(torch.DEVICE, "used"), str(n))
        if __name__ == "__main__":
            os.environ["FAKE_MEASURED_PID"] = str(os.getpid())
    """) + textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(REPO, "benchmarks", "python")]))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60), device


def test_the_sampler_process_sees_a_peak_between_steps(tmp_path):
    done, _ = run_with_fake_device(tmp_path, """
        torch.cuda.init()
        sampler = torch_train.PeakSampler(torch, interval=0.001)
        print(sampler.in_use())    # 100 + both contexts
        with sampler:
            set_used(700)          # a spike the measured process never samples itself
            time.sleep(0.2)
            set_used(300)
        print(sampler.peak, sampler._process.is_alive())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "800", "False"]


def test_the_sampler_counts_from_start_not_from_before(tmp_path):
    done, _ = run_with_fake_device(tmp_path, """
        sampler = torch_train.PeakSampler(torch, interval=0.001)
        set_used(900)              # before the steps: not part of the peak
        time.sleep(0.1)
        set_used(200)
        with sampler:
            time.sleep(0.05)
        print(sampler.peak)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["250"]


def test_a_sampler_that_cannot_start_fails_at_once_and_says_so(tmp_path):
    done, _ = run_with_fake_device(tmp_path, """
        started = time.monotonic()
        try:
            torch_train.PeakSampler(torch, interval=0.001, timeout=30)
        except torch_train.SamplerFailed as e:
            print(f"after {time.monotonic() - started:.0f} s:", e)
    """, env={"FAKE_INIT_FAILS": "1"})
    assert done.returncode == 0, done.stderr
    seconds, _, message = done.stdout.partition(" s: ")
    assert int(seconds.split()[-1]) < 10, "it waited for the timeout instead of seeing the sampler die"
    assert message.startswith("the memory sampler process stopped")
    assert "no second context on this device" in done.stderr   # the sampler's own error


def test_a_measured_step_counts_from_both_contexts_on_the_chosen_cpus(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one for the measured process, one for the sampler")
    done, device = run_with_fake_device(tmp_path, f"""
        def workload(torch, args):
            def step():
                set_used(400)      # the step's own peak: 300 above what was in use before
                time.sleep(0.02)
                set_used(100)
            return step, "fake"
        torch_train.BUILDERS["fake"] = workload
        args = torch_train.make_parser().parse_args(
            ["--child", "--workload", "fake", "--config", "torch", "--steps", "3", "--warmup", "1",
             "--cpus", "{cpus[0]}"])
        torch_train.run_child(args)
    """)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["peak_bytes"] == 300 and result["cpus"] == str(cpus[0])
    placed = sorted(eval(p.read_text()) for p in device.glob("context-*") if not p.name.endswith(".tmp"))
    assert placed == sorted([[cpus[0]], cpus[1:]])  # the measured process, and the sampler on the others
