"""The binary log reader (mrstack._binary_scan) against the row-by-row reader it stands in
for (log_events._read_row_by_row, through _binary_log_rows): the same events for every
binary log it reads, and Unusual (so read_log_events words the error row by row) for
every log it does not. The logs are generated: both clocks, threads sharing blocks, tick
points running backwards, stamps running backwards, failures, null pointers, damaged
bytes, cut-short files, gzip."""
import gzip
import random
import time

import pytest

from mrstack import _binary_scan, _log_scan, log_events
from mrstack.convert import ConversionError, read_log_events
from log_fixtures import binary_log, row_by_row, write

STAMP_MAX = (1 << 62) - 1
READ = {}   # (clock, valid) -> how many of the random logs


def fast(path):
    try:
        return "events", _binary_scan.read_events(path)
    except _log_scan.Unusual:
        return "unusual", None
    except ConversionError as e:
        return "error", str(e)


def public(path):
    try:
        return "events", read_log_events(path)
    except ConversionError as e:
        return "error", str(e)


def assert_alike(path):
    """read_log_events gives the row-by-row reading; the fast reader gives it too, or
    gives up. Returns (whether the row-by-row reader read events, whether the fast reader
    read the log)."""
    expected = row_by_row(path)
    assert public(path) == expected
    got = fast(path)
    if got[0] != "unusual":
        assert got == expected
    return expected[0] == "events", got[0] == "events"


