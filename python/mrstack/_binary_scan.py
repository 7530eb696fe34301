"""The fast way through a binary allocation log (include/mrstack/log/binary_log.hpp) for
mrstack.log_events.read_log_events: the records read as columns of 64-bit words (a
memoryview over the whole log, each column copied out of it in C), stamps and merge keys
made a run of one thread's records at a time, tick stamps converted a run at a time, and
no CSV text made or parsed, so a large log takes a fraction of the row-by-row reader's
time and memory.

As mrstack._log_scan does for CSV, it reads only what it can read exactly as the
row-by-row reader (log_events._binary_log_rows, then _read_row_by_row) does, and gives
up (raises Unusual) on anything else: any damaged block or header, a block not started
by a thread record, a null pointer, any failed check, a log whose CSV text might pass
MAX_TEXT_BYTES, a time zone with leap seconds (there a Time column can read :60, which
the row-by-row reader refuses). read_log_events then reads the file row by row, which
words the error. The only errors raised here are those of reading the file
(log_events._log_bytes), which the row-by-row reader raises first with the same words.
"""
import bisect
import itertools
import operator
import struct
import sys
import time
from array import array

from . import log_events as _rows
from ._log_scan import Unusual, check_events, merged_keys

_BLOCK_MAGIC = 0x4B4C4252
_THREAD = 3 << 62                      # a thread record's first word is at least this
_CHUNK = 1 << 16                       # records made into Python ints at a time
_ROW_BITS = 32                         # an event's index in a merge key
_KIND_NAMES = ("allocate", "failure", "free")  # by the record's kind (0, 1, 2)
# The longest CSV row log_events._binary_log_rows can make of one event: a 20-digit
# thread, the Time (15), "allocate failure", 0x and 16 hex digits, a 20-digit size, the
# stream as the pointer, a 19-digit stamp, six commas and the newline.
_ROW_MOST = 20 + 15 + 16 + 18 + 20 + 18 + 19 + 7
_LEAP_SECOND = 78796800                # 1972-06-30 23:59:60 UTC where leap seconds count


