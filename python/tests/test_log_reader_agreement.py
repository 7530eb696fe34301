"""The Python log reader (mrstack.log_events) against mrstack's C++ reader, the reference:
the same events, or an error naming the same line, for the same bytes. Each test holds one
disagreement a review found (and reproduced) to the C++ reader's rule; where
mrstack-replay is built, its own reading of the same logs is compared as well."""
import gzip
import os
import pickle
import re
import subprocess
import time
import zlib

import pytest

from mrstack import log_events
from log_fixtures import binary_log
from mrstack.convert import ConversionError, convert_torch_snapshot, log_to_memory_viz, main, read_log_events
from mrstack.log_events import _binary_log_rows

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
STAMPED = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n"
STAMP_MAX = (1 << 62) - 1


def _replay():
    """The built mrstack-replay, or None (the comparisons with it are then skipped)."""
    for preset in ("release", "debug"):
        path = os.path.join(REPO, "build", preset, "tools", "mrstack-replay")
        if os.access(path, os.X_OK):
            return path
    return None


def cpp_reading(path, tmp_path):
    """What mrstack-replay --write-csv makes of the log: ("events", count, its CSV text) or
    ("error", the line it names or None, the message)."""
    binary = _replay()
    if binary is None:
        pytest.skip("mrstack-replay is not built (cmake --build --preset release --target mrstack-replay)")
    out = tmp_path / "cpp_out.csv"
    done = subprocess.run([binary, str(path), "--write-csv", str(out)], capture_output=True, text=True,
                          errors="replace", timeout=120)
    if done.returncode == 0:
        # "(1 event, ...)", "(9,094 events, ...)": the count as the tool words it.
        count = int(re.search(r"\(([\d,]+) events?\b", done.stdout + done.stderr).group(1).replace(",", ""))
        return "events", count, out.read_text(errors="surrogateescape")
    assert done.returncode == 2, done.stderr
    line = re.match(rf"mrstack-replay: {re.escape(str(path))}:(\d+)", done.stderr)
    return "error", int(line.group(1)) if line else None, done.stderr


def python_reading(path):
    """The same, from read_log_events (its events without the failures, as the C++ count)."""
    try:
        events = read_log_events(str(path))
    except ConversionError as e:
        line = re.match(rf"{re.escape(str(path))}:(\d+)", str(e))
        return "error", int(line.group(1)) if line else None, str(e)
    return "events", sum(1 for e in events if e[1] != "failure"), events


def assert_same_reading(path, tmp_path):
    cpp, python = cpp_reading(path, tmp_path), python_reading(path)
    assert cpp[:2] == python[:2], f"{path}:\n C++: {cpp}\n Python: {python}"


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# ---- 1. tick-clock stamps and the Time column of a binary log ---------------------------

def test_a_damaged_tick_point_is_clamped_not_an_overflow_traceback(tmp_path):
    """A point (1 tick, 2^64 - 1 ns) made the stamp 2^62 - 1 some 2^126 ns, and
    time.localtime raised OverflowError out of the reader (and of memory-viz). The C++
    reader clamps a converted stamp to 2^62 - 1, the largest a record holds."""
    log = write(tmp_path, "hugerate.bin", binary_log([[(3, 0, 7, 1, (1 << 64) - 1), (0, STAMP_MAX, 0x1000, 100, 0)]],
                                                     clock=1))
    rows = _binary_log_rows(str(log), log.read_bytes())
    assert rows[1][-1] == str(STAMP_MAX)
    assert [e[:4] for e in read_log_events(str(log))] == [(2, "allocate", 0x1000, 100)]
    assert main(["memory-viz", str(log), "-o", str(tmp_path / "s.pickle")]) == 0


