#!/usr/bin/env python3
"""What per-stream partitions over one shared pool would cost on bench_multistream's steps.

A design considered for the multi-stream target (docs/suballocators.md, "What one shared
pool can do"): each stream allocates from a partition of its own (no shared lock), whose
memory comes in granule-aligned extents from one shared best-fit pool grown in place over
a virtual range; a partition holding more than H free bytes hands the whole granules
inside its largest free blocks back to the shared pool until it holds at most L. This
simulates it on the benchmark's steps (same generator rules: 20,000 steps a stream of
1 B-64 MiB uniform sizes, allocate or free with equal odds under the stream's share of an
8 GiB cap, then free everything; streams interleaved at random) and prints, per setting,
the peak committed memory / 8 GiB and the trips to the shared pool per allocator call
(takes of an extent, and hand-backs). Each trip meets the shared lock, and a take of
another stream's extent needs stream ordering.

  tools/simulate-stream-partitions.py [S ...]      (default: 2 8; about 10 s per S)

With --borrowing it simulates another design instead: thread shards of slabs taken from
one shared pool grown in place, where a shard that cannot serve a request first allocates
from the other shards' free blocks (best fit among them) and only then takes a slab of
max(request, shard / 12 within 4-64 MiB) (or exactly the request with --exact-slabs);
wholly free slabs go back to the shared pool before it grows. It prints the peak / cap,
the borrowings and slab takes per allocator call, and the same without borrowing.

With --keep it simulates exact slabs without borrowing, where a shard gives its wholly free
slabs back once it holds more than a bound of free bytes (swept), with and without an ideal
drain of every shard before the shared pool grows.
"""
import argparse
import bisect
import random
import sys

GRANULE = 2 << 20
CAP = 8 << 30
STEPS = 20000
LARGEST = 64 << 20
ALIGN = 512


def make_steps(cap, seed):
    rng = random.Random(seed)
    steps, live, usage, slot = [], [], 0, 0
    def free_one():
        nonlocal usage
        k = rng.randrange(len(live))
        s, b = live[k]
        live[k] = live[-1]
        live.pop()
        steps.append((False, s, b))
        usage -= b
    for _ in range(STEPS):
        b = rng.randint(1, LARGEST)
        if not live or (rng.random() < 0.5 and usage + b <= cap):
            if usage + b > cap:
                continue
            steps.append((True, slot, b))
            live.append((slot, b))
            slot += 1
            usage += b
        else:
            free_one()
    while live:
        free_one()
    return steps


class FreeRanges:
    """Free address ranges, merged with their neighbours; best fit by a linear scan."""
    def __init__(self):
        self.starts, self.size, self.total = [], {}, 0

    def add(self, a, n):
        self.total += n
        i = bisect.bisect_left(self.starts, a)
        if i > 0 and self.starts[i - 1] + self.size[self.starts[i - 1]] == a:
            i -= 1
            a = self.starts.pop(i)
            n += self.size.pop(a)
        if i < len(self.starts) and a + n == self.starts[i]:
            n += self.size.pop(self.starts.pop(i))
        self.starts.insert(i, a)
        self.size[a] = n

    def remove(self, a):
        self.starts.pop(bisect.bisect_left(self.starts, a))
        n = self.size.pop(a)
        self.total -= n
        return n

    def best_fit(self, n):
        best = None
        for a in self.starts:
            if self.size[a] >= n and (best is None or self.size[a] < self.size[best]):
                best = a
        return best


def interleaved(steps):
    """The streams' steps, interleaved at random (seeded, so every design sees the same
    order): (stream, allocate?, slot, bytes rounded up to ALIGN)."""
    next_step = [0] * len(steps)
    rng = random.Random(1)
    running = list(range(len(steps)))
    while running:
        t = rng.choice(running)
        if next_step[t] == len(steps[t]):
            running.remove(t)
            continue
        allocate, slot, b = steps[t][next_step[t]]
        next_step[t] += 1
        yield t, allocate, slot, (b + ALIGN - 1) // ALIGN * ALIGN