def read_events(path):
    """read_log_events' events of the binary log at `path`; Unusual where the row-by-row
    reader must read it (see the module's text)."""
    data = _rows._log_bytes(path)
    if not data.startswith(_rows._BINARY_MAGIC) or len(data) < 32 or sys.byteorder != "little":
        raise Unusual("not a binary log this module reads")
    if time.localtime(_LEAP_SECOND).tm_sec == 60:
        raise Unusual("a time zone with leap seconds")
    version, record_size, _, clock = struct.unpack_from("<IIqQ", data, 8)
    if version != 1 or record_size != 32 or clock not in (0, 1):
        raise Unusual("a header the row-by-row reader refuses")
    # Every block is 8-byte aligned in the file: one view of words reads all of them.
    words = memoryview(data)[:len(data) // 8 * 8].cast("Q")
    runs, points = _runs(data, words, clock)
    count = sum(run[1] for run in runs)
    if len(_rows.HEADER) + len(",Stamp\n") + count * _ROW_MOST > _rows.MAX_TEXT_BYTES or count >> _ROW_BITS:
        raise Unusual("the CSV text might pass the reader's limit")
    produced = _merged(words, runs, _RunScale(points) if clock == 1 else None)
    words.release()  # the columns are copies: the log's bytes are no longer needed
    del data
    events = []
    check_events(produced, events)
    return events


def _runs(data, words, clock):
    """([(first word, records, thread)] of each run of event records after a thread
    record, in file order; the (ticks, ns) points of the thread records). Unusual where
    _binary_log_rows raises."""
    runs, points, at, end = [], [], 32, len(data)
    while at < end:
        if end - at < 8:
            raise Unusual("cut short")
        magic, count = struct.unpack_from("<II", data, at)
        if magic != _BLOCK_MAGIC or count == 0 or count * 32 > end - at - 8:
            raise Unusual("a damaged block")
        first = (at + 8) // 8
        at += 8 + count * 32
        firsts = words[first:first + 4 * count:4]
        if firsts[0] < _THREAD:
            raise Unusual("a block that does not start with a thread record")
        threads = [0]
        if count > 1 and max(firsts[1:]) >= _THREAD:   # rare: threads sharing a buffer
            threads += [i for i in range(1, count) if firsts[i] >= _THREAD]
        for i, following in zip(threads, threads[1:] + [count]):
            record = first + 4 * i
            stamp, thread, size, stream = words[record] - _THREAD, words[record + 1], words[record + 2], words[record + 3]
            if stamp or (clock == 0 and (size or stream)):
                raise Unusual("a thread record with data it may not hold")
            if clock == 1 and size:
                points.append((size, stream))
            if following > i + 1:
                runs.append((record + 4, following - i - 1, thread))
    return runs, points


class _RunScale:
    """log_events._tick_scale, a run of ticks at a time: a run's ticks within one stretch
    between kept points are converted in one comprehension. A run that rises (as one
    thread's ticks do) is cut where it passes a kept point (one of each block that other
    threads wrote meanwhile); the ticks of a run that does not are converted by
    _tick_scale itself, one at a time."""

    def __init__(self, points):
        self.kept = _rows._kept_points(points)
        self.kept_ticks = [ticks for ticks, _ in self.kept]
        self.one = _rows._tick_scale(points)

    def __call__(self, ticks):
        kept = self.kept
        if len(kept) == 1:
            return [0] * len(ticks)
        kept_ticks = self.kept_ticks
        i, last = bisect.bisect_right(kept_ticks, min(ticks)), bisect.bisect_right(kept_ticks, max(ticks))
        if i == last:
            return self._stretch(i, ticks)
        if not all(map(operator.le, ticks, itertools.islice(ticks, 1, None))):
            return list(map(self.one, ticks))
        stamps, at = [], 0
        for stretch in range(i, last + 1):
            # The ticks below the stretch's end point (all that are left, in the last).
            end = len(ticks) if stretch == last else bisect.bisect_left(ticks, kept_ticks[stretch], at)
            if end > at:
                stamps += self._stretch(stretch, ticks[at:end])
            at = end
        return stamps

    def _stretch(self, i, ticks):
        """The ns of ticks that bisect_right puts at `i` in the kept ticks: between kept
        points i - 1 and i, or past the last at the rate from (0, 0) to it."""
        kept = self.kept
        (a_ticks, a_ns), (b_ticks, b_ns) = (kept[0], kept[-1]) if i == len(kept) else (kept[i - 1], kept[i])
        rise, run = b_ns - a_ns, b_ticks - a_ticks
        stamps = [a_ns + (t - a_ticks) * rise // run for t in ticks]
        # A damaged point's rate gives more than a record holds: clamped as _tick_scale does.
        if max(stamps) > _rows._STAMP_MAX:
            stamps = [min(stamp, _rows._STAMP_MAX) for stamp in stamps]
        return stamps


def _merged(words, runs, scale):
    """The events in the order _in_stamp_order gives their rows: each thread's events in
    file order, the threads merged by (stamp, not a free, line) — one sort of every key
    when each thread's keys already rise, which gives the same order, else heapq.merge
    by the same keys. A key is (stamp, not a free, event index) in one int."""
    firsts, pointers, sizes, streams = (array("Q") for _ in range(4))
    threads = {}
    index, mask = 0, (1 << 62) - 1
    for first, count, thread in runs:
        keys = threads.setdefault(thread, [])
        for start in range(0, count, _CHUNK):
            begin, stop = first + 4 * start, first + 4 * min(count, start + _CHUNK)
            for column, offset in ((firsts, 0), (pointers, 1), (sizes, 2), (streams, 3)):
                column.frombytes(words[begin + offset:stop + offset:4].tobytes())
            chunk = words[begin:stop:4].tolist()
            if scale is None:
                keys += [((w & mask) << 1 | (w >> 62 != 2)) << _ROW_BITS | i for i, w in enumerate(chunk, index)]
            else:
                stamps = scale([w & mask for w in chunk])
                keys += [(s << 1 | (w >> 62 != 2)) << _ROW_BITS | i
                         for i, (s, w) in enumerate(zip(stamps, chunk), index)]
            index += len(chunk)
    return _events(merged_keys(threads), (firsts, pointers, sizes, streams))


def _events(order, columns):
    """Each key's event as _checked_event makes it; Unusual for a row it refuses."""
    firsts, pointers, sizes, streams = columns
    mask, names, shared_sizes, shared_streams, most = (1 << _ROW_BITS) - 1, _KIND_NAMES, {}, {}, 1 << 16
    for key in order:
        index = key & mask
        kind, address, size = firsts[index] >> 62, pointers[index], sizes[index]
        if not address or (kind == 1 and not size):
            if not size:
                continue                      # a no-op row, skipped
            if kind != 1:
                raise Unusual("a null pointer")
        # Equal sizes and streams share one int (up to `most` of each), as the CSV
        # reader's events do.
        shared = shared_sizes.get(size)
        if shared is not None:
            size = shared
        elif len(shared_sizes) < most:
            shared_sizes[size] = size
        stream = streams[index]
        shared = shared_streams.get(stream)
        if shared is not None:
            stream = shared
        elif len(shared_streams) < most:
            shared_streams[stream] = stream
        yield index + 2, names[kind], address, size, stream, (key >> (_ROW_BITS + 1)) // 1000