def random_log(rng, clock, damage):
    """(blocks, start wall ns) of a random binary log, valid unless `damage`: each
    thread's records in its own blocks (now and then two threads in one), its stamps
    mostly rising; with the tick clock, (ticks, ns) points in the thread records."""
    threads = rng.sample(range(1, 1 << 20), rng.randrange(1, 5)) + ([1 << 63] if rng.random() < 0.1 else [])
    live, freed = {}, []
    pointers = [0x1000 * rng.randrange(1, 64) for _ in range(40)] + [(1 << 64) - 4096]
    streams = [0, 0x10, 0x20, (1 << 64) - 1]
    stamp = rng.randrange(0, 1000)                       # one clock: the threads' stamps agree
    blocks = []
    rate = rng.choice((1, 3, 7))                         # ticks per ns, roughly
    for _ in range(rng.randrange(1, 12)):
        block = []
        for _ in range(rng.choice((1, 1, 2))):           # threads sharing a buffer
            thread = rng.choice(threads)
            if clock == 1:
                ticks = 0 if rng.random() < 0.2 else rng.randrange(1, 10**7)
                point = (ticks, ticks // rate + rng.randrange(-50, 50) if ticks else 0)
                point = (point[0], max(point[1], 0))
            else:
                point = (0, 0)
            block.append((3, 0, thread) + point)
            for _ in range(rng.randrange(0, 30)):
                stamp += rng.choice((0, 1, 5, 100, 1000))
                back = 2000 if rng.random() < 0.03 else 0     # a stamp running backwards
                when = max(0, stamp - back) * (1 if clock == 0 else rate)
                roll = rng.random()
                if live and roll < 0.4:
                    pointer = rng.choice(sorted(live))
                    block.append((2, when, pointer, live.pop(pointer), rng.choice(streams)))
                    freed.append(pointer)
                elif roll < 0.45:
                    block.append((1, when, rng.choice((0, 0x1000)), rng.choice((0, 1 << 40)), rng.choice(streams)))
                elif roll < 0.48:
                    block.append((rng.choice((0, 2)), when, 0, 0, 0))       # a no-op row
                else:
                    pointer = rng.choice([p for p in pointers if p not in live] or [0x999000])
                    live[pointer] = rng.choice((1, 256, 4096, (1 << 40) + 3))
                    block.append((0, when, pointer, live[pointer], rng.choice(streams)))
        blocks.append(block)
    if damage:
        kind = rng.randrange(6)
        target = rng.choice(blocks)
        at = rng.randrange(len(target))
        record = list(target[at])
        if kind == 0:
            record[2] = 0                                # a null pointer (an error unless size 0)
        elif kind == 1:
            record[0] = rng.randrange(4)                 # another kind: a block's first not a thread
        elif kind == 2:
            record[3] = rng.choice((0, 1, live.get(record[2], 1) + 1))
        elif kind == 3:
            record[1] = rng.randrange(0, 3)              # a thread record with a stamp
        elif kind == 4 and freed:
            target.append((2, record[1], rng.choice(freed), 1, 0))  # a second free, maybe
        else:
            record[4] = rng.choice(streams) ^ 1
        target[at] = tuple(record)
    return blocks, rng.choice((0, 1_700_000_000_123_456_789, -5, (1 << 63) - 10**9))


@pytest.mark.parametrize("seed", range(300))
def test_random_logs_read_alike(tmp_path, seed):
    rng = random.Random(seed)
    clock = seed % 2
    blocks, wall = random_log(rng, clock, damage=seed % 3 == 2)
    data = binary_log(blocks, start_wall_ns=wall, clock=clock)
    valid, read = assert_alike(write(tmp_path, "log.bin", data))
    assert read == valid, "the fast reader gave up on a valid log"
    READ[clock, valid] = READ.get((clock, valid), 0) + 1
    assert_alike(write(tmp_path, "log.bin.gz", gzip.compress(data)))
    # Cut short anywhere, a byte changed anywhere, and gzip cut short.
    assert_alike(write(tmp_path, "cut.bin", data[:rng.randrange(len(data))]))
    changed = bytearray(data)
    changed[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    assert_alike(write(tmp_path, "changed.bin", bytes(changed)))
    packed = gzip.compress(data)
    assert_alike(write(tmp_path, "cut.bin.gz", packed[:rng.randrange(len(packed))]))


def test_the_random_logs_are_valid_and_not_on_both_clocks():
    """Most random logs are valid, and some are not, on each clock (run after them)."""
    if len(READ) < 4:
        pytest.skip("the random logs were not all read")
    assert all(READ[clock, True] > READ[clock, False] > 10 for clock in (0, 1)), READ


def test_valid_logs_are_read_without_the_row_by_row_reader(tmp_path, monkeypatch):
    """read_log_events reads a binary log (plain and gzip) the fast way, not row by row."""
    rng = random.Random(7)
    paths = []
    for clock in (0, 1):
        expected = ("error",)
        while expected[0] != "events" or len(expected[1]) < 20:   # a valid log of some length
            blocks, wall = random_log(rng, clock, damage=False)
            data = binary_log(blocks, start_wall_ns=wall, clock=clock)
            expected = row_by_row(write(tmp_path, f"{clock}.bin", data))
        expected = expected[1]
        paths.append((write(tmp_path, f"{clock}.bin.gz", gzip.compress(data)), expected))
        paths.append((str(tmp_path / f"{clock}.bin"), expected))

    def no_rows(path):
        raise AssertionError(f"{path} read row by row")
    monkeypatch.setattr(log_events, "_read_row_by_row", no_rows)
    for path, expected in paths:
        assert read_log_events(path) == expected


@pytest.mark.parametrize("name, blocks, clock", [
    ("cut_header.bin", None, 0),
    ("no_thread.bin", [[(0, 5, 0x1000, 16, 0)]], 0),
    ("thread_stamp.bin", [[(3, 5, 7, 0, 0), (0, 5, 0x1000, 16, 0)]], 1),
    ("thread_size.bin", [[(3, 0, 7, 9, 0), (0, 5, 0x1000, 16, 0)]], 0),
    ("null.bin", [[(3, 0, 7, 0, 0), (0, 5, 0, 16, 0)]], 0),
    ("null_free.bin", [[(3, 0, 7, 0, 0), (2, 5, 0, 16, 0)]], 0),
    ("live.bin", [[(3, 0, 7, 0, 0), (0, 5, 0x1000, 16, 0), (0, 6, 0x1000, 16, 0)]], 0),
    ("second_free.bin", [[(3, 0, 7, 0, 0), (2, 5, 0x1000, 16, 0)], [(3, 0, 8, 0, 0), (2, 6, 0x1000, 16, 0)]], 0),
    ("size.bin", [[(3, 0, 7, 0, 0), (0, 5, 0x1000, 16, 0), (2, 6, 0x1000, 17, 0)]], 0),
    ("bytes.bin", [[(3, 0, 7, 0, 0), (0, 5, 0x1000, 1 << 63, 0), (0, 6, 0x2000, 1 << 63, 0)]], 0),
])
def test_each_error_is_the_row_by_row_readers(tmp_path, name, blocks, clock):
    data = b"MRSTLOG\x01\x01\0\0\0" if blocks is None else binary_log(blocks, clock=clock)
    for path in (write(tmp_path, name, data), write(tmp_path, name + ".gz", gzip.compress(data))):
        expected = row_by_row(path)
        assert expected[0] == "error"
        assert fast(path)[0] == "unusual"
        assert public(path) == expected


@pytest.mark.parametrize("header, named", [
    ((2, 32, 0), "format version 2"), ((1, 16, 0), "records of 16 bytes"), ((1, 32, 2), "clock 0x2"),
])
def test_a_header_error_is_the_row_by_row_readers(tmp_path, header, named):
    version, record_size, clock = header
    data = b"MRSTLOG\x01" + version.to_bytes(4, "little") + record_size.to_bytes(4, "little") + bytes(8) + \
        clock.to_bytes(8, "little") + binary_log([[(3, 0, 7, 0, 0), (0, 5, 0x1000, 16, 0)]])[32:]
    path = write(tmp_path, "header.bin", data)
    assert fast(path)[0] == "unusual"
    assert named in public(path)[1] and public(path) == row_by_row(path)


def test_file_errors_are_worded_as_the_row_by_row_readers(tmp_path):
    """The errors of reading the file come from the same function, first on both sides."""
    missing = str(tmp_path / "missing.bin")
    garbage = write(tmp_path, "garbage.bin.gz", gzip.compress(binary_log([[(3, 0, 7, 0, 0)]])) + b"xy")
    for path in (missing, garbage):
        assert fast(path) == row_by_row(path) == public(path)
        assert fast(path)[0] == "error"


def test_a_log_whose_text_may_pass_the_limit_is_read_row_by_row(tmp_path, monkeypatch):
    rows = [(3, 0, 7, 0, 0)] + [(0, i, 0x1000 * (i + 1), 16, 0) for i in range(40)]
    path = write(tmp_path, "big.bin", binary_log([rows]))
    monkeypatch.setattr(log_events, "MAX_TEXT_BYTES", 1000)   # the text is about 2400 bytes
    assert fast(path)[0] == "unusual"
    assert public(path) == row_by_row(path) and "larger than 1000 bytes" in public(path)[1]
    monkeypatch.setattr(log_events, "MAX_TEXT_BYTES", 40 * 133 + 45)  # passes only the bound
    assert fast(path)[0] == "events" and public(path) == row_by_row(path)


def test_a_time_zone_with_leap_seconds_is_read_row_by_row(tmp_path, monkeypatch):
    """There a record's Time can read 23:59:60, which the row-by-row reader refuses."""
    monkeypatch.setenv("TZ", "right/UTC")
    try:
        time.tzset()
        if time.localtime(78796800).tm_sec != 60:
            pytest.skip("no right/UTC time zone here")
        path = write(tmp_path, "leap.bin", binary_log([[(3, 0, 7, 0, 0), (0, 5, 0x1000, 16, 0)]],
                                                     start_wall_ns=78796800 * 10**9))
        assert fast(path)[0] == "unusual"
        assert public(path) == row_by_row(path) and "bad Time '23:59:60" in public(path)[1]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_runs_of_ticks_convert_as_tick_scale():
    """A run in one stretch, rising or not across stretches, on a kept point, past the
    last point, clamped at 2^62 - 1."""
    rng = random.Random(3)
    for _ in range(1000):
        points = [(rng.randrange(1, 10**6), rng.randrange(0, 10**6)) for _ in range(rng.randrange(0, 30))]
        if rng.random() < 0.1:
            points.append((1, (1 << 64) - 1))
        one, runs = log_events._tick_scale(points), _binary_scan._RunScale(points)
        start = rng.randrange(0, 2 * 10**6)
        ticks = [start + rng.randrange(0, rng.choice((10, 10**5, 10**6))) for _ in range(rng.randrange(1, 50))]
        ticks += rng.sample([t for t, _ in points], min(len(points), 3))
        if rng.random() < 0.1:
            ticks.append(STAMP_MAX)
        if rng.random() < 0.6:
            ticks.sort()
        assert runs(ticks) == [one(t) for t in ticks]


# Two small valid logs, one on each clock: two threads, one of them sharing the second
# block, an allocate failure, the tick clock's points in the thread records.
SMALL = [
    (binary_log([[(3, 0, 7, 0, 0), (0, 5, 0x1000, 16, 0x10), (1, 6, 0, 32, 0)],
                 [(3, 0, 8, 0, 0), (2, 9, 0x1000, 16, 0), (3, 0, 7, 0, 0), (0, 9, 0x2000, 1, 0)]]), 0),
    (binary_log([[(3, 0, 7, 1000, 300), (0, 500, 0x1000, 16, 0x10), (1, 600, 0, 32, 0)],
                 [(3, 0, 8, 3000, 1000), (2, 900, 0x1000, 16, 0), (3, 0, 7, 2000, 1500), (0, 2900, 0x2000, 1, 0)]],
                start_wall_ns=1_700_000_000 * 10**9, clock=1), 1),
]
# Words a damaged record or block header may hold: the edges of a stamp, of each kind, of
# a pointer, size or stream, a block count of 0 or one past the records (in a header word).
WORDS = (0, 1, STAMP_MAX, 1 << 62, 2 << 62, 3 << 62, (3 << 62) + 1, (1 << 64) - 1,
         0x4B4C4252, 0x4B4C4252 | 1 << 32, 0x4B4C4252 | 5 << 32)


@pytest.mark.parametrize("data, clock", SMALL)
def test_a_small_log_cut_anywhere_or_a_word_replaced_reads_alike(tmp_path, data, clock):
    """The log cut at every byte, and each of its words (a block header's too) replaced by
    each of WORDS: the fast reader reads the valid ones (and only those) as the row-by-row
    reader does."""
    variants = [data[:end] for end in range(len(data) + 1)]
    for at in range(32, len(data), 8):
        variants += [data[:at] + word.to_bytes(8, "little") + data[at + 8:] for word in WORDS]
    read = 0
    for variant in variants:
        valid, fast_read = assert_alike(write(tmp_path, "variant.bin", variant))
        assert fast_read == valid, variant.hex()
        read += fast_read
    assert read > 50   # the fast reader had valid logs to read, not only errors


def mutated(rng, data):
    """`data` damaged at the byte level: a bit flipped, a block's count one off (or 0, or
    huge), a block duplicated, the blocks reordered, a thread record put inside a block, an
    empty block or a stray tail added, the log cut short."""
    def blocks(data):
        found, at = [], 32
        while at + 8 <= len(data):
            count = int.from_bytes(data[at + 4:at + 8], "little")
            found.append(data[at:at + 8 + 32 * count])
            at += 8 + 32 * count
        return found
    for _ in range(rng.choice((1, 1, 2, 3))):
        head, parts = data[:32], blocks(data)
        op = rng.randrange(9)
        if op == 0:
            changed = bytearray(data)
            changed[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            data = bytes(changed)
        elif op == 1 and parts:
            k = rng.randrange(len(parts))
            count = int.from_bytes(parts[k][4:8], "little")
            new = rng.choice((count + 1, count - 1, 0, (1 << 32) - 1, 1 << 27)) % (1 << 32)
            parts[k] = parts[k][:4] + new.to_bytes(4, "little") + parts[k][8:]
            data = head + b"".join(parts)
        elif op == 2 and parts:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(parts))
            data = head + b"".join(parts)
        elif op == 3:
            rng.shuffle(parts)
            data = head + b"".join(parts)
        elif op == 4 and parts:
            k = rng.randrange(len(parts))
            count = min(int.from_bytes(parts[k][4:8], "little"), (len(parts[k]) - 8) // 32)
            at = 8 + 32 * rng.randrange(count + 1)
            thread = binary_log([[(3, rng.choice((0, 0, 1)), rng.randrange(1 << 64), rng.choice((0, 0, 5)),
                                   rng.choice((0, 0, 7)))]])[40:]
            parts[k] = (parts[k][:4] + ((count + 1) % (1 << 32)).to_bytes(4, "little") + parts[k][8:at] + thread +
                        parts[k][at:])
            data = head + b"".join(parts)
        elif op == 5:
            data += binary_log([[]])[32:]                  # a block of 0 records
        elif op == 6:
            data += bytes(rng.randrange(1, 9))
        elif op == 7:
            data = data[:rng.randrange(len(data) + 1)]
        else:
            data = data[:32]                               # the header alone
    return data


@pytest.mark.parametrize("seed", range(80))
def test_mutated_logs_read_alike(tmp_path, monkeypatch, seed):
    """Valid logs damaged at the byte level (plain, as two gzip members, after an empty
    member, gzip cut short), read with columns made three records at a time."""
    monkeypatch.setattr(_binary_scan, "_CHUNK", 3)
    rng = random.Random(1000 + seed)
    clock = seed % 2
    blocks, wall = random_log(rng, clock, damage=False)
    data = binary_log(blocks, start_wall_ns=wall, clock=clock)
    for _ in range(4):
        data = mutated(rng, data)
        assert_alike(write(tmp_path, "mutated.bin", data))
        half = len(data) // 2
        assert_alike(write(tmp_path, "two.bin.gz", gzip.compress(data[:half]) + gzip.compress(data[half:])))
        packed = gzip.compress(b"") + gzip.compress(data)
        assert_alike(write(tmp_path, "empty_first.bin.gz", packed))
        assert_alike(write(tmp_path, "cut.bin.gz", packed[:rng.randrange(len(packed))]))


def test_a_header_alone_is_a_log_of_no_events(tmp_path):
    for clock in (0, 1):
        path = write(tmp_path, "header.bin", binary_log([], clock=clock))
        assert fast(path) == row_by_row(path) == public(path) == ("events", [])
