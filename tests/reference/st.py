"""Minimal safetensors reader/writer on numpy + json (no `safetensors` package).

File layout:
    8 bytes   little-endian u64 N = header length
    N bytes   JSON header: {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
              "__metadata__": {str: str}}, padded with spaces to a multiple of 8
    rest      data buffer; offsets are relative to its start

Supported dtypes: F64, F32, F16, BF16, I64, I32, I8, U8.  numpy has no
bfloat16, so BF16 tensors are read as float32 (exact widening) and written
from float32 with round-to-nearest-even.
"""

import json
import struct

import numpy as np

_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
}
_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1}
_FROM_NP = {np.dtype(v).str: k for k, v in _NP.items()}


def _bf16_to_f32(raw):
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32)


def _f32_to_bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    nan = np.isnan(a)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep NaN a (quiet) NaN
    return out


def read_header(path):
    """Return (header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n).decode("utf-8"))
    meta = hdr.pop("__metadata__", None) or {}
    return hdr, meta, 8 + n


def load(path, keep_raw_bf16=False):
    """Read a file; returns (dict name -> numpy array, metadata dict).

    BF16 is widened to float32 unless keep_raw_bf16 (then uint16 bit patterns).
    Raises ValueError on malformed headers (overlapping/out-of-range offsets,
    size mismatch, unknown dtype).
    """
    hdr, meta, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read()
    out = {}
    spans = []
    for name, info in hdr.items():
        dt = info["dtype"]
        if dt not in _SIZE:
            raise ValueError(f"{path}: tensor {name}: unknown dtype {dt}")
        shape = tuple(int(s) for s in info["shape"])
        b, e = (int(x) for x in info["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= e <= len(buf)) or e - b != count * _SIZE[dt]:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {b},{e} for {dt}{list(shape)}")
        spans.append((b, e, name))
        raw = buf[b:e]
        if dt == "BF16":
            arr = np.frombuffer(raw, dtype="<u2") if keep_raw_bf16 else _bf16_to_f32(raw)
        else:
            arr = np.frombuffer(raw, dtype=_NP[dt])
        out[name] = arr.reshape(shape).copy()
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(f"{path}: tensors {n0} and {n1} overlap")
    return out, meta


def save(path, tensors, metadata=None, dtypes=None):
    """Write tensors (dict name -> numpy array or torch tensor) to path.

    dtypes optionally maps a name to a target safetensors dtype (e.g. "BF16");
    otherwise the dtype is the array's own.  Tensors are stored in sorted
    order of decreasing element size, then name (as the reference library
    does), packed without holes, so every tensor is naturally aligned.
    """
    dtypes = dtypes or {}
    md = {"format": "pt"}
    if metadata:
        md.update({str(k): str(v) for k, v in metadata.items()})
    header = {"__metadata__": md}
    blobs = []
    off = 0
    arrays = {}
    for name, a in tensors.items():
        if hasattr(a, "detach"):  # torch tensor
            a = a.detach().cpu().numpy()
        arrays[name] = np.asarray(a)

    def target(name):
        a = arrays[name]
        dt = dtypes.get(name)
        if dt is None:
            dt = _FROM_NP.get(a.dtype.newbyteorder("<").str if a.dtype.byteorder == ">" else a.dtype.str)
            if dt is None:
                raise ValueError(f"tensor {name}: unsupported numpy dtype {a.dtype}")
        return dt

    for name in sorted(arrays, key=lambda n: (-_SIZE[target(n)], n)):
        a = arrays[name]
        dt = target(name)
        if dt == "BF16":
            raw = _f32_to_bf16(a).tobytes()
        else:
            raw = np.ascontiguousarray(a, dtype=_NP[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
