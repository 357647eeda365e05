"""safetensors files written and read byte by byte from the format's spec, for the tests that need
dtypes numpy lacks (BF16, F8_E4M3, F8_E5M2) or must not depend on the Python library."""
import json
import struct


def write_raw(path, entries, metadata=None):
    """A safetensors file from (name, dtype, shape, bytes) entries, by hand."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_raw(path):
    """(header dict, data bytes) of a safetensors file, by hand."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]
