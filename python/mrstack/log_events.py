"""Reading allocation logs in Python, as mrstack-replay reads them: RMM's CSV (and the
logging adaptor's per-thread CSV with its Stamp column, merged by stamp), the logging
adaptor's binary records, plain or gzip-compressed, told apart by the content. Each row is
checked by the C++ reader's rules (src/log/allocation_log.cpp, src/log/log_file.cpp,
src/log/binary_log.cpp) and within its default bounds (MAX_TEXT_BYTES, MAX_LINE_BYTES,
MAX_STREAMS), and an error names the file and the line (or a binary log's byte offset).
`python -m mrstack.convert memory-viz` is built on `read_log_events`.
"""
import bisect
import heapq
import os
import re
import stat
import struct
import time
import zlib

__all__ = ["HEADER", "ConversionError", "read_log_events", "MAX_TEXT_BYTES", "MAX_LINE_BYTES", "MAX_STREAMS"]

HEADER = "Thread,Time,Action,Pointer,Size,Stream"

# The C++ reader's default bounds (log_limits, include/mrstack/log/allocation_log.hpp) and
# the width of its stream index: a log past them is refused there, so it is refused here.
MAX_TEXT_BYTES = 4 << 30   # the (decompressed) text, or a binary log's CSV text
MAX_LINE_BYTES = 64 << 10  # one line, its \r left out
MAX_STREAMS = 65535        # distinct Stream handles


class ConversionError(Exception):
    """The input cannot be converted; the message says what and where."""


def hex_text(value):
    """A pointer or stream as the logs write it: 0, or 0x and lower-case hex digits."""
    return "0" if value == 0 else f"0x{value & 0xFFFFFFFFFFFFFFFF:x}"


def _parse_time_us(text):
    """A Time field the reader takes (see _is_time) -> microseconds: since midnight for a
    time of day H:MM:SS[.f], since whatever origin the log counts from for a number of
    seconds (as mrstack.convert writes a PyTorch trace's times); None when unreadable. The
    fraction is rounded to the microsecond, in integers (no float rounding)."""
    match = _TIME.fullmatch(text.strip())
    if not match:
        return None
    hours, minutes, seconds, fraction = match.groups()
    whole = _digits_value(hours) if minutes is None else int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    micro = 0
    if fraction:
        # Half up at the seventh digit: the digits after it cannot change the microsecond
        # (and int() refuses more than 4300 digits, which a 64 KiB line can hold).
        fraction = fraction[:7]
        scale = 10 ** len(fraction)
        micro = (int(fraction) * 2_000_000 + scale) // (2 * scale)  # half up
    return whole * 1_000_000 + micro


