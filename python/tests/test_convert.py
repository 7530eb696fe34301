"""python -m mrstack.convert torch: snapshot dicts built here (no torch needed) become
mrstack allocation logs; bad input is a clear error and never a half-written file.

Run: PYTHONPATH=python python3 -m pytest python/tests/test_convert.py
"""

import gzip
import os
import pathlib
import pickle
import random
import re
import shutil
import subprocess
import sys

import pytest

from mrstack.convert import HEADER, ConversionError, convert_torch_snapshot, main

REPO = pathlib.Path(__file__).resolve().parents[2]


def entry(action, addr=None, size=0, stream=0, time_us=None, **extra):
    e = {"action": action, "size": size, "stream": stream, "frames": []}
    if addr is not None:
        e["addr"] = addr
    if time_us is not None:
        e["time_us"] = time_us
    e.update(extra)
    return e


def snapshot(*device_traces):
    return {"segments": [], "device_traces": [list(t) for t in device_traces], "allocator_settings": {}}


def test_actions_map_to_log_rows_and_caching_entries_are_left_out():
    trace = [
        entry("segment_alloc", addr=0x7F0000000000, size=2 << 20, time_us=1_000_000),
        entry("alloc", addr=0x7F0000000000, size=512, time_us=1_000_000),
        entry("alloc", addr=0x7F0000000200, size=1024, stream=0x55AA, time_us=1_000_250),
        entry("free_requested", addr=0x7F0000000000, size=512, time_us=1_000_300),
        entry("free_completed", addr=0x7F0000000000, size=512, time_us=1_000_301),
        entry("oom", size=1 << 40, device_free=123, time_us=3_723_000_007),
        entry("snapshot", time_us=3_723_000_008),
    ]
    out = convert_torch_snapshot(snapshot(trace))
    assert out.lines == [
        HEADER,
        "1,0.000000,allocate,0x7f0000000000,512,0",
        "1,0.000250,allocate,0x7f0000000200,1024,0x55aa",
        "1,0.000300,free,0x7f0000000000,512,0",
        "1,3722.000007,allocate failure,0,1099511627776,0",
    ]
    assert (out.allocations, out.frees, out.failures, out.ignored_entries, out.leaks) == (2, 1, 1, 3, 1)
    assert out.device == 0
    assert "3 events (2 allocate, 1 free) from device 0" in out.summary()
    assert "1 blocks still allocated" in out.summary()


def test_frees_of_blocks_allocated_before_recording_are_left_out_and_counted():
    trace = [
        entry("free_requested", addr=0x1000, size=512),  # allocated before the trace began
        entry("alloc", addr=0x2000, size=512),
        entry("free_requested", addr=0x2000, size=512),
        entry("free_requested", addr=0x2000, size=512),  # the same block again: not live any more
    ]
    out = convert_torch_snapshot(snapshot(trace))
    assert out.lines[1:] == ["1,0.000000,allocate,0x2000,512,0", "1,0.000000,free,0x2000,512,0"]
    assert out.unpaired_frees == 2
    assert "2 frees of blocks allocated before recording began left out" in out.summary()


def test_unknown_actions_are_counted_not_fatal():
    out = convert_torch_snapshot(snapshot([entry("alloc", addr=0x100, size=512), entry("defragment", addr=0x100)]))
    assert out.unknown_actions == {"defragment": 1}
    assert "1 entries with unknown action 'defragment' left out" in out.summary()


def test_device_choice():
    one = [entry("alloc", addr=0x100, size=512)]
    two = [entry("alloc", addr=0x200, size=1024), entry("free_requested", addr=0x200, size=1024)]
    assert convert_torch_snapshot(snapshot([], one)).device == 1
    assert convert_torch_snapshot(snapshot(one, two), device=1).lines[1] == "1,0.000000,allocate,0x200,1024,0"
    with pytest.raises(ConversionError, match=r"traces for several devices: 0 \(1 entries\), 1 \(2 entries\); "
                                              r"choose one with --device"):
        convert_torch_snapshot(snapshot(one, two))
    with pytest.raises(ConversionError, match=r"--device 5: the snapshot has traces for devices 0 to 1"):
        convert_torch_snapshot(snapshot(one, two), device=5)
    with pytest.raises(ConversionError, match=r"--device 0: its trace is empty; devices with entries: 1 \(1 entries\)"):
        convert_torch_snapshot(snapshot([], one), device=0)
    with pytest.raises(ConversionError, match=r"device_traces are empty: record them with "
                                              r"torch.cuda.memory._record_memory_history\(\)"):
        convert_torch_snapshot(snapshot([], []))


