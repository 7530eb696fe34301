"""Shared fixtures for the mrstack Python tests.

The tests import the package from this checkout (python/), and find libmrstack_c.so the
way the package does (MRSTACK_LIBRARY, the package folder, build/*/). Tests that need the
library skip, saying why, when it is not built — unless MRSTACK_REQUIRE_LIBRARY=1 (set by
tools/run-tests.sh), where a missing library is a failure. The same holds for the compiled
fast path (_fastpath.abi3.so) next to the library.
"""
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)


def _library_or_reason():
    from mrstack import _lib
    try:
        path = _lib.library_path()
    except _lib.LibraryNotFoundError as e:
        return None, str(e)
    if path is None:
        return None, f"{_lib.LIBRARY_NAME} is not built (cmake --build --preset release --target mrstack_c)"
    return path, ""


@pytest.fixture(scope="session")
def library_path():
    path, reason = _library_or_reason()
    if path is None:
        if os.environ.get("MRSTACK_REQUIRE_LIBRARY") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def fastpath_path(library_path):
    """The compiled fast path next to the library (the same build). Skips when it was not
    built, unless MRSTACK_REQUIRE_LIBRARY=1, where CI's build must have made it."""
    from mrstack import _lib
    path = os.path.join(os.path.dirname(os.path.abspath(library_path)), _lib.FASTPATH_NAME)
    if not os.path.isfile(path):
        reason = f"{path} is not built (cmake --build --preset release --target mrstack_fastpath)"
        if os.environ.get("MRSTACK_REQUIRE_LIBRARY") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture
def run_python(library_path):
    """Runs a snippet in a fresh interpreter (process-wide configuration is one-shot) with
    the package on the path and MRSTACK_LIBRARY pointing at the library; returns the
    completed process. `env` adds or removes (value None) variables."""
    def run(code, env=None, check=True):
        environment = dict(os.environ)
        environment["PYTHONPATH"] = PYTHON_DIR + os.pathsep + environment.get("PYTHONPATH", "")
        environment["MRSTACK_LIBRARY"] = library_path
        environment.pop("MRSTACK_RESOURCE", None)
        environment.pop("MRSTACK_FASTPATH", None)   # the extension when built, unless a test says
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        # A file, not -c: multiprocessing's spawn start method re-imports the main module.
        with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="mrstack_snippet_", delete=False) as f:
            f.write(textwrap.dedent(code))
        try:
            done = subprocess.run([sys.executable, f.name], env=environment, capture_output=True, text=True,
                                  timeout=300)
        finally:
            os.unlink(f.name)
        if check and done.returncode != 0:
            raise AssertionError(f"snippet failed ({done.returncode}):\nstdout:\n{done.stdout}\n"
                                 f"stderr:\n{done.stderr}")
        return done
    return run
