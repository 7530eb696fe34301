"""One self-contained HTML page about a replayed allocation log.

    python -m mrstack.report TIMELINE.json -o report.html
    python -m mrstack.report LOG.csv[.gz] [-r SPEC ...] [--capacity SIZE] -o report.html

The first form reads a timeline that ``mrstack-replay LOG -r SPEC ... --timeline FILE``
wrote (format ``mrstack-timeline/1``). The second runs mrstack-replay itself, with
``--timeline`` to a temporary file: the binary is the one ``--replay`` names, else
``MRSTACK_REPLAY``, else ``mrstack-replay`` on PATH, else the newest build of this checkout
(``build/*/tools/mrstack-replay``).

The page needs no network: the plots are drawn by matplotlib and inlined as SVG, the
style sheet is inline, nothing is loaded from elsewhere. It shows live bytes against each
stack's footprint over the log, each stack's free bytes held against its largest free
block (how fragmented its free memory is), the allocation-size histogram, the activity of
each thread and stream, the per-stack summary table with the verdict, and for every stack
that refused a request: the log line, the request and the stack's fragmentation then, and
for every stack that could not be built or broke: what stopped it.
"""

import argparse
import glob
import html
import io
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

from . import _lib, log_events as _log_events
from ._files import is_same_file, write_atomically

__all__ = ["TIMELINE_FORMAT", "ReportError", "load_timeline", "render_html", "write_report", "find_replay",
           "run_replay", "main"]

TIMELINE_FORMAT = "mrstack-timeline/1"
_SERIES = ("footprint_bytes", "free_held_bytes", "largest_free_block")


class ReportError(Exception):
    """The input cannot be reported on; the message says what and where."""


# ---- input ------------------------------------------------------------------------------

def _timeline_bytes(path):
    """The bytes of the timeline file, at most the log reader's limit (MAX_TEXT_BYTES: a
    timeline is far smaller than the log it samples). A pipe or a device (/dev/zero named
    timeline.json) is read as the log reader reads one, a block at a time up to the limit
    and stopping at a NUL, where json.load had read it whole: forever, or until memory ran out."""
    limit = _log_events.MAX_TEXT_BYTES
    with open(path, "rb") as f:
        status = os.fstat(f.fileno())
        if stat.S_ISREG(status.st_mode):
            data = b"" if status.st_size > limit else f.read(limit + 1)
            size = max(status.st_size, len(data))
        else:
            data = _log_events._stream_bytes(f)
            size = len(data)
    if size > limit:
        raise ReportError(f"{path}: not a timeline: larger than {limit} bytes, the reader's limit")
    return data


def load_timeline(path):
    """The timeline at `path`, checked against the schema the report relies on."""
    try:
        timeline = json.loads(_timeline_bytes(path).decode("utf-8"))
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or e}") from None
    except MemoryError:
        raise ReportError(f"{path}: not a timeline: it does not fit in this process's memory") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not JSON ({e})") from None
    except UnicodeDecodeError as e:
        # JSON is UTF-8; a file that is not (a log named .json, a damaged copy) is no timeline.
        raise ReportError(f"{path}: not JSON: byte {e.start} is not UTF-8 ({e.reason})") from None
    except RecursionError:
        raise ReportError(f"{path}: not a timeline: its JSON nests too deep to read") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ReportError(f"{path}: not a timeline: {e}") from None
    check_timeline(timeline, path)
    return timeline


def _integer(v):
    """`v` as an int when it is an integer, numpy's included (a timeline built or edited in
    Python may hold them, and the page draws them as any other), else None; a bool is none."""
    try:
        return _lib.index(v, "a timeline number")
    except TypeError:
        return None


def _shown(v):
    """`v` for an error message: its repr, or the size of an integer too large to draw."""
    n = _integer(v)
    return f"an integer of {n.bit_length()} bits (too large to draw)" if n is not None and abs(n) >= 2**1023 else repr(v)


