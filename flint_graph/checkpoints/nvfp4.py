"""NVFP4 weight format helpers: decode, encode, scale choice and the lossless GGML repack.

Follows DESIGN.md §2. A value is `e2m1(code) * e4m3(scale byte) * scale2`, with one unsigned-E4M3
scale byte per 16 consecutive K elements and an FP32 `scale2` per tensor (or per expert).

Two byte layouts of the same bits:
- NVIDIA (ModelOpt / CUTLASS, what our kernels read): codes uint8 [..., N, K/2] with element 2i
  in the low nibble and 2i+1 in the high nibble of byte i; scales uint8 [..., N, K/16].
- GGML type 40 (llama.cpp, what the GGUF holds): per row, K/64 blocks of 36 bytes = 4 scale bytes
  then 32 code bytes; inside each 16-value sub-block, byte j holds value j (low nibble) and
  value j+8 (high nibble).

Scale bytes decode exactly as `gguf.quants.NVFP4.ue4m3_to_fp32` (our oracle): exponent bits 3..6,
bias 7, subnormals man * 2^-9, bit 7 ignored, and bytes 0x00 and 0x7F decode to 0. (The oracle
halves the scale and doubles the E2M1 table; the product is the same.) Every product
e2m1 * e4m3 is exact in FP32 (at most 6 significant bits), so dequantisation rounds only when
multiplying by scale2 and never when scale2 is a power of two.

Shape legend: E experts, N output rows, K input columns (K % 64 == 0).
"""

from __future__ import annotations

import functools

import torch

SUB_BLOCK = 16  # values per E4M3 scale byte
GGML_BLOCK = 64  # values per GGML type-40 block
GGML_BLOCK_BYTES = 36  # 4 scale bytes + 32 code bytes
E4M3_MAX = 448.0  # largest finite E4M3 value; byte 0x7E
E2M1_MAX = 6.0
# Magnitudes of E2M1 codes 0..7 (bit 3 is the sign).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rows quantised per step: bounds the fp32 temporaries (~64 MiB each) on CPU and GPU alike.
_CHUNK_ELEMENTS = 1 << 24


def _ue4m3_value(byte: int) -> float:
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if byte in (0x00, 0x7F):
        return 0.0
    return man * 2.0**-9 if exp == 0 else (1.0 + man / 8.0) * 2.0 ** (exp - 7)


@functools.lru_cache(maxsize=None)
def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [256], e2m1 [16]) float32 lookup tables on `device` (constants, cached)."""
    e4m3 = torch.tensor([_ue4m3_value(b) for b in range(256)], dtype=torch.float32)
    # Code 8 is -0; +0 keeps the product's sign bit equal to the oracle's (int 0 * scale).
    e2m1 = torch.tensor(list(E2M1_GRID) + [0.0] + [-v for v in E2M1_GRID[1:]],
                        dtype=torch.float32)
    return e4m3.to(device), e2m1.to(device)


def ue4m3_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Decode raw unsigned-E4M3 bytes (uint8, any shape) to float32 of the same shape."""
    if scales.dtype != torch.uint8:
        raise ValueError(f"scales: dtype {scales.dtype}; expected torch.uint8 (raw E4M3 bytes)")
    return _tables(scales.device)[0][scales.int()]


def _scale2_view(scale2: torch.Tensor | float, lead: tuple[int, ...], what: str,
                 device: torch.device) -> torch.Tensor:
    """scale2 [] or [E] as float32 broadcastable against [..., N, X] (E = lead[0] of a stack)."""
    scale2 = torch.as_tensor(scale2, dtype=torch.float32, device=device)
    if scale2.dim() == 0:
        return scale2
    if scale2.dim() == 1 and len(lead) == 1 and scale2.shape[0] == lead[0]:
        return scale2.view(-1, 1, 1)
    raise ValueError(
        f"{what}: scale2 has shape {list(scale2.shape)}; expected [] or [E] with E = the leading "
        f"dimension of a 3-D stack (leading dims here: {list(lead)})"
    )


