"""The fast way through a CSV allocation log for mrstack.log_events.read_log_events: the
text read in blocks (gzip inflated as it is read), whole blocks of lines matched by one
regular expression, the values kept in arrays, so a large log takes a fraction of the
row-by-row reader's time and memory.

It reads only what it can read exactly as the row-by-row reader does, and gives up
(raises Unusual) on anything else: a binary log, a file that is not a regular file, a
log past a limit, any error at all. read_log_events then reads the file row by row, which
gives the same events or raises the error with its message. So this module never words
an error: a log it finishes gives the events the row-by-row reader gives, and a log it
gives up on is read by that reader. A row outside the fast pattern (spaces around a
field, a (nil) pointer, a long fraction, non-ASCII thread) is read by the row-by-row
reader's own functions, one row at a time.
"""
import heapq
import itertools
import operator
import os
import re
import stat
import zlib
from array import array

from . import log_events as _rows

BLOCK_BYTES = 1 << 20          # read (and inflated) at a time
_FAST_LINE_BYTES = 4096        # no line the fast pattern takes is longer
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_ROW_BITS = 32                 # a row's index in a stamp-order key (a row takes 16 bytes or more)


class Unusual(Exception):
    """The log is not one this module reads; the row-by-row reader reads it."""


class BinaryLog(Unusual):
    """The log is a binary log (mrstack._binary_scan reads those)."""


# One row as the row-by-row reader takes it without a doubt: a printable ASCII Thread, a
# time of day with at most six decimals or a number of seconds, a known action, hex
# pointer and stream (0x or not, at most 16 digits, or (nil)), a size below 10^19, no
# spaces anywhere; any columns after the checked ones; a \r before the line's end.
_THREAD = rb"[!-+\--~]{1,200}"
_HEX = rb"(?:(?:0[xX])?([0-9a-fA-F]{1,16})|\(nil\))"
_HMS = rb"(?:[01]?[0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_TAIL = rb"(?:,[^\n]{0,1000})?\r?"
# Without a Stamp column: the Time column's whole part and fraction, action, pointer,
# size, stream.
_PLAIN = (rb"%s,(%s|[0-9]{1,18})(?:\.([0-9]{1,6}))?,(allocate failure|allocate|free),%s,([0-9]{1,19}),%s%s"
          % (_THREAD, _HMS, _HEX, _HEX, _TAIL))
# With one (the Time column checked, not read): thread, action, pointer, size, stream, stamp.
_STAMPED = (rb"(%s),(?:%s|[0-9]{1,40})(?:\.[0-9]{1,40})?,(allocate failure|allocate|free),%s,([0-9]{1,19}),%s,"
            rb"([0-9]{1,19})%s" % (_THREAD, _HMS, _HEX, _HEX, _TAIL))
_PATTERNS = {stamped: (re.compile(b"^" + line + b"$", re.MULTILINE), re.compile(line))
             for stamped, line in ((False, _PLAIN), (True, _STAMPED))}
_KIND = {b"allocate": 0, b"free": 1, b"allocate failure": 2}
_KIND_NAMES = ("allocate", "free", "failure")
_SLOW = 3                      # a row read by the row-by-row reader's functions


def read_events(path):
    """read_log_events' events of the log at `path`; Unusual where the row-by-row reader
    must read it (see the module's text)."""
    if _rows.MAX_LINE_BYTES < _FAST_LINE_BYTES or _rows.MAX_TEXT_BYTES > 16 << _ROW_BITS:
        raise Unusual("limits this module does not keep")
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_size > _rows.MAX_TEXT_BYTES + 4096:
                raise Unusual("not a regular file, or too large")
            first = f.read(max(BLOCK_BYTES, len(_GZIP_MAGIC)))
            blocks = _inflated(f, first) if first.startswith(_GZIP_MAGIC) else _plain(f, first)
            reader = _Reader(path)
            return reader.read(_pieces(blocks))
    except (OSError, _rows.ConversionError):
        raise Unusual("an error, worded by the row-by-row reader") from None


def _plain(f, first):
    yield first
    while True:
        block = f.read(BLOCK_BYTES)
        if not block:
            return
        yield block


def _inflated(f, data):
    """The text of every gzip stream in the file, one after another, in pieces; Unusual
    where the row-by-row reader's _gunzip raises."""
    at_end = False
    while True:
        while len(data) < 2 and not at_end:
            more = f.read(BLOCK_BYTES)
            at_end = not more
            data += more
        if not data:
            return
        if not data.startswith(_GZIP_MAGIC):
            raise Unusual("bytes after the gzip stream")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflater.eof:
            if not data:
                data = f.read(BLOCK_BYTES)
                if not data:
                    raise Unusual("cut short")
            try:
                piece = inflater.decompress(data, 8 * BLOCK_BYTES)
            except zlib.error:
                raise Unusual("damaged") from None
            data = inflater.unconsumed_tail
            if piece:
                yield piece
        data = inflater.unused_data + data


