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
every row is thread 1. Times are seconds since the first entry (``12.000250``: a
number of seconds, which the log readers take for any span, where a time of day stops
at 23:59:59).

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
An allocation that overlaps a live block is an error naming both lines (mrstack-replay,
which tracks pointers, not ranges, takes such a log; a snapshot's blocks cannot overlap).
A 0-byte allocation (at a real pointer) is counted and paired with its free, but neither
has a trace entry: there is no block to draw. Times are microseconds since the first
event: from the Stamp column where the log has one (a binary log always has), else from
the Time column, a time of day taken past midnight when it goes back by more than 12 hours.
"""

import argparse
import bisect
import gzip
import numbers
import os
import pickle
import sys

from . import _lib
from ._files import checked_path as _checked_path, is_same_file as _is_same_file
from ._files import write_atomically as _write_atomically
from .log_events import HEADER, ConversionError, hex_text as _hex, read_log_events

__all__ = ["ConversionError", "TorchConversion", "convert_torch_snapshot", "load_snapshot", "write_log",
           "read_log_events", "log_to_memory_viz", "write_snapshot", "main"]

# Trace actions that describe PyTorch's own caching rather than the program's requests.
_IGNORED_TORCH_ACTIONS = frozenset(
    {"free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot"})


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


def _time_text(microseconds):
    """A time since the trace's first entry as the Time column: seconds with six decimals.
    Not H:MM:SS: the readers take hours 0-23 there (a time of day), and a trace that
    spans 24 hours or more was written as 24:00:00.000000, which they refuse."""
    seconds, micro = divmod(max(0, int(microseconds)), 1_000_000)
    return f"{seconds}.{micro:06d}"


def _int_field(entry, key, where, action, required=True, default=0, unsigned64=False):
    """The entry's integer `key`; `unsigned64`: it must be a 64-bit unsigned value (an
    address, a size, a stream handle), as the log's columns are — a wider one had been
    written masked or as a Size the log reader then refused."""
    if key not in entry:
        if required:
            raise ConversionError(f"{where}: the {action!r} entry has no {key!r}")
        return default
    value = _integer(entry[key])
    if value is None:
        raise ConversionError(f"{where}: {key!r} of the {action!r} entry is {entry[key]!r}, expected an integer")
    if unsigned64 and not 0 <= value < 1 << 64:
        raise ConversionError(f"{where}: {key!r} of the {action!r} entry is {value}, outside 0 to 2^64 - 1")
    return value


def _integer(value):
    """`value` as an int when it is an integer, numpy's included (a snapshot built or edited
    with numpy holds them), else None; a bool is none."""
    try:
        return _lib.index(value, "a trace entry's field")
    except TypeError:
        return None


def _checked_device(device, what):
    """`device` as an int: True had been taken for device 1, and "0", 1.5 or None had ended
    in a TypeError from a comparison or an index, naming no argument."""
    if isinstance(device, bool) or not isinstance(device, numbers.Integral):
        raise TypeError(f"{what} must be an int device index, not {type(device).__name__} ({device!r:.60})")
    return int(device)


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
    if device is not None:
        device = _checked_device(device, "convert_torch_snapshot: device")
    traces = snapshot["device_traces"]
    if not isinstance(traces, (list, tuple)) or not all(isinstance(t, (list, tuple)) for t in traces):
        raise ConversionError("'device_traces' must be a list with one list of trace entries per device")
    device = _choose_device(traces, device)
    trace = traces[device]
    out = TorchConversion(device)
    live = {}  # address -> (size, entry index)
    # Times count from the trace's first entry, whatever its action.
    start_us = next((t for t in (_integer(e.get("time_us")) for e in trace if isinstance(e, dict)) if t is not None),
                    None)
    for index, entry in enumerate(trace):
        where = f"device_traces[{device}][{index}]"
        if not isinstance(entry, dict) or "action" not in entry:
            raise ConversionError(f"{where}: expected a dict with an 'action', found {entry!r:.80}")
        action = entry["action"]
        # A trace's actions are strings; another value (unhashable, or not ordered with the
        # others in the summary) had ended the conversion with a TypeError.
        if not isinstance(action, str):
            raise ConversionError(f"{where}: 'action' is {action!r:.80}, expected a string such as 'alloc'")
        if action in _IGNORED_TORCH_ACTIONS:
            out.ignored_entries += 1
            continue
        if action not in ("alloc", "free_requested", "oom"):
            out.unknown_actions[action] = out.unknown_actions.get(action, 0) + 1
            continue
        time_us = None if entry.get("time_us") is None else _int_field(entry, "time_us", where, action)
        time = _time_text(time_us - start_us if time_us is not None else 0)
        size = _int_field(entry, "size", where, action, unsigned64=True)
        stream = _int_field(entry, "stream", where, action, required=False, default=0, unsigned64=True)
        if action == "oom":
            out.lines.append(f"1,{time},allocate failure,0,{size},{_hex(stream)}")
            out.failures += 1
            continue
        addr = _int_field(entry, "addr", where, action, unsigned64=True)
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
    _checked_path(path, "load_snapshot: path")
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
    except (MemoryError, OverflowError) as e:
        # A damaged length field: the pickle asks for more memory than there is, or can be.
        raise ConversionError(
            f"{path}: not a readable pickle ({type(e).__name__}: {e or 'a length past the memory'}); it is damaged "
            "or not a file written by torch.cuda.memory._dump_snapshot()") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as e:
        raise ConversionError(
            f"{path}: not a readable pickle ({type(e).__name__}: {e}); expected a file written by "
            "torch.cuda.memory._dump_snapshot()") from None


def write_log(lines, path):
    """Writes the log atomically: a temporary file beside `path`, then a rename, so no
    reader ever sees half a log and a failure leaves none. A name ending in .gz is
    gzip-compressed; "-" writes to standard output."""
    path = os.fsdecode(_checked_path(path, "write_log: path"))  # a pathlib.Path had no .endswith
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

    _write_atomically(path, write)


# ---- log -> PyTorch memory snapshot ---------------------------------------------------

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


# A day in microseconds: a time of day that goes back by more than half of it has passed midnight.
_DAY_US = 86_400_000_000


def _trace_times(events):
    """Each event's trace time: microseconds since the first event with a time (0 for an
    event without one). The events' time_us is a stamped log's Stamp // 1000, which only
    rises; else the Time column's time of day, in row order, which is time order: a time
    that goes back by more than 12 hours has passed midnight, so it and those after it get
    24 hours more, each time (taken as they were, a free past midnight came 24 hours
    before its allocation)."""
    times, start, previous, days = [], None, None, 0
    for *_, time_us in events:
        if time_us is None:
            times.append(0)
            continue
        if previous is not None and time_us < previous - _DAY_US // 2:
            days += 1
        previous = time_us
        time_us += days * _DAY_US
        start = time_us if start is None else start
        times.append(time_us - start)
    return times


class _LiveBlocks:
    """The live blocks of each inferred segment, by address, so that an allocation that
    overlaps a live block is refused: the snapshot's segments are tiled by their blocks,
    which no two overlapping ones can do. mrstack's reader keeps pointers, not ranges, and
    takes such a log (a lost free, or allocations from two layers of one stack logged into
    one file); drawn, it had blocks on top of each other and inactive gaps inside live
    blocks."""

    def __init__(self, starts, source):
        self.starts, self.source = starts, source
        self.by_segment = {}  # segment index -> sorted addresses of its live blocks

    def add(self, live, line, address, size):
        """Books a live block; `live` maps address -> (size, stream, line) of every live one."""
        blocks = self.by_segment.setdefault(bisect.bisect_right(self.starts, address) - 1, [])
        i = bisect.bisect_left(blocks, address)
        for other in blocks[max(i - 1, 0):i + 1]:  # live blocks never overlap: the neighbours suffice
            other_size, _, other_line = live[other]
            if other < address + size and address < other + other_size:
                raise ConversionError(
                    f"{self.source}:{line}: allocate of {_hex(address)} ({size} bytes) overlaps the block of "
                    f"{other_size} bytes at {_hex(other)} that line {other_line} allocated and no line freed since: "
                    "a memory snapshot cannot hold overlapping blocks (did the log lose a free, or mix two layers?)")
        blocks.insert(i, address)

    def remove(self, address):
        blocks = self.by_segment[bisect.bisect_right(self.starts, address) - 1]
        del blocks[bisect.bisect_left(blocks, address)]


def _end_segments(segments, segment_stream, live, device):
    """The snapshot's segments at the end of the log: each with its live allocations as
    active_allocated blocks and the gaps as inactive ones (0-byte blocks have no place)."""
    snapshot_segments = []
    for k, (seg_start, seg_end) in enumerate(segments):
        blocks, cursor, active = [], seg_start, 0
        for address in sorted(a for a, (size, *_) in live.items() if size and seg_start <= a < seg_end):
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
    return snapshot_segments


def log_to_memory_viz(events, device=0, device_count=None, source="<log>"):
    """The snapshot dict (``torch.cuda.memory._snapshot()`` layout) of a log's events
    (read_log_events'), with what was counted. A 0-byte allocation is counted and paired
    with its free, but has no trace entry or block (the viewer draws none). An allocation
    that overlaps a live block is a ConversionError naming `source` and both lines."""
    # Checked first: device_traces gets one list per device up to this one (a negative one
    # indexed an empty list; a huge one built billions of lists). device_count alike: a
    # negative one was ignored, and 10**9 built a billion lists.
    device = _checked_device(device, "log_to_memory_viz: device")
    if not 0 <= device <= MAX_TORCH_DEVICE:
        raise ConversionError(f"--device {device}: PyTorch's device indices are 0 to {MAX_TORCH_DEVICE}")
    if device_count is not None:
        device_count = _checked_device(device_count, "log_to_memory_viz: device_count")
        if not 0 <= device_count <= MAX_TORCH_DEVICE + 1:
            raise ValueError(f"log_to_memory_viz: device_count {device_count} is outside 0 to {MAX_TORCH_DEVICE + 1} "
                             f"(PyTorch's device indices are 0 to {MAX_TORCH_DEVICE})")
    segments = _infer_segments(events)
    starts = [start for start, _ in segments]
    blocks = _LiveBlocks(starts, source)
    announced = set()
    segment_stream = {}
    trace, live = [], {}
    allocations = frees = failures = unpaired = 0
    for (line, kind, address, size, stream, _), when in zip(events, _trace_times(events)):
        entry = {"addr": address, "size": size, "stream": stream, "time_us": when, "frames": []}
        if kind == "failure":
            trace.append(dict(entry, action="oom", addr=0, device_free=0))
            failures += 1
        elif kind == "allocate":
            allocations += 1
            if size:
                blocks.add(live, line, address, size)
            live[address] = (size, stream, line)
            if size == 0:
                # Nothing to draw (no block, no segment), but it is live: its free pairs with
                # it, not counted as a free without an allocation in the log.
                continue
            k = bisect.bisect_right(starts, address) - 1
            if k not in announced:
                announced.add(k)
                segment_stream[k] = stream
                seg_start, seg_end = segments[k]
                trace.append(dict(entry, action="segment_alloc", addr=seg_start, size=seg_end - seg_start))
            trace.append(dict(entry, action="alloc"))
        elif address in live:
            allocated, allocated_stream, _ = live.pop(address)
            if allocated:
                blocks.remove(address)
            frees += 1
            for action in ("free_requested", "free_completed") if allocated else ():
                trace.append(dict(entry, action=action, size=allocated, stream=allocated_stream))
        else:
            unpaired += 1
    count = max(device + 1, device_count or 0)
    traces = [[] for _ in range(count)]
    traces[device] = trace
    snapshot = {"segments": _end_segments(segments, segment_stream, live, device), "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                       "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                                       "pinned_use_host_register": False, "roundup_power2_divisions": {}}}
    return MemoryVizConversion(snapshot, allocations, frees, failures, unpaired)


def write_snapshot(snapshot, path):
    """Pickles `snapshot` to `path` atomically (as torch.cuda.memory._dump_snapshot does);
    "-" writes it to standard output, as the torch conversion's "-" does (it had made a
    file named "-")."""
    path = os.fsdecode(_checked_path(path, "write_snapshot: path"))
    # Pickled whole before anything is written: pickle.dump stopped half way through an
    # object it cannot pickle, with pickle's own error naming no file, and standard output,
    # a pipe or a device (written in place) had already taken the first part.
    where = "standard output" if path == "-" else path
    try:
        data = pickle.dumps(snapshot)
    except MemoryError:
        raise
    except RecursionError:
        raise ConversionError(f"{where}: cannot write the snapshot: it nests too deep to pickle") from None
    except Exception as e:  # PicklingError, TypeError, AttributeError: whatever an object's __reduce__ raises
        raise ConversionError(f"{where}: cannot write the snapshot: it cannot be pickled "
                              f"({type(e).__name__}: {e})") from e
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    _write_atomically(path, lambda f: f.write(data))


def _memory_viz_main(args):
    try:
        conversion = log_to_memory_viz(read_log_events(args.log), args.device, source=args.log)
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
    viz_parser.add_argument("-o", "--output", required=True, metavar="SNAPSHOT.pickle",
                            help="the snapshot to write (-: standard output)")
    viz_parser.add_argument("--device", type=int, default=0, metavar="N", help="the device the trace is for (default 0)")
    args = parser.parse_args(argv)
    source = args.log if args.source == "memory-viz" else args.snapshot
    if args.output != "-" and _is_same_file(source, args.output):
        # The input was read whole and then replaced: a log became a pickle, or the reverse.
        print(f"python -m mrstack.convert: error: -o {args.output} is the input itself: give the output its own path",
              file=sys.stderr)
        return 2
    if args.source == "memory-viz":
        return _memory_viz_main(args)
    try:
        snapshot = load_snapshot(args.snapshot)
        try:
            conversion = convert_torch_snapshot(snapshot, args.device)
        except ConversionError as e:  # its errors name the entry, not the file holding it
            raise ConversionError(f"{args.snapshot}: {e}") from None
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
