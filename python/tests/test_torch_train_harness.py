"""The measuring parts of benchmarks/python/torch_train.py, on the CPU: CPU lists, how
rounds combine, and the peak sampler process."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "python"))
import torch_train  # noqa: E402


def test_cpu_lists():
    assert torch_train.parse_cpus("2-5,9") == [2, 3, 4, 5, 9]
    assert torch_train.parse_cpus("7") == [7]
    assert torch_train.parse_cpus("") == []


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


# The sampler runs in a fresh interpreter whose `torch` is a stand-in: `used` is the
# device's memory in use, read from a file, so the measured process and the sampler
# process see one device. (A real torch another test imported is never replaced.)
FAKE_TORCH = """
class cuda:
    @staticmethod
    def init():
        pass

    @staticmethod
    def mem_get_info():
        return 1000 - int(open(USED).read()), 1000
"""


def run_with_fake_device(tmp_path, body):
    (tmp_path / "torch").mkdir()
    used = tmp_path / "used"
    used.write_text("100")
    (tmp_path / "torch" / "__init__.py").write_text(f"USED = {str(used)!r}\n" + FAKE_TORCH)
    script = tmp_path / "measure.py"
    script.write_text(textwrap.dedent(f"""
        import time, torch, torch_train
        USED = {str(used)!r}
        def set_used(n):
            open(USED, "w").write(str(n))
        if __name__ == "__main__":
    """) + textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(REPO, "benchmarks", "python")]))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_sampler_process_sees_a_peak_between_steps(tmp_path):
    out = run_with_fake_device(tmp_path, """
        sampler = torch_train.PeakSampler(torch, interval=0.001)
        print(sampler.in_use())
        with sampler:
            set_used(700)          # a spike the measured process never samples itself
            time.sleep(0.2)
            set_used(300)
        print(sampler.peak, sampler._process.is_alive())
    """)
    assert out == ["100", "700", "False"]


def test_the_sampler_counts_from_start_not_from_before(tmp_path):
    out = run_with_fake_device(tmp_path, """
        sampler = torch_train.PeakSampler(torch, interval=0.001)
        set_used(900)              # before the steps: not part of the peak
        time.sleep(0.1)
        set_used(200)
        with sampler:
            time.sleep(0.05)
        print(sampler.peak)
    """)
    assert out == ["200"]