def _is_number(v):
    """A JSON number the page can draw: an integer within a float's range (a larger one
    cannot be scaled or plotted), or a float."""
    if isinstance(v, float):
        return True
    n = _integer(v)
    return n is not None and abs(n) < 2**1023


def _check_numbers(values, what, where, samples=None, none_allowed=False):
    if not isinstance(values, list) or (samples is not None and len(values) != samples):
        size = f" of {samples} entries" if samples is not None else ""
        raise ReportError(f"{where}: {what} must be a list{size}")
    for k, v in enumerate(values):
        if not (_is_number(v) or (none_allowed and v is None)):
            raise ReportError(f"{where}: {what}[{k}] is {_shown(v)}, not a number")


def _check_records(records, what, where, fields, text_fields=(), counts=(), strings=()):
    """`records`: absent, or a list of objects whose `fields` are numbers (or null), whose
    `counts` are numbers where present (the page formats them with thousands commas, or
    adds them: null is no count), whose `strings` are text where present and not null (the
    page escapes them as HTML) and which have every one of `text_fields` (the names the
    plots print)."""
    if records is None:
        return
    if not isinstance(records, list):
        raise ReportError(f"{where}: \"{what}\" must be a list")
    for k, r in enumerate(records):
        if not isinstance(r, dict):
            raise ReportError(f"{where}: {what}[{k}] is {r!r}, not an object")
        for field in text_fields:
            if field not in r:
                raise ReportError(f"{where}: {what}[{k}] has no \"{field}\"")
        for field in fields:
            if field in r and not (_is_number(r[field]) or r[field] is None):
                raise ReportError(f"{where}: {what}[{k}].{field} is {_shown(r[field])}, not a number")
        for field in counts:
            if field in r and not _is_number(r[field]):
                raise ReportError(f"{where}: {what}[{k}].{field} is {_shown(r[field])}, not a number")
        for field in strings:
            if r.get(field) is not None and not isinstance(r[field], str):
                raise ReportError(f"{where}: {what}[{k}].{field} is {r[field]!r}, not a string")


def check_timeline(timeline, where="timeline"):
    """Raises ReportError naming the first thing in `timeline` the report could not draw."""
    if not isinstance(timeline, dict) or timeline.get("format") != TIMELINE_FORMAT:
        found = timeline.get("format") if isinstance(timeline, dict) else type(timeline).__name__
        raise ReportError(f"{where}: format {found!r}, expected {TIMELINE_FORMAT!r} "
                          "(write it with mrstack-replay --timeline)")
    for key in ("sample_event", "live_bytes", "stacks"):
        if not isinstance(timeline.get(key), list):
            raise ReportError(f"{where}: \"{key}\" is missing or not a list")
    samples = len(timeline["sample_event"])
    _check_numbers(timeline["sample_event"], '"sample_event"', where)
    if len(timeline["live_bytes"]) != samples:
        raise ReportError(f"{where}: \"live_bytes\" has {len(timeline['live_bytes'])} entries, "
                          f"\"sample_event\" {samples}")
    _check_numbers(timeline["live_bytes"], '"live_bytes"', where, samples, none_allowed=True)
    if not timeline["stacks"]:
        raise ReportError(f"{where}: \"stacks\" is empty (no stack was replayed)")
    for i, stack in enumerate(timeline["stacks"]):
        if not isinstance(stack, dict) or not isinstance(stack.get("resource"), str):
            raise ReportError(f"{where}: stacks[{i}] must be an object with a \"resource\" string")
        name = stack["resource"]
        for key in _SERIES:
            _check_numbers(stack.get(key), f"stack {name!r}: \"{key}\"", where, samples, none_allowed=True)
        failure = stack.get("failure")
        if failure is not None and not isinstance(failure, dict):
            raise ReportError(f"{where}: stack {name!r}: \"failure\" must be an object or null")
        if stack.get("error") is not None and not isinstance(stack["error"], str):
            raise ReportError(f"{where}: stack {name!r}: \"error\" is {_shown(stack['error'])}, not a string")
        if failure:  # the plot marks a failure at its event; an empty object is no failure
            _check_records([failure], f"stack {name!r} failure", where, ("line", "bytes"), ("event",), ("event",),
                           ("message",))
            _check_records([failure.get("fragmentation") or {}], f"stack {name!r} failure fragmentation", where,
                           ("held_bytes", "live_bytes", "free_bytes", "largest_free_block"), (), ("free_blocks",),
                           ("resource",))
    if timeline.get("capacity_bytes") is not None and not _is_number(timeline["capacity_bytes"]):
        raise ReportError(f"{where}: \"capacity_bytes\" is {_shown(timeline['capacity_bytes'])}, not a number")
    if "events" in timeline and not _is_number(timeline["events"]):
        raise ReportError(f"{where}: \"events\" is {_shown(timeline['events'])}, not a number")
    _check_records(timeline.get("size_histogram"), "size_histogram", where, ("min_bytes",),
                   ("min_bytes", "allocations"), ("allocations",))
    _check_records(timeline.get("threads"), "threads", where, (), ("thread", "allocations", "frees"),
                   ("allocations", "frees"))
    _check_records(timeline.get("streams"), "streams", where, (), ("stream", "allocations", "frees"),
                   ("allocations", "frees"))
    # The verdict names stacks by "resource"; the table formats the counts with commas.
    _check_records(timeline.get("results"), "results", where,
                   ("failures", "ns_per_event", "ns_per_call", "peak_live_bytes", "peak_footprint_bytes",
                    "footprint_ratio", "leaks"), ("resource",), ("events", "upstream_allocations"), ("resource",))


