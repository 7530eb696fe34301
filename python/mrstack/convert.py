"""Convert allocation traces between other tools and mrstack's allocation-log CSV.

    python -m mrstack.convert torch SNAPSHOT.pickle -o LOG.csv [--device N]
    python -m mrstack.convert memory-viz LOG.csv[.gz] -o SNAPSHOT.pickle [--device N]

The output is the log format mrstack-replay reads (and mrstack's and RMM's logging
adaptors write): a header ``Thread,Time,Action,Pointer,Size,Stream`` and one row per
event, so a PyTorch training run can be replayed on any mrstack stack:

    mrstack-replay LOG.csv -r "pool > cuda" -r cuda_async

PyTorch snapshots
-----------------
Record one with::

    torch.cuda.memory._record_memory_history()          # before the work to record
    ...                                                  # the work
    torch.cuda.memory._dump_snapshot("snapshot.pickle")  # a pickled dict

The snapshot's ``device_traces`` holds, per device, the allocator's trace entries (dicts
with ``action``, ``addr``, ``size``, ``stream`` and, in recent versions, ``time_us``).
One device is converted at a time:

- ``alloc`` becomes ``allocate``; ``free_requested`` (the program let go of the block)
  becomes ``free``; ``oom`` becomes ``allocate failure`` (the size asked, pointer 0);
- ``free_completed``, ``segment_alloc``/``segment_free``/``segment_map``/
  ``segment_unmap`` and ``snapshot`` describe PyTorch's own caching, not the program's
  requests, and are left out;
- a free of a block allocated before recording began (or before the trace's ring buffer
  window: ``max_entries``) has no allocation to pair with; it is left out and counted.

Sizes are the caching allocator's block sizes (requests rounded up to 512 bytes, or more
for large blocks), which is what the program held. The snapshot has no thread ids, so
every row is thread 1. Times are relative to the first entry (``H:MM:SS.ffffff``).

Only convert snapshots you trust: reading a pickle can run code.

To PyTorch's memory viewer
--------------------------
``memory-viz`` goes the other way (from a CSV log, or from the logging adaptor's binary
records, which read as the CSV they stand for; plain or gzip-compressed, told apart by
the content as mrstack-replay does): it writes a log as the dict
``torch.cuda.memory._snapshot()`` returns, pickled, so https://pytorch.org/memory_viz and
``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``segsum``, ``trace``) show
it. ``device_traces[N]`` gets ``alloc`` for each allocation, ``free_requested`` and
``free_completed`` for each free, ``oom`` for each ``allocate failure``, each with its
address, size, stream and time; ``frames`` are empty (a log has no stack traces).

A log has no segments (what the logging program's allocator held from the device), so
they are inferred: each maximal address range covered, over the whole log, by
allocations that overlap or lie less than 512 bytes apart (allocators round requests up
to 512 bytes) is one segment, announced by a ``segment_alloc`` just
before its first allocation. ``segments`` is the state at the end of the log: each
segment with its live allocations as ``active_allocated`` blocks and the gaps between
them as ``inactive`` ones. Frees without an allocation in the log are left out, counted.
"""

import argparse
import bisect
import gzip
import heapq
import os
import pickle
import re
import struct
import sys
import tempfile
import time
import zlib

__all__ = ["ConversionError", "TorchConversion", "convert_torch_snapshot", "load_snapshot", "write_log",
           "read_log_events", "log_to_memory_viz", "write_snapshot", "main"]

HEADER = "Thread,Time,Action,Pointer,Size,Stream"

# Trace actions that describe PyTorch's own caching rather than the program's requests.
_IGNORED_TORCH_ACTIONS = frozenset(
    {"free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot"})


class ConversionError(Exception):
    """The input cannot be converted; the message says what and where."""


