"""mrstack on Dask workers: a `distributed` worker plugin that gives every worker its
stack before any library touches CUDA, and one call that collects every worker's
statistics on the client.

    from dask_cuda import LocalCUDACluster         # one worker per GPU
    from distributed import Client
    import mrstack.dask

    plugin = mrstack.dask.MrstackPlugin("pool(initial=8GiB) > cuda", hooks=("cupy",),
                                        log_file="/tmp/alloc-{worker}-{pid}.csv")
    cluster = LocalCUDACluster(n_workers=2, plugins={plugin})   # or client.register_plugin(plugin)
    client = Client(cluster)
    ...
    print(mrstack.dask.statistics(client))         # one row per worker

It works the same on a plain `distributed` cluster (`LocalCluster`, `dask worker`): a
worker's device is `device` (default 0), which under Dask-CUDA is the worker's own GPU
(Dask-CUDA gives each worker a CUDA_VISIBLE_DEVICES that lists its GPU first).

The log file: `{worker}` becomes the worker's name (characters other than letters,
digits, `.`, `_` and `-` become `_`), `{pid}` the worker process's id and `{device}` the
worker's GPU as CUDA_VISIBLE_DEVICES names it (else the device ordinal). The plugin puts
``logging(file=..., auto_flush=true)`` on top of the spec, so each row is in the file as
soon as it is logged (the worker's stack lives until the process exits) and the file is
a valid allocation log for ``mrstack-replay`` at any moment.
"""
import os
import re
import time
from dataclasses import asdict, dataclass

from distributed.diagnostics.plugin import WorkerPlugin

import mrstack
from mrstack import _lib

__all__ = ["MrstackPlugin", "WorkerStatistics", "StatisticsTable", "statistics", "log_files", "expand_placeholders"]

PLUGIN_NAME = "mrstack"
HOOKS = ("cupy", "numba", "torch")
MAX_DEVICES = 64  # the devices mrstack serves (a spec's device= has the same bound)
# In a worker: spec a plugin configured with its logging layer -> the spec under that layer.
_logged_from = {}


def _safe(text):
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(text))


def _visible_device(device):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    return entries[device] if device < len(entries) else str(device)


def expand_placeholders(text, worker_name, device=0, pid=None):
    """`text` with `{worker}`, `{pid}` and `{device}` filled in for this worker."""
    return (str(text).replace("{worker}", _safe(worker_name))
            .replace("{pid}", str(os.getpid() if pid is None else pid))
            .replace("{device}", _safe(_visible_device(device))))


def _hooks_argument(hooks):
    """`hooks` as a tuple of names. Checked on the client: None failed with "'NoneType' object
    is not iterable", 3 alike, and ["cupy", 1] with a ValueError calling 1 an unknown hook."""
    if hooks is None:
        return ()
    if isinstance(hooks, str):
        return (hooks,)
    accepted = 'a hook name ("cupy", "numba" or "torch"), a list, tuple or set of them, or None for none'
    if not isinstance(hooks, (list, tuple, set, frozenset)):
        raise TypeError(f"mrstack.dask: hooks must be {accepted}, not {type(hooks).__name__} ({hooks!r:.60})")
    for hook in hooks:
        if not isinstance(hook, str):
            raise TypeError(f"mrstack.dask: hooks must be {accepted}; it holds {hook!r:.60}, "
                            f"a {type(hook).__name__}")
    return tuple(hooks)