def _pieces(blocks):
    """The text in pieces of whole lines (the last may lack its newline), the byte order
    mark dropped; Unusual for a binary log, a NUL byte, a text over MAX_TEXT_BYTES or a
    line over MAX_LINE_BYTES."""
    carry, size, first = b"", 0, True
    for block in blocks:
        size += len(block)
        # A binary log is told before its NUL bytes are (its magic holds none).
        if first and (carry + block).startswith(_rows._BINARY_MAGIC):
            raise BinaryLog("a binary log")
        if size > _rows.MAX_TEXT_BYTES or b"\0" in block:
            raise Unusual("too large, or binary data")
        if first:
            carry += block
            if len(carry) < len(_rows._BINARY_MAGIC):
                continue
            block, carry, first = carry[3:] if carry.startswith(_BOM) else carry, b"", False
        end = block.rfind(b"\n") + 1
        if end == 0:
            carry += block
            if len(carry) > _rows.MAX_LINE_BYTES + 1:
                raise Unusual("a line too long")
            continue
        yield carry + block[:end] if carry else block[:end]
        carry = block[end:]
    if first and carry.startswith(_BOM):
        carry = carry[3:]
    if carry:
        yield carry


class _Reader:
    """One log's reading: its rows, then (with a Stamp column, in stamp order) its events
    checked as _EventChecks checks them."""

    def __init__(self, path):
        self.path = path
        self.stamped = None
        self.times = {}                     # a Time column's whole part -> microseconds
        self.sizes = {}                     # a Size's text -> its value, shared
        self.streams = {}                   # a Stream's text -> its value, shared

    def read(self, pieces):
        events = []
        produced = self._stamped_events() if self._header(pieces) else self._plain_events()
        self._check(produced, events)
        return events

    def _header(self, pieces):
        """Reads line 1 (the header) off the first piece; whether the log has a Stamp
        column. The rest of the pieces are left in self.rest."""
        piece = next(pieces, b"")
        end = piece.find(b"\n")
        line, piece = (piece, b"") if end < 0 else (piece[:end], piece[end + 1:])
        _, header = next(_rows._text_rows(self.path, line.decode("utf-8", "surrogateescape")))
        if header is None:
            raise Unusual("no header")
        self.stamped = _rows._checked_header(self.path, header)
        self.rest = itertools.chain((piece,), pieces)
        return self.stamped

    def _batches(self):
        """(rows, first line number, None) for each run of lines the fast pattern takes,
        rows a list of its groups; (None, line number, fields) for a line it does not take
        (fields as the row-by-row reader splits them; a blank line is left out)."""
        many, one = _PATTERNS[self.stamped]
        number = 2
        for piece in self.rest:
            if not piece:
                continue
            lines = piece.count(b"\n") + (not piece.endswith(b"\n"))
            rows = many.findall(piece)
            if len(rows) == lines:          # every line matched, in order
                yield rows, number, None
                number += lines
                continue
            batch = []
            for line in piece.split(b"\n")[:lines]:
                match = one.fullmatch(line)
                if match:
                    batch.append(match.groups(b""))
                else:
                    if batch:
                        yield batch, number - len(batch), None
                        batch = []
                    _, fields = next(_rows._text_rows(self.path, line.decode("utf-8", "surrogateescape")))
                    if fields is not None:
                        yield None, number, fields
                number += 1
            if batch:
                yield batch, number - len(batch), None

    # ---- without a Stamp column: events in file order ------------------------------------

    def _plain_events(self):
        times, sizes, streams, path, names = self.times, self.sizes, self.streams, self.path, _KIND_NAMES
        for rows, number, fields in self._batches():
            if rows is None:
                event = _rows._checked_event(path, number, fields)
                if event is not None:
                    yield event
                continue
            self._keep_caches_small()
            for whole, fraction, action, pointer, size, stream in rows:
                kind = _KIND[action]
                address = int(pointer, 16) if pointer else 0
                value = sizes.get(size)
                if value is None:
                    value = sizes[size] = int(size)
                if not address or (kind == 2 and not value):
                    if not value:                 # a no-op row, skipped
                        number += 1
                        continue
                    if kind != 2:
                        raise Unusual("a null pointer")
                handle = streams.get(stream)
                if handle is None:
                    handle = streams[stream] = int(stream, 16) if stream else 0
                base = times.get(whole)
                if base is None:
                    base = times[whole] = _rows._parse_time_us(whole.decode())
                yield number, names[kind], address, value, handle, base + int((fraction + b"000000")[:6])
                number += 1

    def _keep_caches_small(self):
        for cache in (self.times, self.sizes, self.streams):
            if len(cache) > 1 << 16:
                cache.clear()

    # ---- with a Stamp column: every row read, then merged by stamp -----------------------

    def _stamped_events(self):
        threads = {}            # thread -> keys: (stamp, not a free, row index) in one int
        kinds, addresses, sizes, handles, numbers = (array("B"), array("Q"), array("Q"), array("Q"), array("Q"))
        slow = {}               # row index -> (line number, fields) of a row read row by row
        streams = self.streams

        for rows, number, fields in self._batches():
            if rows is None:
                if len(fields) < 7 or _rows._decimal_field(fields[6]) is None:
                    raise Unusual("a row without its Stamp")
                index = len(kinds)
                slow[index] = (number, fields)
                key = (_rows._decimal_field(fields[6]) << 1 | (fields[2] != "free")) << _ROW_BITS | index
                threads.setdefault(fields[0].encode("utf-8", "surrogateescape"), []).append(key)
                kinds.append(_SLOW)
                for column in (addresses, sizes, handles, numbers):
                    column.append(0)
                continue
            index = len(kinds)
            for thread, action, pointer, size, stream, stamp in rows:
                kind = _KIND[action]
                keys = threads.get(thread)
                if keys is None:
                    keys = threads[thread] = []
                keys.append((int(stamp) << 1 | (kind != 1)) << _ROW_BITS | index)
                kinds.append(kind)
                addresses.append(int(pointer, 16) if pointer else 0)
                sizes.append(int(size))
                handle = streams.get(stream)
                if handle is None:
                    handle = streams[stream] = int(stream, 16) if stream else 0
                handles.append(handle)
                numbers.append(number)
                number += 1
                index += 1
        return self._merged(threads, (kinds, addresses, sizes, handles, numbers), slow)

    def _merged(self, threads, columns, slow):
        """The rows' events in stamp order (each thread's rows in file order, merged as
        _in_stamp_order merges them: heapq.merge by the same keys, or, when every thread's
        keys already rise, one sort, which gives the same order)."""
        kinds, addresses, sizes, handles, numbers = columns
        order = merged_keys(threads)
        mask, names, path, shared = (1 << _ROW_BITS) - 1, _KIND_NAMES, self.path, self.sizes
        for key in order:
            index, stamp = key & mask, key >> (_ROW_BITS + 1)
            kind = kinds[index]
            if kind == _SLOW:
                event = _rows._checked_event(path, *slow[index], stamp)
                if event is not None:
                    yield event
                continue
            address, size = addresses[index], sizes[index]
            if not address or (kind == 2 and not size):
                if not size:
                    continue                      # a no-op row, skipped
                if kind != 2:
                    raise Unusual("a null pointer")
            size = shared.setdefault(size, size) if len(shared) < 1 << 16 else size
            yield numbers[index], names[kind], address, size, handles[index], stamp // 1000

    def _check(self, produced, events):
        check_events(produced, events)