@pytest.mark.parametrize("snap, message", [
    ([1, 2], r"the snapshot is a list, expected the dict"),
    ({"segments": []}, r"has no 'device_traces': record them with"),
    ({"device_traces": [5]}, r"'device_traces' must be a list with one list of trace entries per device"),
    (snapshot(["alloc"]), r"device_traces\[0\]\[0\]: expected a dict with an 'action'"),
    (snapshot([{"action": "alloc", "size": 512}]), r"device_traces\[0\]\[0\]: the 'alloc' entry has no 'addr'"),
    (snapshot([{"action": "alloc", "addr": 256}]), r"the 'alloc' entry has no 'size'"),
    (snapshot([entry("alloc", addr=0x100, size="512")]), r"'size' of the 'alloc' entry is '512', expected an integer"),
    (snapshot([entry("alloc", addr=0x100, size=-1)]), r"'size' of the 'alloc' entry is -1, outside 0 to 2\^64 - 1"),
    # Wider than the log's 64-bit columns: the address had been written masked (two live
    # blocks at 0x1000), the size as one the log reader then refused.
    (snapshot([entry("alloc", addr=0x1000 + 2**64, size=512)]), r"'addr' of the 'alloc' entry is 18446744073709555712"),
    (snapshot([entry("alloc", addr=-4096, size=512)]), r"'addr' of the 'alloc' entry is -4096, outside"),
    (snapshot([entry("alloc", addr=0x100, size=2**70)]), r"'size' of the 'alloc' entry is 1180591620717411303424"),
    (snapshot([entry("alloc", addr=0x100, size=512, stream=-1)]), r"'stream' of the 'alloc' entry is -1, outside"),
    (snapshot([entry("alloc", addr=0, size=512)]), r"the 'alloc' entry has a null 'addr'"),
    (snapshot([entry("alloc", addr=0x100, size=512, time_us=1.5)]), r"'time_us' of the 'alloc' entry is 1.5"),
    (snapshot([entry("alloc", addr=0x100, size=512), entry("alloc", addr=0x100, size=512)]),
     r"device_traces\[0\]\[1\]: 'alloc' of 0x100, which entry 0 allocated and no entry freed since"),
    (snapshot([entry("alloc", addr=0x100, size=512), entry("free_requested", addr=0x100, size=1024)]),
     r"'free_requested' of 0x100 with size 1024, but entry 0 allocated it with 512"),
    # An action that is no string: unhashable, it ended the conversion with a TypeError;
    # beside a string one, the summary's sort of the unknown actions did.
    (snapshot([entry("alloc", addr=0x100, size=512), entry(["alloc"])]),
     r"device_traces\[0\]\[1\]: 'action' is \['alloc'\], expected a string"),
    (snapshot([entry("weird"), entry(None)]), r"device_traces\[0\]\[1\]: 'action' is None, expected a string"),
])
def test_bad_snapshots_are_clear_errors(snap, message):
    with pytest.raises(ConversionError, match=message):
        convert_torch_snapshot(snap)


def test_random_traces_match_a_simple_model():
    rng = random.Random(5)
    for _ in range(30):
        trace, expected, live = [], [HEADER], {}
        t = 10_000
        for i in range(rng.randrange(1, 300)):
            t += rng.randrange(0, 50)
            roll = rng.random()
            if roll < 0.1:  # a free of something allocated before the trace began
                trace.append(entry("free_requested", addr=0x9000_0000 + i * 512, size=512, time_us=t))
            elif roll < 0.2:
                trace.append(entry("segment_alloc", addr=0xA000_0000, size=2 << 20, time_us=t))
            elif not live or roll < 0.6:
                addr, size, stream = 0x7000_0000 + i * 4096, rng.randrange(1, 4096), rng.choice([0, 0x42])
                trace.append(entry("alloc", addr=addr, size=size, stream=stream, time_us=t))
                live[addr] = size
                expected.append(f"1,{t - 10_000},allocate,{addr:#x},{size},{stream and hex(stream) or 0}")
            else:
                addr = rng.choice(sorted(live))
                size = live.pop(addr)
                trace.append(entry("free_requested", addr=addr, size=size, time_us=t))
                expected.append(f"1,{t - 10_000},free,{addr:#x},{size},0")
        base = trace[0]["time_us"]  # times count from the trace's first entry
        expected = [HEADER] + [_shift(x, base - 10_000) for x in expected[1:]]
        out = convert_torch_snapshot(snapshot(trace))
        # The model writes times as plain microseconds, the converter as seconds with six
        # decimals; compare them as numbers.
        def normalized(line):
            if line == HEADER:
                return line
            cols = line.split(",")
            seconds, micro = cols[1].split(".")
            cols[1] = str(int(seconds) * 1_000_000 + int(micro))
            return ",".join(cols)
        assert [normalized(x) for x in out.lines] == expected
        assert out.leaks == len(live)