def _digits_value(digits):
    """The value of a string of decimal digits, however long: the reader takes a number of
    seconds of any length (a line may hold 64 KiB), where int() refuses more than 4300
    digits (sys.get_int_max_str_digits) with a ValueError."""
    digits = digits.lstrip("0") or "0"
    value = 0
    for at in range(0, len(digits), 4000):
        chunk = digits[at:at + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


# The logging adaptor's binary records (include/mrstack/log/binary_log.hpp).
_BINARY_MAGIC = b"MRSTLOG\x01"
_BINARY_ACTIONS = ("allocate", "allocate failure", "free")
_STAMP_MAX = (1 << 62) - 1  # the largest stamp a record holds (its top two bits are the kind)


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
            yield at, word >> 62, word & _STAMP_MAX, pointer, size, stream, index == 0
            at += 32


def _tick_scale(points):
    """Tick stamps to nanoseconds exactly as the C++ reader converts them: piecewise linear
    through the kept points, past the last at the rate from (0, 0) to it. The points are
    (0, 0) and the (ticks, ns) ones sorted; each is kept when its ticks are past the last
    kept one's and its ns at least that one's (of equal ticks the smallest ns: points
    running backwards are left out). Integers, floored, then at most 2^62 - 1: a damaged
    point's rate gave times no record can hold (and Python's localtime an OverflowError)."""
    kept = _kept_points(points)
    kept_ticks = [ticks for ticks, _ in kept]

    def scale(ticks):
        if len(kept) == 1:
            return 0  # only the origin: no rate known
        i = bisect.bisect_right(kept_ticks, ticks)
        (a_ticks, a_ns), (b_ticks, b_ns) = (kept[0], kept[-1]) if i == len(kept) else (kept[i - 1], kept[i])
        return min(a_ns + (ticks - a_ticks) * (b_ns - a_ns) // (b_ticks - a_ticks), _STAMP_MAX)
    return scale


def _kept_points(points):
    """The points _tick_scale converts through, (0, 0) first, in order of ticks."""
    kept = [(0, 0)]
    for ticks, ns in sorted(points):
        if ticks > kept[-1][0] and ns >= kept[-1][1]:
            kept.append((ticks, ns))
    return kept


def _clock_text(wall_ns):
    """The Time column the C++ writer gives a wall-clock instant (src/adaptor/log_rows.hpp):
    the instant wrapped to a signed 64-bit value (a damaged start time wraps there, it does
    not stop the read), its floored second in local time, 00:00:00 where the C library
    cannot convert the second (as localtime_r's failure leaves it there)."""
    wall_ns = (wall_ns + (1 << 63)) % (1 << 64) - (1 << 63)
    seconds, ns = divmod(wall_ns, 1_000_000_000)
    try:
        hms = time.strftime("%H:%M:%S", time.localtime(seconds))
    except (OverflowError, ValueError, OSError):
        hms = "00:00:00"
    return f"{hms}.{ns // 1000:06d}"


def _binary_log_rows(path, data):
    """A binary log's rows as the CSV the adaptor writes in per-thread order would hold
    them (its header first). Raises ConversionError naming the byte offset, also when that
    CSV text would pass MAX_TEXT_BYTES (as the C++ reader counts it)."""
    def fail(offset, what):
        raise ConversionError(f"{path}: binary log, byte offset {offset}: {what}")
    if len(data) < 32:
        fail(0, f"cut short: the file header takes 32 bytes, the log has {len(data)}")
    version, record_size, start_wall_ns, clock = struct.unpack_from("<IIqQ", data, 8)
    # Each field at its own offset, as the C++ reader names them.
    if version != 1:
        fail(8, f"format version {version}; this reader reads version 1")
    if record_size != 32:
        fail(12, f"records of {record_size} bytes; version 1 records are 32")
    if clock not in (0, 1):
        fail(24, f"clock {clock:#x}: expected 0 (nanoseconds) or 1 (time-stamp counter ticks)")
    # Each record checked as its block is read, as the C++ reader's first pass does: listed
    # first, a damaged block after a bad thread record was named instead of the record.
    records = []
    for record in _binary_records(path, data):
        at, kind, stamp, _, size, stream, _ = record
        if kind == 3 and clock == 0 and (stamp or size or stream):
            fail(at, "a thread record with a stamp, size or stream (its fields after the id must be 0)")
        if kind == 3 and clock == 1 and stamp:
            fail(at, "a thread record with a stamp (its stamp field must be 0)")
        records.append(record)
    # Clock 1: stamps are time-stamp counter ticks; thread records carry (ticks, ns) points.
    scale = _tick_scale([(size, stream) for _, kind, _, _, size, stream, _ in records if kind == 3 and size]) \
        if clock == 1 else (lambda stamp: stamp)
    rows = [HEADER.split(",") + ["Stamp"]]
    used = len(HEADER) + len(",Stamp\n")
    thread = None
    for at, kind, stamp, pointer, size, stream, first in records:
        if kind == 3:
            thread = pointer
            continue
        if first:
            fail(at, "a block's first record must name its thread (kind 3)")
        stamp = scale(stamp)
        row = [str(thread), _clock_text(start_wall_ns + stamp), _BINARY_ACTIONS[kind],
               f"{pointer:#x}" if pointer else "(nil)", str(size), f"{stream:#x}" if stream else "0", str(stamp)]
        used += sum(map(len, row)) + len(row)  # the fields, their six commas and the newline
        if used > MAX_TEXT_BYTES:
            fail(at, f"the log's CSV text is larger than {MAX_TEXT_BYTES} bytes, the reader's limit")
        rows.append(row)
    return rows


# The log format as mrstack's C++ reader takes it (include/mrstack/log/allocation_log.hpp):
# the same rows must give the same events, or an error, on both sides.
_COLUMNS = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,16})")
_DECIMAL = re.compile(r"[0-9]+")
_TIME = re.compile(r"([0-9]+)(?::([0-9]{2}):([0-9]{2}))?(?:\.([0-9]+))?")
_ACTIONS = {"allocate": "allocate", "free": "free", "allocate failure": "failure"}
_GZIP_MAGIC = b"\x1f\x8b"


