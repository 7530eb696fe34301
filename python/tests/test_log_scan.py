"""The block reader (mrstack._log_scan) against the row-by-row reader it stands in for
(log_events._read_row_by_row): the same events for every log it reads, and Unusual (so
read_log_events words the error row by row) for every log it does not. Blocks of a few
bytes put rows, \\r\\n pairs, a byte order mark and gzip streams across block edges."""
import gzip
import random

import pytest

from mrstack import _log_scan, log_events
from mrstack.convert import ConversionError, read_log_events
from log_fixtures import binary_log, row_by_row, write

PLAIN = "Thread,Time,Action,Pointer,Size,Stream\n"
STAMPED = "Thread,Time,Action,Pointer,Size,Stream,Stamp\n"


def assert_read_alike(path):
    """The block reader reads `path` (no Unusual) and gives the row-by-row events."""
    expected = row_by_row(path)
    assert expected[0] == "events", expected
    assert _log_scan.read_events(path) == expected[1]
    assert read_log_events(path) == expected[1]


def assert_left_to_rows(path):
    """The block reader gives `path` up, and read_log_events raises the row-by-row error."""
    expected = row_by_row(path)
    assert expected[0] == "error", expected
    with pytest.raises(_log_scan.Unusual):
        _log_scan.read_events(path)
    with pytest.raises(ConversionError) as raised:
        read_log_events(path)
    assert str(raised.value) == expected[1]


@pytest.fixture(params=[1, 3, 7, 64, 1 << 20], ids=lambda size: f"block{size}")
def block(request, monkeypatch):
    monkeypatch.setattr(_log_scan, "BLOCK_BYTES", request.param)
    return request.param


PLAIN_ROWS = (
    "1,01:00:00.5,allocate,0x1000,256,0\r\n"
    "1,01:00:00.123456,allocate,1100,256,0x7\r\n"
    "\r\n"
    "2 , 01:00:01.1234567 ,allocate,0x2000,  64 ,0x7\n"        # spaces, seven decimals: row by row
    "2,3600,free,0X2000,64,7,extra,columns\n"
    "   \t\n"
    "3,4000.25,allocate failure,(nil),4096,0x9\n"
    "3,4001,allocate failure,0x0,0,0x9\n"                      # a refusal of nothing: skipped
    "4,23:59:59,free,(nil),0,0\n"                              # a free of nullptr: skipped
    "thr\u00e9ad,02:00:00,free,0x1000,256,0\n"                 # a non-ASCII thread: row by row
    "5,02:00:00.000001,free,1100,256,0x7"                      # no final newline
)


def test_a_plain_log_reads_alike_at_every_block_size(tmp_path, block):
    assert_read_alike(write(tmp_path, "plain.csv", PLAIN + PLAIN_ROWS))
    assert_read_alike(write(tmp_path, "bom.csv", "\ufeff" + PLAIN + PLAIN_ROWS + "\n"))
    assert_read_alike(write(tmp_path, "crlf.csv", (PLAIN + PLAIN_ROWS).replace("\n", "\r\n").replace("\r\r", "\r")))


def test_a_log_of_a_header_only_reads_alike(tmp_path, block):
    assert_read_alike(write(tmp_path, "header.csv", PLAIN))
    assert_read_alike(write(tmp_path, "header_no_newline.csv", STAMPED.rstrip("\n")))


STAMPED_ROWS = (
    "7,01:00:00,allocate,0x10,8,0,100\n"
    "7,01:00:00,free,0x20,8,0,100\n"                           # a free of a block from before the log
    "7,01:00:00,allocate,0x30,8,0x5,300\n"
    " 8 ,01:00:00,free,0x10,8,0,100\n"                         # thread 8 row by row, merged with 8's others
    "8,01:00:00,allocate,0x20,8,0,200\n"
    "8,01:00:00,allocate failure,(nil),99,0x6,250\r\n"
    "8,5,free,0x30,8,0x5,400,extra\n"
    "9,01:00:00.999999999,allocate,40,16,0,100\n"
)