def test_tick_stamps_follow_the_exact_integer_rule():
    """ns = a.ns + (t - a.ticks) * (b.ns - a.ns) // (b.ticks - a.ticks) through the kept
    points, past the last from (0, 0), at most 2^62 - 1; of equal ticks the smallest ns."""
    scale = log_events._tick_scale([(9000000006, 3000000000)])
    # 1999999999.67 and exactly 2000000000: a rate rounded first gave 1999999999 twice,
    # and a free sorted with the allocation it follows.
    assert (scale(6000000003), scale(6000000004), scale(9000000006)) == (1999999999, 2000000000, 3000000000)
    assert scale(18000000012) == 6000000000                    # past the last point: its rate from (0, 0)
    equal = log_events._tick_scale([(10, 100), (10, 50), (20, 40), (30, 150)])
    assert (equal(10), equal(20), equal(30)) == (50, 100, 150)  # (10, 50) kept; (20, 40) runs backwards
    assert log_events._tick_scale([])(123) == 0                 # only the origin: no rate
    assert log_events._tick_scale([(1, 2)])((1 << 62) - 10) == STAMP_MAX


def test_the_time_column_never_raises_and_wraps_as_the_cpp_writer(tmp_path):
    """The wall time is the start plus the stamp wrapped to a signed 64-bit value, as the
    C++ writer formats it; whatever the header holds, no OverflowError/ValueError/OSError."""
    for wall in (-(1 << 63), (1 << 63) - 1, -5, 0):
        for stamp in (0, 999, STAMP_MAX):
            text = log_events._clock_text(wall + stamp)
            assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{6}", text), (wall, stamp, text)
    # The wrap itself: 2^63 - 1 + 1 ns is -2^63 ns, in 1677, not a time in 2262.
    wrapped = -(1 << 63)
    seconds, ns = divmod(wrapped, 1_000_000_000)
    assert log_events._clock_text((1 << 63)) == time.strftime("%H:%M:%S", time.localtime(seconds)) + \
        f".{ns // 1000:06d}"


@pytest.mark.parametrize("blocks, clock, wall", [
    ([[(3, 0, 7, 1, (1 << 64) - 1), (0, STAMP_MAX, 0x1000, 100, 0)]], 1, 0),
    ([[(3, 0, 1, 9000000006, 3000000000), (0, 6000000003, 0x1000, 64, 0)], [(3, 0, 2, 0, 0),
                                                                          (2, 6000000004, 0x1000, 64, 0)]], 1, 0),
    ([[(3, 0, 7, 10, 100), (0, 20, 0x1000, 100, 0)], [(3, 0, 7, 10, 50), (2, 30, 0x1000, 100, 0)]], 1, 0),
    ([[(3, 0, 7, 0, 0), (0, STAMP_MAX, 0x1000, 1, 0)]], 0, (1 << 63) - 1),
    ([[(3, 0, 7, 0, 0), (0, 1, 0x1000, 1, 0)]], 0, -(1 << 63)),
    ([[(3, 0, 7, 3 * 10**12, 10**12), (0, 4 * 10**12, 0x1000, 1, 0), (0, 1234567, 0x2000, 1, 0)]], 1,
     1_700_000_000_123_456_789),
])
def test_binary_rows_are_the_cpp_readers_csv(tmp_path, blocks, clock, wall):
    log = write(tmp_path, "log.bin", binary_log(blocks, start_wall_ns=wall, clock=clock))
    kind, _, text = cpp_reading(log, tmp_path)
    assert kind == "events", text
    assert "\n".join(",".join(row) for row in _binary_log_rows(str(log), log.read_bytes())) + "\n" == text


# ---- 2, 3. memory-viz: times past midnight, 0-byte allocations ---------------------------

def viz_times(path):
    snapshot = log_to_memory_viz(read_log_events(str(path))).snapshot
    return [(e["action"], e["time_us"]) for e in snapshot["device_traces"][0]]