def _clip(text):
    """A field as an error message quotes it: at most 80 characters, as the C++ reader's
    (a field may be most of a 64 KiB line)."""
    return repr(text) if len(text) <= 80 else repr(text[:80]) + "..."


def _hex_field(text):
    """Hex with or without 0x (at most 16 digits), or glibc's (nil); None when malformed."""
    if text == "(nil)":
        return 0
    match = _HEX.fullmatch(text)
    return int(match.group(1), 16) if match else None


def _decimal_field(text):
    """Decimal digits only (no sign, no '_', no spaces inside), below 2^64; else None.
    Leading zeros are taken, as std::from_chars takes them, however many; more than 20
    significant digits are past 2^64 (and int() refused them past 4300, a ValueError)."""
    if not _DECIMAL.fullmatch(text):
        return None
    significant = text.lstrip("0")
    return int(significant or "0") if len(significant) <= 20 and int(significant or "0") < 1 << 64 else None


def _is_time(text):
    """H:MM:SS[.f] (hours 0-23, minutes and seconds 0-59) or a number of seconds."""
    match = _TIME.fullmatch(text)
    if not match:
        return False
    hours, minutes, seconds, _ = match.groups()
    return minutes is None or (len(hours) <= 2 and int(hours) < 24 and int(minutes) < 60 and int(seconds) < 60)


def _too_big(path):
    return ConversionError(f"{path}: the log's text is larger than {MAX_TEXT_BYTES} bytes, the reader's limit")


def _gunzip(path, data):
    """Every gzip stream in `data` inflated, one after another, as mrstack's reader does
    (src/log/log_file.cpp): bytes after the last stream that do not start another stream
    are an error (gzip.decompress skipped trailing zeros, so a damaged file read as whole),
    and so is a text over MAX_TEXT_BYTES."""
    pieces, size, at = [], 0, 0
    while at < len(data):
        if not data.startswith(_GZIP_MAGIC, at):
            raise ConversionError(f"{path}: {len(data) - at} bytes of trailing garbage after the gzip stream, at "
                                  f"byte offset {at} of the file")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = memoryview(data)[at:]
        while not inflater.eof:
            if not pending:
                raise ConversionError(f"{path}: cannot read it: the compressed log is damaged or cut short "
                                      "(unexpected end of file)")
            try:
                # At most one byte past the limit: the text is never held past it.
                piece = inflater.decompress(pending, MAX_TEXT_BYTES - size + 1)
            except zlib.error as e:
                raise ConversionError(f"{path}: cannot read it: the compressed log is damaged ({e})") from None
            size += len(piece)
            if size > MAX_TEXT_BYTES:
                raise _too_big(path)
            pieces.append(piece)
            pending = inflater.unconsumed_tail
        at = len(data) - len(inflater.unused_data)
    return b"".join(pieces)


def _log_rows(path):
    """(line number, fields, or None for a blank line) of every line of a log file: its
    bytes gunzipped when they start as gzip does, a binary log read as its CSV rows, else
    CSV text (a byte order mark skipped). Bytes that are not UTF-8 are kept as surrogate
    escapes: only the Thread column must be UTF-8 (checked where a row is read), as in
    the C++ reader. Raises ConversionError naming the file."""
    data = _log_bytes(path)
    if data.startswith(_BINARY_MAGIC):
        return enumerate(_binary_log_rows(path, data), start=1)
    if len(data) > MAX_TEXT_BYTES:
        raise _too_big(path)
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise ConversionError(f"{path}:{line}: a NUL byte at byte offset {nul} of "
                              "the text: the log holds binary data, expected CSV text (or gzip-compressed CSV)")
    if not data:
        return iter(())
    return _text_rows(path, data.decode("utf-8-sig", "surrogateescape"))


def _no_memory(path):
    return ConversionError(f"{path}: the log does not fit in this process's memory (its text may be up to "
                           f"{MAX_TEXT_BYTES} bytes, the reader's limit)")


