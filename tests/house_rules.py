#!/usr/bin/env python3
"""The house rules docs/design.md states, checked on every test run.

1. No source file over 700 lines (src/, include/, tools/, benchmarks/, python/mrstack/).
2. The CUDA-free cores include nothing outside detail/: include/mrstack/detail/* and
   src/detail/* name no other mrstack header and no CUDA header.
3. src/ mirrors include/mrstack/: every src/<part>/ folder has an include/mrstack/<part>/
   twin (besides the parts that have no public headers of their own).
4. No C++ function over 80 lines unless a comment within the three lines above it says
   why, with the words "long function:". Needs the `lizard` package (pip); without it this
   check reports itself skipped, by name.

Prints every breach with file:line and exits 1 when there is one.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 80
SOURCE_DIRS = ["src", "include", "tools", "benchmarks", "python/mrstack"]
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".c", ".py", ".cu", ".cuh"}
# Parts of src/ that have no header folder of their own: the spec builder (its headers are
# include/mrstack/spec*.hpp), the C ABI (include/mrstack/c_api.h) and the Python extension.
SRC_ONLY_PARTS = {"spec", "c_api", "python"}
CUDA_HEADER = re.compile(r'#\s*include\s*[<"](cuda|cu[a-z_]*\.h|nv)')
MRSTACK_INCLUDE = re.compile(r'#\s*include\s*[<"](mrstack/[^>"]+)[>"]')


def sources(dirs):
    for d in dirs:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in SOURCE_SUFFIXES:
                yield p


def rel(p):
    return p.relative_to(ROOT).as_posix()


def check_file_sizes():
    breaches = []
    for p in sources(SOURCE_DIRS):
        n = p.read_text(errors="replace").count("\n")
        if n > MAX_FILE_LINES:
            breaches.append(f"{rel(p)}: {n} lines, more than {MAX_FILE_LINES}")
    return breaches


def check_core_arrows():
    breaches = []
    for p in sources(["include/mrstack/detail", "src/detail"]):
        for lineno, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            m = MRSTACK_INCLUDE.search(line)
            if m and not m.group(1).startswith("mrstack/detail/"):
                breaches.append(f"{rel(p)}:{lineno}: a core includes {m.group(1)}, outside detail/")
            if CUDA_HEADER.search(line):
                breaches.append(f"{rel(p)}:{lineno}: a core includes a CUDA header: {line.strip()}")
    return breaches


def check_mirror():
    breaches = []
    for d in sorted((ROOT / "src").iterdir()):
        if d.is_dir() and d.name not in SRC_ONLY_PARTS and not (ROOT / "include/mrstack" / d.name).is_dir():
            breaches.append(f"src/{d.name}/ has no include/mrstack/{d.name}/ twin")
    return breaches


def check_function_lengths():
    try:
        import lizard
    except ImportError:
        print("house_rules: function-length check SKIPPED: the lizard package is not installed")
        return []
    breaches = []
    for p in sources(["src", "include", "tools", "benchmarks"]):
        if p.suffix not in {".cpp", ".hpp", ".h", ".cu"}:
            continue
        text = p.read_text(errors="replace")
        lines = text.splitlines()
        info = lizard.analyze_file.analyze_source_code(str(p), text)
        for f in info.function_list:
            length = f.end_line - f.start_line + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            above = " ".join(lines[max(0, f.start_line - 4):f.start_line - 1])
            if "long function:" not in above:
                breaches.append(f"{rel(p)}:{f.start_line}: {f.name} is {length} lines, more than "
                                f"{MAX_FUNCTION_LINES}, and no 'long function:' comment says why")
    return breaches


def main():
    breaches = check_file_sizes() + check_core_arrows() + check_mirror() + check_function_lengths()
    for b in breaches:
        print(b)
    if breaches:
        print(f"house_rules: {len(breaches)} breach(es) of the rules in docs/design.md")
        return 1
    print("house_rules: every rule holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
