"""Writing an output file whole or not at all, as mrstack-replay writes its own
(write_atomically, src/replay/cli_json.cpp)."""
import os
import stat
import tempfile


def checked_path(path, what):
    """`path` if it names a file (str, bytes or os.PathLike), else a TypeError naming `what`
    (the function and argument). An int is refused before open() sees it: open() takes it
    for a file descriptor, so read_log_events(3) read, and then closed, whatever the process
    had open as descriptor 3."""
    if isinstance(path, (str, bytes, os.PathLike)):
        return path
    raise TypeError(f"{what} must be a file name (str, bytes or os.PathLike), not {type(path).__name__} "
                    f"({path!r:.60})")


def is_same_file(a, b):
    """Whether the names `a` and `b` reach one existing file (through links and other
    spellings of the path too)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (or names nothing openable)
        return False


def write_atomically(path, write):
    """Calls write(binary file) for `path`. A regular file (or none yet) is written as a
    temporary file beside it, renamed over it, so no reader sees half of it and a failure
    leaves `path` as it was; the file gets the mode the umask gives a new file (mkstemp's
    0600 had made a report or log no one else could read). What is not a regular file
    (/dev/null, /dev/stdout, a FIFO) is written in place: renamed over, the device or
    pipe was replaced by a regular file, and nothing reached the reader."""
    try:
        mode = os.stat(path).st_mode
        special = not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)
    except OSError:
        special = False  # no such file yet (or none reachable): the rename reports what is wrong
    if special:
        with open(path, "wb") as f:
            write(f)
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask():
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