# ---- the checks of _EventChecks, on every event in order ---------------------------------

def merged_keys(threads):
    """Every thread's keys (a dict of lists, each in its thread's file order; emptied
    here), merged in key order: one sort when each thread's keys already rise, which
    gives the same order as heapq.merge, else heapq.merge (an iterator)."""
    runs = list(threads.values())
    threads.clear()
    if all(all(map(operator.le, keys, itertools.islice(keys, 1, None))) for keys in runs):
        order = list(itertools.chain.from_iterable(runs))
        runs.clear()
        order.sort()
        return order
    return heapq.merge(*runs)


def check_events(produced, events):
    """Appends each event to `events` after _EventChecks' checks (Unusual where one
    fails). A log's total allocated bytes are never below its live bytes, so the total
    alone is held to 2^64 - 1. The pointers freed and not allocated since are only
    needed for a free of a pointer that is not live: they are found then, from the
    events so far, and kept up to date from there on. A free's event shares its
    allocation's address."""
    streams, live, freed = set(), {}, None
    total, most, most_streams = 0, (1 << 64) - 1, _rows.MAX_STREAMS
    append = events.append
    for event in produced:
        line, kind, address, size, stream, _ = event
        if stream not in streams:
            if len(streams) == most_streams:
                raise Unusual("too many streams")
            streams.add(stream)
        if kind == "allocate":
            if address in live or total + size > most:
                raise Unusual("a live pointer allocated, or too many bytes")
            total += size
            live[address] = event
            if freed is not None:
                freed.discard(address)
        elif kind == "free":
            allocation = live.pop(address, None)
            if allocation is not None:
                if allocation[3] != size:
                    raise Unusual("a free of another size")
                event = (line, kind, allocation[2], size, stream, event[5])
            else:
                if freed is None:
                    freed = _freed(events)
                if address in freed:
                    raise Unusual("a second free")
            if freed is not None:
                freed.add(address)
        append(event)


def _freed(events):
    """The pointers the events free and do not allocate again after."""
    freed = set()
    for _, kind, address, *_ in events:
        if kind == "allocate":
            freed.discard(address)
        elif kind == "free":
            freed.add(address)
    return freed