class TorchConversion:
    """The rows of one converted device trace, and what was left out."""

    def __init__(self, device):
        self.device = device
        self.lines = [HEADER]
        self.allocations = 0
        self.frees = 0
        self.failures = 0
        self.unpaired_frees = 0    # frees of blocks allocated before the trace began
        self.ignored_entries = 0   # PyTorch's caching bookkeeping (segments, free_completed...)
        self.unknown_actions = {}  # action -> count, for actions this converter does not know
        self.leaks = 0             # blocks still allocated when the snapshot was taken

    @property
    def events(self):
        return self.allocations + self.frees

    def summary(self):
        parts = [f"{self.events:,} events ({self.allocations:,} allocate, {self.frees:,} free) from device {self.device}"]
        if self.failures:
            parts.append(f"{self.failures:,} allocation failures")
        if self.unpaired_frees:
            parts.append(f"{self.unpaired_frees:,} frees of blocks allocated before recording began left out")
        if self.leaks:
            parts.append(f"{self.leaks:,} blocks still allocated at the snapshot")
        if self.ignored_entries:
            parts.append(f"{self.ignored_entries:,} caching entries (segments, free_completed) left out")
        for action, count in sorted(self.unknown_actions.items()):
            parts.append(f"{count:,} entries with unknown action {action!r} left out")
        return "; ".join(parts)


def _hex(value):
    return "0" if value == 0 else f"0x{value & 0xFFFFFFFFFFFFFFFF:x}"


def _time_text(microseconds):
    seconds, micro = divmod(max(0, int(microseconds)), 1_000_000)
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{sec:02d}.{micro:06d}"


def _int_field(entry, key, where, action, required=True, default=0):
    if key not in entry:
        if required:
            raise ConversionError(f"{where}: the {action!r} entry has no {key!r}")
        return default
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConversionError(f"{where}: {key!r} of the {action!r} entry is {value!r}, expected an integer")
    return value


def _choose_device(traces, device):
    with_entries = [(d, len(t)) for d, t in enumerate(traces) if len(t) > 0]
    if device is not None:
        if not 0 <= device < len(traces):
            raise ConversionError(
                f"--device {device}: the snapshot has traces for devices 0 to {len(traces) - 1}" if traces else
                f"--device {device}: the snapshot has no device traces")
        if not traces[device]:
            listing = ", ".join(f"{d} ({n:,} entries)" for d, n in with_entries) or "none"
            raise ConversionError(f"--device {device}: its trace is empty; devices with entries: {listing}")
        return device
    if not with_entries:
        raise ConversionError(
            "the snapshot's device_traces are empty: record them with "
            "torch.cuda.memory._record_memory_history() before the work, then take the snapshot")
    if len(with_entries) > 1:
        listing = ", ".join(f"{d} ({n:,} entries)" for d, n in with_entries)
        raise ConversionError(f"the snapshot has traces for several devices: {listing}; choose one with --device")
    return with_entries[0][0]


def convert_torch_snapshot(snapshot, device=None):
    """Converts one device's trace of a PyTorch memory snapshot (the dict
    ``torch.cuda.memory._snapshot()`` returns) into log lines. Raises ConversionError."""
    if not isinstance(snapshot, dict):
        raise ConversionError(
            f"the snapshot is a {type(snapshot).__name__}, expected the dict torch.cuda.memory._snapshot() returns")
    if "device_traces" not in snapshot:
        raise ConversionError(
            "the snapshot has no 'device_traces': record them with torch.cuda.memory._record_memory_history() "
            "before the work, then take the snapshot")
    traces = snapshot["device_traces"]
    if not isinstance(traces, (list, tuple)) or not all(isinstance(t, (list, tuple)) for t in traces):
        raise ConversionError("'device_traces' must be a list with one list of trace entries per device")
    device = _choose_device(traces, device)
    trace = traces[device]
    out = TorchConversion(device)
    live = {}  # address -> (size, entry index)
    # Times count from the trace's first entry, whatever its action.
    start_us = next((e["time_us"] for e in trace if isinstance(e, dict) and isinstance(e.get("time_us"), int)), None)
    for index, entry in enumerate(trace):
        where = f"device_traces[{device}][{index}]"
        if not isinstance(entry, dict) or "action" not in entry:
            raise ConversionError(f"{where}: expected a dict with an 'action', found {entry!r:.80}")
        action = entry["action"]
        if action in _IGNORED_TORCH_ACTIONS:
            out.ignored_entries += 1
            continue
        if action not in ("alloc", "free_requested", "oom"):
            out.unknown_actions[action] = out.unknown_actions.get(action, 0) + 1
            continue
        time_us = None if entry.get("time_us") is None else _int_field(entry, "time_us", where, action)
        time = _time_text(time_us - start_us if time_us is not None else 0)
        size = _int_field(entry, "size", where, action)
        if size < 0:
            raise ConversionError(f"{where}: 'size' of the {action!r} entry is negative ({size})")
        stream = _int_field(entry, "stream", where, action, required=False, default=0)
        if action == "oom":
            out.lines.append(f"1,{time},allocate failure,0,{size},{_hex(stream)}")
            out.failures += 1
            continue
        addr = _int_field(entry, "addr", where, action)
        if addr == 0:
            raise ConversionError(f"{where}: the {action!r} entry has a null 'addr'")
        if action == "alloc":
            if addr in live:
                raise ConversionError(
                    f"{where}: 'alloc' of {_hex(addr)}, which entry {live[addr][1]} allocated and no entry freed "
                    "since: the trace is inconsistent")
            live[addr] = (size, index)
            out.lines.append(f"1,{time},allocate,{_hex(addr)},{size},{_hex(stream)}")
            out.allocations += 1
        else:
            if addr not in live:
                out.unpaired_frees += 1
                continue
            allocated_size, allocated_at = live.pop(addr)
            if allocated_size != size:
                raise ConversionError(
                    f"{where}: 'free_requested' of {_hex(addr)} with size {size}, but entry {allocated_at} "
                    f"allocated it with {allocated_size}")
            out.lines.append(f"1,{time},free,{_hex(addr)},{size},{_hex(stream)}")
            out.frees += 1
    out.leaks = len(live)
    return out


