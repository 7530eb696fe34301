"""python -m mrstack.report: one self-contained HTML page from a timeline (or a log,
through mrstack-replay), checked as text and, in headless Chromium, as a rendered page."""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

from timeline_fixtures import make_timeline

matplotlib = pytest.importorskip("matplotlib", reason="the report draws with matplotlib (requirements-test.txt)")

from mrstack import report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_LOG = os.path.join(REPO, "data", "torch_resnet50_train.csv.gz")


def write_json(tmp_path, timeline, name="timeline.json"):
    path = tmp_path / name
    path.write_text(json.dumps(timeline))
    return str(path)


def run_report(*args):
    return subprocess.run([sys.executable, "-m", "mrstack.report", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")}, timeout=120)


def test_page_is_self_contained_with_every_plot_and_the_table(tmp_path):
    timeline = make_timeline()
    out = tmp_path / "report.html"
    done = run_report(write_json(tmp_path, timeline), "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count("<svg") == 4                       # footprint, fragmentation, histogram, activity
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org", "")
    assert "https://" not in text and "<link" not in text and "@import" not in text
    for spec in ("pool &gt; cuda", "binning &gt; pool &gt; cuda"):
        assert spec in text
    # mrstack-replay's verdict: fastest by the time inside the allocator (ns_per_call), not
    # by ns_per_event, which ranks the stacks the other way in this timeline.
    assert "fastest binning &gt; pool &gt; cuda (75.0 ns/call)" in text
    assert "both stacks replayed the whole log." in text
    assert "Failures" not in text
    # Every stack's footprint is a drawn line, not only a legend entry.
    assert len(re.findall(r"<path ", text)) > 20


def test_a_timeline_named_in_capitals_is_read_as_a_timeline(tmp_path):
    # "t.JSON" was replayed as an allocation log, which failed on its first line.
    out = tmp_path / "report.html"
    done = run_report(write_json(tmp_path, make_timeline(), name="timeline.JSON"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "binning &gt; pool &gt; cuda" in out.read_text()


def test_failure_section_names_line_request_and_fragmentation(tmp_path):
    timeline = make_timeline(fail_at=2000)
    html = report.render_html(timeline)
    section = html[html.index("id=\"failures\""):html.index("<h2>Footprint")]
    assert "binning &gt; pool &gt; cuda refused a request" in section
    assert "2,002" in section            # the log line
    assert "40 MiB" in section           # the request
    assert "largest free block" in section and "free blocks" in section and "17" in section
    assert "1 of 2 stacks did not replay the whole log." in html
    assert "class=\"failed\"" in html


def test_malformed_timelines_are_refused_naming_what(tmp_path):
    bad = make_timeline()
    bad["format"] = "something/2"
    done = run_report(write_json(tmp_path, bad), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "mrstack-timeline/1" in done.stderr
    short = make_timeline()
    short["stacks"][0]["largest_free_block"].pop()
    done = run_report(write_json(tmp_path, short), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "largest_free_block" in done.stderr and "pool > cuda" in done.stderr
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("spoil, named", [
    (lambda t: t.update(stacks=[5]), "stacks[0] must be an object"),
    (lambda t: t["stacks"][0].pop("resource"), "stacks[0] must be an object with a \"resource\""),
    (lambda t: t.update(stacks=[]), "\"stacks\" is empty"),
    (lambda t: t["live_bytes"].__setitem__(3, "x"), "\"live_bytes\"[3] is 'x'"),
    (lambda t: t["stacks"][1]["footprint_bytes"].__setitem__(0, True), "\"footprint_bytes\"[0] is True"),
    (lambda t: t["stacks"][0].update(failure="boom"), "\"failure\" must be an object or null"),
    (lambda t: t.update(size_histogram=[{"min_bytes": "x", "allocations": 1}]), "size_histogram[0].min_bytes"),
    (lambda t: t.update(threads=[{"thread": 1}]), "threads[0] has no \"allocations\""),
    (lambda t: t.update(results=[7]), "results[0] is 7, not an object"),
])
def test_timelines_the_plots_cannot_draw_are_refused_naming_the_entry(tmp_path, spoil, named):
    # Each of these passed the old check and crashed while drawing, with a traceback.
    bad = make_timeline()
    spoil(bad)
    done = run_report(write_json(tmp_path, bad), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "r.html").exists()


def _with_failure(t, **fields):
    t["stacks"][0]["failure"] = {"line": 5, "event": 3, "bytes": 512, "message": "out of memory", **fields}


@pytest.mark.parametrize("spoil, named", [
    (lambda t: t["results"][0].pop("resource"), "results[0] has no \"resource\""),
    (lambda t: t["results"][0].update(events=None), "results[0].events is None, not a number"),
    (lambda t: t["results"][0].update(upstream_allocations=None), "results[0].upstream_allocations is None"),
    (lambda t: t.update(events="3000"), "\"events\" is '3000', not a number"),
    (lambda t: _with_failure(t, event=None), "failure[0].event is None, not a number"),
    (lambda t: t["stacks"][0].update(failure={"line": 5}), "failure[0] has no \"event\""),
    (lambda t: _with_failure(t, message=7), "failure[0].message is 7, not a string"),
    (lambda t: _with_failure(t, fragmentation={"resource": 5}), "fragmentation[0].resource is 5, not a string"),
    (lambda t: _with_failure(t, fragmentation={"resource": "pool", "free_blocks": "17"}),
     "fragmentation[0].free_blocks is '17', not a number"),
    (lambda t: t["size_histogram"][0].update(allocations=None), "size_histogram[0].allocations is None"),
    (lambda t: t["threads"][0].update(allocations=None), "threads[0].allocations is None"),
    (lambda t: t["streams"][1].update(frees=None), "streams[1].frees is None"),
])
def test_timelines_the_page_cannot_format_are_refused_naming_the_entry(tmp_path, spoil, named):
    # Each passed the check (null was taken for a number, a missing name or event for an
    # optional one) and then failed in the table, the verdict or a plot with a traceback.
    bad = make_timeline(events=50, points=10)
    spoil(bad)
    done = run_report(write_json(tmp_path, bad), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("content, named", [
    (b'{"format": "mrstack-timeline/1", "log": "\xff"}', "not JSON: byte 41 is not UTF-8"),
    (b"[" * 100_000, "nests too deep"),
])
def test_a_timeline_file_that_is_no_json_is_an_error_not_a_traceback(tmp_path, content, named):
    path = tmp_path / "timeline.json"
    path.write_bytes(content)
    done = run_report(str(path), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("spoil, named", [
    # Counts past int64 were C longs to matplotlib (OverflowError), sample events past
    # 64 bits an array of objects (TypeError); numbers past a float's range could not be
    # scaled at all. The first two now draw; the last are refused.
    (lambda t: t["size_histogram"][0].update(allocations=2**64 - 1), None),
    (lambda t: t["threads"][0].update(frees=2**64 - 1), None),
    (lambda t: t["sample_event"].__setitem__(-1, 2**70), None),
    # Null live bytes passed the check (and the peak's filter) and failed in fill_between.
    (lambda t: t["live_bytes"].__setitem__(2, None), None),
    (lambda t: t["live_bytes"].__setitem__(1, 10**400), "\"live_bytes\"[1] is an integer of 1329 bits (too large"),
    (lambda t: t["results"][0].update(ns_per_call=10**400), "results[0].ns_per_call is an integer of 1329 bits"),
])
def test_huge_numbers_draw_or_are_refused_not_a_traceback(tmp_path, spoil, named):
    timeline = make_timeline(events=50, points=10)
    spoil(timeline)
    done = run_report(write_json(tmp_path, timeline), "-o", str(tmp_path / "r.html"))
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, named is None or named in done.stderr) == (0 if named is None else 2, True), done.stderr


def test_a_device_named_json_is_refused_at_once_not_read_forever(tmp_path):
    # json.load read /dev/zero whole: until memory ran out (here, under a 1 GiB address
    # space, a MemoryError traceback). Now it is read as the log reader reads a device, a
    # block at a time, stopping at the first NUL.
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    done = subprocess.run([sys.executable, "-c", f"""if True:
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from mrstack import report
        try:
            report.load_timeline({str(tmp_path / "zero.json")!r})
        except report.ReportError as e:
            print("REFUSED", e)
        """], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")})
    assert done.stdout.startswith(f"REFUSED {tmp_path / 'zero.json'}: not JSON"), (done.stdout, done.stderr[-2000:])


def test_a_fifo_past_the_limit_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    # A pipe had no size limit at all; it now has the log reader's (made small here).
    import threading
    monkeypatch.setattr(report._log_events, "MAX_TEXT_BYTES", 1 << 20)
    path = tmp_path / "timeline.json"
    os.mkfifo(path)
    written = []

    def writer():
        try:
            with open(path, "wb") as f:
                for _ in range(8):
                    f.write(b" " * (1 << 20))   # JSON whitespace: no NUL to stop at
                    written.append(1)
        except BrokenPipeError:                 # the reader stopped at its limit and closed
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with pytest.raises(report.ReportError, match=f"^{re.escape(str(path))}: not a timeline: larger than 1048576 bytes"):
        report.load_timeline(str(path))
    thread.join(30)
    assert not thread.is_alive() and len(written) < 8


def test_a_regular_file_past_the_limit_is_refused_by_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(report._log_events, "MAX_TEXT_BYTES", 1000)
    path = write_json(tmp_path, make_timeline(events=50, points=10))
    assert os.path.getsize(path) > 1000
    with pytest.raises(report.ReportError, match="not a timeline: larger than 1000 bytes, the reader's limit"):
        report.load_timeline(path)


def test_an_integer_json_cannot_convert_is_refused(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text('{"format": "mrstack-timeline/1", "events": ' + "9" * 5000 + "}")
    done = run_report(str(path), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "not a timeline: Exceeds the limit" in done.stderr, done.stderr


def test_a_stack_that_could_not_be_built_says_why(tmp_path):
    """mrstack-replay writes what stopped a stack as its "error" (no failure, samples all
    null); the page showed a failed row and no reason, the command line no failed stack."""
    timeline = make_timeline(events=50, points=10)
    why = "building the stack failed: out of memory: simulated could not allocate 2.00 GiB"
    stack = timeline["stacks"][0]
    for key in ("footprint_bytes", "free_held_bytes", "largest_free_block"):
        stack[key] = [None] * len(stack[key])
    stack["error"] = timeline["results"][0]["error"] = why
    done = run_report(write_json(tmp_path, timeline), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0 and "failed: pool > cuda" in done.stdout, done.stdout + done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "pool &gt; cuda stopped" in page and why in page
    stack["error"] = 5
    done = run_report(write_json(tmp_path, timeline), "-o", str(tmp_path / "r2.html"))
    assert done.returncode == 2 and "stack 'pool > cuda': \"error\" is 5, not a string" in done.stderr, done.stderr


def test_thread_and_stream_ids_are_printed_as_written_not_as_tex(tmp_path):
    """A thread id is any printable text; one with a pair of '$' was drawn as TeX math, and
    a malformed one ended the report with matplotlib's parse error."""
    timeline = make_timeline(events=50, points=10)
    timeline["threads"][0]["thread"] = "$\\frac$"
    timeline["streams"][0]["stream"] = "$x^2$"
    done = run_report(write_json(tmp_path, timeline), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "$\\frac$" in page and "$x^2$" in page


def test_an_output_that_cannot_be_written_is_an_error_and_leaves_nothing_behind(tmp_path):
    timeline = write_json(tmp_path, make_timeline())
    folder = tmp_path / "a_folder"
    folder.mkdir()
    for output in (str(folder), str(tmp_path / "missing" / "r.html")):
        done = run_report(timeline, "-o", output)
        assert done.returncode == 2 and f"cannot write {output}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert os.listdir(folder) == [] and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_timeline_points_zero_is_not_dropped(tmp_path):
    # 0 is an argument like any other: with a timeline it is refused, as the others are.
    done = run_report(write_json(tmp_path, make_timeline()), "-o", str(tmp_path / "r.html"), "--timeline-points", "0")
    assert done.returncode == 2 and "apply to a log, not to a timeline" in done.stderr


def test_big_timeline_is_small_and_fast(tmp_path):
    timeline = make_timeline(events=40000, points=2000, stacks=("pool > cuda", "pool > vmm", "binning > pool > cuda",
                                                                 "arena > cuda", "cuda_async", "cuda"))
    started = time.perf_counter()
    size = report.write_report(timeline, str(tmp_path / "r.html"))
    seconds = time.perf_counter() - started
    assert size < 2 * 2**20
    assert seconds < 10


def _fake_replay(tmp_path, timeline):
    """A stand-in mrstack-replay: writes `timeline` where --timeline says, records its
    arguments, exits 1 (a stack failed) so the report must still be written."""
    source = write_json(tmp_path, timeline, "canned.json")
    script = tmp_path / "fake-replay"
    script.write_text(f"""#!{sys.executable}
import shutil, sys
args = sys.argv[1:]
open({str(tmp_path / 'args.txt')!r}, 'w').write('\\n'.join(args))
shutil.copy({source!r}, args[args.index('--timeline') + 1])
sys.exit(1)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_log_is_replayed_with_the_stacks_asked_for(tmp_path, monkeypatch):
    fake = _fake_replay(tmp_path, make_timeline(fail_at=1500))
    monkeypatch.setenv("MRSTACK_REPLAY", fake)
    out = tmp_path / "r.html"
    done = run_report("log.csv.gz", "-r", "pool > cuda", "-r", "binning > pool > cuda", "--capacity", "1GiB",
                      "-o", str(out))
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args[:5] == ["log.csv.gz", "-r", "pool > cuda", "-r", "binning > pool > cuda"]
    assert args[5:7] == ["--capacity", "1GiB"] and "--timeline" in args
    assert "failed: binning > pool > cuda" in done.stdout
    assert out.read_text().count("<svg") == 4


def test_missing_replay_binary_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MRSTACK_REPLAY", str(tmp_path / "nowhere"))
    done = run_report("log.csv", "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "MRSTACK_REPLAY" in done.stderr and "nowhere" in done.stderr


def _replay_with_timeline():
    try:
        binary = report.find_replay()
    except report.ReportError:
        return None
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return binary if "--timeline" in helped.stdout + helped.stderr else None


def test_a_replay_binary_that_cannot_run_is_named(tmp_path):
    # Executable but no program (no ELF header, no #! line): exec fails with ENOEXEC,
    # which subprocess raised as an OSError out of the report.
    fake = tmp_path / "mrstack-replay"
    fake.write_bytes(b"garbage, not a program")
    fake.chmod(0o755)
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1000,512,0\n")
    done = run_report(str(log), "--replay", str(fake), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2 and f"mrstack.report: {fake}: cannot run it: Exec format error" in done.stderr, \
        done.stderr
    assert not (tmp_path / "r.html").exists()


def test_sample_log_report_through_the_real_replay(tmp_path):
    binary = _replay_with_timeline()
    if binary is None:
        pytest.skip("no mrstack-replay with --timeline in this build")
    out = tmp_path / "r.html"
    started = time.perf_counter()
    done = run_report(SAMPLE_LOG, "--replay", binary, "--simulate", "-r", "pool > cuda", "-r", "binning > pool > cuda",
                      "-o", str(out))
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 2 * 2**20 and seconds <= 10
    assert out.read_text().count("<svg") == 4


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_page_renders_in_headless_chromium(tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the screenshot proves the page renders")
    from PIL import Image
    page = tmp_path / "report.html"
    report.write_report(make_timeline(fail_at=2500), str(page))
    shot = tmp_path / "report.png"
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1200,4200", f"--screenshot={shot}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stderr
    keep = os.environ.get("MRSTACK_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    # Not blank: the plots' colours are there, down the page where the SVGs are.
    small = image.resize((width // 4, height // 4))
    colours = small.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50
    raw = small.tobytes()
    pixels = [raw[i:i + 3] for i in range(0, len(raw), 3)]
    coloured = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)  # not grey: lines and fills
    assert coloured > 0.01 * len(pixels)
    bottom_half = small.crop((0, small.size[1] // 2, small.size[0], small.size[1]))
    assert len(bottom_half.getcolors(maxcolors=1 << 20)) > 20   # the later plots are drawn too


def test_sparse_timelines_still_make_a_page(tmp_path):
    """One sample, a stack that failed at the first event (every entry null), no
    histogram, no thread or stream rows, no results: a page, saying so, not a crash."""
    timeline = {"format": "mrstack-timeline/1", "log": "tiny.csv", "events": 1, "simulated": True,
                "capacity_bytes": 1 << 20, "sample_event": [0], "live_bytes": [0],
                "stacks": [{"resource": "pool > cuda", "footprint_bytes": [None], "free_held_bytes": [None],
                            "largest_free_block": [None],
                            "failure": {"line": 2, "event": 0, "bytes": 2 << 20, "message": "out of memory",
                                        "fragmentation": None}}],
                "size_histogram": [], "threads": [], "streams": [], "results": []}
    html = report.render_html(timeline)
    assert html.count("<svg") == 4
    assert "no stack replayed the whole log" in html
    assert "2 MiB" in html and "capacity 1 MiB" in html


def _result(resource, ns_per_call, ratio, lower_bound=False, failures=0):
    return {"resource": resource, "events": 10, "failures": failures, "error": None, "ns_per_event": 500.0,
            "ns_per_call": ns_per_call, "footprint_ratio": ratio, "footprint_lower_bound": lower_bound}


def test_verdict_words_and_ranks_as_mrstack_replay_does():
    """verdict_text (src/replay/cli_verdict.cpp): equal footprint ratios go to the faster
    stack; a stack without a ratio (peak live 0: null or NaN) or with a lower bound is
    never the most compact; times are printed as the table prints them; the sentence
    ends saying how many stacks replayed the whole log."""
    tie = [_result("a", 90.0, 1.25), _result("b", 80.0, 1.25), _result("c", 70.0, 1.0, lower_bound=True)]
    assert report.verdict(tie) == ("fastest c (70.0 ns/call); most compact b (1.250x of peak live); "
                                   "all 3 stacks replayed the whole log.")
    for missing in (float("nan"), None, 0):
        results = [_result("none", 1500.4, missing), _result("some", 2500.5, 1.5)]
        assert report.verdict(results) == ("fastest none (1,500 ns/call); most compact some (1.500x of peak live); "
                                           "both stacks replayed the whole log."), missing
    assert report.verdict([_result("only", 12.25, missing)]) == \
        "fastest only (12.2 ns/call); it replayed the whole log."
    failed = [_result("ok", 50.0, 2.0), _result("bad", 10.0, 1.0, failures=3)]
    assert report.verdict(failed) == ("fastest ok (50.0 ns/call); most compact ok (2.000x of peak live); "
                                      "1 of 2 stacks did not replay the whole log.")
    # A timeline without ns_per_call (an older mrstack-replay) ranks by ns_per_event.
    older = [dict(_result("x", None, 1.5), ns_per_event=40.0), dict(_result("y", None, 1.5), ns_per_event=30.0)]
    assert report.verdict(older).startswith("fastest y (30.0 ns/event); most compact y (1.500x of peak live)")


def test_verdict_names_no_fastest_stack_on_a_log_with_no_events():
    # Every stack timed nothing (null times): the first was "fastest a (– ns/event)".
    empty = [dict(_result(name, None, None), events=0, ns_per_event=None) for name in ("a", "b")]
    assert report.verdict(empty) == ("no stack is fastest (the log has no allocations or frees to time); "
                                     "both stacks replayed the whole log.")


def test_verdict_is_the_real_replays_sentence_on_a_log_with_no_events(tmp_path):
    binary = _replay_with_timeline()
    if binary is None:
        pytest.skip("no mrstack-replay with --timeline in this build")
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n")
    timeline = tmp_path / "t.json"
    done = subprocess.run([binary, str(log), "--simulate", "-r", "pool > cuda", "-r", "cuda", "--timeline",
                           str(timeline)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = next(line for line in done.stdout.splitlines() if line.startswith("verdict: "))
    assert report.verdict(json.loads(timeline.read_text())["results"]) == printed[len("verdict: "):]


def test_verdict_is_the_real_replays_sentence(tmp_path):
    binary = _replay_with_timeline()
    if binary is None:
        pytest.skip("no mrstack-replay with --timeline in this build")
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1000,100,0\n2,0,allocate,0x2000,300,0x5\n"
                   "1,0,free,0x1000,100,0\n2,0,allocate,0x4000,1024,0x5\n2,0,free,0x2000,300,0x5\n")
    timeline = tmp_path / "t.json"
    done = subprocess.run([binary, str(log), "--simulate", "-r", "pool > cuda", "-r", "cuda", "-r", "binning > cuda",
                           "--timeline", str(timeline)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = next(line for line in done.stdout.splitlines() if line.startswith("verdict: "))
    assert report.verdict(json.loads(timeline.read_text())["results"]) == printed[len("verdict: "):]


def test_a_log_whose_name_starts_with_a_dash_reaches_the_replay_as_a_file(tmp_path, monkeypatch):
    # mrstack-replay has no "--": "-log.csv" was passed as is and read as an unknown option.
    fake = _fake_replay(tmp_path, make_timeline())
    monkeypatch.setenv("MRSTACK_REPLAY", fake)
    monkeypatch.chdir(tmp_path)
    done = run_report("-o", str(tmp_path / "r.html"), "--", "-log.csv")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "args.txt").read_text().split("\n")[0] == os.path.join(".", "-log.csv")


@pytest.mark.parametrize("program, said", [("exit 1", "exited 1 without writing the timeline (it printed nothing)"),
                                           ("exit 0", "exited 0 without writing the timeline (it printed nothing)"),
                                           ("echo broke >&2; exit 3",
                                            "exited 3 without writing the timeline:\nbroke")])
def test_a_replay_that_writes_no_timeline_is_said_whole(tmp_path, program, said):
    # The message ended with ":" and an empty line when the replay printed nothing, and an
    # exit of 0 without a timeline read like success.
    fake = tmp_path / "mrstack-replay"
    fake.write_text(f"#!/bin/sh\n{program}\n")
    fake.chmod(0o755)
    done = run_report("log.csv", "--replay", str(fake), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"mrstack.report: {fake} log.csv --timeline "), done.stderr
    assert done.stderr.endswith(f" {said}\n"), done.stderr
    assert not (tmp_path / "r.html").exists()


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path):
    # The page replaced the timeline (or the log) it was made from.
    given = write_json(tmp_path, make_timeline())
    before = open(given, "rb").read()
    done = run_report(given, "-o", os.path.join(tmp_path, ".", os.path.basename(given)))
    assert done.returncode == 2
    assert done.stderr.startswith("mrstack.report: -o ") and done.stderr.endswith(
        " is the input itself: give the page its own path\n"), done.stderr
    assert open(given, "rb").read() == before


def test_numpy_integers_in_a_timeline_draw_as_ints_do():
    # A timeline built or edited with numpy holds numpy's integers: check_timeline called
    # np.int64(5) "not a number" and the page was refused, though it draws them as any int.
    np = pytest.importorskip("numpy")
    timeline = make_timeline(events=300, points=50)

    def as_numpy(value):
        if isinstance(value, dict):
            return {k: as_numpy(v) for k, v in value.items()}
        if isinstance(value, list):
            return [as_numpy(v) for v in value]
        return np.int64(value) if type(value) is int else value

    converted = as_numpy(timeline)
    assert type(converted["sample_event"][0]) is np.int64
    report.check_timeline(converted)
    without_plots = [re.sub(r"<svg.*?</svg>", "", report.render_html(t), flags=re.S) for t in (timeline, converted)]
    assert without_plots[0] == without_plots[1]
    # A bool stays refused, numpy's too (it has no __index__).
    for flag in (True, np.bool_(True)):
        converted["live_bytes"][0] = flag
        with pytest.raises(report.ReportError, match=r"\"live_bytes\"\[0\] is .*True.*, not a number"):
            report.check_timeline(converted)