class MrstackPlugin(WorkerPlugin):
    """Configures mrstack on each worker when the worker starts (or, registered on a running
    cluster with ``client.register_plugin``, at once on every worker).

    spec      the stack spec; None: the worker's MRSTACK_RESOURCE, else mrstack's default
    hooks     the libraries to route through mrstack: one of "cupy", "numba", "torch", or a
              list, tuple or set of them; None or () for none (the default)
    log_file  a CSV allocation log per worker: a str or os.PathLike (placeholders: see the
              module's doc)
    device    the device whose stack the worker uses and reports (default 0)
    build     build the stack at set-up, so the first task does not pay for it (True, the
              default, or False)

    Set-up fails on the worker (and Dask reports it) for a bad spec, an unknown hook, or a
    worker whose stacks were already built from another spec.
    """

    name = PLUGIN_NAME

    def __init__(self, spec=None, hooks=(), log_file=None, device=0, build=True):
        hooks = _hooks_argument(hooks)
        unknown = [h for h in hooks if h not in HOOKS]
        if unknown:
            raise ValueError(f"mrstack.dask: unknown hooks {unknown}; choose from {', '.join(HOOKS)}")
        # Checked here, on the client: int() had read 1.9 as device 1, True as 1 and "-3" as
        # a negative ordinal that failed only on every worker at set-up. A bool, a float or a
        # str is a TypeError, an ordinal out of range a ValueError, as everywhere in mrstack.
        device = _lib.checked_integer(device, "mrstack.dask: device", 0, MAX_DEVICES - 1)
        # Checked here too: str() on the worker made b"pool > cuda" the spec "b'pool > cuda'",
        # which failed on every worker with a parser error about a quote.
        if spec is not None and not isinstance(spec, str):
            raise TypeError(f"mrstack.dask: spec must be a str or None, not {type(spec).__name__} ({spec!r:.60})")
        # log_file and build too: str() had made b"/logs/a.csv" a file named "b'/logs/a.csv'"
        # and 3 a file named "3" in the worker's directory, "" the directory itself, and
        # build="no" read as yes.
        if log_file is not None:
            if isinstance(log_file, os.PathLike):
                log_file = os.fspath(log_file)
            if not isinstance(log_file, str) or not log_file:
                raise TypeError(f"mrstack.dask: log_file must be a file name (a non-empty str or os.PathLike) or "
                                f"None, not {type(log_file).__name__} ({log_file!r:.60})")
        if build not in (True, False):
            raise TypeError(f"mrstack.dask: build must be True or False, not {type(build).__name__} ({build!r:.60})")
        self.spec, self.hooks, self.log_file = spec, tuple(hooks), log_file
        self.device, self.build = device, bool(build)
        # Filled in on the worker by setup():
        self.worker_spec = None
        self._base_spec = None  # worker_spec without the logging layer
        self.worker_log_file = None
        self.setup_seconds = None

    def _spec_for(self, worker_name):
        spec = self.spec if self.spec is not None else os.environ.get("MRSTACK_RESOURCE") or None
        if spec is None and self.log_file is not None:
            spec = mrstack.configured_spec()
            # Set up again in the same worker (the plugin registered a second time): the
            # configured spec is then the one this module made, logging layer included, and
            # wrapping it again would log every event twice (or, once built, be refused).
            spec = _logged_from.get(spec, spec)
        if spec is not None:
            spec = expand_placeholders(spec, worker_name, self.device)
        self._base_spec = spec
        if self.log_file is not None:
            self.worker_log_file = os.path.abspath(expand_placeholders(self.log_file, worker_name, self.device))
            quoted = self.worker_log_file.replace("\\", "\\\\").replace('"', '\\"')  # the spec's escapes
            spec = f'logging(file="{quoted}", auto_flush=true) > {spec}'
        return spec

    def setup(self, worker):
        started = time.perf_counter()
        self.worker_spec = self._spec_for(worker.name)
        if self.worker_spec is not None:
            mrstack.configure(self.worker_spec)
            if self.log_file is not None:
                _logged_from[self.worker_spec] = self._base_spec
        # The hooks go in before any task runs, so CuPy, Numba and PyTorch allocate through
        # mrstack from their first allocation on (PyTorch's allocator must be swapped before
        # PyTorch initializes CUDA).
        for hook in self.hooks:
            self._install(hook)
        if self.build:
            mrstack.device_stack(self.device)
        self.setup_seconds = time.perf_counter() - started

    @staticmethod
    def _install(hook):
        if hook == "cupy":
            import mrstack.cupy
            mrstack.cupy.install()
        elif hook == "torch":
            import mrstack.torch
            mrstack.torch.install()
        elif hook == "numba":
            from numba import cuda
            import mrstack.numba
            cuda.set_memory_manager(mrstack.numba.MrstackNumbaMemoryManager)


@dataclass(frozen=True)
class WorkerStatistics:
    worker: str            #: the worker's name
    address: str
    pid: int
    device: str            #: the GPU as CUDA_VISIBLE_DEVICES names it (else the ordinal)
    stack: str             #: the stack's layers; "" before it is built
    live_bytes: int
    peak_bytes: int
    free_bytes_held: int
    log_file: str          #: the worker's allocation log, "" without one
    setup_seconds: float   #: time the plugin's set-up took on the worker (-1: no plugin)


class StatisticsTable(list):
    """The rows `statistics` returns; printing it prints one line per worker."""

    def __str__(self):
        def mib(n):
            return f"{n / 2**20:.1f} MiB"
        header = ("worker", "device", "stack", "live", "peak", "held free")
        rows = [(r.worker, r.device, r.stack or "(not built)", mib(r.live_bytes), mib(r.peak_bytes),
                 mib(r.free_bytes_held)) for r in self]
        widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *rows]]
        return "\n".join(lines)


def _worker_statistics(dask_worker=None):
    plugin = dask_worker.plugins.get(PLUGIN_NAME) if dask_worker is not None else None
    device = plugin.device if plugin is not None else 0
    s = mrstack.statistics(device)
    return asdict(WorkerStatistics(
        worker=str(dask_worker.name), address=dask_worker.address, pid=os.getpid(),
        device=_visible_device(device), stack=s.stack, live_bytes=s.live_bytes, peak_bytes=s.peak_bytes,
        free_bytes_held=s.free_bytes_held, log_file=(plugin.worker_log_file or "") if plugin else "",
        setup_seconds=plugin.setup_seconds if plugin and plugin.setup_seconds is not None else -1.0))


def statistics(client, workers=None):
    """Every worker's mrstack statistics, one `WorkerStatistics` row each (sorted by worker
    name), as a list that prints as a table: ``print(mrstack.dask.statistics(client))``."""
    results = client.run(_worker_statistics, workers=workers)
    rows = [WorkerStatistics(**r) for r in results.values()]
    return StatisticsTable(sorted(rows, key=lambda r: r.worker))


def log_files(client):
    """Worker name -> its allocation log file (workers logging to a file only)."""
    return {r.worker: r.log_file for r in statistics(client) if r.log_file}