def load_snapshot(path):
    """Reads a pickled snapshot (as torch.cuda.memory._dump_snapshot writes it)."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        raise ConversionError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConversionError(f"{path}: is a directory, expected a snapshot file") from None
    except PermissionError as e:
        raise ConversionError(f"{path}: cannot read it ({e.strerror})") from None
    except ModuleNotFoundError as e:
        raise ConversionError(
            f"{path}: reading it needs the Python module {e.name!r}; snapshots from "
            "torch.cuda.memory._dump_snapshot() are plain dicts and need none") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as e:
        raise ConversionError(
            f"{path}: not a readable pickle ({type(e).__name__}: {e}); expected a file written by "
            "torch.cuda.memory._dump_snapshot()") from None


def write_log(lines, path):
    """Writes the log atomically: a temporary file beside `path`, then a rename, so no
    reader ever sees half a log and a failure leaves none. A name ending in .gz is
    gzip-compressed; "-" writes to standard output."""
    text = "\n".join(lines) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return

    def write(raw):
        if path.endswith(".gz"):
            with gzip.GzipFile(filename=os.path.basename(path)[:-3], mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(text.encode())
        else:
            raw.write(text.encode())
        raw.flush()
        os.fsync(raw.fileno())

    _write_atomically(path, write)


def _write_atomically(path, write):
    """Calls write(file) on a temporary file beside `path`, then renames it to `path`; on
    any failure the temporary file is removed and `path` is left as it was."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---- log -> PyTorch memory snapshot ---------------------------------------------------

def _parse_time_us(text):
    """H:MM:SS.ffffff (mrstack's and RMM's loggers) -> microseconds; None when unreadable."""
    try:
        hours, minutes, seconds = text.strip().split(":")
        return round((int(hours) * 3600 + int(minutes) * 60 + float(seconds)) * 1_000_000)
    except ValueError:
        return None


# The logging adaptor's binary records (include/mrstack/log/binary_log.hpp).
_BINARY_MAGIC = b"MRSTLOG\x01"
_BINARY_ACTIONS = ("allocate", "allocate failure", "free")


def _binary_records(path, data):
    """(offset, kind, stamp, pointer, size, stream, first in its block) for every record of
    a binary log, after its 32-byte header; a damaged block is a ConversionError."""
    at = 32
    while at < len(data):
        if len(data) - at < 8:
            raise ConversionError(f"{path}: binary log, byte offset {at}: cut short where a block header was expected")
        magic, count = struct.unpack_from("<II", data, at)
        if magic != 0x4B4C4252 or count == 0 or count * 32 > len(data) - at - 8:
            raise ConversionError(f"{path}: binary log, byte offset {at}: a damaged or cut-short block "
                                  f"(magic {magic:#x}, {count} records)")
        at += 8
        for index in range(count):
            word, pointer, size, stream = struct.unpack_from("<QQQQ", data, at)
            yield at, word >> 62, word & ((1 << 62) - 1), pointer, size, stream, index == 0
            at += 32


