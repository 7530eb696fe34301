"""tools/compare-benchmarks.py: times compared in ns whatever unit each build reports, and
a binary that cannot run, fails or prints no JSON named with a clear error (exit 1), not
a traceback. The "binaries" are small Python scripts printing Google Benchmark JSON."""
import json
import os
import stat
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "compare-benchmarks.py")


def fake_binary(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport json, sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def printing(tmp_path, name, benchmarks):
    runs = [dict({"run_type": "iteration"}, **b) for b in benchmarks]
    return fake_binary(tmp_path, name, f"print(json.dumps({{'benchmarks': json.loads({json.dumps(runs)!r})}}))")


def compare(old, new, *extra):
    return subprocess.run([sys.executable, TOOL, old, new, "--rounds", "2", *extra], capture_output=True, text=True)


def test_times_in_different_units_compare_in_ns(tmp_path):
    # 2 us then 1000 ns: the new build is twice as fast. Compared as raw numbers it read
    # 500 times slower.
    old = printing(tmp_path, "old", [{"name": "BM_x", "real_time": 2.0, "time_unit": "us"}])
    new = printing(tmp_path, "new", [{"name": "BM_x", "real_time": 1000.0, "time_unit": "ns"}])
    done = compare(old, new)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("BM_x"))
    assert row.split()[1:] == ["2000", "1000", "0.500", "0.500"]


def test_a_binary_that_fails_is_named_with_its_status(tmp_path):
    old = printing(tmp_path, "old", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"}])
    new = fake_binary(tmp_path, "new", "print('CUDA error: no device', file=sys.stderr); sys.exit(3)")
    done = compare(old, new)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"new build: {new} exited with status 3: CUDA error: no device" in done.stderr


def test_a_binary_that_prints_no_json_or_does_not_exist(tmp_path):
    old = printing(tmp_path, "old", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"}])
    garbled = fake_binary(tmp_path, "garbled", "print('not json')")
    done = compare(old, garbled)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "printed no Google Benchmark JSON" in done.stderr
    missing = str(tmp_path / "no_such_binary")
    done = compare(missing, old)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"old build: {missing}: cannot run it" in done.stderr


def test_an_error_in_one_build_is_named_and_fails_the_comparison(tmp_path):
    old = printing(tmp_path, "old", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"},
                                     {"name": "BM_y", "real_time": 1.0, "time_unit": "ns"}])
    new = printing(tmp_path, "new", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"},
                                     {"name": "BM_y", "error_occurred": True, "error_message": "no CUDA device"}])
    done = compare(old, new)
    assert done.returncode == 1
    assert "NOT COMPARED BM_y: no CUDA device" in done.stdout


def test_a_zero_time_is_named_not_divided_by(tmp_path):
    # A real_time of 0 ended the tool with ZeroDivisionError (and log(0) in the mean).
    old = printing(tmp_path, "old", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"},
                                     {"name": "BM_z", "real_time": 0.0, "time_unit": "ns"}])
    new = printing(tmp_path, "new", [{"name": "BM_x", "real_time": 1.0, "time_unit": "ns"},
                                     {"name": "BM_z", "real_time": 2.0, "time_unit": "ns"}])
    done = compare(old, new)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "NOT COMPARED BM_z: real_time 0.0 is not a positive time" in done.stdout
