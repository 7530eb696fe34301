"""Builds the mrstack wheel. The package is pure Python over a shared library that CMake
builds (libmrstack_c.so): when one is found — $MRSTACK_LIBRARY, or the newest
../build/*/libmrstack_c.so of this checkout — it is copied into the package, so the
installed package finds it next to itself. Without one the package still installs, and
looks for the library at run time (see mrstack/_lib.py).

The optional fast path, _fastpath.abi3.so (CMake's target mrstack_fastpath, built next to
the library), is copied along when the library's folder has one: the two come from the
same build. Without it the package uses ctypes for everything."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libmrstack_c.so"
FASTPATH = "_fastpath.abi3.so"


def built_library():
    env = os.environ.get("MRSTACK_LIBRARY")
    if env:
        path = os.path.join(env, LIBRARY) if os.path.isdir(env) else env
        if not os.path.isfile(path):
            raise SystemExit(f"MRSTACK_LIBRARY={env!r}: no {LIBRARY} there")
        return path
    built = glob.glob(os.path.join(HERE, "..", "build", "*", LIBRARY))
    return max(built, key=os.path.getmtime) if built else None


class build_py_with_library(build_py):
    def run(self):
        super().run()
        library = built_library()
        if library is None:
            self.announce(f"mrstack: no {LIBRARY} found; the package will look for it at run time", level=3)
            return
        target = os.path.join(self.build_lib, "mrstack", LIBRARY)
        self.announce(f"mrstack: bundling {os.path.abspath(library)}", level=3)
        shutil.copy2(library, target)
        fastpath = os.path.join(os.path.dirname(library), FASTPATH)
        if os.path.isfile(fastpath):
            self.announce(f"mrstack: bundling {os.path.abspath(fastpath)}", level=3)
            shutil.copy2(fastpath, os.path.join(self.build_lib, "mrstack", FASTPATH))
        else:
            self.announce(f"mrstack: no {FASTPATH} next to the library; the package will use ctypes only", level=3)


class BinaryDistribution(Distribution):
    # The wheel carries a shared library when one was found: tag it for this platform.
    def has_ext_modules(self):
        return built_library() is not None


commands = {"build_py": build_py_with_library}
try:  # setuptools >= 70.1 has its own; before, the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:
    class bdist_wheel_any_python(bdist_wheel):
        # Neither binary depends on the Python version (the library is plain C ABI, the
        # extension abi3 for 3.10+), so the wheel is for any Python 3 on this platform,
        # not only the one that built it: py3-none-<platform>.
        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    commands["bdist_wheel"] = bdist_wheel_any_python

setup(cmdclass=commands, distclass=BinaryDistribution)