def _tick_scale(points):
    """Tick stamps to nanoseconds, piecewise linear through the (ticks, ns) points and
    (0, 0), past the last at the whole span's rate; points running backwards left out."""
    kept = [(0, 0)]
    for ticks, ns in sorted(points):
        if ticks > kept[-1][0] and ns >= kept[-1][1]:
            kept.append((ticks, ns))
    def scale(ticks):
        if len(kept) == 1:
            return 0
        i = bisect.bisect_right([p[0] for p in kept], ticks)
        a, b = (kept[0], kept[-1]) if i == len(kept) else (kept[i - 1], kept[i])
        return int(a[1] + (ticks - a[0]) * (b[1] - a[1]) / (b[0] - a[0]))
    return scale


def _binary_log_rows(path, data):
    """A binary log's rows as the CSV the adaptor writes in per-thread order would hold
    them (its header first). Raises ConversionError naming the byte offset."""
    def fail(offset, what):
        raise ConversionError(f"{path}: binary log, byte offset {offset}: {what}")
    if len(data) < 32:
        fail(0, f"cut short: the file header takes 32 bytes, the log has {len(data)}")
    version, record_size, start_wall_ns, clock = struct.unpack_from("<IIqQ", data, 8)
    if version != 1 or record_size != 32 or clock not in (0, 1):
        fail(8, f"version {version}, records of {record_size} bytes, clock {clock}: this reader reads "
                "version 1, 32-byte records, clock 0 or 1")
    records = list(_binary_records(path, data))
    for at, kind, stamp, _, size, stream, _ in records:
        if kind == 3 and clock == 0 and (stamp or size or stream):
            fail(at, "a thread record with a stamp, size or stream (its fields after the id must be 0)")
        if kind == 3 and clock == 1 and stamp:
            fail(at, "a thread record with a stamp (its stamp field must be 0)")
    # Clock 1: stamps are time-stamp counter ticks; thread records carry (ticks, ns) points.
    scale = _tick_scale([(size, stream) for _, kind, _, _, size, stream, _ in records if kind == 3 and size]) \
        if clock == 1 else (lambda stamp: stamp)
    rows = [HEADER.split(",") + ["Stamp"]]
    thread = None
    for at, kind, stamp, pointer, size, stream, first in records:
        if kind == 3:
            thread = pointer
            continue
        if first:
            fail(at, "a block's first record must name its thread (kind 3)")
        stamp = scale(stamp)
        seconds, ns = divmod(start_wall_ns + stamp, 1_000_000_000)
        clock_text = time.strftime("%H:%M:%S", time.localtime(seconds)) + f".{ns // 1000:06d}"
        rows.append([str(thread), clock_text, _BINARY_ACTIONS[kind], f"{pointer:#x}" if pointer else "(nil)",
                     str(size), f"{stream:#x}" if stream else "0", str(stamp)])
    return rows


# The log format as mrstack's C++ reader takes it (include/mrstack/log/allocation_log.hpp):
# the same rows must give the same events, or an error, on both sides.
_COLUMNS = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,16})")
_DECIMAL = re.compile(r"[0-9]+")
_TIME = re.compile(r"([0-9]+)(?::([0-9]{2}):([0-9]{2}))?(?:\.[0-9]+)?")
_ACTIONS = {"allocate": "allocate", "free": "free", "allocate failure": "failure"}


def _hex_field(text):
    """Hex with or without 0x (at most 16 digits), or glibc's (nil); None when malformed."""
    if text == "(nil)":
        return 0
    match = _HEX.fullmatch(text)
    return int(match.group(1), 16) if match else None


def _decimal_field(text):
    """Decimal digits only (no sign, no '_', no spaces inside), below 2^64; else None."""
    return int(text) if _DECIMAL.fullmatch(text) and int(text) < 1 << 64 else None


def _is_time(text):
    """H:MM:SS[.f] (hours 0-23, minutes and seconds 0-59) or a number of seconds."""
    match = _TIME.fullmatch(text)
    if not match:
        return False
    hours, minutes, seconds = match.groups()
    return minutes is None or (len(hours) <= 2 and int(hours) < 24 and int(minutes) < 60 and int(seconds) < 60)


def _split_rows(text):
    """(line number, fields) of each non-blank line, split as the C++ reader splits them: at
    every comma (no quoting), each field trimmed of spaces and tabs, a line's \r dropped."""
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if line.strip(" \t"):
            rows.append((number, [field.strip(" \t") for field in line.split(",")]))
    return rows