def test_memory_viz_times_run_on_past_midnight(tmp_path):
    """A free 20 us after its allocation, across midnight, came 24 h before it (time_us
    -86399999980): the times were read from the time of day alone."""
    across = write(tmp_path, "midnight.csv", HEADER + "1,23:59:59.999990,allocate,0x1000,100,0\n"
                                                      "1,00:00:00.000010,free,0x1000,100,0\n"
                                                      "1,23:00:00.000000,allocate,0x1000,100,0\n")
    assert viz_times(across) == [("segment_alloc", 0), ("alloc", 0), ("free_requested", 20), ("free_completed", 20),
                                 ("alloc", 23 * 3600 * 10**6 + 10)]
    # A log with a Stamp column (a binary log has one) is timed by its stamps.
    log = write(tmp_path, "midnight.bin", binary_log([[(3, 0, 1, 0, 0), (0, 0, 0x1000, 100, 0),
                                                       (2, 20_000, 0x1000, 100, 0)]],
                                                     start_wall_ns=86400 * 20000 * 10**9 - 10_000))
    assert [t for _, t in viz_times(log)] == [0, 0, 20, 20]
    stamped = write(tmp_path, "stamped.csv", STAMPED + "1,23:59:59.999990,allocate,0x1000,100,0,5000\n"
                                                       "1,00:00:00.000010,free,0x1000,100,0,25000\n")
    assert [t for _, t in viz_times(stamped)] == [0, 0, 20, 20]


def test_memory_viz_pairs_a_zero_byte_allocation_with_its_free(tmp_path):
    """A 0-byte allocation at a real pointer was dropped, so its free was counted as one
    without an allocation in the log. It is an allocation, paired; it has no block."""
    log = write(tmp_path, "zero_viz.csv", HEADER + "1,0,allocate,0x1000,0,0\n1,0,free,0x1000,0,0\n"
                                                   "1,0,allocate,0x2000,512,0\n1,0,allocate,0x3000,0,0\n")
    conversion = log_to_memory_viz(read_log_events(str(log)))
    assert (conversion.allocations, conversion.frees, conversion.unpaired_frees) == (3, 1, 0)
    assert "without an allocation" not in conversion.summary()
    trace = conversion.snapshot["device_traces"][0]
    assert [(e["action"], e["addr"]) for e in trace] == [("segment_alloc", 0x2000), ("alloc", 0x2000)]
    assert [[(b["state"], b["size"]) for b in s["blocks"]] for s in conversion.snapshot["segments"]] == \
        [[("active_allocated", 512)]]


# ---- 5. torch -> CSV times past 24 hours ------------------------------------------------

