"""Reading allocation logs in Python, as mrstack-replay reads them: RMM's CSV (and the
logging adaptor's per-thread CSV with its Stamp column, merged by stamp), the logging
adaptor's binary records, plain or gzip-compressed, told apart by the content. Each row is
checked by the C++ reader's rules (src/log/allocation_log.cpp), and an error names the file
and the line. `python -m mrstack.convert memory-viz` is built on `read_log_events`.
"""
import bisect
import gzip
import heapq
import re
import struct
import time
import zlib

__all__ = ["HEADER", "ConversionError", "read_log_events"]

HEADER = "Thread,Time,Action,Pointer,Size,Stream"


class ConversionError(Exception):
    """The input cannot be converted; the message says what and where."""


def hex_text(value):
    """A pointer or stream as the logs write it: 0, or 0x and lower-case hex digits."""
    return "0" if value == 0 else f"0x{value & 0xFFFFFFFFFFFFFFFF:x}"


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
    bad = next((c for c in thread if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:  # (bytes that are not UTF-8 already failed to decode)
        raise ConversionError(f"{where}: bad Thread: byte 0x{ord(bad):02x} is not printable UTF-8 text: expected a "
                              "thread id")
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
    _check_pairs(path, events)
    return events


def _check_pairs(path, events):
    """mrstack's reader's rules for each pointer, in event order: no second allocation while
    it is live (the log lost a free: a snapshot would hold two blocks at one address), no
    second free, and a free's size is its allocation's. One difference, kept on purpose: a
    free of a pointer no earlier line allocated (a block allocated before recording began)
    is left out and counted by log_to_memory_viz, where mrstack-replay, which must replay
    every free, refuses the log."""
    live = {}   # address -> (line that allocated it, its size)
    freed = {}  # address -> (line that allocated it, line that freed it), until allocated again
    for line, kind, address, size, *_ in events:
        if kind == "allocate":
            if address in live:
                raise ConversionError(f"{path}:{line}: allocate of {hex_text(address)}, which is still live: line "
                                      f"{live[address][0]} allocated it and no line freed it since")
            live[address] = (line, size)
            freed.pop(address, None)
        elif kind == "free":
            if address in live:
                allocated_line, allocated_size = live.pop(address)
                if size != allocated_size:
                    raise ConversionError(f"{path}:{line}: free of {hex_text(address)} with Size {size}, but line "
                                          f"{allocated_line} allocated it with {allocated_size} bytes")
                freed[address] = (allocated_line, line)
            elif address in freed:
                allocated_line, freed_line = freed[address]
                raise ConversionError(f"{path}:{line}: free of {hex_text(address)}, which is not live: line "
                                      f"{allocated_line} allocated it and line {freed_line} already freed it")


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
