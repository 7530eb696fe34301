"""Logs built by hand for the Python tests."""
import struct


def binary_log(blocks, start_wall_ns=0, clock=0):
    """A binary log as the logging adaptor writes one (include/mrstack/log/binary_log.hpp):
    blocks of (kind, stamp, pointer, size, stream) records."""
    data = b"MRSTLOG\x01" + struct.pack("<IIqQ", 1, 32, start_wall_ns, clock)
    for records in blocks:
        data += struct.pack("<II", 0x4B4C4252, len(records))
        for kind, stamp, pointer, size, stream in records:
            data += struct.pack("<QQQQ", stamp | kind << 62, pointer, size, stream)
    return data