def test_a_torch_trace_spanning_a_day_converts_to_a_readable_log(tmp_path):
    """24 h after the first entry was written '24:00:00.000000', which both readers refuse
    (hours 0-23); a number of seconds they read for any span."""
    snapshot = {"device_traces": [[
        {"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 5},
        {"action": "free_requested", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 5 + 24 * 3600 * 10**6}]]}
    lines = convert_torch_snapshot(snapshot).lines
    assert lines[1:] == ["1,0.000000,allocate,0x1000,512,0", "1,86400.000000,free,0x1000,512,0"]
    log = write(tmp_path, "day.csv", "\n".join(lines) + "\n")
    assert [e[1] for e in read_log_events(str(log))] == ["allocate", "free"]
    assert [t for _, t in viz_times(log)] == [0, 0, 86400 * 10**6, 86400 * 10**6]
    if _replay() is not None:
        assert_same_reading(log, tmp_path)


# ---- 6, 8. which rows take part in the stamp merge; 0-byte failures ----------------------

def test_null_and_failure_rows_take_part_in_the_stamp_merge(tmp_path):
    """The C++ reader merges every row by stamp and skips null rows only when it reads
    them in that order; dropped before the merge, a null row let thread A's next row
    (stamp 1) move ahead of thread B's, and the log was refused."""
    for filler in ("A,0,allocate,0,0,0,10", "A,0,allocate failure,(nil),64,0,10", "A,0,allocate failure,0x9,0,0,10"):
        rest = "A,0,allocate,0x1000,64,0,1\nB,0,allocate,0x1000,64,0,5\nB,0,free,0x1000,64,0,6\n"
        log = write(tmp_path, "nullmerge.csv", STAMPED + filler + "\n" + rest)
        lines = [(line, kind) for line, kind, *_ in read_log_events(str(log))]
        expected = [(4, "allocate"), (5, "free")] + ([(2, "failure")] if "(nil),64" in filler else []) + \
            [(3, "allocate")]
        assert lines == expected, filler
        if _replay() is not None:
            assert_same_reading(log, tmp_path)


def test_a_zero_byte_allocate_failure_is_skipped_whatever_its_pointer(tmp_path):
    """A refusal of nothing: the C++ reader skips it as it skips a null row of size 0."""
    log = write(tmp_path, "zero_fail.csv", HEADER + "1,0,allocate failure,(nil),0,0\n"
                                                    "1,0,allocate failure,0x1234,0,0x5\n"
                                                    "1,0,allocate failure,(nil),64,0\n")
    assert [(line, kind, size) for line, kind, _, size, *_ in read_log_events(str(log))] == [(4, "failure", 64)]
    assert log_to_memory_viz(read_log_events(str(log))).failures == 1


# ---- 7. byte counts past 2^64 - 1, and the order of the checks ---------------------------

def test_live_or_total_bytes_past_2_64_are_refused_naming_the_line(tmp_path):
    half = 1 << 63
    live = write(tmp_path, "live.csv", HEADER + f"1,0,allocate,0x1000,{half},0\n1,0,allocate,0x2000,{half},0\n")
    total = write(tmp_path, "total.csv", HEADER + f"1,0,allocate,0x1000,{half},0\n1,0,free,0x1000,{half},0\n"
                                                  f"1,0,allocate,0x2000,{half},0\n1,0,bogus,0x2000,{half},0\n")
    for path, line in ((live, 3), (total, 4)):
        with pytest.raises(ConversionError, match=rf"{path.name}:{line}: with this allocation of {half} bytes the "
                                                  r"log's bytes would pass 2\^64 - 1: the sizes are absurd"):
            read_log_events(str(path))
    # Checked row by row, as the C++ reader does: the line 4 above is never reached.
    fine = write(tmp_path, "fine.csv", HEADER + f"1,0,allocate,0x1000,{(1 << 64) - 1},0\n"
                                                f"1,0,free,0x1000,{(1 << 64) - 1},0\n1,0,allocate,0x2000,0,0\n")
    assert len(read_log_events(str(fine))) == 3
    if _replay() is not None:
        for path in (live, total, fine):
            assert_same_reading(path, tmp_path)


# ---- 9. bytes that are not UTF-8, gzip trailers, limits ----------------------------------

def test_only_the_thread_column_must_be_utf8(tmp_path):
    extra = write(tmp_path, "latin1.csv", b"Thread,Time,Action,Pointer,Size,Stream,Note\n"
                                          b"1,0,allocate,0x1000,100,0,caf\xe9\n1,0,free,0x1000,100,0,x\n")
    assert [e[1] for e in read_log_events(str(extra))] == ["allocate", "free"]
    thread = write(tmp_path, "thread.csv", HEADER.encode() + b"1,0,allocate,0x1000,100,0\nw\xe9,0,free,0x1000,100,0\n")
    with pytest.raises(ConversionError, match=r"thread.csv:3: bad Thread: byte 0xe9 is not printable UTF-8 text"):
        read_log_events(str(thread))
    if _replay() is not None:
        assert_same_reading(extra, tmp_path)
        assert_same_reading(thread, tmp_path)


def test_bytes_after_the_last_gzip_stream_are_an_error(tmp_path):
    text = (HEADER + "1,0,allocate,0x1000,100,0\n1,0,free,0x1000,100,0\n").encode()
    packed = gzip.compress(text, mtime=0)
    for name, tail, message in (("zeros", b"\0" * 8, r"8 bytes of trailing garbage after the gzip stream, at byte "
                                                     rf"offset {len(packed)} of the file"),
                                ("junk", b"junk", r"4 bytes of trailing garbage"),
                                ("cut", gzip.compress(text)[:-4], r"damaged or cut short \(unexpected end of file\)")):
        path = write(tmp_path, f"{name}.csv.gz", packed + tail)
        with pytest.raises(ConversionError, match=rf"{name}.csv.gz: .*{message}"):
            read_log_events(str(path))
    two = write(tmp_path, "two.csv.gz", gzip.compress(text[:50]) + gzip.compress(b"") + gzip.compress(text[50:]))
    assert len(read_log_events(str(two))) == 2
    bad_crc = bytearray(packed)
    bad_crc[-8] ^= 1
    with pytest.raises(ConversionError, match=r"crc.csv.gz: cannot read it: the compressed log is damaged"):
        read_log_events(str(write(tmp_path, "crc.csv.gz", bytes(bad_crc))))
    if _replay() is not None:
        for name in ("zeros", "junk", "two"):
            assert_same_reading(tmp_path / f"{name}.csv.gz", tmp_path)


def test_the_readers_limits_name_the_line(tmp_path, monkeypatch):
    """The C++ reader's defaults: a line of at most 64 KiB, 65,535 streams, 4 GiB of text."""
    long = write(tmp_path, "long.csv", "Thread,Time,Action,Pointer,Size,Stream,Note\n1,0,allocate,0x1000,16,0,"
                                       + "x" * 70000 + "\n")
    with pytest.raises(ConversionError, match=r"long.csv:2: the line is 70025 bytes long, more than the reader's "
                                              r"limit of 65536"):
        read_log_events(str(long))
    rows = "".join(f"1,0,allocate,{hex(0x1000 * (i + 1))},16,{hex(i + 1)}\n" for i in range(65536))
    streams = write(tmp_path, "streams.csv", HEADER + rows)
    with pytest.raises(ConversionError, match=r"streams.csv:65537: the log uses more than 65535 streams"):
        read_log_events(str(streams))
    assert len(read_log_events(str(write(tmp_path, "fewer.csv", HEADER + rows[:rows.rindex("1,0")])))) == 65535
    if _replay() is not None:
        assert_same_reading(long, tmp_path)
        assert_same_reading(streams, tmp_path)
    monkeypatch.setattr(log_events, "MAX_TEXT_BYTES", 100)
    small = HEADER + "1,0,allocate,0x1000,16,0\n"
    assert len(read_log_events(str(write(tmp_path, "small.csv", small)))) == 1
    for name, content in (("big.csv", small * 3), ("big.csv.gz", gzip.compress((small * 3).encode())),
                          ("big.bin", binary_log([[(3, 0, 7, 0, 0)] + [(0, i, 0x1000 * (i + 1), 16, 0)
                                                                       for i in range(3)]]))):
        with pytest.raises(ConversionError, match=rf"{re.escape(name)}: .*larger than 100 bytes, the reader's limit"):
            read_log_events(str(write(tmp_path, name, content)))


def test_numbers_of_thousands_of_digits_are_read_as_the_cpp_reader_reads_them(tmp_path):
    """A 64 KiB line holds numbers past the 4300 digits Python's int() converts: a Size or
    Stamp of 5000 digits, a Time of 5000 digits of seconds or of fraction raised
    ValueError out of the reader. std::from_chars takes leading zeros however many, and
    the Time column is only checked there."""
    stamped = STAMPED.replace("\n", "")
    logs = {
        "size.csv": (HEADER + "1,0,allocate,0x1000," + "9" * 5000 + ",0\n",
                     r"size.csv:2: bad Size '9{80}'\.\.\.: expected a number of bytes"),
        "stamp.csv": (f"{stamped}\n1,0,allocate,0x1000,5,0," + "1" * 5000 + "\n",
                      r"stamp.csv:2: bad Stamp '1{80}'\.\.\.: expected nanoseconds"),
        "zeros.csv": (HEADER + "1,0,allocate,0x1000," + "0" * 5000 + "5,0\n", None),
        "zero_stamp.csv": (f"{stamped}\n1,0,allocate,0x1000,5,0," + "0" * 5000 + "7\n", None),
        "seconds.csv": (HEADER + "1," + "1" * 5000 + ",allocate,0x1000,5,0\n1,0.5,free,0x1000,5,0\n", None),
        "fraction.csv": (HEADER + "1,0." + "4" * 6 + "5" + "9" * 5000 + ",allocate,0x1000,5,0\n", None),
    }
    for name, (text, error) in logs.items():
        path = write(tmp_path, name, text)
        if error is None:
            events = read_log_events(str(path))
            assert events[0][3] == 5, name
        else:
            with pytest.raises(ConversionError, match=error):
                read_log_events(str(path))
        if _replay() is not None:
            assert_same_reading(path, tmp_path)
    assert read_log_events(str(tmp_path / "zero_stamp.csv"))[0][5] == 0       # the Stamp 7 ns, in us
    assert read_log_events(str(tmp_path / "seconds.csv"))[0][5] == (10**5000 - 1) // 9 * 1_000_000  # 5000 ones
    assert read_log_events(str(tmp_path / "fraction.csv"))[0][5] == 444_445  # half up at the seventh digit
    assert log_to_memory_viz(read_log_events(str(tmp_path / "seconds.csv"))).allocations == 1


def test_a_bad_thread_record_is_named_before_a_damaged_block_after_it(tmp_path):
    """The C++ reader checks each block, then its records, in file order; the Python one
    read every block first, so it named a cut-short block at the end instead of the bad
    thread record before it."""
    path = write(tmp_path, "order.bin", binary_log([[(3, 5, 7, 0, 0), (0, 1, 0x1000, 16, 0)], [(3, 0, 7, 0, 0)]])[:-10])
    with pytest.raises(ConversionError, match=r"order.bin: binary log, byte offset 40: a thread record with a stamp, "
                                              r"size or stream"):
        read_log_events(str(path))
    if _replay() is not None:
        cpp = cpp_reading(path, tmp_path)
        assert cpp[0] == "error" and "byte offset 40: a thread record with a stamp" in cpp[2], cpp


@pytest.mark.parametrize("version, record_size, clock, named", [
    (2, 32, 0, "byte offset 8: format version 2; this reader reads version 1"),
    (1, 64, 0, "byte offset 12: records of 64 bytes; version 1 records are 32"),
    (1, 32, 7, "byte offset 24: clock 0x7: expected 0 (nanoseconds) or 1 (time-stamp counter ticks)"),
])
def test_a_binary_header_field_is_named_at_its_offset(tmp_path, version, record_size, clock, named):
    """The Python reader named byte offset 8 for any of the three, the C++ reader each
    field's own."""
    data = b"MRSTLOG\x01" + version.to_bytes(4, "little") + record_size.to_bytes(4, "little") + bytes(8) + \
        clock.to_bytes(8, "little")
    path = write(tmp_path, "header.bin", data)
    with pytest.raises(ConversionError, match=re.escape(f"header.bin: binary log, {named}")):
        read_log_events(str(path))
    if _replay() is not None:
        cpp = cpp_reading(path, tmp_path)
        assert cpp[0] == "error" and named in cpp[2], cpp


def test_binary_logs_cut_or_damaged_are_refused_as_the_cpp_reader_refuses_them(tmp_path):
    """A small binary log (tick clock, two threads sharing a block) cut at every word and
    each of its words replaced by an edge value: read_log_events, through its column
    reader, takes the logs mrstack-replay takes, with as many events. The one difference
    is kept on purpose: a free of a pointer no row allocated, which log_to_memory_viz
    counts and a replay cannot replay."""
    if _replay() is None:
        pytest.skip("mrstack-replay is not built (cmake --build --preset release --target mrstack-replay)")
    data = binary_log([[(3, 0, 7, 1000, 300), (0, 500, 0x1000, 16, 0x10), (1, 600, 0, 32, 0)],
                       [(3, 0, 8, 3000, 1000), (2, 900, 0x1000, 16, 0), (3, 0, 7, 2000, 1500),
                        (0, 2900, 0x2000, 1, 0)]], start_wall_ns=1_700_000_000 * 10**9, clock=1)
    variants = [data[:end] for end in range(0, len(data) + 1, 8)]
    for at in range(32, len(data), 8):
        variants += [data[:at] + word.to_bytes(8, "little") + data[at + 8:]
                     for word in (0, (1 << 62) - 1, 3 << 62, (1 << 64) - 1)]
    taken = 0
    for variant in variants:
        path = write(tmp_path, "variant.bin", variant)
        cpp, python = cpp_reading(path, tmp_path), python_reading(path)
        if python[0] == "events" and cpp[0] == "error" and "which no row stamped before it allocated" in cpp[2]:
            continue
        assert cpp[0] == python[0] and (cpp[0] == "error" or cpp[1] == python[1]), \
            f"{variant.hex()}:\n C++: {cpp}\n Python: {python}"
        taken += python[0] == "events"
    assert taken > 20