def dequantize(codes: torch.Tensor, scales: torch.Tensor, scale2: torch.Tensor,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense weights from NVIDIA-layout NVFP4.

    Args:
        codes: uint8 [..., N, K/2], element 2i in the low nibble, 2i+1 in the high nibble.
        scales: uint8 [..., N, K/16], raw unsigned-E4M3 bytes.
        scale2: float32 [] or [E] (E = codes.shape[0] of a 3-D stack).
        dtype: output dtype.
    Returns: [..., N, K] of `dtype`: (e2m1 * e4m3) exact in fp32, times scale2 in fp32, then one
        rounding to `dtype`. Bit-equal to `gguf.quants.NVFP4` dequantisation times scale2.
    Raises ValueError for wrong dtypes or mismatched shapes.
    """
    if codes.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"codes/scales: dtypes {codes.dtype}/{scales.dtype}; expected uint8")
    *lead, n, half_k = codes.shape
    k = 2 * half_k
    if k % SUB_BLOCK or tuple(scales.shape) != (*lead, n, k // SUB_BLOCK):
        raise ValueError(f"scales: shape {list(scales.shape)}; expected "
                         f"{[*lead, n, k // SUB_BLOCK]} for codes {list(codes.shape)}")
    s2 = _scale2_view(scale2, tuple(lead), "dequantize", codes.device)
    e4m3, e2m1 = _tables(codes.device)
    nib = torch.stack((codes & 0xF, codes >> 4), dim=-1).int()  # [..., N, K/2, 2]
    vals = e2m1[nib].view(*lead, n, k // SUB_BLOCK, SUB_BLOCK)
    out = vals * e4m3[scales.int()].unsqueeze(-1)  # exact
    return (out.view(*lead, n, k) * s2).to(dtype)


def quantize(w: torch.Tensor, scale2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise `w` to NVIDIA-layout NVFP4 under a given second-level scale.

    Block scale (per 16 values along K) = E4M3 round-to-nearest-even of amax / 6 / scale2,
    clamped to 448 first so byte 0x7F (NaN in OCP E4M3) never appears. Each value then goes to
    the nearest E2M1 code under step = e4m3(scale) * scale2; an exact tie goes to the code with
    an even mantissa, magnitude 0, 1, 2 or 4 (in steps: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
    1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), as the hardware's round-to-nearest-even cvt does.
    Magnitudes above 6 * step (scale rounded down) saturate to 6. Zero magnitude always gets
    code 0 (never -0), and a block whose scale rounds to 0 gets all-zero codes.

    Exactness: with a power-of-two scale2 (what `choose_scale2` returns) the tie thresholds are
    exact, so the result is the true nearest code and on-grid values round-trip bit for bit;
    otherwise a threshold carries one fp32 rounding.

    Args:
        w: float tensor [..., N, K] (fp32/bf16/fp16), finite, K % 64 == 0.
        scale2: float32 [] or [E] for a 3-D stack [E, N, K]; finite and positive.
    Returns: (codes uint8 [..., N, K/2], scales uint8 [..., N, K/16]) on w's device.
    Raises ValueError naming the dimension when K % 64 != 0, for non-finite values of w, or a
        scale2 of the wrong shape or not finite and positive.
    """
    if w.dim() < 2:
        raise ValueError(f"quantize: w has shape {list(w.shape)}; expected [..., N, K]")
    *lead, n, k = w.shape
    if k % GGML_BLOCK:
        raise ValueError(f"quantize: K (last dimension of w, shape {list(w.shape)}) = {k}; "
                         f"expected a multiple of {GGML_BLOCK}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize: w holds non-finite values (inf or NaN)")
    s2 = _scale2_view(scale2, tuple(lead), "quantize", w.device)
    if not bool(((s2 > 0) & torch.isfinite(s2)).all()):
        raise ValueError(f"quantize: scale2 = {s2.flatten().tolist()[:8]}; expected finite "
                         f"positive values")
    rows = w.reshape(-1, k)
    num_rows = rows.shape[0]
    s2_rows = s2.reshape(-1).float().repeat_interleave(num_rows // s2.numel()).view(-1, 1)
    codes = torch.empty(num_rows, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(num_rows, k // SUB_BLOCK, dtype=torch.uint8, device=w.device)
    step = max(1, _CHUNK_ELEMENTS // k)
    for r0 in range(0, num_rows, step):
        r1 = min(num_rows, r0 + step)
        codes[r0:r1], scales[r0:r1] = _quantize_rows(rows[r0:r1], s2_rows[r0:r1])
    return codes.view(*lead, n, k // 2), scales.view(*lead, n, k // SUB_BLOCK)


def _quantize_rows(x: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] float, s2 [R, 1] float32 -> (codes [R, K/2], scales [R, K/16]) uint8."""
    r, k = x.shape
    xb = x.float().view(r, k // SUB_BLOCK, SUB_BLOCK)
    ax = xb.abs()
    target = ax.amax(dim=-1) / E2M1_MAX / s2  # [R, K/16]
    scales = target.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    unit = (_tables(x.device)[0][scales.int()] * s2).unsqueeze(-1)  # step [R, K/16, 1]
    # Midpoints between neighbouring magnitudes; `>=` where the upper code has the even mantissa.
    idx = torch.zeros_like(ax, dtype=torch.uint8)
    for j, mid in enumerate((0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)):
        hit = ax >= mid * unit if j % 2 else ax > mid * unit
        idx += hit.to(torch.uint8)
    idx *= (unit > 0).to(torch.uint8)
    c = idx | (((xb < 0) & (idx > 0)).to(torch.uint8) << 3)
    c = c.view(r, k)
    return c[:, 0::2] | (c[:, 1::2] << 4), scales


def choose_scale2(w: torch.Tensor, per_expert: bool) -> torch.Tensor:
    """The power-of-two scale2 that puts `w`'s largest block scale in [224, 448] (after rounding).

    scale2 = 2^ceil(log2(amax / (6 * 448))): the smallest power of two whose largest block scale
    fits E4M3, so block scales sit as high as they can and a block stays in E4M3's normal range
    (>= 2^-6) down to amax_block ~ amax / 2^14.8. A power of two keeps every NVFP4 value exactly
    representable in BF16. An all-zero tensor (or expert) gets 1.0.

    Args:
        w: float [..., N, K]; with per_expert, a stack [E, N, K].
        per_expert: one scale2 per leading index (returns [E]) instead of one per tensor ([]).
    Returns: float32 [] or [E] on w's device.
    Raises ValueError for per_expert on a non-3-D tensor or non-finite values.
    """
    if per_expert and w.dim() != 3:
        raise ValueError(f"choose_scale2: per_expert needs a stack [E, N, K]; w has shape "
                         f"{list(w.shape)}")
    flat = w.reshape(w.shape[0], -1) if per_expert else w.reshape(1, -1)
    lo, hi = torch.aminmax(flat, dim=1)
    amax = torch.maximum(-lo, hi).double()
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("choose_scale2: w holds non-finite values (inf or NaN)")
    need = amax / (E2M1_MAX * E4M3_MAX)
    mant, exp = torch.frexp(need)  # need = mant * 2^exp, mant in [0.5, 1)
    exp = torch.where(mant == 0.5, exp - 1, exp).clamp(-126, 127)
    scale2 = torch.ldexp(torch.ones_like(need), exp)
    scale2 = torch.where(amax > 0, scale2, torch.ones_like(scale2)).float()
    return scale2 if per_expert else scale2.reshape(())


def to_ggml_blocks(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """NVIDIA layout -> GGML type-40 rows (pure bit permutation; scale bytes copied verbatim).

    Args: codes uint8 [..., N, K/2], scales uint8 [..., N, K/16], K % 64 == 0.
    Returns: uint8 [..., N, (K/64) * 36] on the inputs' device.
    Raises ValueError for mismatched shapes or dtypes.
    """
    *lead, n, half_k = codes.shape
    k = 2 * half_k
    if (codes.dtype != torch.uint8 or scales.dtype != torch.uint8 or k % GGML_BLOCK
            or tuple(scales.shape) != (*lead, n, k // SUB_BLOCK)):
        raise ValueError(f"to_ggml_blocks: codes {list(codes.shape)} {codes.dtype}, scales "
                         f"{list(scales.shape)} {scales.dtype}; expected uint8 [..., N, K/2] "
                         f"and [..., N, K/16] with K % {GGML_BLOCK} == 0")
    sub = codes.reshape(-1, k // SUB_BLOCK, 8)  # 8 bytes per 16-value sub-block
    vals = torch.stack((sub & 0xF, sub >> 4), dim=-1).view(-1, k // SUB_BLOCK, 16)
    q = vals[..., :8] | (vals[..., 8:] << 4)  # byte j: value j low, value j+8 high
    nb = k // GGML_BLOCK
    blocks = torch.cat((scales.reshape(-1, nb, 4), q.reshape(-1, nb, 32)), dim=-1)
    return blocks.reshape(*lead, n, nb * GGML_BLOCK_BYTES)


def from_ggml_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGML type-40 rows -> NVIDIA layout (inverse of `to_ggml_blocks`, bit for bit).

    Args: blocks uint8 [..., N, (K/64) * 36].
    Returns: (codes uint8 [..., N, K/2], scales uint8 [..., N, K/16]), contiguous, same device.
    Raises ValueError when the last dimension is not a multiple of 36 or the dtype is not uint8.
    """
    *lead, n, row_bytes = blocks.shape
    if blocks.dtype != torch.uint8 or row_bytes % GGML_BLOCK_BYTES:
        raise ValueError(f"from_ggml_blocks: blocks {list(blocks.shape)} {blocks.dtype}; "
                         f"expected uint8 with a last dimension that is a multiple of "
                         f"{GGML_BLOCK_BYTES}")
    nb = row_bytes // GGML_BLOCK_BYTES
    b = blocks.reshape(-1, nb, GGML_BLOCK_BYTES)
    scales = b[..., :4].reshape(*lead, n, nb * 4)
    q = b[..., 4:].reshape(-1, nb * 4, 8)
    vals = torch.cat((q & 0xF, q >> 4), dim=-1).view(-1, nb * 4, 8, 2)
    codes = vals[..., 0] | (vals[..., 1] << 4)  # byte i: element 2i low, 2i+1 high
    return codes.reshape(*lead, n, nb * 32), scales.contiguous()
