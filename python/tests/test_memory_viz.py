"""python -m mrstack.convert memory-viz: an allocation log written as the snapshot dict
torch.cuda.memory._snapshot() returns. Checked against the layout PyTorch's viewer and
torch.cuda._memory_viz read (and, where torch is installed, with those functions)."""
import gzip
import os
import pickle
import re
import random
import subprocess
import sys

import pytest

from log_fixtures import binary_log
from mrstack.convert import ConversionError, convert_torch_snapshot, log_to_memory_viz, read_log_events

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_LOG = os.path.join(REPO, "data", "torch_resnet50_train.csv.gz")


def write_log(path, rows):
    text = "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
        f"1,0:00:{i // 1000:02d}.{i % 1000:06d},{action},{hex(ptr) if ptr else 0},{size},{stream}\n"
        for i, (action, ptr, size, stream) in enumerate(rows))
    path.write_text(text)
    return str(path)


def check_layout(snapshot, device=0):
    """What the viewer and _memory_viz rely on, the same invariants segsum asserts."""
    assert set(snapshot) >= {"segments", "device_traces"}
    for seg in snapshot["segments"]:
        for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                    "segment_type", "blocks", "frames"):
            assert key in seg, key
        cursor, allocated = seg["address"], 0
        for block in seg["blocks"]:
            assert block["address"] == cursor                  # blocks tile the segment, in order
            assert block["state"] in ("active_allocated", "inactive")
            assert block["size"] > 0 and block["frames"] == []
            if block["state"] == "active_allocated":
                assert block["requested_size"] == block["size"]
                allocated += block["size"]
            cursor += block["size"]
        assert cursor == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == seg["active_size"] == allocated
    for d, trace in enumerate(snapshot["device_traces"]):
        assert d == device or trace == []
        for e in trace:
            assert e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc", "oom")
            assert isinstance(e["addr"], int) and isinstance(e["size"], int) and isinstance(e["stream"], int)
            assert isinstance(e["time_us"], int) and e["frames"] == []
            if e["action"] == "oom":
                assert "device_free" in e


def test_actions_segments_and_end_state(tmp_path):
    path = write_log(tmp_path / "log.csv", [
        ("allocate", 0x10000, 500, 0), ("allocate", 0x10200, 1024, 0),   # one segment (512-byte rounding)
        ("allocate", 0x90000, 4096, 7),                                  # another
        ("free", 0x10000, 500, 0), ("allocate failure", 0, 1 << 30, 0), ("free", 0x55, 8, 0)])
    conversion = log_to_memory_viz(read_log_events(path), device=1)
    snap = conversion.snapshot
    check_layout(snap, device=1)
    actions = [e["action"] for e in snap["device_traces"][1]]
    assert actions == ["segment_alloc", "alloc", "alloc", "segment_alloc", "alloc", "free_requested",
                       "free_completed", "oom"]
    first = snap["device_traces"][1][0]
    assert (first["addr"], first["size"]) == (0x10000, 1536)
    assert [s["address"] for s in snap["segments"]] == [0x10000, 0x90000]
    assert snap["segments"][1]["stream"] == 7
    assert [(b["state"], b["size"]) for b in snap["segments"][0]["blocks"]] == [("inactive", 512),
                                                                                 ("active_allocated", 1024)]
    assert (conversion.allocations, conversion.frees, conversion.failures, conversion.unpaired_frees) == (3, 1, 1, 1)