def test_a_per_thread_log_reads_alike_at_every_block_size(tmp_path, block):
    assert_read_alike(write(tmp_path, "stamped.csv", STAMPED + STAMPED_ROWS))
    assert_read_alike(write(tmp_path, "stamped.csv.gz", gzip.compress((STAMPED + STAMPED_ROWS).encode())))


def test_a_thread_whose_stamps_go_back_is_merged_as_heapq_merges_it(tmp_path, block):
    rows = ("1,0,allocate,0x10,8,0,500\n1,0,allocate,0x20,8,0,100\n2,0,free,0x10,8,0,300\n"
            "2,0,allocate,0x40,8,0,50\n1,0,free,0x20,8,0,600\n")
    path = write(tmp_path, "backwards.csv", STAMPED + rows)
    assert_read_alike(path)
    assert [line for line, *_ in read_log_events(path)] == [4, 5, 2, 3, 6]


def test_gzip_streams_one_after_another_read_alike(tmp_path, block):
    text = (PLAIN + PLAIN_ROWS + "\n").encode("utf-8")
    cut = len(text) // 3
    assert_read_alike(write(tmp_path, "two.csv.gz", gzip.compress(text[:cut]) + gzip.compress(text[cut:])))
    assert_read_alike(write(tmp_path, "empty_member.csv.gz", gzip.compress(text) + gzip.compress(b"")))


def test_freed_pointers_are_found_when_first_needed_and_kept_after(tmp_path):
    # 0x10 allocated and freed before the first free of a pointer that is not live (0x99):
    # its second free must still be refused, and after it is allocated again, freed again.
    fine = "1,1,allocate,0x10,8,0\n1,2,free,0x10,8,0\n1,3,free,0x99,8,0\n1,4,allocate,0x10,8,0\n1,5,free,0x10,8,0\n"
    assert_read_alike(write(tmp_path, "fine.csv", PLAIN + fine))
    assert_left_to_rows(write(tmp_path, "again.csv", PLAIN + fine + "1,6,free,0x10,8,0\n"))
    assert_left_to_rows(write(tmp_path, "before.csv", PLAIN + fine[:44] + "1,3,free,0x10,8,0\n"))
    assert_left_to_rows(write(tmp_path, "orphan.csv", PLAIN + "1,1,free,0x99,8,0\n1,2,free,0x99,8,0\n"))


def test_a_free_shares_its_allocations_address(tmp_path):
    path = write(tmp_path, "share.csv", PLAIN + "1,1,allocate,0x7f0000001000,8,0\n1,2,free,0x7F0000001000,8,0\n")
    allocation, free = _log_scan.read_events(path)
    assert free[2] is allocation[2]


@pytest.mark.parametrize("name, content", [
    ("empty.csv", ""),
    ("blank_header.csv", "\n" + PLAIN),
    ("bad_header.csv", "Thread,Time,Action\n1,1,allocate,0x10,8,0\n"),
    ("bad_row.csv", PLAIN + "1,1,allocate,0x10,8,0\n" * 1 + "1,25:00:00,free,0x10,8,0\n"),
    ("double_free.csv", PLAIN + "1,1,allocate,0x10,8,0\n1,2,free,0x10,8,0\n1,3,free,0x10,8,0\n"),
    ("live_again.csv", PLAIN + "1,1,allocate,0x10,8,0\n1,2,allocate,0x10,8,0\n"),
    ("other_size.csv", PLAIN + "1,1,allocate,0x10,8,0\n1,2,free,0x10,9,0\n"),
    ("null.csv", PLAIN + "1,1,allocate,(nil),8,0\n"),
    ("too_many_bytes.csv", PLAIN + f"1,1,allocate,0x10,{(1 << 64) - 1},0\n1,2,allocate,0x20,1,0\n"),
    ("no_stamp.csv", STAMPED + "1,1,allocate,0x10,8,0,5\n1,1,free,0x10,8,0\n"),
    ("bad_stamp.csv", STAMPED + "1,1,allocate,0x10,8,0,-5\n"),
    ("stamped_bad_row.csv", STAMPED + "1,1,allocate,0x10,8,0,5\n1,1,free,0x10,8,zz,9\n"),
    ("nul.csv", PLAIN + "1,1,allocate,0x10,8,0\n\0"),
    ("long_line.csv", PLAIN + "1,1,allocate,0x10,8,0," + "x" * (64 << 10) + "\n"),
    ("long_line_no_newline.csv", PLAIN + "1" * (64 << 10 | 2)),
    ("garbage.csv.gz", gzip.compress(PLAIN.encode()) + b"\0\0"),
    ("cut.csv.gz", gzip.compress((PLAIN + "1,1,allocate,0x10,8,0\n").encode())[:-6]),
    ("damaged.csv.gz", gzip.compress(PLAIN.encode())[:10] + b"\xff" * 20),
])
def test_a_log_in_error_is_left_to_the_row_by_row_reader(tmp_path, block, name, content):
    assert_left_to_rows(write(tmp_path, name, content))


