"""Time and peak memory of the Python log reader (mrstack.log_events.read_log_events) on
large generated logs, beside mrstack's C++ reader (mrstack-replay LOG --write-csv OUT,
which also writes the CSV) when it is built.

    python3 benchmarks/python/log_reader.py [--rows N] [--threads T] [--streams S]
                                            [--dir DIR] [--replay PATH] [--repeat R]
                                            [--python PACKAGE_FOLDER]

Writes three logs into DIR (default: a temporary folder, removed after), unless they are
there already with the same shape: time.csv (RMM's columns, the Time column a time of
day, rows in one global order), stamp.csv (the logging adaptor's per-thread order: each
thread's rows together, a Stamp column, merged by stamp when read) and stamp.csv.gz (the
same, gzip-compressed). Each log is read R times (default 1) in a fresh process; the
output is the fastest wall time and the largest peak RSS (the child's ru_maxrss) of each
reader. The logs are valid: every row is an allocation, a free of a live allocation (of
its size) or now and then an allocate failure, on T threads and S streams.
"""
import argparse
import gzip
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

READ = """
import sys, time
sys.path.insert(0, {python!r})
from mrstack.log_events import read_log_events
start = time.perf_counter()
events = read_log_events({path!r})
print(len(events), time.perf_counter() - start)
"""


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


def write_logs(folder, rows, threads, streams):
    shape = f"{rows} {threads} {streams}\n"
    marker = os.path.join(folder, "shape.txt")
    paths = [os.path.join(folder, name) for name in ("time.csv", "stamp.csv", "stamp.csv.gz")]
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
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="mrstack-log-reader-")
    os.makedirs(folder, exist_ok=True)
    try:
        paths = write_logs(folder, args.rows, args.threads, args.streams)
        have_replay = os.access(args.replay, os.X_OK)
        print(f"{args.rows} rows, {args.threads} threads, {args.streams} streams; "
              f"{'C++: ' + args.replay if have_replay else 'mrstack-replay not built: Python only'}")
        print(f"{'log':<14}{'MB':>8}{'events':>10}{'Python s':>10}{'MiB':>8}{'C++ s':>8}{'MiB':>8}{'ratio s':>9}"
              f"{'ratio MiB':>10}")
        for path in paths:
            code = READ.format(python=args.python, path=path)
            runs = [measure([sys.executable, "-c", code]) for _ in range(args.repeat)]
            py_wall = min(run[0] for run in runs)
            py_rss = max(run[1] for run in runs)
            count = runs[0][2].split()[0]
            line = f"{os.path.basename(path):<14}{os.path.getsize(path) / 1e6:>8.1f}{count:>10}{py_wall:>10.2f}{py_rss:>8.0f}"
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
