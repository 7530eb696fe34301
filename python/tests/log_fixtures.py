"""Logs built by hand for the Python tests, and the reference reader's answer."""
import struct

from mrstack import log_events
from mrstack.convert import ConversionError


def write(tmp_path, name, content):
    """Writes `content` (bytes, or str kept byte for byte) to tmp_path/name; its path."""
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content)
    return str(path)


def row_by_row(path):
    """("events", the events) or ("error", the message) from the row-by-row reader, which
    the fast readers must match exactly."""
    try:
        return "events", log_events._read_row_by_row(path)
    except ConversionError as e:
        return "error", str(e)


def binary_log(blocks, start_wall_ns=0, clock=0):
    """A binary log as the logging adaptor writes one (include/mrstack/log/binary_log.hpp):
    blocks of (kind, stamp, pointer, size, stream) records."""
    data = b"MRSTLOG\x01" + struct.pack("<IIqQ", 1, 32, start_wall_ns, clock)
    for records in blocks:
        data += struct.pack("<II", 0x4B4C4252, len(records))
        for kind, stamp, pointer, size, stream in records:
            data += struct.pack("<QQQQ", stamp | kind << 62, pointer, size, stream)
    return data