def _checked_header(path, header):
    """Whether the log has the Stamp column; a header the C++ reader refuses is an error."""
    for i, name in enumerate(_COLUMNS):
        if i >= len(header) or header[i].lower() != name.lower():
            found = header[i] if i < len(header) else "nothing"
            raise ConversionError(f"{path}:1: header column {i + 1} is {found!r}, expected {name!r}: the header must "
                                  f"start with {HEADER}")
    return len(header) > 6 and header[6].lower() == "stamp"


def _checked_event(path, number, row):
    """One row's event (line, kind, address, size, stream, time_us), checked as the C++
    reader checks it; None for a null-pointer row of size 0 (which that reader skips)."""
    where = f"{path}:{number}"
    thread, time_text, action, pointer, size_text, stream_text = row[:6]
    if not thread:
        raise ConversionError(f"{where}: the Thread column is empty: expected a thread id")
    if not _is_time(time_text):
        raise ConversionError(f"{where}: bad Time {time_text!r}: expected a time of day such as 01:00:00.000123 "
                              "(hours 0-23, minutes and seconds 0-59) or a number of seconds")
    kind = _ACTIONS.get(action)
    if kind is None:
        raise ConversionError(f"{where}: unknown action {action!r} (expected allocate, free or allocate failure)")
    address, size, stream = _hex_field(pointer), _decimal_field(size_text), _hex_field(stream_text)
    if address is None:
        raise ConversionError(f"{where}: bad Pointer {pointer!r}: expected a hexadecimal address (with or without 0x)")
    if size is None:
        raise ConversionError(f"{where}: bad Size {size_text!r}: expected a number of bytes (decimal digits, "
                              "below 2^64)")
    if stream is None:
        raise ConversionError(f"{where}: bad Stream {stream_text!r}: expected a hexadecimal stream handle")
    if kind != "failure" and address == 0:
        if size == 0:
            return None  # an allocation of nothing, or a free of nullptr: a no-op
        raise ConversionError(f"{where}: a{'' if kind == 'free' else 'n'} {action} row of {size} bytes has a null "
                              "Pointer")
    return number, kind, address, size, stream, _parse_time_us(time_text)


def read_log_events(path):
    """The events of an allocation log: (line, action, address, size, stream, time_us)
    with action "allocate", "free" or "failure". Raises ConversionError naming the line.
    A binary log (the logging adaptor's ``binary`` format) reads as its CSV rows. The rows
    are read and checked as mrstack's C++ reader reads them (header names without case,
    a byte order mark skipped, fields split at every comma and trimmed, numbers strict)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        # Compressed or not by the content, as mrstack's reader decides (not by the name: a
        # gzip file named .csv, or a plain one named .gz, is read there, so it is here).
        if data.startswith(b"\x1f\x8b"):
            data = gzip.decompress(data)  # every gzip stream, one after another
        if data.startswith(_BINARY_MAGIC):
            rows = list(enumerate(_binary_log_rows(path, data), start=1))
        else:
            nul = data.find(b"\0")
            if nul >= 0:
                line = data.count(b"\n", 0, nul) + 1
                raise ConversionError(f"{path}:{line}: a NUL byte at byte offset {nul} of "
                                      "the text: the log holds binary data, expected CSV text (or gzip-compressed CSV)")
            rows = _split_rows(data.decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConversionError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise ConversionError(f"{path}: cannot read it ({e})") from None
    if not rows:
        raise ConversionError(f"{path}: empty, expected the header {HEADER}")
    if rows[0][0] != 1:
        raise ConversionError(f"{path}:1: a blank line, expected the header {HEADER}")
    has_stamp = _checked_header(path, rows[0][1])
    columns = 7 if has_stamp else 6
    events, stamped = [], []
    for number, row in rows[1:]:
        if len(row) < columns:
            raise ConversionError(f"{path}:{number}: {len(row)} fields, expected {columns} ({HEADER}"
                                  f"{',Stamp' if has_stamp else ''})")
        stamp = _decimal_field(row[6]) if has_stamp else None
        if has_stamp and stamp is None:
            raise ConversionError(f"{path}:{number}: bad Stamp {row[6]!r}: expected nanoseconds (decimal digits)")
        event = _checked_event(path, number, row)
        if event is not None:
            events.append(event)
            stamped.append((row[0], stamp))
    if has_stamp:
        events = _in_stamp_order(stamped, events)
    _check_no_live_reallocation(path, events)
    return events


def _check_no_live_reallocation(path, events):
    """A second allocation of a pointer still live is an error, as in mrstack's reader: the
    log lost a free, and a snapshot of it would hold two blocks at one address (frees of
    pointers not live are left out, counted, by log_to_memory_viz)."""
    live = {}  # address -> line that allocated it
    for line, kind, address, *_ in events:
        if kind == "allocate":
            if address in live:
                raise ConversionError(f"{path}:{line}: allocate of {_hex(address)}, which is still live: line "
                                      f"{live[address]} allocated it and no line freed it since")
            live[address] = line
        elif kind == "free":
            live.pop(address, None)


def _in_stamp_order(stamped, events):
    """A log in per-thread order (a Stamp column): each thread's rows in file order, the
    threads merged by stamp, a free before another thread's allocation at equal stamps
    (as mrstack's reader and the logging adaptor's merged writer order them). `stamped`
    holds each event's (thread, stamp)."""
    by_thread = {}
    for (thread, stamp), event in zip(stamped, events):
        by_thread.setdefault(thread, []).append((stamp, event[1] != "free", event[0], event))
    merged = heapq.merge(*by_thread.values(), key=lambda item: item[:3])
    return [item[3] for item in merged]


