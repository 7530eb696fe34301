"""Timelines for the report's tests, made the way mrstack-replay --timeline makes them
(the schema of the "mrstack-timeline/1" format), from a small random allocation log."""
import random


def make_timeline(events=3000, points=500, fail_at=None, seed=3, stacks=("pool > cuda", "binning > pool > cuda")):
    """A timeline of a random log of `events` events over `stacks`; the last stack fails at
    event `fail_at` (its arrays then hold null after it) when that is given."""
    rng = random.Random(seed)
    live, sizes, log = {}, [], []   # log: (live bytes after, thread, stream, size or None)
    next_ptr = 1
    for _ in range(events):
        if live and rng.random() < 0.47:
            ptr = rng.choice(list(live))
            log.append(("free", live.pop(ptr), ptr))
        else:
            size = rng.choice([512, 4096, 65536, 1 << 20, 5 << 20, 40 << 20])
            live[next_ptr] = size
            sizes.append(size)
            log.append(("allocate", size, next_ptr))
            next_ptr += 1
    live_series, total = [], 0
    for action, size, _ in log:
        total += size if action == "allocate" else -size
        live_series.append(total)
    step = max(1, events // points)
    sample_event = list(range(step - 1, events, step))
    if sample_event[-1] != events - 1:
        sample_event.append(events - 1)
    timeline = {"format": "mrstack-timeline/1", "log": "random.csv", "events": events, "simulated": True,
                "capacity_bytes": None, "sample_event": sample_event,
                "live_bytes": [live_series[e] for e in sample_event], "stacks": [], "results": []}
    for k, spec in enumerate(stacks):
        growth = 1.1 + 0.25 * k
        footprint, held = [], 0
        for e in sample_event:
            held = max(held, int(live_series[e] * growth))
            footprint.append(held)
        free = [f - timeline["live_bytes"][i] for i, f in enumerate(footprint)]
        largest = [x // (2 + k) for x in free]
        failure = None
        failing = fail_at is not None and k == len(stacks) - 1
        if failing:
            cut = next(i for i, e in enumerate(sample_event) if e >= fail_at)
            for series in (footprint, free, largest):
                series[cut:] = [None] * (len(series) - cut)
            request = 40 << 20
            failure = {"line": fail_at + 2, "event": fail_at, "bytes": request,
                       "message": f"out of memory: {request} bytes requested of pool",
                       "fragmentation": {"resource": "pool", "held_bytes": footprint[cut - 1],
                                         "live_bytes": timeline["live_bytes"][cut - 1], "free_bytes": free[cut - 1],
                                         "largest_free_block": largest[cut - 1], "free_blocks": 17}}
        timeline["stacks"].append({"resource": spec, "footprint_bytes": footprint, "free_held_bytes": free,
                                   "largest_free_block": largest, "failure": failure})
        peak_footprint = max(v for v in footprint if v is not None)
        timeline["results"].append({
            "resource": spec, "built_as": spec, "log": "random.csv", "simulated": True, "warmup": False,
            "events": events, "failures": 1 if failing else 0,
            "first_failure_line": failure["line"] if failure else None,
            "first_failure_bytes": failure["bytes"] if failure else None,
            "first_failure_message": failure["message"] if failure else None,
            "seconds": 0.001 * (k + 1), "seconds_per_run": [0.001 * (k + 1)], "ns_per_event": 30.0 + 10 * k,
            # The time inside the allocator, in the other order than ns_per_event (wall time),
            # so a test sees which of the two picks the fastest stack.
            "ns_per_call": 25.0 + 100.0 / (k + 1),
            "peak_live_bytes": max(live_series), "peak_footprint_bytes": peak_footprint,
            "footprint_ratio": peak_footprint / max(live_series), "footprint_measured_by": "footprint_meter",
            "footprint_lower_bound": False, "upstream_allocations": 10 + k, "leaks": 0, "leaked_bytes": 0,
            "error": None})
    buckets = {}
    for size in sizes:
        low = 1 << (size.bit_length() - 1)
        buckets[low] = buckets.get(low, 0) + 1
    timeline["size_histogram"] = [{"min_bytes": lo, "max_bytes": 2 * lo - 1, "allocations": n}
                                  for lo, n in sorted(buckets.items())]
    timeline["threads"] = [{"thread": "1", "allocations": len(sizes), "frees": events - len(sizes),
                            "bytes_allocated": sum(sizes)}]
    timeline["streams"] = [{"stream": "0x0", "allocations": len(sizes) - 5, "frees": events - len(sizes) - 5,
                            "bytes_allocated": sum(sizes) - 1},
                           {"stream": "0x7f00", "allocations": 5, "frees": 5, "bytes_allocated": 1}]
    return timeline
