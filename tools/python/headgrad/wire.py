"""The worker protocol between headgrad (C++) and a Python worker.

One message each way, over a pipe: a little-endian u32 length, that many bytes
of a JSON header (UTF-8), then the raw little-endian bytes of every tensor the
header's "tensors" list describes, in its order. A tensor sent to Python is a
strided view over the span of its storage that it covers (so a transposed or
sliced input arrives as the same view, not as a contiguous copy):
    {"name", "dtype", "shape", "strides", "offset", "span"}   (span elements follow)
A tensor sent back is contiguous: {"name", "dtype", "shape"}, or {"name", "none": true}.
"""
import json
import struct

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "bool": torch.bool, "int64": torch.int64}
NAMES = {v: k for k, v in DTYPES.items()}
# The largest header the C++ side writes is a few kilobytes: anything far past it is garbage.
MAX_HEADER = 1 << 24


class ProtocolError(RuntimeError):
    pass


def _read_exact(f, n):
    chunks, got = [], 0
    while got < n:
        b = f.read(n - got)
        if not b:
            if got == 0 and not chunks:
                return None
            raise ProtocolError(f"the pipe closed in the middle of a message ({got} of {n} bytes)")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_message(f):
    """(header dict, {name: tensor}) or None at the end of the stream."""
    raw = _read_exact(f, 4)
    if raw is None:
        return None
    (n,) = struct.unpack("<I", raw)
    if n > MAX_HEADER:
        raise ProtocolError(f"a header of {n} bytes (garbage on the pipe?)")
    header = json.loads(_read_exact(f, n).decode("utf-8"))
    tensors = {}
    for entry in header.get("tensors", []):
        if entry.get("none"):
            tensors[entry["name"]] = None
            continue
        dtype = DTYPES[entry["dtype"]]
        shape = list(entry["shape"])
        span = int(entry.get("span", _numel(shape)))
        itemsize = torch.empty((), dtype=dtype).element_size()
        data = bytearray(_read_exact(f, span * itemsize) or b"")
        base = torch.frombuffer(data, dtype=dtype) if span else torch.empty(0, dtype=dtype)
        if "strides" in entry:
            t = torch.as_strided(base, shape, entry["strides"], int(entry.get("offset", 0)))
        else:
            t = base.reshape(shape)
        tensors[entry["name"]] = t
    return header, tensors


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def write_message(f, header, tensors=()):
    """tensors: (name, tensor or None) pairs, sent contiguous."""
    entries, blobs = [], []
    for name, t in tensors:
        if t is None:
            entries.append({"name": name, "none": True})
            continue
        t = t.detach().contiguous()
        if t.dtype not in NAMES:
            raise ProtocolError(f"{name} is {t.dtype}; headgrad takes {', '.join(map(str, NAMES))}")
        entries.append({"name": name, "dtype": NAMES[t.dtype], "shape": list(t.shape)})
        # bfloat16 has no numpy type: its bytes go through an int16 view
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        blobs.append(raw.numpy().tobytes() if raw.numel() else b"")
    h = dict(header, tensors=entries)
    data = json.dumps(h).encode("utf-8")
    f.write(struct.pack("<I", len(data)) + data)
    for b in blobs:
        f.write(b)
    f.flush()