def test_binary_logs_and_limits_are_left_to_the_row_by_row_reader(tmp_path, monkeypatch):
    path = write(tmp_path, "log.bin", binary_log([[(3, 0, 7, 0, 0), (0, 5, 0x1000, 100, 0), (2, 9, 0x1000, 100, 0)]]))
    with pytest.raises(_log_scan.Unusual):
        _log_scan.read_events(path)
    assert [e[:4] for e in read_log_events(path)] == [(2, "allocate", 0x1000, 100), (3, "free", 0x1000, 100)]
    small = write(tmp_path, "small.csv", PLAIN + "1,1,allocate,0x10,8,0\n")
    monkeypatch.setattr(log_events, "MAX_LINE_BYTES", 100)
    with pytest.raises(_log_scan.Unusual):
        _log_scan.read_events(small)
    assert len(read_log_events(small)) == 1
    monkeypatch.setattr(log_events, "MAX_LINE_BYTES", 64 << 10)
    monkeypatch.setattr(log_events, "MAX_TEXT_BYTES", 50)
    assert_left_to_rows(small)


def _noisy_log(rng, stamped):
    """A small log of valid rows with, now and then, one field or byte changed."""
    lines, live = [STAMPED if stamped else PLAIN], []
    for number in range(rng.randrange(1, 40)):
        thread = rng.choice(("1", "2", " 3", "t\u00e9"))
        if live and rng.random() < 0.5:
            pointer, size = live.pop(rng.randrange(len(live)))
            action = "free"
        else:
            pointer, size = rng.randrange(1, 64) * 16, rng.choice((0, 8, 64))
            action = rng.choice(("allocate",) * 8 + ("allocate failure",))
            if action == "allocate":
                live.append((pointer, size))
        fields = [thread, rng.choice(("01:00:00", "7.5", "23:59:59.1234567", "1:02:03.000001")), action,
                  rng.choice((f"{pointer:#x}", f"{pointer:x}", f"{pointer:#X}")), str(size), rng.choice(("0", "0x5", "9"))]
        if stamped:
            fields.append(str(rng.choice((number, 10, 100 - number))))
        line = ",".join(fields) + rng.choice(("\n", "\r\n", "\n", ",x\n"))
        if rng.random() < 0.03:
            at = rng.randrange(len(line))
            line = line[:at] + rng.choice((",", " ", "", "\n", "g", "\udcff")) + line[at + 1:]
        lines.append(line)
    return "".join(lines)


def test_noisy_logs_read_alike_or_are_left_to_the_row_by_row_reader(tmp_path, monkeypatch):
    rng = random.Random(12)
    read = given_up = 0
    for case in range(300):
        monkeypatch.setattr(_log_scan, "BLOCK_BYTES", rng.choice((5, 16, 100, 1 << 20)))
        path = write(tmp_path, f"noisy{case}.csv", _noisy_log(rng, stamped=case % 2 == 1))
        expected = row_by_row(path)
        try:
            events = _log_scan.read_events(path)
        except _log_scan.Unusual:
            given_up += 1
            assert expected[0] == "error" or log_events._BINARY_MAGIC in open(path, "rb").read(), path
            continue
        read += 1
        assert ("events", events) == expected, path
    assert read > 100 and given_up > 30  # both ways taken
