"""Read what a launcher needs from a CUDA cubin (an ELF64 file) without CUDA tools or a GPU.

Per kernel (`.text.<symbol>` section) from its `.nv.info.<symbol>` records: the parameter
offsets and sizes (EIATTR_KPARAM_INFO), the parameter buffer size (EIATTR_CBANK_PARAM_SIZE),
the block shape baked in by `.reqntid` (EIATTR_REQNTID) or `.maxntid` (EIATTR_MAX_THREADS);
from the global `.nv.info`: registers per thread (EIATTR_REGCOUNT) and the per-thread local
memory frame, where ptxas spills (EIATTR_FRAME_SIZE); static shared memory from
`.nv.shared.<symbol>`. The SM the cubin targets is the second byte of the ELF header's e_flags
(0x5a = 90, 0x64 = 100). Record layout (fmt u8, attr u8, u16 value-or-size) follows what
`cuobjdump -elf` prints; see ../shared/cute-dsl-aot.md §1-§2.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

_FMT_SVAL = 0x04  # record carries a payload of the given size
_KPARAM_INFO, _CBANK_PARAM_SIZE, _REQNTID, _MAX_THREADS, _REGCOUNT = 0x17, 0x19, 0x10, 0x05, 0x2F
_FRAME_SIZE = 0x11


class CubinFormatError(ValueError):
    """The bytes are not a cubin this reader understands."""


@dataclass
class KernelInfo:
    """What the cubin says about one kernel. params: [(ordinal, offset, size)] in ordinal order."""

    params: list[tuple[int, int, int]] = field(default_factory=list)
    param_bytes: int | None = None
    reqntid: list[int] | None = None
    maxntid: list[int] | None = None
    regs: int | None = None
    static_smem: int = 0
    frame_size: int = 0  # local memory bytes per thread (spills, local arrays)


def cubin_sm(elf: bytes) -> int:
    """The SM number a cubin was built for (90 for sm_90a, 100 for sm_100a)."""
    _check_elf(elf)
    return struct.unpack_from("<I", elf, 0x30)[0] >> 8 & 0xFF


def _check_elf(elf: bytes) -> None:
    if len(elf) < 0x40 or elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise CubinFormatError("not an ELF64 cubin (a fatbin or a truncated file?)")


def _sections(elf: bytes) -> dict[str, tuple[int, int]]:
    _check_elf(elf)
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]

    def name(off: int) -> str:
        start = names_at + off
        return elf[start:elf.index(b"\0", start)].decode()

    return {name(h[0]): (h[4], h[5]) for h in heads}


def _records(buf: bytes):
    """(attr, payload) for each .nv.info record; inline values come back as 2 bytes."""
    i = 0
    while i + 4 <= len(buf):
        fmt, attr, val = struct.unpack_from("<BBH", buf, i)
        i += 4
        if fmt == _FMT_SVAL:
            yield attr, buf[i:i + val]
            i += val
        else:
            yield attr, struct.pack("<H", val)


def read_cubin(elf: bytes) -> dict[str, KernelInfo]:
    """{symbol: KernelInfo} for every kernel in the cubin. Raises CubinFormatError."""
    try:
        return _read_cubin(elf)
    except CubinFormatError:
        raise
    except (struct.error, IndexError, KeyError, ValueError) as e:  # UnicodeDecodeError too
        raise CubinFormatError(f"malformed cubin ({type(e).__name__}: {e})") from None


def _read_cubin(elf: bytes) -> dict[str, KernelInfo]:
    secs = _sections(elf)

    def raw(name: str) -> bytes:
        off, size = secs[name]
        return elf[off:off + size]

    out: dict[str, KernelInfo] = {}
    for sec in secs:
        if not sec.startswith(".text."):
            continue
        sym = sec[len(".text."):]
        info = KernelInfo(static_smem=secs.get(".nv.shared." + sym, (0, 0))[1])
        for attr, p in _records(raw(".nv.info." + sym)) if ".nv.info." + sym in secs else ():
            if attr == _KPARAM_INFO:  # u32 index, u16 ordinal, u16 offset, u32 flags|size<<18
                _, ordinal, offset, packed = struct.unpack_from("<IHHI", p)
                info.params.append((ordinal, offset, packed >> 18 & 0x3FFF))
            elif attr == _CBANK_PARAM_SIZE:
                (info.param_bytes,) = struct.unpack_from("<H", p)
            elif attr == _REQNTID:
                info.reqntid = list(struct.unpack_from("<III", p))
            elif attr == _MAX_THREADS:
                info.maxntid = list(struct.unpack_from("<III", p))
        info.params.sort()
        out[sym] = info
    if ".nv.info" in secs and ".symtab" in secs:
        symtab, strtab = raw(".symtab"), raw(".strtab")
        for attr, p in _records(raw(".nv.info")):
            if attr in (_REGCOUNT, _FRAME_SIZE):
                idx, value = struct.unpack_from("<II", p)
                (name_off,) = struct.unpack_from("<I", symtab, idx * 24)
                name = strtab[name_off:strtab.index(b"\0", name_off)].decode()
                if name in out and attr == _REGCOUNT:
                    out[name].regs = value
                elif name in out:
                    out[name].frame_size = value
    return out
