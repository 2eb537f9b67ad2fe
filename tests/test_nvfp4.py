"""NVFP4 helpers against gguf's independent NVFP4 oracle and brute-force searches (DESIGN §2).

Everything here is bit-exact except the off-grid quantisation error bound, which is the format's
own: half the gap between the two E2M1 magnitudes around |x| times the block step
e4m3(scale) * scale2, plus |x| - 6 * step where the block scale rounded down and x saturates.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import NVFP4 as GGUF_NVFP4
from gguf.quants import dequantize as gguf_dequantize

from flint_graph.checkpoints import nvfp4

GRID = torch.tensor(nvfp4.E2M1_GRID, dtype=torch.float64)


def _random_blocks(shape, seed):
    """Random GGML type-40 rows uint8 [*shape[:-1], (K/64)*36] whose scale bytes run through
    every value 0..255 (0x00, 0x7F, >= 0x80 included)."""
    g = torch.Generator().manual_seed(seed)
    *lead, n, k = shape
    nb = k // 64
    blocks = torch.randint(0, 256, (*lead, n, nb, 36), dtype=torch.uint8, generator=g)
    num_scales = blocks[..., :4].numel()
    every = torch.arange(num_scales, dtype=torch.int64) % 256
    perm = every[torch.randperm(num_scales, generator=g)].to(torch.uint8)
    blocks[..., :4] = perm.view(*lead, n, nb, 4)
    return blocks.view(*lead, n, nb * 36)


def _oracle(blocks: torch.Tensor, scale2: torch.Tensor) -> torch.Tensor:
    """gguf's dequantisation of raw GGML blocks times scale2 (fp32, one rounding)."""
    ref = gguf_dequantize(blocks.numpy(), GGMLQuantizationType.NVFP4)  # [..., N, K] float32
    s2 = scale2.numpy().astype(np.float32)
    if s2.ndim == 1:
        s2 = s2.reshape(-1, 1, 1)
    return torch.from_numpy(np.asarray(ref * s2, dtype=np.float32))


def test_ue4m3_table_matches_oracle_for_every_byte():
    every = torch.arange(256, dtype=torch.uint8)
    ref = 2 * GGUF_NVFP4.ue4m3_to_fp32(every.numpy())  # the oracle halves its scales
    assert torch.equal(nvfp4.ue4m3_to_float(every), torch.from_numpy(ref.astype(np.float32)))


@pytest.mark.parametrize("shape, scale2", [
    ((24, 256), torch.tensor(0.3712)),  # 2-D, arbitrary (non power of two) scale2: rounds once
    ((3, 40, 128), torch.tensor([0.25, 1.7e-3, 3.0])),  # expert stack, per-expert scale2
    ((5, 8, 64), torch.tensor(2.0**-12)),  # stack sharing one scale2, one block per row
])
def test_dequantize_matches_gguf_oracle_bit_for_bit(shape, scale2):
    blocks = _random_blocks(shape, seed=1)
    codes, scales = nvfp4.from_ggml_blocks(blocks)
    assert codes.shape == (*shape[:-1], shape[-1] // 2)
    assert scales.shape == (*shape[:-1], shape[-1] // 16)
    ours = nvfp4.dequantize(codes, scales, scale2, torch.float32)
    ref = _oracle(blocks, scale2)
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))  # sign bits included
    # BF16 output is the fp32 value rounded once.
    assert torch.equal(nvfp4.dequantize(codes, scales, scale2, torch.bfloat16),
                       ref.to(torch.bfloat16))