def _stream_bytes(f):
    """What a pipe or device holds, up to MAX_TEXT_BYTES + 4097 bytes, read a block at a
    time: plain text stops at its first NUL (the error _log_rows reports), so /dev/zero or
    /dev/urandom is refused at once, where 4 GiB of it had been read first (or the reading
    ended in a MemoryError)."""
    blocks, size = [], 0
    while size <= MAX_TEXT_BYTES + 4096:
        block = f.read(min(1 << 20, MAX_TEXT_BYTES + 4097 - size))
        if not block:
            break
        blocks.append(block)
        size += len(block)
        first = blocks[0]
        if not first.startswith(_GZIP_MAGIC) and not first.startswith(_BINARY_MAGIC[:len(first)]) and b"\0" in block:
            break
    return b"".join(blocks)


def _log_bytes(path):
    """A log file's bytes, gunzipped when they start as gzip does; ConversionError naming
    the file when it cannot be read or is past MAX_TEXT_BYTES."""
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if stat.S_ISREG(status.st_mode):
                # Past the limit by its size: it had been read, 4 GiB of it, only to be refused.
                if status.st_size > MAX_TEXT_BYTES + 4096:
                    raise _too_big(path)
                data = f.read(MAX_TEXT_BYTES + 4097)
            else:
                data = _stream_bytes(f)
    except FileNotFoundError:
        raise ConversionError(f"{path}: no such file") from None
    except OSError as e:
        raise ConversionError(f"{path}: cannot read it ({e})") from None
    except MemoryError:
        raise _no_memory(path) from None
    # The compressed form is never larger than its text by more than gzip's headers.
    if len(data) > MAX_TEXT_BYTES + 4096:
        raise _too_big(path)
    # Compressed or not by the content, as mrstack's reader decides (not by the name: a
    # gzip file named .csv, or a plain one named .gz, is read there, so it is here).
    if data.startswith(_GZIP_MAGIC):
        data = _gunzip(path, data)
    return data