class MemoryVizConversion:
    """A log turned into a PyTorch memory snapshot, and what was left out."""

    def __init__(self, snapshot, allocations, frees, failures, unpaired_frees):
        self.snapshot = snapshot
        self.allocations, self.frees, self.failures, self.unpaired_frees = allocations, frees, failures, unpaired_frees

    def summary(self):
        segments = self.snapshot["segments"]
        parts = [f"{self.allocations:,} allocations, {self.frees:,} frees, {len(segments):,} inferred segments "
                 f"({sum(s['total_size'] for s in segments):,} bytes)"]
        if self.failures:
            parts.append(f"{self.failures:,} allocation failures (oom)")
        if self.unpaired_frees:
            parts.append(f"{self.unpaired_frees:,} frees without an allocation in the log left out")
        return "; ".join(parts)


# Allocators round requests up (PyTorch's and RMM's to 512 bytes), so the next block of a
# segment starts up to this many bytes after the previous one's requested end.
SEGMENT_GAP = 512


def _infer_segments(events, gap=SEGMENT_GAP):
    """Maximal address ranges covered by allocations that overlap or lie less than `gap`
    bytes apart: [(start, end)]."""
    ranges = sorted((address, address + size) for _, kind, address, size, _, _ in events
                    if kind == "allocate" and size > 0)
    merged = []
    for start, end in ranges:
        if merged and start < merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


# PyTorch's device index (c10::DeviceIndex) is an int8: a snapshot has traces for at most 128 devices.
MAX_TORCH_DEVICE = 127