def test_nvidia_layout_by_hand():
    # One row, K = 64: element 2i low nibble / 2i+1 high nibble of NVIDIA byte i; scale 1.0
    # (0x38) for every sub-block; codes count up so each value's position is visible.
    k = 64
    want = torch.tensor([i % 16 for i in range(k)], dtype=torch.uint8)  # code per element
    codes = (want[0::2] | (want[1::2] << 4)).view(1, k // 2)
    scales = torch.full((1, k // 16), 0x38, dtype=torch.uint8)
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6]
    expect = torch.tensor([[e2m1[c] for c in want.tolist()]])
    assert torch.equal(nvfp4.dequantize(codes, scales, torch.tensor(1.0), torch.float32), expect)
    # GGML: sub-block s is bytes 4 + 8s ... 4 + 8s + 7, byte j = value j | value j+8 << 4.
    blocks = nvfp4.to_ggml_blocks(codes, scales)[0]
    for s in range(4):
        v = want[16 * s:16 * s + 16]
        assert torch.equal(blocks[4 + 8 * s:12 + 8 * s], v[:8] | (v[8:] << 4))


@pytest.mark.parametrize("shape", [(7, 192), (4, 9, 64), (2, 3, 5, 128)])
def test_repack_round_trips_exactly(shape):
    blocks = _random_blocks(shape, seed=2)
    assert torch.equal(nvfp4.to_ggml_blocks(*nvfp4.from_ggml_blocks(blocks)), blocks)
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (*shape[:-1], shape[-1] // 16), dtype=torch.uint8, generator=g)
    c2, s2 = nvfp4.from_ggml_blocks(nvfp4.to_ggml_blocks(codes, scales))
    assert torch.equal(c2, codes) and torch.equal(s2, scales)


def _on_grid(shape, scale2, seed):
    """Random NVFP4 (codes, scales) whose blocks each hold a +-6 (so amax/6 recovers the scale
    byte) and no -0 code (quantize writes +0); scale bytes 0x01..0x7E, subnormals included."""
    g = torch.Generator().manual_seed(seed)
    *lead, n, k = shape
    vals = torch.randint(0, 16, (*lead, n, k // 16, 16), dtype=torch.uint8, generator=g)
    vals[vals == 8] = 0
    pos = torch.randint(0, 16, (*lead, n, k // 16, 1), generator=g)
    sign = torch.randint(0, 2, (*lead, n, k // 16, 1), generator=g).to(torch.uint8) << 3
    vals.scatter_(-1, pos, 7 | sign)
    vals = vals.view(*lead, n, k)
    codes = vals[..., 0::2] | (vals[..., 1::2] << 4)
    scales = torch.randint(1, 0x7F, (*lead, n, k // 16), dtype=torch.uint8, generator=g)
    return codes, scales


@pytest.mark.parametrize("shape, scale2", [
    ((16, 256), torch.tensor(2.0**-7)),
    ((3, 8, 128), torch.tensor([1.0, 2.0**-20, 64.0])),
])
def test_quantize_on_grid_round_trips_exactly(shape, scale2):
    codes, scales = _on_grid(shape, scale2, seed=4)
    for dtype in (torch.float32, torch.bfloat16):  # power-of-two scale2: BF16 holds every value
        w = nvfp4.dequantize(codes, scales, scale2, dtype)
        c2, s2 = nvfp4.quantize(w, scale2)
        assert torch.equal(c2, codes) and torch.equal(s2, scales)


def _brute_scale_bytes(amax, scale2):
    """Nearest E4M3 byte (0x00..0x7E) to amax/6/scale2 clamped to 448, ties to the even byte."""
    target = (amax / 6 / scale2).clamp(max=448).double()
    table = nvfp4.ue4m3_to_float(torch.arange(0x7F, dtype=torch.uint8)).double()
    dist = (target.unsqueeze(-1) - table).abs()
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    # among the tied bytes prefer an even one (consecutive bytes are consecutive values)
    even = ties & (torch.arange(0x7F) % 2 == 0)
    pick = torch.where(even.any(-1, keepdim=True), even, ties).float().argmax(-1)
    return pick.to(torch.uint8)


def _brute_codes(x, step):
    """Nearest E2M1 code (float64 search over all 8 magnitudes; ties to an even mantissa)."""
    dist = (x.abs().double().unsqueeze(-1) - GRID * step.double().unsqueeze(-1)).abs()
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    even = ties & (torch.arange(8) % 2 == 0)
    mag = torch.where(even.any(-1, keepdim=True), even, ties).float().argmax(-1)
    mag = torch.where(step > 0, mag, torch.zeros_like(mag)).to(torch.uint8)
    return mag | (((x < 0) & (mag > 0)).to(torch.uint8) << 3)


def _unpack(codes):
    return torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)


@pytest.mark.parametrize("per_expert", [False, True])
def test_quantize_off_grid_is_nearest_and_within_format_error(per_expert):
    g = torch.Generator().manual_seed(5)
    # Experts (or row groups) of very different magnitude, heavy tails, and exact zeros.
    w = torch.randn(3, 24, 128, generator=g) * torch.tensor([1e-3, 1.0, 40.0]).view(3, 1, 1)
    w = w * torch.exp(torch.randn(3, 24, 1, generator=g))
    w[0, 0, :16] = 0
    if not per_expert:
        w = w.reshape(72, 128)
    scale2 = nvfp4.choose_scale2(w, per_expert)
    codes, scales = nvfp4.quantize(w, scale2)
    s2 = scale2.view(-1, 1, 1) if per_expert else scale2
    blocks = w.view(*w.shape[:-1], 8, 16)
    assert torch.equal(scales, _brute_scale_bytes(blocks.abs().amax(-1), s2))
    step = (nvfp4.ue4m3_to_float(scales) * s2).unsqueeze(-1).expand_as(blocks)
    assert torch.equal(_unpack(codes), _brute_codes(blocks, step).view(w.shape))
    # Format error: half the local gap between neighbouring magnitudes times the step, plus
    # the saturation excess |x| - 6 * step where the scale rounded down.
    deq = nvfp4.dequantize(codes, scales, scale2, torch.float32).double()
    ax = blocks.abs().double().reshape(w.shape)
    st = step.double().reshape(w.shape)
    upper = torch.bucketize((ax / st).clamp(max=6), GRID).clamp(1, 7)
    half_gap = (GRID[upper] - GRID[upper - 1]) / 2
    bound = half_gap * st + (ax - 6 * st).clamp(min=0)
    assert bool(((deq - w.double()).abs() <= bound).all())


def test_quantize_ties_go_to_even_mantissa():
    scale2 = torch.tensor(0.5)
    step = 0.5 * 1.25  # scale byte 0x3A = 1.25; a 6 * step element fixes it
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    row = torch.cat([mids, -mids]) * step
    codes, scales = nvfp4.quantize(row.repeat(4).view(1, 64), scale2)
    assert torch.equal(scales, torch.full((1, 4), 0x3A, dtype=torch.uint8))
    mags = torch.tensor([0, 2, 2, 4, 4, 6, 6, 7], dtype=torch.uint8)  # 0, 1, 1, 2, 2, 4, 4, 6
    want = torch.cat([mags, mags | ((mags > 0).to(torch.uint8) << 3)]).repeat(4)
    assert torch.equal(_unpack(codes)[0], want)


def test_quantize_rejects_bad_k_and_non_finite():
    with pytest.raises(ValueError, match=r"K .* = 96; expected a multiple of 64"):
        nvfp4.quantize(torch.randn(4, 96), torch.tensor(1.0))
    w = torch.randn(4, 64)
    w[1, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        nvfp4.quantize(w, torch.tensor(1.0))
    with pytest.raises(ValueError, match="scale2 has shape"):
        nvfp4.quantize(torch.randn(2, 4, 64), torch.ones(3))
    with pytest.raises(ValueError, match="finite positive"):
        nvfp4.quantize(torch.randn(2, 4, 64), torch.tensor([1.0, 0.0]))


def test_choose_scale2_powers_of_two_and_normal_scales():
    g = torch.Generator().manual_seed(6)
    mags = torch.tensor([3e-4, 1.0, 7.0, 900.0])
    w = torch.randn(4, 32, 256, generator=g) * mags.view(4, 1, 1)
    for per_expert in (True, False):
        s2 = nvfp4.choose_scale2(w, per_expert)
        assert s2.dtype == torch.float32 and s2.shape == ((4,) if per_expert else ())
        mant, _ = torch.frexp(s2)
        assert bool((mant == 0.5).all())  # exact powers of two
        _, scales = nvfp4.quantize(w, s2)
        value = nvfp4.ue4m3_to_float(scales)
        top = value.amax(dim=(1, 2)) if per_expert else value.max()
        assert bool((top <= 448).all()) and bool((top >= 224).all())  # tightest power of two
        if per_expert:  # Gaussian blocks sit within a few binades of the max: all normal
            assert bool((value >= 2.0**-6).all())
    assert nvfp4.choose_scale2(torch.zeros(2, 64), False).item() == 1.0
    with pytest.raises(ValueError, match="per_expert"):
        nvfp4.choose_scale2(torch.randn(4, 64), True)


@pytest.mark.gpu
def test_cuda_matches_cpu_bit_for_bit():
    blocks = _random_blocks((4, 96, 512), seed=7)
    scale2 = torch.tensor([0.5, 0.25, 2.0, 1.0])
    c, s = nvfp4.from_ggml_blocks(blocks)
    cc, cs = nvfp4.from_ggml_blocks(blocks.cuda())
    assert torch.equal(cc.cpu(), c) and torch.equal(cs.cpu(), s)
    assert torch.equal(nvfp4.to_ggml_blocks(cc, cs).cpu(), blocks)
    assert torch.equal(nvfp4.dequantize(cc, cs, scale2.cuda(), torch.float32).cpu(),
                       nvfp4.dequantize(c, s, scale2, torch.float32))
    w = torch.randn(4, 96, 512, generator=torch.Generator().manual_seed(8))
    s2 = nvfp4.choose_scale2(w, True)
    assert torch.equal(nvfp4.choose_scale2(w.cuda(), True).cpu(), s2)
    qc, qs = nvfp4.quantize(w, s2)
    gc, gs = nvfp4.quantize(w.cuda(), s2.cuda())
    assert torch.equal(gc.cpu(), qc) and torch.equal(gs.cpu(), qs)
