#!/usr/bin/env python3
"""Compares two builds of one Google Benchmark program, run interleaved on one host.

    tools/compare-benchmarks.py OLD_BINARY NEW_BINARY [--rounds 5] [--filter REGEX]
                                [--min-time 0.2] [--json OUT]

Each round runs the old binary, then the new one (so drifts of the host — frequency,
neighbours, page cache — hit both alike). Per benchmark it keeps the fastest round of each
(the least disturbed measurement: noise only ever adds time) and the median, and prints
new / old for both, then the geometric means. A benchmark that reported an error, or ran
in only some rounds of a build, is named and makes the exit status 1 (it is left out of
the table); one that every round of one build ran and none of the other (added or
removed) is named only. A binary that cannot run, fails or prints no benchmark JSON ends
the comparison with its name and status (exit status 1). Times are compared in ns, whatever
unit each build reports. Otherwise the exit status is 0, and the numbers are for reading.

Why not one long run of each: on shared GPU hosts, round-to-round spreads of up to 40%
were seen in the same binary, wider than the effects this tool is for (a few percent).
"""
import argparse
import json
import math
import statistics
import subprocess
import sys


NS_PER_UNIT = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


class RunError(Exception):
    """A binary that could not be run, failed, or printed no benchmark JSON."""


def run_once(binary, filter_regex, min_time, failed):
    """One run's real times in ns by benchmark name; names that reported an error go to `failed`."""
    command = [binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}"]
    if filter_regex:
        command.append(f"--benchmark_filter={filter_regex}")
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise RunError(f"{binary}: cannot run it: {e.strerror or e}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RunError(f"{binary} exited with status {done.returncode}" + (": " + " | ".join(tail) if tail else ""))
    try:
        benchmarks = json.loads(done.stdout)["benchmarks"]
    except (ValueError, KeyError, TypeError) as e:
        raise RunError(f"{binary} printed no Google Benchmark JSON ({e})") from None
    times = {}
    for b in benchmarks:
        if b.get("run_type", "iteration") != "iteration":
            continue
        if b.get("error_occurred"):
            failed.setdefault(b["name"], b.get("error_message", "error"))
            continue
        # In ns: a benchmark whose time unit differs between the builds (Unit() changed)
        # would otherwise compare, say, microseconds with nanoseconds.
        unit = b.get("time_unit", "ns")
        if unit not in NS_PER_UNIT:
            raise RunError(f"{binary}: benchmark {b['name']} has an unknown time unit {unit!r}")
        if not b.get("real_time", 0) > 0:  # a ratio and its logarithm need a time
            failed.setdefault(b["name"], f"real_time {b.get('real_time')!r} is not a positive time")
            continue
        times[b["name"]] = b["real_time"] * NS_PER_UNIT[unit]
    return times


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--filter", default="")
    parser.add_argument("--min-time", default="0.2", help="--benchmark_min_time, no unit (benchmark 1.7)")
    parser.add_argument("--json", help="also write every round's times here")
    args = parser.parse_args(argv)
    rounds = {"old": [], "new": []}
    failed = {"old": {}, "new": {}}
    for r in range(args.rounds):
        for which in ("old", "new"):
            try:
                rounds[which].append(run_once(getattr(args, which), args.filter, args.min_time, failed[which]))
            except RunError as e:
                print(f"compare-benchmarks: round {r + 1}, {which} build: {e}", file=sys.stderr)
                return 1
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    every_round = rounds["old"] + rounds["new"]
    seen = set().union(*every_round, failed["old"], failed["new"])
    names = sorted(n for n in seen if all(n in t for t in every_round))
    missing = []  # failed, or ran in only some rounds of a build: the exit status says so
    for n in sorted(seen - set(names)):
        in_all = {w: all(n in t for t in rounds[w]) for w in ("old", "new")}
        in_none = {w: not any(n in t for t in rounds[w]) for w in ("old", "new")}
        if n not in failed["old"] and n not in failed["new"] and any(
                in_all[w] and in_none[o] for w, o in (("old", "new"), ("new", "old"))):
            print(f"ONLY IN THE {'NEW' if in_all['new'] else 'OLD'} BUILD {n}")  # added or removed: not a failure
            continue
        missing.append(n)
        why = failed["new"].get(n) or failed["old"].get(n) or "missing from some rounds"
        print(f"NOT COMPARED {n}: {why}")
    if not names:
        print("no benchmark ran in both builds (check --filter)")
        return 1
    fastest, medians = [], []
    width = max(len(n) for n in names)
    print(f"{'benchmark':<{width}}  {'old ns':>10} {'new ns':>10} {'best':>6} {'median':>7}")
    for n in names:
        old = [t[n] for t in rounds["old"]]
        new = [t[n] for t in rounds["new"]]
        best = min(new) / min(old)
        median = statistics.median(new) / statistics.median(old)
        fastest.append(best)
        medians.append(median)
        print(f"{n:<{width}}  {min(old):>10.4g} {min(new):>10.4g} {best:>6.3f} {median:>7.3f}")
    print(f"geometric mean new/old: fastest rounds {geometric_mean(fastest):.3f}, medians {geometric_mean(medians):.3f}"
          f" ({len(names)} benchmarks, {args.rounds} rounds; max by fastest {max(fastest):.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