def simulate(streams, keep_above, keep_down_to, extent_min):
    steps = [make_steps(CAP // streams, 7000 + t) for t in range(streams)]
    shared, frontier, peak = FreeRanges(), 0, 0
    parts = [FreeRanges() for _ in range(streams)]
    where = [dict() for _ in range(streams)]
    takes = hand_backs = calls = 0
    for t, allocate, slot, n in interleaved(steps):
        calls += 1
        part = parts[t]
        if allocate:
            a = part.best_fit(n)
            if a is None:
                takes += 1
                e = max((n + GRANULE - 1) // GRANULE * GRANULE, extent_min)
                s = shared.best_fit(e)
                if s is None:  # grow in place: the free range at the frontier counts
                    tail = shared.starts[-1] if shared.starts else None
                    have = shared.size[tail] if tail is not None and tail + shared.size[tail] == frontier else 0
                    shared.add(frontier, e - have)
                    frontier += e - have
                    peak = max(peak, frontier)
                    s = frontier - e
                got = shared.remove(s)
                if got > e:
                    shared.add(s + e, got - e)
                part.add(s, e)
                a = part.best_fit(n)
            got = part.remove(a)
            if got > n:
                part.add(a + n, got - n)
            where[t][slot] = (a, n)
        else:
            a, n = where[t].pop(slot)
            part.add(a, n)
            if part.total > keep_above:
                hand_backs += 1
                for x in sorted(part.starts, key=lambda x: -part.size[x]):
                    if part.total <= keep_down_to:
                        break
                    size = part.size[x]
                    lo = (x + GRANULE - 1) // GRANULE * GRANULE
                    hi = (x + size) // GRANULE * GRANULE
                    if hi - lo < GRANULE:
                        continue
                    part.remove(x)
                    if lo > x:
                        part.add(x, lo - x)
                    if x + size > hi:
                        part.add(hi, x + size - hi)
                    shared.add(lo, hi - lo)
    return peak / CAP, takes / calls, hand_backs / calls


class Shard:
    """A thread shard: its slabs (base -> [size, free ranges, live blocks])."""
    def __init__(self):
        self.slabs = {}

    def best_fit(self, n):
        best = None
        for base, (_, free, _) in self.slabs.items():
            a = free.best_fit(n)
            if a is not None and (best is None or free.size[a] < best[0]):
                best = (free.size[a], base, a)
        return best

    def place(self, fit, n):
        """Allocates n bytes where `fit` (from best_fit) says; returns (base, address)."""
        _, base, a = fit
        slab = self.slabs[base]
        got = slab[1].remove(a)
        if got > n:
            slab[1].add(a + n, got - n)
        slab[2] += 1
        return base, a

    def free(self, base, a, n):
        self.slabs[base][1].add(a, n)
        self.slabs[base][2] -= 1

    def free_bytes(self):
        return sum(v[1].total for v in self.slabs.values())


class SlabSource:
    """The shared pool shards take slabs from, grown in place at its frontier."""
    def __init__(self):
        self.free, self.frontier, self.peak = FreeRanges(), 0, 0

    def give_back(self, shard):
        """Takes `shard`'s wholly free slabs back."""
        for base in [b for b, v in shard.slabs.items() if v[2] == 0]:
            self.free.add(base, shard.slabs.pop(base)[0])

    def take_slab(self, shard, e, drain=()):
        """A slab of e bytes for `shard`: from free memory, else after the shards in `drain`
        gave their wholly free slabs back, else grown."""
        s = self.free.best_fit(e)
        if s is None and drain:
            for other in drain:
                self.give_back(other)
            s = self.free.best_fit(e)
        if s is None:
            tail = self.free.starts[-1] if self.free.starts else None
            have = self.free.size[tail] if tail is not None and tail + self.free.size[tail] == self.frontier else 0
            grow = -(-(e - have) // GRANULE) * GRANULE
            self.free.add(self.frontier, grow)
            self.frontier += grow
            self.peak = max(self.peak, self.frontier)
            s = self.free.best_fit(e)
        got = self.free.remove(s)
        if got > e:
            self.free.add(s + e, got - e)
        free = FreeRanges()
        free.add(s, e)
        shard.slabs[s] = [e, free, 0]


def simulate_borrowing(streams, exact_slabs, borrow):
    steps = [make_steps(CAP // streams, 7000 + t) for t in range(streams)]
    source = SlabSource()
    shards = [Shard() for _ in range(streams)]
    where = [dict() for _ in range(streams)]
    calls = borrowed = takes = 0
    for t, allocate, slot, n in interleaved(steps):
        calls += 1
        if not allocate:
            shard, base, a, n = where[t].pop(slot)
            shard.free(base, a, n)
            continue
        shard, fit = shards[t], shards[t].best_fit(n)
        if fit is None and borrow:
            found = [(f[0], q, f) for q in range(streams) if q != t for f in [shards[q].best_fit(n)] if f]
            if found:
                _, q, fit = min(found)
                shard = shards[q]
                borrowed += 1
        if fit is None:
            shard = shards[t]
            held = sum(v[0] for v in shard.slabs.values())
            e = -(-n // GRANULE) * GRANULE
            if not exact_slabs:
                e = max(e, min(64 << 20, max(4 << 20, held // 12 // GRANULE * GRANULE)))
            takes += 1
            source.take_slab(shard, e, drain=shards)  # wholly free slabs go back first
            fit = shard.best_fit(n)
        base, a = shard.place(fit, n)
        where[t][slot] = (shard, base, a, n)
    return source.peak / CAP, borrowed / calls, takes / calls


def simulate_keep(streams, keep, drain_before_growth):
    """Thread shards of exact slabs (each slab the size of the request that took it), no
    borrowing: after a free, a shard holding more than `keep` free bytes gives all its
    wholly free slabs back to the shared pool; with `drain_before_growth`, every shard's
    wholly free slabs go back before the shared pool grows (an ideal drain, which no
    stream ordering delays). Returns peak / cap, slab takes and give-backs per call."""
    steps = [make_steps(CAP // streams, 7000 + t) for t in range(streams)]
    source = SlabSource()
    shards = [Shard() for _ in range(streams)]
    where = [dict() for _ in range(streams)]
    calls = takes = backs = 0
    for t, allocate, slot, n in interleaved(steps):
        calls += 1
        if not allocate:
            shard, base, a, n = where[t].pop(slot)
            shard.free(base, a, n)
            if shard.free_bytes() > keep:
                backs += 1
                source.give_back(shard)
            continue
        shard = shards[t]
        fit = shard.best_fit(n)
        if fit is None:
            takes += 1
            source.take_slab(shard, -(-n // GRANULE) * GRANULE, drain=shards if drain_before_growth else ())
            fit = shard.best_fit(n)
        base, a = shard.place(fit, n)
        where[t][slot] = (shard, base, a, n)
    return source.peak / CAP, takes / calls, backs / calls


def main_keep(counts):
    mib = 1 << 20
    print("S  keep (MiB)  drain before growth  peak / cap  slab takes a call  give-backs a call")
    for s in counts:
        for keep in (64 * mib, 128 * mib, 256 * mib, 512 * mib, 1 << 50):
            for drain in (False, True):
                peak, takes, backs = simulate_keep(s, keep, drain)
                label = "none" if keep == 1 << 50 else str(keep // mib)
                print(f"{s:<2} {label:>10}  {'yes' if drain else 'no':19s} {peak:10.3f}  {takes:17.3f}  {backs:17.3f}",
                      flush=True)


def main_borrowing(counts, exact_slabs):
    print("S  borrowing  peak / cap  borrowings a call  slab takes a call")
    for s in counts:
        for borrow in (True, False):
            peak, borrowed, takes = simulate_borrowing(s, exact_slabs, borrow)
            print(f"{s:<2} {'yes' if borrow else 'no':9s} {peak:10.3f}  {borrowed:17.3f}  {takes:17.3f}", flush=True)


def stream_count(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a stream count must be at least 1, not {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("counts", nargs="*", type=stream_count, default=[2, 8], metavar="S")
    design = parser.add_mutually_exclusive_group()
    design.add_argument("--keep", action="store_true")
    design.add_argument("--borrowing", action="store_true")
    parser.add_argument("--exact-slabs", action="store_true", help="with --borrowing")
    args = parser.parse_intermixed_args()  # counts may come before or after the flags
    if args.exact_slabs and not args.borrowing:
        parser.error("--exact-slabs goes with --borrowing")
    counts = args.counts
    if args.keep:
        main_keep(counts)
        return
    if args.borrowing:
        main_borrowing(counts, args.exact_slabs)
        return
    mib = 1 << 20
    settings = [(128 * mib, 64 * mib, 2 * mib), (256 * mib, 128 * mib, 16 * mib), (256 * mib, 192 * mib, 2 * mib),
                (384 * mib, 256 * mib, 2 * mib), (512 * mib, 384 * mib, 2 * mib)]
    print("S  hand back above / down to  least extent   peak / cap  takes a call  hand-backs a call")
    for s in counts:
        for above, down_to, least in settings:
            peak, takes, backs = simulate(s, above, down_to, least)
            print(f"{s:<2} {above // mib:>6} / {down_to // mib:<4} MiB        {least // mib:>3} MiB      "
                  f"{peak:8.3f}  {takes:11.3f}  {backs:13.3f}", flush=True)


if __name__ == "__main__":
    main()
