"""Time and peak memory of the Python log reader (mrstack.log_events.read_log_events) on
large generated logs, beside mrstack's C++ reader (mrstack-replay LOG --write-csv OUT,
which also writes the CSV) when it is built.

    python3 benchmarks/python/log_reader.py [--rows N] [--threads T] [--streams S]
                                            [--dir DIR] [--replay PATH] [--repeat R]
                                            [--python PACKAGE_FOLDER] [--row-by-row]
                                            [--logs NAME ...]

Writes six logs into DIR (default: a temporary folder, removed after), unless they are
there already with the same shape: time.csv (RMM's columns, the Time column a time of
day, rows in one global order), stamp.csv (the logging adaptor's per-thread order: each
thread's rows together, a Stamp column, merged by stamp when read), stamp.csv.gz (the
same, gzip-compressed), and the same events as the logging adaptor's binary log:
stamp.bin (nanosecond stamps), ticks.bin (time-stamp counter ticks, a (ticks, ns) point
in each block's thread record) and ticks.bin.gz, each thread's records in blocks of
2048. --logs reads only the logs named. Each log is read R times (default 1) in a fresh
process; the output is the fastest wall time and the largest peak RSS (the child's
ru_maxrss) of each reader; --row-by-row adds the row-by-row reader's
(log_events._read_row_by_row, which read_log_events falls back to). The logs are valid:
every row is an allocation, a free of a live allocation (of its size) or now and then an
allocate failure, on T threads and S streams.
"""
import argparse
import gzip
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

READ = """
import sys, time
sys.path.insert(0, {python!r})
from mrstack.log_events import {reader} as read
start = time.perf_counter()
events = read({path!r})
print(len(events), time.perf_counter() - start)
"""
LOGS = ("time.csv", "stamp.csv", "stamp.csv.gz", "stamp.bin", "ticks.bin", "ticks.bin.gz")
BLOCK_RECORDS = 2048           # records a binary block holds, its thread record included
TICKS_PER_NS = 3               # the time-stamp counter's rate in ticks.bin


def generate(rows, threads, streams, seed=1):
    """[(thread, stamp_ns, action, pointer, size, stream)] in stamp order: each thread
    allocates from its own address range and frees its own live blocks, so the log is
    valid in any order that keeps each thread's rows in order."""
    rng = random.Random(seed)
    live = [[] for _ in range(threads)]
    next_address = [0x7F0000000000 + (t << 44) for t in range(threads)]  # 16 TiB apart: never meeting
    stream_ids = [0] + [0x5500000000 + 0x100 * s for s in range(1, streams)]
    out, stamp = [], 3_600_000_000_000  # one in the morning
    for _ in range(rows):
        t = rng.randrange(threads)
        stamp += rng.randrange(1, 2000)
        blocks = live[t]
        roll = rng.random()
        if blocks and (roll < 0.45 or len(blocks) > 2000):
            pointer, size, stream = blocks.pop(rng.randrange(len(blocks)))
            out.append((t, stamp, "free", pointer, size, stream))
        elif roll > 0.998:
            out.append((t, stamp, "allocate failure", 0, 1 << rng.randrange(30, 40), rng.choice(stream_ids)))
        else:
            size = rng.choice((256, 512, 4096, 65536, 1 << 20)) * rng.randrange(1, 9)
            pointer = next_address[t]
            next_address[t] += (size + 511) // 512 * 512
            stream = stream_ids[t % streams]
            blocks.append((pointer, size, stream))
            out.append((t, stamp, "allocate", pointer, size, stream))
    return out


