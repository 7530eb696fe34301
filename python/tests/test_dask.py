"""mrstack.dask on a CPU: a LocalCluster of two worker processes over `simulated` stacks.
The plugin configures each worker, tasks allocate through mrstack, the client collects one
statistics row per worker, and each worker's allocation log replays with mrstack-replay."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

import mrstack.dask  # noqa: E402  (after the skip: needs distributed)
from mrstack.dask import MrstackPlugin, expand_placeholders  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = str(REPO / "python")
MIB = 1 << 20
SPEC = "pool(initial=4MiB) > simulated(capacity=1GiB)"


def _replay_tool():
    found = os.environ.get("MRSTACK_REPLAY")
    if found:
        return found
    for preset in ("release", "ci", "debug"):
        candidate = REPO / "build" / preset / "tools" / "mrstack-replay"
        if candidate.exists():
            return str(candidate)
    return shutil.which("mrstack-replay")


def test_placeholders_name_the_worker_process_and_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    text = expand_placeholders("/logs/{worker}-{pid}-gpu{device}.csv", "tcp://10.0.0.1:4000", device=0, pid=42)
    assert text == "/logs/tcp___10.0.0.1_4000-42-gpu3.csv"
    assert expand_placeholders("{device}", "w", device=1) == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert expand_placeholders("{device}/{pid}", 0, device=2) == f"2/{os.getpid()}"


def test_unknown_hooks_are_refused_on_the_client():
    with pytest.raises(ValueError, match="jax"):
        MrstackPlugin(SPEC, hooks=("cupy", "jax"))


@pytest.mark.parametrize("hooks", [3, b"cupy", {"cupy": 1}, ["cupy", 1], ("numba", None)])
def test_hooks_of_a_wrong_type_are_refused_on_the_client_naming_the_argument(hooks):
    # 3 gave "'int' object is not iterable", and ["cupy", 1] a ValueError calling 1 a hook.
    with pytest.raises(TypeError, match=r'mrstack\.dask: hooks must be a hook name \("cupy", "numba" or "torch"\), '
                                        r"a list, tuple or set of them, or None for none"):
        MrstackPlugin(SPEC, hooks=hooks)


@pytest.mark.parametrize("hooks, kept", [(None, ()), ((), ()), ([], ()), ("cupy", ("cupy",)),
                                         (["numba", "torch"], ("numba", "torch")), ({"cupy"}, ("cupy",))])
def test_hooks_may_be_none_one_name_or_a_collection_of_names(hooks, kept):
    assert MrstackPlugin(SPEC, hooks=hooks).hooks == kept


@pytest.mark.parametrize("log_file", [b"/tmp/a.csv", 3, "", ["a.csv"]])
def test_a_log_file_that_is_not_a_file_name_is_refused_on_the_client(log_file):
    # str() made b"/tmp/a.csv" a file named "b'/tmp/a.csv'", 3 a file named "3", and "" the
    # worker's directory.
    with pytest.raises(TypeError, match=r"^mrstack\.dask: log_file must be a file name \(a non-empty str or "
                                        f"os.PathLike\\) or None, not {type(log_file).__name__}"):
        MrstackPlugin(SPEC, log_file=log_file)


def test_a_log_file_may_be_a_pathlib_path(tmp_path):
    assert MrstackPlugin(SPEC, log_file=tmp_path / "a.csv").log_file == str(tmp_path / "a.csv")


@pytest.mark.parametrize("build", ["no", None, 2])
def test_a_build_that_is_not_a_bool_is_refused_on_the_client(build):
    # Its truth was taken: build="no" built the stack.
    with pytest.raises(TypeError, match=f"^mrstack\\.dask: build must be True or False, not {type(build).__name__}"):
        MrstackPlugin(SPEC, build=build)


@pytest.mark.parametrize("device", [-1, 64])
def test_a_device_out_of_range_is_refused_on_the_client(device):
    with pytest.raises(ValueError, match=f"^mrstack\\.dask: device is {device}, outside \\[0, 63\\]"):
        MrstackPlugin(SPEC, device=device)


@pytest.mark.parametrize("device", [1.9, True, False, "1", None])
def test_a_device_that_is_not_an_int_is_refused_on_the_client(device):
    # A bool is an int to Python but no ordinal: device=True had been device 1.
    with pytest.raises(TypeError, match=f"^mrstack\\.dask: device must be an int, not {type(device).__name__} "
                                        f"\\({re.escape(repr(device))}\\)"):
        MrstackPlugin(SPEC, device=device)


@pytest.mark.parametrize("spec", [b"pool > cuda", 123, ["pool > cuda"]])
def test_a_spec_that_is_not_a_str_is_refused_on_the_client(spec):
    with pytest.raises(TypeError, match=f"spec must be a str or None, not {type(spec).__name__}"):
        MrstackPlugin(spec)


def test_a_device_ordinal_is_kept():
    assert MrstackPlugin(SPEC, device=3).device == 3


def test_a_log_file_name_with_a_backslash_or_quote_reaches_the_spec_as_it_is(tmp_path):
    # Only '"' was escaped: a backslash in the name started an escape in the spec's quotes.
    import mrstack
    path = tmp_path / 'a\\b"c.csv'
    plugin = MrstackPlugin(SPEC, log_file=str(path))
    stack = mrstack.Stack(plugin._spec_for("w"))
    stack.deallocate(stack.allocate(MIB), MIB)
    stack.close()
    assert path.exists() and path.read_text().startswith("Thread,Time,Action")


def test_a_plugin_set_up_twice_in_one_worker_logs_each_event_once(run_python, tmp_path):
    # Registered a second time (client.register_plugin again), the plugin is set up again in
    # the same worker process; without a spec of its own it builds on the configured spec,
    # which then already carries its logging layer: a second one logged every event twice,
    # and once the stack was built the longer spec was refused.
    done = run_python(f"""
        import mrstack, mrstack.dask

        class Worker:
            name = "w1"

        mrstack.configure({SPEC!r})
        for build in (False, True, True):
            mrstack.dask.MrstackPlugin(log_file={str(tmp_path / "log-{worker}.csv")!r}, build=build).setup(Worker())
            print(mrstack.configured_spec())
        print(mrstack.device_stack(0).describe())
    """)
    specs = done.stdout.splitlines()
    assert specs[0].count("logging(") == 1 and specs[0].endswith(SPEC), specs[0]
    assert specs[1:3] == [specs[0]] * 2, specs
    assert specs[3] == "logging > pool > simulated", specs[3]


# Runs on a worker: allocates `count` blocks of `mib` MiB from the worker's device stack,
# frees all but one, and keeps that one (the statistics must show it live).
_kept = []


def _allocate_on_worker(mib, count):
    import mrstack
    stack = mrstack.device_stack(0)
    blocks = [stack.allocate(mib * MIB) for _ in range(count)]
    for ptr in blocks[1:]:
        stack.deallocate(ptr, mib * MIB)
    _kept.append(blocks[0])
    return stack.describe()


@pytest.fixture
def cluster_env(monkeypatch, library_path):
    # Worker processes start fresh: they find the package and the library by environment.
    monkeypatch.setenv("PYTHONPATH", PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("MRSTACK_LIBRARY", os.path.abspath(library_path))
    monkeypatch.delenv("MRSTACK_RESOURCE", raising=False)


def test_plugin_configures_workers_collects_statistics_and_logs_replay(tmp_path, cluster_env):
    from distributed import Client, LocalCluster

    log_pattern = str(tmp_path / "alloc-{worker}-{pid}.csv")
    plugin = MrstackPlugin(SPEC, log_file=log_pattern)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(plugin)
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2
        # Worker i allocates 3 blocks of (i + 1) MiB and keeps one.
        described = [client.submit(_allocate_on_worker, i + 1, 3, workers=[w], pure=False).result()
                     for i, w in enumerate(workers)]
        assert described == ["logging > pool > simulated"] * 2
        rows = mrstack.dask.statistics(client)
        assert len(rows) == 2
        by_address = {r.address: r for r in rows}
        for i, w in enumerate(workers):
            row = by_address[w]
            assert row.stack == "logging > pool > simulated", row
            assert row.live_bytes == (i + 1) * MIB, row
            assert row.peak_bytes == 3 * (i + 1) * MIB, row
            assert row.free_bytes_held >= 2 * (i + 1) * MIB, row
            assert row.setup_seconds >= 0, row
            assert row.pid != os.getpid()
        table = str(rows)
        assert len(table.splitlines()) == 3 and all(str(r.worker) in table for r in rows), table
        logs = mrstack.dask.log_files(client)
    assert len(set(logs.values())) == 2, logs
    for worker, log in logs.items():
        assert Path(log).parent == tmp_path and f"alloc-{worker}-" in Path(log).name, log
        rows_in_log = Path(log).read_text().splitlines()
        assert len(rows_in_log) == 1 + 3 + 2, rows_in_log  # header, 3 allocations, 2 frees
    tool = _replay_tool()
    if tool is None:
        pytest.skip("mrstack-replay is not built (set MRSTACK_REPLAY or build a preset's tools)")
    for log in logs.values():
        done = subprocess.run([tool, log], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_spec_from_the_workers_environment(tmp_path, cluster_env, monkeypatch):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("MRSTACK_RESOURCE", "binning > simulated")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(MrstackPlugin())
        (row,) = mrstack.dask.statistics(client)
        assert row.stack == "binning > simulated", row  # built at set-up, from the environment
        assert row.live_bytes == 0 and row.log_file == ""