# ---- mrstack-replay ---------------------------------------------------------------------

def find_replay(explicit=None):
    """The mrstack-replay binary to run (see the module's doc), or ReportError naming
    where it looked."""
    looked = []
    for label, candidate in (("--replay", explicit), ("MRSTACK_REPLAY", os.environ.get("MRSTACK_REPLAY"))):
        if candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
            raise ReportError(f"{label}={candidate!r} is not an executable file")
    on_path = shutil.which("mrstack-replay")
    if on_path:
        return on_path
    looked.append("PATH")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    built = [p for p in glob.glob(os.path.join(repo, "build", "*", "tools", "mrstack-replay")) if os.access(p, os.X_OK)]
    looked.append(os.path.join(repo, "build", "*", "tools"))
    if built:
        return max(built, key=os.path.getmtime)
    raise ReportError("mrstack-replay not found (looked at --replay, MRSTACK_REPLAY, " + ", ".join(looked) +
                      "); build it (cmake --build --preset release --target mrstack-replay) or name it with --replay")


def run_replay(log, resources=(), replay=None, extra=()):
    """Replays `log` with mrstack-replay --timeline and returns the timeline. A stack that
    fails makes mrstack-replay exit 1; the timeline it wrote is still reported."""
    binary = find_replay(replay)
    with tempfile.TemporaryDirectory(prefix="mrstack-report-") as folder:
        path = os.path.join(folder, "timeline.json")
        # mrstack-replay has no "--": a log named "-x.csv" was read as an unknown option.
        command = [binary, os.path.join(".", log) if log.startswith("-") else log]
        for spec in resources:
            command += ["-r", spec]
        command += list(extra) + ["--timeline", path]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        except OSError as e:  # executable, but not a program this system runs (ENOEXEC, a bad interpreter)
            raise ReportError(f"{binary}: cannot run it: {e.strerror or e}") from None
        if done.returncode not in (0, 1) or not os.path.isfile(path):
            # Said whole: an exit without output had ended the message with ":" and an
            # empty line, and an exit of 0 looked like success.
            said = done.stderr.strip() or done.stdout.strip()
            missing = "" if os.path.isfile(path) else " without writing the timeline"
            raise ReportError(f"{' '.join(command)} exited {done.returncode}{missing}" +
                              (f":\n{said}" if said else " (it printed nothing)"))
        return load_timeline(path)