def log_to_memory_viz(events, device=0, device_count=None):
    """The snapshot dict (``torch.cuda.memory._snapshot()`` layout) of a log's events."""
    import bisect
    # Checked first: device_traces gets one list per device up to this one (a negative one
    # indexed an empty list; a huge one built billions of lists).
    if not 0 <= device <= MAX_TORCH_DEVICE:
        raise ConversionError(f"--device {device}: PyTorch's device indices are 0 to {MAX_TORCH_DEVICE}")
    segments = _infer_segments(events)
    starts = [start for start, _ in segments]
    announced = set()
    segment_stream = {}
    trace, live = [], {}
    allocations = frees = failures = unpaired = 0
    start_us = next((t for *_, t in events if t is not None), 0)
    for line, kind, address, size, stream, time_us in events:
        when = (time_us - start_us) if time_us is not None else 0
        entry = {"addr": address, "size": size, "stream": stream, "time_us": when, "frames": []}
        if kind == "failure":
            trace.append(dict(entry, action="oom", addr=0, device_free=0))
            failures += 1
        elif kind == "allocate":
            if size <= 0:
                continue
            k = bisect.bisect_right(starts, address) - 1
            if k not in announced:
                announced.add(k)
                segment_stream[k] = stream
                seg_start, seg_end = segments[k]
                trace.append(dict(entry, action="segment_alloc", addr=seg_start, size=seg_end - seg_start))
            trace.append(dict(entry, action="alloc"))
            live[address] = (size, stream)
            allocations += 1
        elif address in live:
            allocated, allocated_stream = live.pop(address)
            for action in ("free_requested", "free_completed"):
                trace.append(dict(entry, action=action, size=allocated, stream=allocated_stream))
            frees += 1
        else:
            unpaired += 1
    snapshot_segments = []
    for k, (seg_start, seg_end) in enumerate(segments):
        blocks, cursor, active = [], seg_start, 0
        for address in sorted(a for a in live if seg_start <= a < seg_end):
            size = live[address][0]
            if address > cursor:
                blocks.append({"address": cursor, "size": address - cursor, "requested_size": 0,
                               "state": "inactive", "frames": []})
            blocks.append({"address": address, "size": size, "requested_size": size,
                           "state": "active_allocated", "frames": []})
            active += size
            cursor = address + size
        if cursor < seg_end:
            blocks.append({"address": cursor, "size": seg_end - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})
        total = seg_end - seg_start
        snapshot_segments.append({
            "device": device, "address": seg_start, "total_size": total, "allocated_size": active,
            "active_size": active, "requested_size": active, "stream": segment_stream.get(k, 0),
            "segment_type": "large" if total > 1 << 20 else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks})
    count = max(device + 1, device_count or 0)
    traces = [[] for _ in range(count)]
    traces[device] = trace
    snapshot = {"segments": snapshot_segments, "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                       "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                                       "pinned_use_host_register": False, "roundup_power2_divisions": {}}}
    return MemoryVizConversion(snapshot, allocations, frees, failures, unpaired)


def write_snapshot(snapshot, path):
    """Pickles `snapshot` to `path` atomically (as torch.cuda.memory._dump_snapshot does)."""
    _write_atomically(path, lambda f: pickle.dump(snapshot, f))


def _memory_viz_main(args):
    try:
        conversion = log_to_memory_viz(read_log_events(args.log), args.device)
        if conversion.allocations == 0 and conversion.failures == 0:
            raise ConversionError(f"{args.log}: the log has no allocations")
        write_snapshot(conversion.snapshot, args.output)
    except ConversionError as e:
        print(f"python -m mrstack.convert: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"python -m mrstack.convert: error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {conversion.summary()}; open it at https://pytorch.org/memory_viz", file=sys.stderr)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mrstack.convert",
        description="Convert allocation traces into mrstack's allocation-log CSV (for mrstack-replay).")
    sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    torch_parser = sources.add_parser(
        "torch", help="a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot)",
        description="Convert a PyTorch memory snapshot recorded with torch.cuda.memory._record_memory_history(): "
                    "alloc -> allocate, free_requested -> free, oom -> allocate failure, one device at a time.")
    torch_parser.add_argument("snapshot", metavar="SNAPSHOT.pickle")
    torch_parser.add_argument("-o", "--output", required=True, metavar="LOG.csv",
                              help="the log to write (.gz: compressed; -: standard output)")
    torch_parser.add_argument("--device", type=int, default=None, metavar="N",
                              help="the device whose trace to convert (default: the only one with entries)")
    viz_parser = sources.add_parser(
        "memory-viz", help="write a log as a PyTorch memory snapshot (for https://pytorch.org/memory_viz)",
        description="Write an allocation log as the pickled dict torch.cuda.memory._snapshot() returns: "
                    "device traces (alloc, free_requested, free_completed, segment_alloc, oom) and the segments "
                    "at the end of the log (inferred from the addresses).")
    viz_parser.add_argument("log", metavar="LOG.csv[.gz]")
    viz_parser.add_argument("-o", "--output", required=True, metavar="SNAPSHOT.pickle")
    viz_parser.add_argument("--device", type=int, default=0, metavar="N", help="the device the trace is for (default 0)")
    args = parser.parse_args(argv)
    if args.source == "memory-viz":
        return _memory_viz_main(args)
    try:
        conversion = convert_torch_snapshot(load_snapshot(args.snapshot), args.device)
        if conversion.events == 0 and conversion.failures == 0:
            raise ConversionError(
                f"{args.snapshot}: device {conversion.device}'s trace has no alloc or free_requested entries")
        write_log(conversion.lines, args.output)
    except ConversionError as e:
        print(f"python -m mrstack.convert: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"python -m mrstack.convert: error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    where = "standard output" if args.output == "-" else args.output
    print(f"wrote {where}: {conversion.summary()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
