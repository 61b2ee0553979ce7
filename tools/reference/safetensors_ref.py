#!/usr/bin/env python3
"""safetensors_ref.py — an independent reference for Hugging Face's safetensors format,
written from the format's specification with Python's json and struct and numpy (no code
shared with shard), to test interoperability both ways.

usage:
  safetensors_ref.py write FILE   write the reference tensors (tests/fixtures/reference.safetensors)
  safetensors_ref.py check FILE   read FILE (written by shard), check the format's rules and that
                                  it holds the reference tensors and shard's metadata

The reference tensors (the same formulas as tests/test_safetensors.c), element i in row-major order:
  f32 [3,4] i*0.5-1   f64 [5] i/3   bf16 [2,3] i*0.25-0.5   f16 [4] i*0.125   i8 [6] i-3
  i32 [2,2] i*1000-7  i64 [3] i*2**40   u8 [2,1,3] i*7%256   scalar f32 [] 42.5   empty u8 [0,3]
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I8": np.int8, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "BF16": np.uint16}  # bf16 travels as its 16 bits


def bf16_bits(values):
    """float32 values -> bf16 bit patterns, rounding to nearest even."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def reference():
    def idx(n):
        return np.arange(n, dtype=np.float64)
    return {
        "f32": ("F32", [3, 4], (idx(12) * 0.5 - 1).astype(np.float32)),
        "f64": ("F64", [5], idx(5) / 3.0),
        "bf16": ("BF16", [2, 3], bf16_bits(idx(6) * 0.25 - 0.5)),
        "f16": ("F16", [4], (idx(4) * 0.125).astype(np.float16)),
        "i8": ("I8", [6], (np.arange(6) - 3).astype(np.int8)),
        "i32": ("I32", [2, 2], (np.arange(4) * 1000 - 7).astype(np.int32)),
        "i64": ("I64", [3], (np.arange(3, dtype=np.int64) * (1 << 40))),
        "u8": ("U8", [2, 1, 3], (np.arange(6) * 7 % 256).astype(np.uint8)),
        "scalar": ("F32", [], np.array([42.5], dtype=np.float32)),
        "empty": ("U8", [0, 3], np.zeros(0, dtype=np.uint8)),
    }


def write_raw(path, tensors, metadata):
    """tensors: {name: (dtype string, shape, numpy values)}"""
    header = {"__metadata__": metadata}
    blobs, at = [], 0
    for name in sorted(tensors):  # name order, as Hugging Face's writer does for equal alignment
        dtype, shape, values = tensors[name]
        data = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_tensors(path, arrays, metadata):
    """arrays: {name: float32 numpy array} written as F32."""
    write_raw(path, {k: ("F32", list(v.shape), v.astype(np.float32).reshape(-1)) for k, v in arrays.items()}, metadata)


def write(path):
    write_raw(path, reference(), {"format": "pt", "written_by": "numpy"})


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key in {keys}")
    return dict(pairs)


def read(path):
    """The format's rules, checked from the specification; returns (metadata, {name: (dtype, shape, bytes)})."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise ValueError("shorter than 8 bytes")
    n = struct.unpack("<Q", raw[:8])[0]
    if n == 0 or n > 100_000_000 or 8 + n > len(raw):
        raise ValueError(f"bad header length {n}")
    text = raw[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise ValueError("header does not start with '{'")
    header = json.loads(text, object_pairs_hook=no_duplicates)
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("non-string metadata")
    data = raw[8 + n:]
    spans, out = [], {}
    for name, e in header.items():
        if not name or "\0" in name:
            raise ValueError(f"bad name {name!r}")
        shape, (begin, end) = e["shape"], e["data_offsets"]
        if any(type(d) is not int or d < 0 for d in shape) or len(shape) > 8:
            raise ValueError(f"{name}: bad shape {shape}")
        size = np.dtype(DTYPES[e["dtype"]]).itemsize * int(np.prod(shape, dtype=np.int64))
        if not (0 <= begin <= end) or end - begin != size:
            raise ValueError(f"{name}: offsets {begin},{end} vs {size} bytes")
        spans.append((begin, end))
        out[name] = (e["dtype"], shape, data[begin:end])
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise ValueError(f"gap or overlap at {begin}")
        at = end
    if at != len(data):
        raise ValueError(f"data area has {len(data)} bytes, tensors end at {at}")
    return meta, out


def check(path):
    meta, tensors = read(path)
    failures = []
    if meta.get("written_by") != "shard":
        failures.append(f"metadata {meta}")
    for name, (dtype, shape, values) in reference().items():
        got = tensors.get(name)
        want = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes()
        if got is None or got[0] != dtype or list(got[1]) != shape or got[2] != want:
            failures.append(f"{name}: {got and got[:2]} vs {(dtype, shape)}")
    if set(tensors) != set(reference()):
        failures.append(f"tensor names {sorted(tensors)}")
    for f in failures:
        print("FAIL:", f)
    print(f"{path}: {len(tensors)} tensors read by the Python reference,", "ok" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2]))
