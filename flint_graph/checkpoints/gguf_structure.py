"""The structure of a GGUF file checked before any of it is parsed into arrays (issue 26): every
count, length and offset against the file's size, every string as UTF-8, every value type and
tensor type known, tensor data aligned, inside the file and not overlapping another tensor's.

gguf's `GGUFReader` trusts the header: a metadata array whose count runs past the end of the
file makes it loop while memory climbs, a tensor offset that wraps or overlaps another loads,
and a non-UTF-8 string fails later, deep in the loader. This walk reads the same layout with
bounds checks first (as llama.cpp's gguf reader does) and raises one CheckpointError naming
the file and the key or tensor; the reader then parses a file known to be well-formed. It
reads only the header, metadata and tensor infos (a few MB even for a tokenizer-sized
metadata array), never the tensor data.

Layout (GGUF v2/v3, ggml's docs/gguf.md): "GGUF", u32 version, u64 tensor count, u64 metadata
count; each metadata entry a string key, a u32 value type, the value (a string is a u64 length
and its bytes; an array a u32 element type, a u64 count and the elements); each tensor info a
string name, u32 dimension count, u64 dimensions, u32 GGML type, u64 offset into the data
section, which starts at the next multiple of `general.alignment` (default 32) after the infos.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from flint_graph.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# value types (gguf.GGUFValueType) -> element size in bytes; 8 = string, 9 = array
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, BOOL = 8, 9, 7
QUOTE = 60  # characters of an untrusted name quoted in a message


def _quote(text: str) -> str:
    return repr(text if len(text) <= QUOTE else text[:QUOTE] + "…")


class _Cursor:
    """Reads little-endian fields from a byte buffer with every read bounded by its size."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a readable GGUF file (truncated or "
                               f"corrupt?): {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, past the end of the "
                            f"{self.size}-byte file")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return value[0] if len(value) == 1 else value

    def string(self, what: str) -> str:
        n = self.unpack("Q", f"the length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not UTF-8 (byte {e.start})") from None