# ---- plots ------------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # text.parse_math off: the plots print thread and stream ids (any text the log holds)
    # and stack specs; a pair of '$' in one was drawn as TeX math, and a malformed one
    # ("$\\frac$") ended the report with matplotlib's ParseSyntaxException.
    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False, "text.parse_math": False})
    return plt


def _svg(fig):
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", dpi=110)  # dpi: the rasterized fills
    _pyplot().close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: inline in HTML
    # The RDF metadata (creator, date, namespace addresses) says nothing the page needs.
    return re.sub(r"<metadata>.*?</metadata>", "", text, count=1, flags=re.S)


def _byte_unit(peak):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= scale:
            return unit, scale
    return "B", 1


def _scaled(values, scale):
    return [None if v is None else v / scale for v in values]


def plot_footprint(timeline):
    plt = _pyplot()
    # Floats: matplotlib turns integers past 64 bits (or counts past int64) into arrays
    # of objects, or C longs, and fails on them.
    x = [float(e) for e in timeline["sample_event"]]
    peak = max([v for s in timeline["stacks"] for v in s["footprint_bytes"] if v is not None] +
               [v for v in timeline["live_bytes"] if v is not None] + [1])
    unit, scale = _byte_unit(peak)
    fig, ax = plt.subplots(figsize=(10, 4))
    # Samples are dense (up to a few thousand): straight lines between them draw the same
    # picture as steps with half the vertices, and the filled area is drawn as an image.
    # A null sample is a gap (NaN): None made the array one of objects, which fill_between
    # cannot test for finiteness.
    live = [float("nan") if v is None else v for v in _scaled(timeline["live_bytes"], scale)]
    ax.fill_between(x, live, color="0.8", label="live bytes (the log)", rasterized=True)
    for stack in timeline["stacks"]:
        ax.plot(x, [float("nan") if v is None else v for v in _scaled(stack["footprint_bytes"], scale)],
                linewidth=1.2, label=f"{stack['resource']} footprint")
        failure = stack.get("failure")
        if failure:
            ax.axvline(float(failure["event"]), color="red", linestyle=":", linewidth=1)
    if timeline.get("capacity_bytes"):
        ax.axhline(timeline["capacity_bytes"] / scale, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("event")
    ax.set_ylabel(unit)
    ax.set_title("Live bytes and each stack's footprint")
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig)