def _shift(line, by):
    cols = line.split(",")
    cols[1] = str(int(cols[1]) - by)
    return ",".join(cols)


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return str(path)


def test_command_line_writes_the_log(tmp_path, capsys):
    snap = write_pickle(tmp_path / "snap.pickle", snapshot([entry("alloc", addr=0x100, size=512, time_us=5),
                                                             entry("free_requested", addr=0x100, size=512, time_us=9)]))
    out = tmp_path / "log.csv"
    assert main(["torch", snap, "-o", str(out)]) == 0
    assert out.read_text() == f"{HEADER}\n1,0.000000,allocate,0x100,512,0\n1,0.000004,free,0x100,512,0\n"
    assert "wrote " + str(out) + ": 2 events (1 allocate, 1 free) from device 0" in capsys.readouterr().err
    packed = tmp_path / "log.csv.gz"
    assert main(["torch", snap, "-o", str(packed)]) == 0
    assert gzip.decompress(packed.read_bytes()).decode() == out.read_text()
    assert main(["torch", snap, "-o", "-"]) == 0
    assert capsys.readouterr().out == out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv", "log.csv.gz", "snap.pickle"]  # no temporaries


def test_command_line_errors_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "log.csv"
    cases = [
        (["torch", str(tmp_path / "missing.pickle"), "-o", str(out)], "missing.pickle: no such file"),
        (["torch", str(tmp_path), "-o", str(out)], "is a directory"),
    ]
    (tmp_path / "junk.pickle").write_bytes(b"not a pickle at all")
    cases.append((["torch", str(tmp_path / "junk.pickle"), "-o", str(out)], "not a readable pickle"))
    empty = write_pickle(tmp_path / "empty.pickle", snapshot([entry("segment_alloc", addr=0x100, size=1 << 21)]))
    cases.append((["torch", empty, "-o", str(out)], "device 0's trace has no alloc or free_requested entries"))
    bad = write_pickle(tmp_path / "bad.pickle", snapshot([entry("alloc", addr=0x100, size=512),
                                                           entry("alloc", addr=0x100, size=512)]))
    cases.append((["torch", bad, "-o", str(out)], "device_traces[0][1]: 'alloc' of 0x100"))
    good = write_pickle(tmp_path / "good.pickle", snapshot([entry("alloc", addr=0x100, size=512)]))
    cases.append((["torch", good, "-o", str(tmp_path / "no-such-dir" / "log.csv")], "cannot write"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("python -m mrstack.convert: error: "), err
        assert message in err, err
        assert not out.exists()
    with pytest.raises(SystemExit) as usage:
        main(["torch", good])  # no -o
    assert usage.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pickle", "empty.pickle", "good.pickle", "junk.pickle"]


@pytest.mark.parametrize("damage", [
    b"\x80\x04\x95" + (1 << 63).to_bytes(8, "little") + b".",   # a frame longer than any file: OverflowError
    b"\x80\x04\x8e" + (1 << 63).to_bytes(8, "little") + b".",   # bytes longer than memory can hold: OverflowError
    b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b".",   # a terabyte of bytes: MemoryError (or cut short)
])
def test_a_damaged_length_in_the_pickle_is_an_error_not_a_traceback(tmp_path, capsys, damage):
    path = tmp_path / "damaged.pickle"
    path.write_bytes(damage)
    assert main(["torch", str(path), "-o", str(tmp_path / "log.csv")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a readable pickle" in err, err
    assert not (tmp_path / "log.csv").exists()


def test_python_dash_m_runs_the_module(tmp_path):
    snap = write_pickle(tmp_path / "snap.pickle", snapshot([entry("alloc", addr=0x100, size=512)]))
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    done = subprocess.run(["python3", "-m", "mrstack.convert", "torch", snap, "-o", str(tmp_path / "log.csv")],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log.csv").read_text().startswith(HEADER + "\n1,0.000000,allocate,0x100,512,0")


def _replay_tool():
    found = os.environ.get("MRSTACK_REPLAY")
    if found:
        return found
    for preset in ("release", "ci", "debug"):
        candidate = REPO / "build" / preset / "tools" / "mrstack-replay"
        if candidate.exists():
            return str(candidate)
    return shutil.which("mrstack-replay")


def test_the_converted_log_replays(tmp_path):
    tool = _replay_tool()
    if tool is None:
        pytest.skip("mrstack-replay is not built (set MRSTACK_REPLAY or build the release preset)")
    rng = random.Random(3)
    trace, live = [], []
    for i in range(2000):
        if live and rng.random() < 0.5:
            addr, size = live.pop(rng.randrange(len(live)))
            trace.append(entry("free_requested", addr=addr, size=size, time_us=i))
        else:
            addr, size = 0x7F00_0000_0000 + i * 0x10_0000, rng.choice([512, 4096, 1 << 20])
            live.append((addr, size))
            trace.append(entry("alloc", addr=addr, size=size, stream=0x77, time_us=i))
    out = convert_torch_snapshot(snapshot(trace))
    log = tmp_path / "log.csv"
    log.write_text("\n".join(out.lines) + "\n")
    done = subprocess.run([tool, str(log), "--simulate", "-r", "cuda"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{out.events:,} events" in done.stdout


def test_an_error_inside_the_snapshot_names_the_file_holding_it(tmp_path, capsys):
    # The file was left out: "error: the snapshot is a list" said nothing of which file.
    listed = write_pickle(tmp_path / "listed.pickle", [1, 2])
    assert main(["torch", listed, "-o", str(tmp_path / "log.csv")]) == 2
    assert capsys.readouterr().err == f"python -m mrstack.convert: error: {listed}: the snapshot is a list, " \
                                      "expected the dict torch.cuda.memory._snapshot() returns\n"
    bad = write_pickle(tmp_path / "bad.pickle", snapshot([entry("alloc", addr=0x100, size=-5)]))
    assert main(["torch", bad, "-o", str(tmp_path / "log.csv")]) == 2
    assert f"error: {bad}: device_traces[0][0]: 'size' of the 'alloc' entry is -5" in capsys.readouterr().err
    assert not (tmp_path / "log.csv").exists()


@pytest.mark.parametrize("path", ["an open descriptor", None, 1.5, ["log.csv"]])
def test_a_path_that_is_not_a_file_name_is_refused_before_anything_is_opened(tmp_path, path):
    # An int was taken for a file descriptor: read_log_events(fd) read whatever the process
    # had open there, and closed it.
    from mrstack.convert import load_snapshot, read_log_events, write_log, write_snapshot
    with open(tmp_path / "held.csv", "w") as held:
        held.write(HEADER + "\n1,1.0,allocate,0x100,512,0\n")
        held.flush()
        if path == "an open descriptor":
            path = held.fileno()
        for call, name in ((lambda: read_log_events(path), "read_log_events: path"),
                           (lambda: load_snapshot(path), "load_snapshot: path"),
                           (lambda: write_log([HEADER], path), "write_log: path"),
                           (lambda: write_snapshot({}, path), "write_snapshot: path")):
            with pytest.raises(TypeError, match=f"^{name} must be a file name \\(str, bytes or os.PathLike\\), "
                                                f"not {type(path).__name__}"):
                call()
        os.fstat(held.fileno())  # still open


def test_a_snapshot_that_cannot_be_pickled_is_an_error_naming_the_file_and_nothing_is_written(tmp_path):
    # pickle's own TypeError came out, naming no file.
    import threading
    from mrstack.convert import write_snapshot
    old = tmp_path / "snap.pickle"
    old.write_bytes(b"the previous snapshot")
    for name in ("snap.pickle", "new.pickle"):
        path = str(tmp_path / name)
        with pytest.raises(ConversionError, match=f"^{re.escape(path)}: cannot write the snapshot: it cannot be "
                                                  r"pickled \(TypeError: cannot pickle '_thread.lock' object\)$"):
            write_snapshot({"segments": list(range(100_000)), "lock": threading.Lock()}, path)
    assert old.read_bytes() == b"the previous snapshot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap.pickle"]  # no new file, no temporary one


def test_a_snapshot_that_cannot_be_pickled_writes_nothing_to_standard_output():
    # Standard output (and a pipe or device) is written in place: it had taken the first
    # part of the pickle, a damaged snapshot for whatever read it.
    done = subprocess.run([sys.executable, "-c", """if True:
        import threading
        from mrstack.convert import ConversionError, write_snapshot
        try:
            write_snapshot({"segments": list(range(100_000)), "lock": threading.Lock()}, "-")
        except ConversionError as e:
            print("REFUSED", e, file=sys.stderr)
        """.replace("import threading", "import sys, threading")], capture_output=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")})
    assert done.stdout == b""
    assert done.stderr.decode().startswith("REFUSED standard output: cannot write the snapshot: it cannot be pickled"), \
        done.stderr.decode()[-2000:]


def test_write_log_takes_a_pathlib_path(tmp_path):
    # It called path.endswith: AttributeError for a pathlib.Path, which write_snapshot took.
    from mrstack.convert import write_log
    write_log([HEADER], tmp_path / "log.csv.gz")
    assert gzip.decompress((tmp_path / "log.csv.gz").read_bytes()).decode() == HEADER + "\n"


def test_numpy_integers_in_a_snapshot_convert_as_ints_do():
    # A snapshot built or edited with numpy holds numpy's integers: each entry was refused
    # ("'size' of the 'alloc' entry is np.int64(512), expected an integer").
    np = pytest.importorskip("numpy")
    trace = [entry("alloc", addr=0x7F0000000000, size=512, stream=0x55AA, time_us=1_000_000),
             entry("free_requested", addr=0x7F0000000000, size=512, time_us=1_000_250),
             entry("oom", size=1 << 40, time_us=1_000_300)]
    as_numpy = [{k: (np.uint64(v) if k == "addr" else np.int64(v)) if type(v) is int else v for k, v in e.items()}
                for e in trace]
    expected = convert_torch_snapshot(snapshot(trace)).lines
    assert expected[1] == "1,0.000000,allocate,0x7f0000000000,512,0x55aa"
    assert convert_torch_snapshot(snapshot(as_numpy), np.int64(0)).lines == expected
    # A bool stays refused, numpy's too.
    for flag in (True, np.bool_(True)):
        with pytest.raises(ConversionError, match=r"'size' of the 'alloc' entry is .*True.*, expected an integer"):
            convert_torch_snapshot(snapshot([entry("alloc", addr=0x100, size=flag)]))


@pytest.mark.parametrize("device", [True, "0", 1.5, None])
def test_a_device_that_is_not_an_int_is_refused_naming_the_argument(device):
    from mrstack.convert import log_to_memory_viz
    with pytest.raises(TypeError, match=f"^log_to_memory_viz: device must be an int device index, "
                                        f"not {type(device).__name__}"):
        log_to_memory_viz([], device)
    if device is not None:  # None is convert_torch_snapshot's "the only device with entries"
        with pytest.raises(TypeError, match=f"^convert_torch_snapshot: device must be an int device index, "
                                            f"not {type(device).__name__}"):
            convert_torch_snapshot(snapshot([entry("alloc", addr=0x100, size=512)]), device)


@pytest.mark.parametrize("count", [-3, 129, 10**6])
def test_a_device_count_outside_pytorchs_devices_is_refused(count):
    # -3 was ignored, and 10**6 built a million empty traces (10**9: a billion, until memory ran out).
    from mrstack.convert import log_to_memory_viz
    with pytest.raises(ValueError, match=f"^log_to_memory_viz: device_count {count} is outside 0 to 128"):
        log_to_memory_viz([], 0, device_count=count)
    assert len(log_to_memory_viz([], 0, device_count=128).snapshot["device_traces"]) == 128


@pytest.mark.parametrize("source", ["memory-viz", "torch"])
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, capsys, source):
    # The input was read whole and then replaced: a log became a pickle, a snapshot a log.
    if source == "torch":
        given = write_pickle(tmp_path / "snap.pickle", snapshot([entry("alloc", addr=0x100, size=512)]))
    else:
        given = str(tmp_path / "log.csv")
        pathlib.Path(given).write_text(f"{HEADER}\n1,1.0,allocate,0x100,512,0\n")
    before = pathlib.Path(given).read_bytes()
    (tmp_path / "sub").mkdir()
    spelled = str(tmp_path / "sub" / ".." / os.path.basename(given))  # another spelling of the same file
    assert main([source, given, "-o", spelled]) == 2
    assert capsys.readouterr().err == (f"python -m mrstack.convert: error: -o {spelled} is the input itself: give the "
                                       "output its own path\n")
    assert pathlib.Path(given).read_bytes() == before