def _time_of_day(stamp_ns):
    seconds, ns = divmod(stamp_ns, 1_000_000_000)
    return f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{ns // 1000:06d}"


def _line(row, with_stamp):
    t, stamp, action, pointer, size, stream = row
    text = (f"{140000000000 + t},{_time_of_day(stamp)},{action},{f'{pointer:#x}' if pointer else '(nil)'},"
            f"{size},{f'{stream:#x}' if stream else '0'}")
    return f"{text},{stamp}\n" if with_stamp else text + "\n"


_ACTION_KINDS = {"allocate": 0, "allocate failure": 1, "free": 2}


def write_binary(path, events, ticks):
    """The events as the logging adaptor's binary log (include/mrstack/log/binary_log.hpp)
    writes them: a block of a thread's records when its buffer is full (and at the end);
    with `ticks`, the stamps in ticks and each block's thread record a (ticks, ns) point
    read as the block is written."""
    buffers = {}
    rate = TICKS_PER_NS if ticks else 1
    start_wall_ns = 1_700_000_000 * 10**9 - 3_600_000_000_000
    with open(path, "wb") as f:
        f.write(b"MRSTLOG\x01" + struct.pack("<IIqQ", 1, 32, start_wall_ns, 1 if ticks else 0))

        def flush(t, now):
            records = buffers.pop(t)
            point = (now * rate, now) if ticks else (0, 0)
            f.write(struct.pack("<II", 0x4B4C4252, len(records) + 1))
            f.write(struct.pack("<QQQQ", 3 << 62, 140000000000 + t, *point))
            f.write(b"".join(records))

        for t, stamp, action, pointer, size, stream in events:
            records = buffers.setdefault(t, [])
            records.append(struct.pack("<QQQQ", stamp * rate | _ACTION_KINDS[action] << 62, pointer, size, stream))
            if len(records) == BLOCK_RECORDS - 1:
                flush(t, stamp)
        last = events[-1][1] if events else 0
        for t in sorted(buffers):
            flush(t, last)


def write_logs(folder, rows, threads, streams):
    shape = f"{rows} {threads} {streams} binary\n"
    marker = os.path.join(folder, "shape.txt")
    paths = [os.path.join(folder, name) for name in LOGS]
    if os.path.exists(marker) and open(marker).read() == shape and all(map(os.path.exists, paths)):
        return paths
    events = generate(rows, threads, streams)
    with open(paths[0], "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        f.writelines(_line(row, False) for row in events)
    per_thread = sorted(events, key=lambda row: row[0])  # stable: each thread's rows in order
    with open(paths[1], "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream,Stamp\n")
        f.writelines(_line(row, True) for row in per_thread)
    with open(paths[1], "rb") as f, gzip.open(paths[2], "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    write_binary(paths[3], events, ticks=False)
    write_binary(paths[4], events, ticks=True)
    with open(paths[4], "rb") as f, gzip.open(paths[5], "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    with open(marker, "w") as f:
        f.write(shape)
    return paths


def measure(command):
    """(wall seconds, peak RSS in MiB, stdout) of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    out, err = child.stdout.read(), child.stderr.read()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({child.returncode}): {err.strip()}")
    return wall, usage.ru_maxrss / 1024, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--dir", help="where the logs are written (and kept)")
    parser.add_argument("--replay", default=os.path.join(REPO, "build", "release", "tools", "mrstack-replay"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--python", default=os.path.join(REPO, "python"),
                        help="the folder the mrstack package is imported from (another checkout's, to compare)")
    parser.add_argument("--row-by-row", action="store_true",
                        help="also time the row-by-row reader (log_events._read_row_by_row)")
    parser.add_argument("--logs", nargs="+", choices=LOGS, default=LOGS, help="read only these logs")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="mrstack-log-reader-")
    os.makedirs(folder, exist_ok=True)
    try:
        paths = write_logs(folder, args.rows, args.threads, args.streams)
        have_replay = os.access(args.replay, os.X_OK)
        print(f"{args.rows} rows, {args.threads} threads, {args.streams} streams; "
              f"{'C++: ' + args.replay if have_replay else 'mrstack-replay not built: Python only'}")
        print(f"{'log':<14}{'MB':>8}{'events':>10}{'Python s':>10}{'MiB':>8}"
              + (f"{'rows s':>8}{'MiB':>8}" if args.row_by_row else "")
              + f"{'C++ s':>8}{'MiB':>8}{'ratio s':>9}{'ratio MiB':>10}")
        for path in paths:
            if os.path.basename(path) not in args.logs:
                continue
            readers = ["read_log_events"] + (["_read_row_by_row"] if args.row_by_row else [])
            line = f"{os.path.basename(path):<14}{os.path.getsize(path) / 1e6:>8.1f}"
            for reader in readers:
                code = READ.format(python=args.python, path=path, reader=reader)
                runs = [measure([sys.executable, "-c", code]) for _ in range(args.repeat)]
                if reader == "read_log_events":
                    py_wall = min(run[0] for run in runs)
                    py_rss = max(run[1] for run in runs)
                    line += f"{runs[0][2].split()[0]:>10}"
                line += f"{min(run[0] for run in runs):>{10 if reader == 'read_log_events' else 8}.2f}" \
                        f"{max(run[1] for run in runs):>8.0f}"
            if have_replay:
                out = os.path.join(folder, "replay_out.csv")
                cpp = [measure([args.replay, path, "--write-csv", out]) for _ in range(args.repeat)]
                cpp_wall, cpp_rss = min(run[0] for run in cpp), max(run[1] for run in cpp)
                line += f"{cpp_wall:>8.2f}{cpp_rss:>8.0f}{py_wall / cpp_wall:>9.1f}{py_rss / cpp_rss:>10.1f}"
            print(line, flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