def test_round_trip_through_the_torch_converter_gives_the_same_log():
    """A random log -> snapshot -> mrstack's own snapshot reader: the same rows."""
    rng = random.Random(5)
    live, rows, nxt = {}, [], 0x1000
    for _ in range(2000):
        if live and rng.random() < 0.45:
            ptr = rng.choice(list(live))
            rows.append(("free", ptr, live.pop(ptr), 0))
        else:
            size = rng.choice([512, 1024, 8192, 1 << 20])
            live[nxt] = size
            rows.append(("allocate", nxt, size, 0))
            nxt += size + rng.choice([0, 0, 512, 4096])
    events = [(i + 2, "allocate" if a == "allocate" else "free", p, s, st, i) for i, (a, p, s, st) in enumerate(rows)]
    snap = log_to_memory_viz(events).snapshot
    check_layout(snap)
    back = convert_torch_snapshot(snap)
    expected = [f"{a},{p:#x},{s}" for a, p, s, _ in rows]
    assert [",".join(line.split(",")[2:5]) for line in back.lines[1:]] == expected
    assert back.leaks == len(live)
    assert sum(s["allocated_size"] for s in snap["segments"]) == sum(live.values())


def test_sample_log_command_line(tmp_path):
    out = tmp_path / "snap.pickle"
    done = subprocess.run([sys.executable, "-m", "mrstack.convert", "memory-viz", SAMPLE_LOG, "-o", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")})
    assert done.returncode == 0, done.stderr
    assert "inferred segments" in done.stderr
    with open(out, "rb") as f:
        snap = pickle.load(f)
    check_layout(snap)
    with gzip.open(SAMPLE_LOG, "rt") as f:
        allocations = sum(1 for line in f if ",allocate," in line)
    assert sum(e["action"] == "alloc" for e in snap["device_traces"][0]) == allocations


def test_dash_writes_the_snapshot_to_standard_output(tmp_path):
    # As the torch conversion's "-o -"; it had written a file named "-" in the folder.
    done = subprocess.run([sys.executable, "-m", "mrstack.convert", "memory-viz", SAMPLE_LOG, "-o", "-"],
                          capture_output=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "-").exists()
    check_layout(pickle.loads(done.stdout))


def test_bad_logs_are_errors_naming_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0:00:00.0,allocate,0x10,64,0\n1,0:00:00.1,grow,0x10,64,0\n")
    with pytest.raises(ConversionError, match=r"bad.csv:3: unknown action 'grow'"):
        read_log_events(str(bad))
    done = subprocess.run([sys.executable, "-m", "mrstack.convert", "memory-viz", str(tmp_path / "none.csv"), "-o",
                           str(tmp_path / "s.pickle")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")})
    assert done.returncode == 2 and "no such file" in done.stderr
    assert not (tmp_path / "s.pickle").exists()


def test_a_per_thread_log_is_read_in_stamp_order(tmp_path):
    """The logging adaptor's per-thread order: each thread's rows in file order, merged by
    the Stamp column (a free before another thread's allocation at an equal stamp)."""
    log = tmp_path / "per_thread.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream,Stamp\n"
                   "2,1:00:00.000002,allocate,0x1000,16,0,900\n"
                   "1,1:00:00.000001,allocate,0x1000,16,0,500\n"
                   "1,1:00:00.000001,free,0x1000,16,0,500\n"
                   "1,1:00:00.000001,free,0x2000,32,0,900\n"
                   "3,1:00:00.000000,allocate,0x2000,32,0,100\n")
    events = read_log_events(str(log))
    assert [line for line, *_ in events] == [6, 3, 4, 5, 2]
    conversion = log_to_memory_viz(events, device=0)
    actions = [e["action"] for e in conversion.snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    assert actions.count("alloc") == 3
    bad = tmp_path / "bad_stamp.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream,Stamp\n1,1:00:00.0,allocate,0x10,64,0,x\n")
    with pytest.raises(ConversionError, match=r"bad_stamp.csv:2: bad Stamp 'x'"):
        read_log_events(str(bad))


def _binary_log(blocks, start_wall_ns=1_700_000_000_123_456_000, clock=0):
    return binary_log(blocks, start_wall_ns, clock)


def test_binary_log_reads_as_its_csv(tmp_path):
    """A binary log, plain or gzipped, gives the events of the same rows written as CSV;
    a damaged one is an error naming the byte offset."""
    blocks = [[(3, 0, 81234, 0, 0), (0, 1000, 0x1000, 256, 0x5500), (1, 1500, 0, 1 << 40, 0x5500),
               (3, 0, 81240, 0, 0), (0, 1700, 0x2000, 64, 0)],
              [(3, 0, 81234, 0, 0), (2, 2000, 0x1000, 256, 0x5500), (3, 0, 81240, 0, 0), (0, 2100, 0x1000, 128, 0)]]
    csv_log = tmp_path / "same.csv"
    csv_log.write_text("Thread,Time,Action,Pointer,Size,Stream,Stamp\n"
                       "81234,0:00:00.000001,allocate,0x1000,256,0x5500,1000\n"
                       "81234,0:00:00.000001,allocate failure,(nil),1099511627776,0x5500,1500\n"
                       "81240,0:00:00.000001,allocate,0x2000,64,0,1700\n"
                       "81234,0:00:00.000002,free,0x1000,256,0x5500,2000\n"
                       "81240,0:00:00.000002,allocate,0x1000,128,0,2100\n")
    binary = tmp_path / "log.bin"
    binary.write_bytes(_binary_log(blocks))
    packed = tmp_path / "log.bin.gz"
    packed.write_bytes(gzip.compress(_binary_log(blocks)))
    expected = [event[:5] for event in read_log_events(str(csv_log))]
    assert [event[:5] for event in read_log_events(str(binary))] == expected
    assert [event[:5] for event in read_log_events(str(packed))] == expected
    cut = tmp_path / "cut.bin"
    cut.write_bytes(_binary_log(blocks)[:-1])
    with pytest.raises(ConversionError, match=r"cut.bin: binary log, byte offset 200: a damaged or cut-short block"):
        read_log_events(str(cut))


def test_binary_log_tick_stamps(tmp_path):
    """Clock 1: tick stamps become nanoseconds through the points thread records carry (as
    the C++ reader converts them: tests/adaptor_logging_binary.cpp)."""
    blocks = [[(3, 0, 7, 3000, 1000), (0, 1500, 0x1000, 16, 0), (2, 3000, 0x1000, 16, 0)],
              [(3, 0, 7, 6000, 3000), (0, 4500, 0x2000, 16, 0), (2, 9000, 0x2000, 16, 0)],
              [(3, 0, 7, 7000, 2500)]]
    log = tmp_path / "ticks.bin"
    log.write_bytes(_binary_log(blocks, start_wall_ns=0, clock=1))
    times = [event[5] for event in read_log_events(str(log))]
    # 500, 1000, 2000 and 4500 ns after the start, as whole microseconds of the Time column
    # (unconverted ticks would read 1, 3, 4 and 9).
    assert [t - times[0] for t in times] == [0, 1, 2, 4]


def test_torch_memory_viz_reads_it(tmp_path):
    """PyTorch's own functions on the export (pure Python: no GPU needed)."""
    memory_viz = pytest.importorskip("torch.cuda._memory_viz", reason="torch is not installed")
    snap = log_to_memory_viz(read_log_events(SAMPLE_LOG)).snapshot
    summary = memory_viz.segsum(snap)          # asserts the segment invariants itself
    assert "total_reserved" in summary
    assert "TOTAL MEM" in memory_viz.trace(snap)
    for html in (memory_viz.trace_plot(snap), memory_viz.segment_plot(snap)):
        assert "snapshot.pickle" in html


def test_binary_log_thread_record_with_data_is_refused_as_the_cpp_reader_does(tmp_path):
    """A thread record (kind 3) carries only the thread id: a stamp, size or stream in it is
    a damaged log, refused by mrstack's C++ reader; the Python reader must not read it."""
    for stamp, size, stream in ((7, 0, 0), (0, 16, 0), (0, 0, 0x55)):
        damaged = tmp_path / f"thread_data_{stamp}_{size}_{stream}.bin"
        damaged.write_bytes(_binary_log([[(3, stamp, 81234, size, stream), (0, 1000, 0x1000, 256, 0)]]))
        with pytest.raises(ConversionError, match=r"byte offset 40: a thread record with a stamp, size or stream"):
            read_log_events(str(damaged))


def test_damaged_gzip_data_is_a_conversion_error(tmp_path):
    """A .gz log whose deflate data is damaged (zlib's error, not an OSError) is refused
    with a ConversionError naming the file, like a bad CRC or a cut-short stream."""
    import zlib
    body = zlib.compressobj(6, zlib.DEFLATED, 31)
    packed = bytearray(body.compress(b"Thread,Time,Action,Pointer,Size,Stream\n" +
                                     b"1,0:00:00,allocate,0x1000,16,0\n" * 20) + body.flush())
    packed[10] = 0xFF  # the first deflate block's header: an invalid block type
    damaged = tmp_path / "damaged.csv.gz"
    damaged.write_bytes(bytes(packed))
    with pytest.raises(ConversionError, match=r"damaged.csv.gz: cannot read it"):
        read_log_events(str(damaged))


def test_a_device_no_snapshot_can_hold_is_an_error_not_a_traceback(tmp_path):
    # --device -1 raised IndexError out of main(); --device 10**10 built ten billion empty
    # traces (a hang, then MemoryError). PyTorch's device index is an int8: 0 to 127.
    path = write_log(tmp_path / "log.csv", [("allocate", 0x10000, 512, 0), ("free", 0x10000, 512, 0)])
    events = read_log_events(path)
    for device in (-1, 128, 10**10):
        with pytest.raises(ConversionError, match=rf"device {device}: PyTorch's device indices are 0 to 127"):
            log_to_memory_viz(events, device)
    from mrstack.convert import main
    out = tmp_path / "s.pickle"
    assert main(["memory-viz", path, "-o", str(out), "--device", "-1"]) == 2
    assert not out.exists()
    assert main(["memory-viz", path, "-o", str(out), "--device", "127"]) == 0
    with open(out, "rb") as f:
        assert len(pickle.load(f)["device_traces"]) == 128


def test_a_negative_size_is_an_error_naming_the_line(tmp_path):
    # It was read as a number and the allocation silently left out of the snapshot;
    # mrstack-replay refuses the same log ("bad Size").
    bad = tmp_path / "neg.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0:00:00.0,allocate,0x10,64,0\n"
                   "1,0:00:00.1,allocate,0x3000,-512,0\n")
    with pytest.raises(ConversionError, match=r"neg.csv:3: bad Size '-512': expected a number of bytes"):
        read_log_events(str(bad))


def test_gzip_is_recognised_by_content_as_the_cpp_reader_does(tmp_path):
    """mrstack-replay decides plain or gzip by the first bytes; the converter went by the
    name, so a gzip log named .csv failed to decode and a plain one named .gz was 'not a
    gzipped file'. Both read the same events as the plain .csv now."""
    text = b"Thread,Time,Action,Pointer,Size,Stream\n1,0:00:00,allocate,0x1000,16,0\n1,0:00:01,free,0x1000,16,0\n"
    plain = tmp_path / "plain.csv"
    plain.write_bytes(text)
    packed_as_csv = tmp_path / "packed.csv"
    packed_as_csv.write_bytes(gzip.compress(text))
    plain_as_gz = tmp_path / "plain.csv.gz"
    plain_as_gz.write_bytes(text)
    two_streams = tmp_path / "two.csv.gz"
    two_streams.write_bytes(gzip.compress(text[:50]) + gzip.compress(text[50:]))
    expected = read_log_events(str(plain))
    assert len(expected) == 2
    for path in (packed_as_csv, plain_as_gz, two_streams):
        assert read_log_events(str(path)) == expected, path
    cut = tmp_path / "cut.csv"
    cut.write_bytes(gzip.compress(text)[:-9])
    with pytest.raises(ConversionError, match=r"cut.csv: cannot read it"):
        read_log_events(str(cut))


def test_rows_are_read_and_checked_as_the_cpp_reader_reads_them(tmp_path):
    """The converter must read a log as mrstack-replay does (tests/allocation_log.cpp): it
    refused logs the C++ reader takes (header names in another case, extra header columns
    that rows leave out) and silently took rows that reader refuses (a size of -10 or 1_0,
    an upper-case action, a quoted field, a NUL byte), turning them into wrong events."""
    def log(name, text):
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        return str(path)

    header = "Thread,Time,Action,Pointer,Size,Stream\n"
    same = read_log_events(log("plain.csv", header + "7,12.5,allocate,0xA0,256,0\n7,13,free,a0,256,0\n"))
    assert [e[:5] for e in same] == [(2, "allocate", 0xA0, 256, 0), (3, "free", 0xA0, 256, 0)]
    for name, text in [
            ("case.csv", "thread,TIME,action,pointer,size,stream\n7,12.5,allocate,0XA0,256,(nil)\n7,13,free,a0,256,0\n"),
            ("extra.csv", "Thread,Time,Action,Pointer,Size,Stream,Extra,More\n7,12.5,allocate,0xA0,256,0,x\n"
                          "7,13,free,0xa0,256,0\n"),
            ("spaces.csv", header + " 7 ,\t12.5, allocate ,0xA0, 256 ,0\r\n\r\n7,13,free,a0,256,0\n"),
            ("nulls.csv", header + "7,12.5,allocate,0xA0,256,0\n7,1,free,0x0,0,0\n7,13,free,a0,256,0\n")]:
        assert [e[1:5] for e in read_log_events(log(name, text))] == [e[1:5] for e in same], name
    # A byte order mark before a per-thread log's header: the Stamp column still orders it.
    bom = log("bom.csv", b"\xef\xbb\xbfThread,Time,Action,Pointer,Size,Stream,Stamp\n"
                         b"2,0,free,0x1000,16,0,20\n1,0,allocate,0x1000,16,0,10\n")
    assert [(line, kind) for line, kind, *_ in read_log_events(bom)] == [(3, "allocate"), (2, "free")]
    row = "1,0:00:00,{action},{pointer},{size},{stream}\n"
    fields = {"action": "allocate", "pointer": "0x1000", "size": "64", "stream": "0"}
    for name, (key, value), message in [
            ("negative", ("size", "-10"), r"bad Size '-10'"),
            ("plus", ("size", "+10"), r"bad Size '\+10'"),
            ("underscore", ("size", "1_0"), r"bad Size '1_0'"),
            ("inner_space", ("size", "1 0"), r"bad Size '1 0'"),
            ("huge", ("size", str(1 << 64)), r"bad Size"),
            ("empty_pointer", ("pointer", ""), r"bad Pointer ''"),
            ("nil_pointer", ("pointer", "nil"), r"bad Pointer 'nil'"),
            ("long_pointer", ("pointer", "0x" + "1" * 17), r"bad Pointer"),
            ("null_pointer", ("pointer", "0"), r"an allocate row of 64 bytes has a null Pointer"),
            ("empty_stream", ("stream", ""), r"bad Stream ''"),
            ("upper_action", ("action", "ALLOCATE"), r"unknown action 'ALLOCATE'"),
            ("quoted", ("action", '"allocate"'), r"unknown action '\"allocate\"'")]:
        with pytest.raises(ConversionError, match=rf"{name}.csv:2: {message}"):
            read_log_events(log(f"{name}.csv", header + row.format(**{**fields, key: value})))
    for name, text, message in [
            ("time", header + "1,25:99:99,allocate,0x1000,64,0\n", r"time.csv:2: bad Time '25:99:99'"),
            ("thread", header + ",0,allocate,0x1000,64,0\n", r"thread.csv:2: the Thread column is empty"),
            ("columns", header + "1,0,allocate,0x1000,64\n", r"columns.csv:2: 5 fields, expected 6"),
            ("order", "Time,Thread,Action,Pointer,Size,Stream\n0,1,allocate,0x1000,64,0\n",
             r"order.csv:1: header column 1 is 'Time', expected 'Thread'"),
            ("stamp", "Thread,Time,Action,Pointer,Size,Stream,Stamp\n1,0,allocate,0x1000,64,0,+5\n",
             r"stamp.csv:2: bad Stamp '\+5'"),
            ("nul", header + "1\0,0,allocate,0x1000,64,0\n", r"nul.csv:2: a NUL byte at byte offset 40")]:
        with pytest.raises(ConversionError, match=message):
            read_log_events(log(f"{name}.csv", text))


def test_a_second_allocation_of_a_live_pointer_is_an_error(tmp_path):
    """mrstack-replay refuses a log that allocates a live pointer again (a free is missing);
    the converter wrote a snapshot with two 'alloc' entries at one address, one free, and
    the first block lost from the segments, with no word of it."""
    log = tmp_path / "twice.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1000,16,0\n"
                   "1,0,allocate,0x1000,16,0\n1,0,free,0x1000,16,0\n")
    with pytest.raises(ConversionError, match=r"twice.csv:3: allocate of 0x1000, which is still live: line 2"):
        read_log_events(str(log))
    # In per-thread order the check follows the merged order: here the free comes first.
    merged = tmp_path / "merged.csv"
    merged.write_text("Thread,Time,Action,Pointer,Size,Stream,Stamp\n1,0,allocate,0x1000,16,0,10\n"
                      "2,0,allocate,0x1000,16,0,30\n1,0,free,0x1000,16,0,20\n")
    assert [line for line, *_ in read_log_events(str(merged))] == [2, 4, 3]


def test_an_allocation_overlapping_a_live_block_is_refused_naming_both_lines(tmp_path):
    """mrstack's reader keeps pointers, not ranges, so it takes a log whose live blocks
    overlap; the snapshot cannot hold them (its segments are tiled by their blocks): it
    had a block on top of another and an inactive gap inside a live block."""
    path = write_log(tmp_path / "overlap.csv", [
        ("allocate", 0x10000, 1000, 0), ("allocate", 0x10010, 16, 0),   # inside the live block of line 2
        ("free", 0x10010, 16, 0), ("free", 0x10000, 1000, 0)])
    with pytest.raises(ConversionError, match=r"overlap.csv:3: allocate of 0x10010 \(16 bytes\) overlaps the block "
                                              r"of 1000 bytes at 0x10000 that line 2 allocated"):
        log_to_memory_viz(read_log_events(path), source=path)
    below = write_log(tmp_path / "below.csv", [("allocate", 0x10010, 16, 0), ("allocate", 0x10000, 17, 0)])
    with pytest.raises(ConversionError, match=r"below.csv:3: allocate of 0x10000 \(17 bytes\) overlaps the block "
                                              r"of 16 bytes at 0x10010 that line 2"):
        log_to_memory_viz(read_log_events(below), source=below)
    # Touching blocks, a block where a freed one was, a 0-byte allocation inside a live
    # block: no overlap, and the segment is tiled.
    fine = write_log(tmp_path / "fine.csv", [
        ("allocate", 0x10000, 16, 0), ("allocate", 0x10010, 16, 0), ("free", 0x10000, 16, 0),
        ("allocate", 0x10008, 8, 0), ("allocate", 0x10014, 0, 0), ("allocate", 0x10020, 4, 0)])
    snap = log_to_memory_viz(read_log_events(fine), source=fine).snapshot
    check_layout(snap)
    assert [(b["address"], b["size"], b["state"]) for b in snap["segments"][0]["blocks"]] == [
        (0x10000, 8, "inactive"), (0x10008, 8, "active_allocated"), (0x10010, 16, "active_allocated"),
        (0x10020, 4, "active_allocated")]


def test_the_command_line_names_the_log_in_an_overlap(tmp_path):
    path = write_log(tmp_path / "overlap.csv", [("allocate", 0x10000, 1000, 0), ("allocate", 0x10010, 16, 0)])
    done = subprocess.run([sys.executable, "-m", "mrstack.convert", "memory-viz", path, "-o", str(tmp_path / "s.pickle")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")})
    assert done.returncode == 2 and f"{path}:3: allocate of 0x10010" in done.stderr, done.stderr
    assert not (tmp_path / "s.pickle").exists()


def test_a_free_of_the_wrong_size_or_a_second_free_is_refused_as_the_cpp_reader_does(tmp_path):
    """Both were taken silently (the size of the allocation used, the second free counted
    as one without an allocation); mrstack-replay refuses either log naming the lines."""
    head = "Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1000,256,0\n"
    for name, rest, message in (
            ("size", "1,0,free,0x1000,512,0\n", "size.csv:3: free of 0x1000 with Size 512, but line 2 allocated it "
                                                "with 256 bytes"),
            ("twice", "1,0,free,0x1000,256,0\n1,0,free,0x1000,256,0\n",
             "twice.csv:4: free of 0x1000, which is not live: line 2 allocated it and line 3 already freed it")):
        log = tmp_path / f"{name}.csv"
        log.write_text(head + rest)
        with pytest.raises(ConversionError, match=re.escape(message)):
            read_log_events(str(log))
    # Allocated again after its free, the pointer may be freed again; a free of a pointer the
    # log never allocated (allocated before recording began) is left out, counted.
    fine = tmp_path / "fine.csv"
    fine.write_text(head + "1,0,free,0x1000,256,0\n1,0,allocate,0x1000,64,0\n1,0,free,0x1000,64,0\n"
                    "1,0,free,0x9000,8,0\n")
    assert len(read_log_events(str(fine))) == 5
    assert "1 frees without an allocation in the log left out" in log_to_memory_viz(read_log_events(str(fine))).summary()


def test_a_second_free_of_a_block_allocated_before_the_log_is_refused(tmp_path):
    """A free of a pointer the log never allocated is left out and counted; a second one
    of the same pointer, with no allocation between, was counted as well, silently: a
    double free of the block, or a log that repeats rows."""
    log = tmp_path / "twice.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0,free,0x9000,8,0\n1,0,allocate,0x1000,8,0\n"
                   "1,0,free,0x9000,8,0\n")
    with pytest.raises(ConversionError, match=re.escape(
            "twice.csv:4: free of 0x9000, which is not live: no line allocated it (a block allocated before the log "
            "began) and line 2 already freed it")):
        read_log_events(str(log))
    # Allocated again in the log after that free, it may be freed again.
    again = tmp_path / "again.csv"
    again.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0,free,0x9000,8,0\n1,0,allocate,0x9000,8,0\n"
                     "1,0,free,0x9000,8,0\n")
    assert [e[1] for e in read_log_events(str(again))] == ["free", "allocate", "free"]


def test_a_thread_id_must_be_printable_utf8_as_the_cpp_reader_wants(tmp_path):
    """mrstack-replay refuses a Thread with a control character or bytes that are not
    UTF-8 (it writes thread ids back into JSON); the converter refuses the same logs,
    naming the line (only the Thread column must be UTF-8)."""
    for name, thread, why in (("control.csv", b"w\x01", r"control.csv:2: bad Thread: byte 0x01 is not printable"),
                              ("latin1.csv", b"\xff\xfe", r"latin1.csv:2: bad Thread: byte 0xff is not printable")):
        bad = tmp_path / name
        bad.write_bytes(b"Thread,Time,Action,Pointer,Size,Stream\n" + thread + b",0:00:00.0,allocate,0x10,64,0\n")
        with pytest.raises(ConversionError, match=why):
            read_log_events(str(bad))
    good = tmp_path / "utf8.csv"
    good.write_bytes("Thread,Time,Action,Pointer,Size,Stream\nwörker-1,0:00:00.0,allocate,0x10,64,0\n"
                     "wörker-1,0:00:00.1,free,0x10,64,0\n".encode())
    assert [e[1] for e in read_log_events(str(good))] == ["allocate", "free"]



@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_umask_mode_and_a_fifo_is_written_in_place(tmp_path, umask):
    """The log, the snapshot and the report were written 0600 (mkstemp's mode: a report
    no one else could open), and a FIFO, /dev/null or /dev/stdout given as -o was replaced
    by a regular file (renamed over; as root, /dev/null itself), where mrstack-replay
    writes such a file in place."""
    import threading
    from mrstack.convert import write_log, write_snapshot
    from mrstack.report import write_report
    from timeline_fixtures import make_timeline
    pytest.importorskip("matplotlib", reason="the report draws with matplotlib")
    old = os.umask(umask)
    try:
        write_log(["Thread,Time,Action,Pointer,Size,Stream"], str(tmp_path / "log.csv.gz"))
        write_snapshot({"segments": []}, str(tmp_path / "snap.pickle"))
        write_report(make_timeline(events=20, points=5), str(tmp_path / "report.html"))
    finally:
        os.umask(old)
    for name in ("log.csv.gz", "snap.pickle", "report.html"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o666 & ~umask, name
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    write_snapshot({"segments": [1]}, str(fifo))
    reader.join(timeout=30)
    assert pickle.loads(got[0]) == {"segments": [1]}
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "log.csv.gz", "report.html", "snap.pickle"]


def _convert_in_two_gib(tmp_path, log):
    """python -m mrstack.convert memory-viz `log`, its address space held to 2 GiB (as on a
    small machine) and its run to 60 s."""
    limit = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
             "sys.argv = ['mrstack.convert'] + sys.argv[1:]; runpy.run_module('mrstack.convert', run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", limit, "memory-viz", str(log), "-o", str(tmp_path / "snap.pickle")],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_of_endless_binary_data_is_refused_at_its_first_nul(tmp_path):
    # A pipe or device was read 4 GiB at once: /dev/zero held the memory (or ended in a
    # MemoryError traceback) before the NUL at byte 0 was found.
    done = _convert_in_two_gib(tmp_path, "/dev/zero")
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("python -m mrstack.convert: error: /dev/zero:1: a NUL byte at byte offset 0 of the text: "
                           "the log holds binary data, expected CSV text (or gzip-compressed CSV)\n")
    assert not (tmp_path / "snap.pickle").exists()


def test_a_file_past_the_limit_is_refused_by_its_size_unread(tmp_path):
    # It was read, 4 GiB of it, only to be refused (a sparse file: no disk is used).
    from mrstack.log_events import MAX_TEXT_BYTES
    log = tmp_path / "huge.csv"
    with open(log, "wb") as f:
        f.truncate(MAX_TEXT_BYTES + 8192)
    done = _convert_in_two_gib(tmp_path, log)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"python -m mrstack.convert: error: {log}: the log's text is larger than {MAX_TEXT_BYTES} "
                           "bytes, the reader's limit\n")


def test_a_log_that_does_not_fit_in_memory_is_an_error_naming_it(monkeypatch, tmp_path):
    from mrstack import _log_scan

    def no_memory(path):
        raise MemoryError
    monkeypatch.setattr(_log_scan, "read_events", no_memory)
    with pytest.raises(ConversionError, match=r"^big\.csv: the log does not fit in this process's memory"):
        read_log_events("big.csv")