def check_gguf_structure(path: str | Path) -> None:
    """Raise CheckpointError naming `path` and the offending key or tensor unless the GGUF's
    header, metadata and tensor infos are well-formed and every tensor's data lies aligned,
    inside the file and apart from the others (module docstring). Reads no tensor data."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise CheckpointError(f"{path}: not a readable GGUF file (truncated or "
                                      f"corrupt?): {size} bytes, shorter than its header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _walk(_Cursor(buf, path))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None


def _walk(c: _Cursor) -> None:
    try:
        magic = bytes(c.buf[:4])
        if magic != MAGIC:
            raise c.fail(f"magic {magic!r}, expected {MAGIC!r}")
        c.pos = 4
        version = c.unpack("I", "the version")
        if version not in VERSIONS:
            raise c.fail(f"version {version}; expected one of {VERSIONS}")
        n_tensors = c.unpack("Q", "the tensor count")
        n_kv = c.unpack("Q", "the metadata count")
        # each entry takes at least 12 (metadata) / 24 (tensor info) bytes: counts that could
        # not fit in the file are refused before any loop runs
        if n_kv > (c.size - c.pos) // 12:
            raise c.fail(f"{n_kv} metadata entries cannot fit in the file")
        if n_tensors > (c.size - c.pos) // 24:
            raise c.fail(f"{n_tensors} tensor infos cannot fit in the file")
        alignment = DEFAULT_ALIGNMENT
        keys: set[str] = set()
        for i in range(n_kv):
            key = c.string(f"metadata key {i}")
            if key in keys:
                raise c.fail(f"metadata key {_quote(key)} appears twice")
            keys.add(key)
            vtype = c.unpack("I", f"the type of {_quote(key)}")
            value = _value(c, vtype, _quote(key))
            if key == "general.alignment":
                if vtype != 4 or not value or value & (value - 1):
                    raise c.fail(f"general.alignment = {value!r}; expected a u32 power of two")
                alignment = value
        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = c.string(f"tensor name {i}")
            what = f"tensor {_quote(name)}"
            if name in names:
                raise c.fail(f"{what} appears twice")
            names.add(name)
            n_dims = c.unpack("I", f"the dimension count of {what}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise c.fail(f"{what} has {n_dims} dimensions; expected 1 … {MAX_DIMS}")
            dims = [c.unpack("Q", f"the shape of {what}") for _ in range(n_dims)]
            raw_type = c.unpack("I", f"the type of {what}")
            offset = c.unpack("Q", f"the data offset of {what}")
            infos.append((name, dims, raw_type, offset))
        data_start = -(-c.pos // alignment) * alignment
        spans = [_span(c, info, alignment, data_start) for info in infos]
        spans.sort()
        for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise c.fail(f"the data of tensor {_quote(bn)} (offset {b0 - data_start}) "
                             f"overlaps tensor {_quote(an)} (ending at {a1 - data_start})")
    except struct.error as e:  # cannot happen after `need`; kept as a clean error regardless
        raise c.fail(str(e)) from None


def _value(c: _Cursor, vtype: int, key: str):
    if vtype == STRING:
        return c.string(f"the value of {key}")
    if vtype == ARRAY:
        etype = c.unpack("I", f"the element type of {key}")
        count = c.unpack("Q", f"the element count of {key}")
        if etype == STRING:
            if count > (c.size - c.pos) // 8:
                raise c.fail(f"{key}: {count} strings cannot fit in the rest of the file")
            for j in range(count):
                c.string(f"element {j} of {key}")
            return None
        if etype == ARRAY:
            raise c.fail(f"{key} is an array of arrays (not read by this loader)")
        width = SCALAR_SIZE.get(etype)
        if width is None:
            raise c.fail(f"{key}: unknown array element type {etype}")
        c.need(count * width, f"the {count} elements of {key}")
        if etype == BOOL and max(c.buf[c.pos:c.pos + count], default=0) > 1:
            bad = next(j for j in range(count) if c.buf[c.pos + j] > 1)
            raise c.fail(f"{key}: element {bad} is the byte {c.buf[c.pos + bad]}; a bool is 0 "
                         "or 1")
        c.pos += count * width
        return None
    width = SCALAR_SIZE.get(vtype)
    if width is None:
        raise c.fail(f"{key}: unknown value type {vtype}")
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q",
           12: "d"}[vtype]
    value = c.unpack(fmt, f"the value of {key}")
    if vtype == BOOL:
        # any non-zero byte read as true ("?"): a 7 or a 9 in a flag passed (a bad-input
        # trial, 2026-12-07); GGUF writes a bool as one byte, 0 or 1
        if value > 1:
            raise c.fail(f"{key}: the byte {value} is no bool (0 or 1)")
        return bool(value)
    return value


def _span(c: _Cursor, info, alignment: int, data_start: int) -> tuple[int, int, str]:
    """(start, end, name): the byte range of one tensor's data in the file."""
    name, dims, raw_type, offset = info
    what = f"tensor {_quote(name)}"
    try:
        qtype = GGMLQuantizationType(raw_type)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise c.fail(f"{what} has unknown GGML type {raw_type}") from None
    n = 1
    for d in dims:
        n *= d
    if n % block:
        raise c.fail(f"{what}: {n} elements are not whole blocks of {block} ({qtype.name})")
    nbytes = n // block * type_size
    if offset % alignment:
        raise c.fail(f"{what}: data offset {offset} is not a multiple of the alignment "
                     f"{alignment}")
    start = data_start + offset  # Python ints: an offset near 2^64 cannot wrap around
    if start + nbytes > c.size:
        raise c.fail(f"{what}: its {nbytes} bytes at offset {offset} run past the end of the "
                     f"file ({c.size - data_start} bytes of data)")
    return start, start + nbytes, name