def plot_fragmentation(timeline):
    plt = _pyplot()
    stacks = timeline["stacks"]
    # Floats: matplotlib turns integers past 64 bits (or counts past int64) into arrays
    # of objects, or C longs, and fails on them.
    x = [float(e) for e in timeline["sample_event"]]
    fig, axes = plt.subplots(len(stacks), 1, figsize=(10, 2.2 * len(stacks) + 0.6), sharex=True, squeeze=False)
    for ax, stack in zip(axes[:, 0], stacks):
        peak = max([v for key in _SERIES[1:] for v in stack[key] if v is not None] + [1])
        unit, scale = _byte_unit(peak)
        free = [float("nan") if v is None else v for v in _scaled(stack["free_held_bytes"], scale)]
        largest = [float("nan") if v is None else v for v in _scaled(stack["largest_free_block"], scale)]
        ax.fill_between(x, free, alpha=0.35, color="tab:orange", label="free bytes held", rasterized=True)
        ax.plot(x, largest, color="tab:blue", linewidth=1.2, label="largest free block")
        ax.set_ylabel(unit)
        ax.set_title(stack["resource"], loc="left", fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("event")
    fig.suptitle("Fragmentation: free bytes held vs. the largest free block", fontsize=10)
    return _svg(fig)


def plot_histogram(timeline):
    plt = _pyplot()
    buckets = timeline.get("size_histogram") or []
    fig, ax = plt.subplots(figsize=(10, 3.2))
    labels = [_format_bytes(b["min_bytes"]) for b in buckets]
    ax.bar(range(len(buckets)), [float(b["allocations"]) for b in buckets], color="tab:green")
    ax.set_xticks(range(len(buckets)), labels, rotation=60, ha="right", fontsize=7)
    counts = [b["allocations"] for b in buckets if b["allocations"] > 0]
    # A log scale only where the counts span orders of magnitude; it flattens anything else.
    ax.set_yscale("log" if counts and max(counts) > 100 * min(counts) else "linear")
    ax.set_xlabel("allocation size (power-of-two bucket, lower bound)")
    ax.set_ylabel("allocations")
    ax.set_title("Allocation sizes")
    return _svg(fig)


def plot_activity(timeline):
    plt = _pyplot()
    groups = [("thread", timeline.get("threads") or []), ("stream", timeline.get("streams") or [])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), squeeze=False)
    for ax, (kind, rows) in zip(axes[0], groups):
        rows = sorted(rows, key=lambda r: -r["allocations"])[:20]
        names = [str(r[kind]) for r in rows]
        positions = range(len(rows))
        ax.bar([p - 0.2 for p in positions], [float(r["allocations"]) for r in rows], width=0.4, label="allocations")
        ax.bar([p + 0.2 for p in positions], [float(r["frees"]) for r in rows], width=0.4, label="frees")
        ax.set_xticks(list(positions), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"Per {kind}" + (" (the 20 busiest)" if len(timeline.get(kind + "s") or []) > 20 else ""))
        ax.legend(fontsize=7)
    return _svg(fig)


# ---- the page ---------------------------------------------------------------------------

def _format_bytes(n):
    if n is None:
        return "–"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.{0 if n % scale == 0 else 2}f} {unit}"
    return f"{n} B"


def _ns_text(ns):
    """A time per call as mrstack-replay prints it (ns_text, src/replay/cli_table.cpp):
    from 100 ns whole, rounded half away from zero, with thousands commas; below, one decimal."""
    return f"{math.floor(ns + 0.5):,}" if ns >= 100 else f"{ns:.1f}"


def _ratio(result):
    """A result's footprint ratio, or None where there is none to rank: missing, null or
    NaN (peak live 0: no ratio), or not above 0."""
    ratio = result.get("footprint_ratio")
    return ratio if _is_number(ratio) and ratio > 0 else None


def verdict(results):
    """The sentence mrstack-replay ends with (verdict_text, src/replay/cli_verdict.cpp,
    less its "verdict: "), from the results: the fastest and the most compact of the
    stacks that replayed the whole log, then how many did."""
    complete = [r for r in results if not r.get("failures") and not r.get("error")
                and not r.get("expected_failures_served")]
    if not complete:
        return "no stack replayed the whole log."
    # As mrstack-replay decides: the time inside the allocator (the replay's own hand-overs
    # between threads must not pick the winner; a timeline without it falls back to wall
    # time), the first of equals; compactness only among stacks whose footprint is
    # measured, not a bound, and that have a ratio, equal ratios the faster first.
    timed = "ns_per_call" if all(_is_number(r.get("ns_per_call")) for r in complete) else "ns_per_event"

    def ns(r):  # a missing or NaN time never wins (NaN would make min() order-dependent)
        return r[timed] if _is_number(r.get(timed)) and not math.isnan(r[timed]) else math.inf
    # A log with no events timed nothing: no stack is the fastest of nothing.
    timed_any = [r for r in complete if r.get("events", 1) != 0]
    if timed_any:
        fastest = min(timed_any, key=ns)
        unit = "ns/call" if timed == "ns_per_call" else "ns/event"
        text = f"fastest {fastest['resource']} ({_ns_text(ns(fastest)) if ns(fastest) < math.inf else '–'} {unit})"
    else:
        text = "no stack is fastest (the log has no allocations or frees to time)"
    fitted = [r for r in complete if _ratio(r) is not None and not r.get("footprint_lower_bound")]
    if fitted:
        compact = min(fitted, key=lambda r: (_ratio(r), ns(r)))
        text += f"; most compact {compact['resource']} ({_ratio(compact):.3f}x of peak live)"
    if len(complete) < len(results):
        return text + f"; {len(results) - len(complete)} of {len(results)} stacks did not replay the whole log."
    return text + ("; it replayed the whole log." if len(results) == 1 else
                   "; both stacks replayed the whole log." if len(results) == 2 else
                   f"; all {len(results)} stacks replayed the whole log.")