def _text_rows(path, text):
    """(line number, fields or None) of each line, split as the C++ reader splits them:
    at every comma (no quoting), each field trimmed of spaces and tabs, a line's \\r
    dropped; None for a blank line. A line over MAX_LINE_BYTES is an error, raised when
    the reading reaches it, as the C++ reader's is (after the errors of the rows above
    it, in a log without a Stamp column)."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        # Counted in bytes: a character is at most four, so only a long line needs encoding.
        if len(line) * 4 > MAX_LINE_BYTES and len(line.encode("utf-8", "surrogateescape")) > MAX_LINE_BYTES:
            raise ConversionError(f"{path}:{number}: the line is {len(line.encode('utf-8', 'surrogateescape'))} "
                                  f"bytes long, more than the reader's limit of {MAX_LINE_BYTES}; it starts: "
                                  f"{line[:200]!r}")
        yield number, ([field.strip(" \t") for field in line.split(",")] if line.strip(" \t") else None)


def _checked_header(path, header):
    """Whether the log has the Stamp column; a header the C++ reader refuses is an error."""
    for i, name in enumerate(_COLUMNS):
        if i >= len(header) or header[i].lower() != name.lower():
            found = header[i] if i < len(header) else "nothing"
            raise ConversionError(f"{path}:1: header column {i + 1} is {_clip(found)}, expected {name!r}: the header "
                                  f"must start with {HEADER}")
    return len(header) > 6 and header[6].lower() == "stamp"


def _bad_thread_byte(thread):
    """The first byte that keeps a Thread from being printable UTF-8 (a control character,
    or a byte the decoding kept as a surrogate escape), or None."""
    for c in thread:
        code = ord(c)
        if code < 0x20 or code == 0x7F:
            return code
        if 0xDC80 <= code <= 0xDCFF:
            return code - 0xDC00
    return None


def _checked_event(path, number, row, stamp=None):
    """One row's event (line, kind, address, size, stream, time_us), checked as the C++
    reader checks it; None for a row that reader skips: a null-pointer row of size 0, an
    allocate failure of 0 bytes (a refusal of nothing). time_us: the Stamp // 1000 when the
    log has a Stamp column (`stamp`), else the Time column (see _parse_time_us)."""
    where = f"{path}:{number}"
    if len(row) < 6:
        raise ConversionError(f"{where}: {len(row)} fields, expected 6 ({HEADER})")
    thread, time_text, action, pointer, size_text, stream_text = row[:6]
    if not thread:
        raise ConversionError(f"{where}: the Thread column is empty: expected a thread id")
    bad = _bad_thread_byte(thread)
    if bad is not None:
        raise ConversionError(f"{where}: bad Thread: byte 0x{bad:02x} is not printable UTF-8 text: expected a "
                              "thread id")
    if not _is_time(time_text):
        raise ConversionError(f"{where}: bad Time {_clip(time_text)}: expected a time of day such as 01:00:00.000123 "
                              "(hours 0-23, minutes and seconds 0-59) or a number of seconds")
    kind = _ACTIONS.get(action)
    if kind is None:
        raise ConversionError(f"{where}: unknown action {_clip(action)} (expected allocate, free or allocate failure)")
    address, size, stream = _hex_field(pointer), _decimal_field(size_text), _hex_field(stream_text)
    if address is None:
        raise ConversionError(f"{where}: bad Pointer {_clip(pointer)}: expected a hexadecimal address (with or "
                              "without 0x)")
    if size is None:
        raise ConversionError(f"{where}: bad Size {_clip(size_text)}: expected a number of bytes (decimal digits, "
                              "below 2^64)")
    if stream is None:
        raise ConversionError(f"{where}: bad Stream {_clip(stream_text)}: expected a hexadecimal stream handle")
    if kind == "failure" and size == 0:
        return None  # a refusal of nothing: no allocator refuses it, whatever its Pointer
    if kind != "failure" and address == 0:
        if size == 0:
            return None  # an allocation of nothing, or a free of nullptr: a no-op
        raise ConversionError(f"{where}: a{'' if kind == 'free' else 'n'} {action} row of {size} bytes has a null "
                              "Pointer")
    time_us = stamp // 1000 if stamp is not None else _parse_time_us(time_text)
    return number, kind, address, size, stream, time_us


def read_log_events(path):
    """The events of an allocation log: (line, action, address, size, stream, time_us)
    with action "allocate", "free" or "failure", in the order mrstack's reader takes them.
    time_us: microseconds, the Stamp // 1000 in a log with a Stamp column (a binary log
    has one), else the Time column's (a time of day wraps at midnight). Raises
    ConversionError naming the line. A binary log (the logging adaptor's ``binary``
    format) reads as its CSV rows. The rows are read and checked as mrstack's C++ reader
    reads them (header names without case, a byte order mark skipped, fields split at
    every comma and trimmed, numbers strict), each row's checks and those of the events
    before it (see _EventChecks) in that order, so an error names the line it names.
    A CSV log is read in blocks by mrstack._log_scan, a binary log a column at a time by
    mrstack._binary_scan; both give the same events, and a log either gives up on (any
    error) is read row by row, here."""
    from . import _binary_scan, _log_scan
    from ._files import checked_path
    checked_path(path, "read_log_events: path")
    try:
        try:
            return _log_scan.read_events(path)
        except _log_scan.BinaryLog:
            try:
                return _binary_scan.read_events(path)
            except _log_scan.Unusual:
                pass
        except _log_scan.Unusual:
            pass
        return _read_row_by_row(path)
    except MemoryError:  # a log within the limits, but not within this machine's memory
        raise _no_memory(path) from None


def _read_row_by_row(path):
    """read_log_events, one row at a time: the reference the block reader keeps to, and
    the reader of every log it gives up on (all errors are worded here)."""
    rows = _log_rows(path)
    number, header = next(rows, (None, None))
    if number is None:
        raise ConversionError(f"{path}: empty, expected the header {HEADER}")
    if header is None:
        raise ConversionError(f"{path}:1: a blank line, expected the header {HEADER}")
    has_stamp = _checked_header(path, header)
    rows = ((number, fields) for number, fields in rows if fields is not None)
    ordered = _in_stamp_order(path, rows) if has_stamp else ((number, fields, None) for number, fields in rows)
    checks = _EventChecks(path)
    events = []
    for number, fields, stamp in ordered:
        event = _checked_event(path, number, fields, stamp)
        if event is not None:
            checks.add(event)
            events.append(event)
    return events


class _EventChecks:
    """mrstack's reader's checks on the events, one at a time in the order it takes them:
    at most MAX_STREAMS distinct streams (failures' included), then per pointer (see
    `pair`)."""

    def __init__(self, path):
        self.path = path
        self.streams = set()
        self.live = {}   # address -> (line that allocated it, its size)
        # address -> (line that allocated it, or None before the log, line that freed it),
        # until allocated again
        self.freed = {}
        self.live_bytes = 0
        self.total_bytes = 0

    def add(self, event):
        line, kind, address, size, stream, _ = event
        if stream not in self.streams:
            if len(self.streams) == MAX_STREAMS:
                raise ConversionError(f"{self.path}:{line}: the log uses more than {MAX_STREAMS} streams")
            self.streams.add(stream)
        if kind != "failure":
            self.pair(line, kind, address, size)

    def pair(self, line, kind, address, size):
        """No second allocation of a live pointer (the log lost a free: a snapshot would
        hold two blocks at one address), live bytes and the log's total allocated bytes
        within 2^64 - 1 (a wrapped sum reports nonsense), no second free, and a free's
        size is its allocation's. One difference, kept on purpose: a free of a pointer no
        earlier line allocated (a block allocated before recording began) is left out and
        counted by log_to_memory_viz, where mrstack-replay, which must replay every free,
        refuses the log. Such a free is booked too: a second free of that pointer (with no
        allocation between) is refused, as any second free is."""
        where = f"{self.path}:{line}"
        if kind == "allocate":
            if address in self.live:
                raise ConversionError(f"{where}: allocate of {hex_text(address)}, which is still live: line "
                                      f"{self.live[address][0]} allocated it and no line freed it since")
            if max(self.live_bytes, self.total_bytes) + size > (1 << 64) - 1:
                raise ConversionError(f"{where}: with this allocation of {size} bytes the log's bytes would pass "
                                      "2^64 - 1: the sizes are absurd")
            self.live_bytes += size
            self.total_bytes += size
            self.live[address] = (line, size)
            self.freed.pop(address, None)
        elif address in self.live:
            allocated_line, allocated_size = self.live[address]
            if size != allocated_size:
                raise ConversionError(f"{where}: free of {hex_text(address)} with Size {size}, but line "
                                      f"{allocated_line} allocated it with {allocated_size} bytes")
            del self.live[address]
            self.live_bytes -= size
            self.freed[address] = (allocated_line, line)
        elif address in self.freed:
            allocated_line, freed_line = self.freed[address]
            allocated = (f"line {allocated_line} allocated it" if allocated_line is not None else
                         "no line allocated it (a block allocated before the log began)")
            raise ConversionError(f"{where}: free of {hex_text(address)}, which is not live: {allocated} and line "
                                  f"{freed_line} already freed it")
        else:
            self.freed[address] = (None, line)  # left out by log_to_memory_viz, but freed once only


def _check_pairs(path, events):
    """The per-pointer checks (_EventChecks.pair) over `events`, in their order."""
    checks = _EventChecks(path)
    for line, kind, address, size, *_ in events:
        if kind != "failure":
            checks.pair(line, kind, address, size)


def _in_stamp_order(path, rows):
    """(line, fields, stamp) of a log in per-thread order (a Stamp column), in the order
    mrstack's reader takes them: every row read first, each must have its Stamp; then
    each thread's rows in file order, the threads merged by stamp, a free before another
    thread's allocation at equal stamps (as the logging adaptor's merged writer orders
    them). Every row takes part, null and allocate failure rows too, and is checked (or
    skipped) only in this order: left out before the merge, a skipped row let its
    thread's next row move ahead of other threads' rows, so the order differed."""
    by_thread = {}
    for number, fields in rows:
        if len(fields) < 7:
            raise ConversionError(f"{path}:{number}: {len(fields)} fields, expected 7 ({HEADER},Stamp)")
        stamp = _decimal_field(fields[6])
        if stamp is None:
            raise ConversionError(f"{path}:{number}: bad Stamp {_clip(fields[6])}: expected nanoseconds (decimal "
                                  "digits)")
        by_thread.setdefault(fields[0], []).append((stamp, fields[2] != "free", number, fields))
    for stamp, _, number, fields in heapq.merge(*by_thread.values(), key=lambda row: row[:3]):
        yield number, fields, stamp