def _summary_table(results):
    head = ("stack", "events", "failures", "ns/call", "ns/event", "peak live", "peak footprint", "footprint / live",
            "upstream allocations", "leaks")
    rows = []
    for r in results:
        failed = bool(r.get("failures") or r.get("error"))
        cells = (r.get("resource"), f"{r.get('events', 0):,}", str(r.get("failures", 0)),
                 f"{r['ns_per_call']:.1f}" if r.get("ns_per_call") is not None else "–",
                 f"{r['ns_per_event']:.1f}" if r.get("ns_per_event") is not None else "–",
                 _format_bytes(r.get("peak_live_bytes")), _format_bytes(r.get("peak_footprint_bytes")),
                 f"{r['footprint_ratio']:.3f}" if r.get("footprint_ratio") else "–",
                 f"{r.get('upstream_allocations', 0):,}", str(r.get("leaks", 0)))
        row = "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
        rows.append(f"<tr class=\"{'failed' if failed else 'ok'}\">{row}</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _failure_section(timeline):
    """Each stack's first refused request, and what stopped a stack that could not be built
    or broke (its "error": without it the page showed a failed row and no reason)."""
    parts = []
    for stack in timeline["stacks"]:
        if stack.get("failure"):
            parts.append(_refusal(stack["resource"], stack["failure"]))
        if stack.get("error"):
            parts.append(f"<div class=\"failure\"><h3>{html.escape(stack['resource'])} stopped</h3>"
                         f"<pre>{html.escape(stack['error'])}</pre></div>")
    if not parts:
        return ""
    return "<h2 id=\"failures\">Failures</h2>" + "".join(parts)


def _refusal(resource, failure):
    frag = failure.get("fragmentation") or {}
    facts = [("log line", f"{failure.get('line'):,}" if failure.get("line") is not None else "–"),
             ("event", f"{failure.get('event'):,}" if failure.get("event") is not None else "–"),
             ("request", _format_bytes(failure.get("bytes")))]
    if frag.get("resource"):
        facts += [("answered by", frag["resource"]), ("held", _format_bytes(frag.get("held_bytes"))),
                  ("live", _format_bytes(frag.get("live_bytes"))), ("free", _format_bytes(frag.get("free_bytes"))),
                  ("largest free block", _format_bytes(frag.get("largest_free_block"))),
                  ("free blocks", f"{frag.get('free_blocks', 0):,}")]
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts)
    return (f"<div class=\"failure\"><h3>{html.escape(resource)} refused a request</h3>"
            f"<dl>{items}</dl><pre>{html.escape(failure.get('message') or '')}</pre></div>")


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 0.9em; } .verdict { font-size: 1.05em; background: #f2f6fb; padding: 0.6em 0.9em;
       border-left: 4px solid #4a7bb7; }
table { border-collapse: collapse; font-size: 0.85em; width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.5em; text-align: right; }
th:first-child, td:first-child { text-align: left; font-family: monospace; }
tr.failed td { background: #fdecea; }
.plot svg { max-width: 100%; height: auto; }
.failure { border: 1px solid #e0a0a0; background: #fff6f5; padding: 0.5em 1em; margin: 0.8em 0; }
.failure dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
.failure dt { color: #555; } .failure dd { margin: 0; font-family: monospace; }
pre { white-space: pre-wrap; font-size: 0.85em; }
"""


def render_html(timeline, title=None):
    """The page, as one string."""
    results = timeline.get("results") or []
    title = title or f"mrstack replay of {os.path.basename(str(timeline.get('log', 'a log')))}"
    capacity = timeline.get("capacity_bytes")
    meta = (f"log <code>{html.escape(str(timeline.get('log', '')))}</code> · {timeline.get('events', 0):,} events · "
            f"{len(timeline['sample_event']):,} samples · {'simulated memory' if timeline.get('simulated') else 'device memory'}"
            + (f" · capacity {_format_bytes(capacity)}" if capacity else ""))
    plots = [("Footprint", plot_footprint(timeline)), ("Fragmentation", plot_fragmentation(timeline)),
             ("Allocation sizes", plot_histogram(timeline)), ("Threads and streams", plot_activity(timeline))]
    sections = "".join(f"<h2>{name}</h2><div class=\"plot\">{svg}</div>" for name, svg in plots)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class=\"meta\">{meta}</p>"
            f"<p class=\"verdict\"><b>Verdict:</b> {html.escape(verdict(results))}</p>"
            f"<h2>Stacks</h2>{_summary_table(results)}{_failure_section(timeline)}{sections}"
            "</body></html>\n")


def write_report(timeline, output, title=None):
    """Writes the page to `output` whole or not at all (a temporary file beside it, renamed);
    ReportError when it cannot be written."""
    data = render_html(timeline, title).encode("utf-8")
    try:
        write_atomically(output, lambda f: f.write(data))
    except OSError as e:
        raise ReportError(f"cannot write {output}: {e.strerror or e}") from None
    return len(data)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mrstack.report",
        description="One self-contained HTML page (inline SVG plots, no network) about a replayed allocation log.")
    parser.add_argument("input", help="a timeline (mrstack-replay --timeline FILE.json) or an allocation log "
                                      "(CSV, plain or .gz), which is replayed")
    parser.add_argument("-o", "--output", required=True, help="the HTML file to write")
    parser.add_argument("-r", "--resource", action="append", default=[], metavar="SPEC",
                        help="a stack to replay the log on (several allowed; default: mrstack-replay's)")
    parser.add_argument("--capacity", help="memory of the simulated device (mrstack-replay --capacity)")
    parser.add_argument("--simulate", action="store_true", help="replay on simulated memory (mrstack-replay --simulate)")
    parser.add_argument("--timeline-points", type=int, help="samples to take (mrstack-replay --timeline-points)")
    parser.add_argument("--replay", help="the mrstack-replay binary (else MRSTACK_REPLAY, PATH, build/*/tools)")
    parser.add_argument("--title", help="the page's title")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if is_same_file(args.input, args.output):  # the page had replaced the log or timeline
            raise ReportError(f"-o {args.output} is the input itself: give the page its own path")
        if args.input.lower().endswith(".json"):  # t.JSON had been replayed as a log
            if args.resource or args.capacity or args.simulate or args.timeline_points is not None:
                raise ReportError("-r/--capacity/--simulate/--timeline-points apply to a log, not to a timeline")
            timeline = load_timeline(args.input)
        else:
            extra = []
            if args.capacity:
                extra += ["--capacity", args.capacity]
            if args.simulate:
                extra.append("--simulate")
            if args.timeline_points is not None:
                extra += ["--timeline-points", str(args.timeline_points)]
            timeline = run_replay(args.input, args.resource, args.replay, extra)
        size = write_report(timeline, args.output, args.title)
    except ReportError as e:
        print(f"mrstack.report: {e}", file=sys.stderr)
        return 2
    failed = [s["resource"] for s in timeline["stacks"] if s.get("failure") or s.get("error")]
    print(f"wrote {args.output}: {size / 1024:.0f} KiB, {len(timeline['stacks'])} stacks"
          + (f", failed: {', '.join(failed)}" if failed else "") + f" ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
