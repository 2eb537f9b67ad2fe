"""GPU tests of qk_norm_rope_kv (kernels/decode/qk_norm_rope_kv.py) against `reference.rms_norm` and
`reference.apply_rope`, and its KV-cache write.

Run on the H200 through tools/gpu_check.sh with a kernel cache holding the model specs of both
presets (both layer kinds: sliding ring with RoPE, paged full layer without).

Every case draws a fresh random fused qkv (make_args), a shuffled table of distinct pages long
enough for the largest position, and NaN-poisoned q_out and caches. Positions cover 0, 1,
P − 1, P (a page edge, or the ring's wrap to entry 0), several rows at different positions,
and positions near 262,143 (where an fp32 RoPE angle would be off by ~0.016 rad).

Tolerances: q_out and the written key entries ‖out − ref‖/‖ref‖ ≤ 1e-2. Both sides round at
the same points (bf16 norm output, bf16 rotated output) and their cos/sin agree to the fp32
ulp, so they differ only where the fp32 sum-of-squares order, the hardware rsqrt or fma
contraction flips a bf16 rounding: expected ~1e-3 or less. Because the rounding points are
the same, at most MAX_FLIPS of the elements (or 2) may differ at all: this is what catches an
angle taken in fp32 (off by up to 0.016 rad near 262,143, which moves the low-frequency pairs
by several bf16 ulps while the norm-wise error stays under 1e-2). The value entries are
copies: bit-exact. Every other cache entry must still hold its NaN poison, bit for bit.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import qk_norm_rope_kv as qk
from flint_graph.kernels import registry

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2
MAX_FLIPS = 0.01  # share of q_out / key elements that may differ (≥ 2; ~1e-4 expected)
PRESETS = ("tiny", "full")
MAX_POS = 262_143
OUT_Q, OUT_K, OUT_V = 6, 7, 8  # q_out, k_cache, v_cache in the argument list


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("qk_norm_rope_kv", "slow_producer")))


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _check_close(what: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    rel = _rel(out, ref)
    assert rel <= REL_TOL, f"{what}: rel err {rel:.2e} > {REL_TOL}"
    flips, allowed = int((out != ref).sum()), max(2, int(MAX_FLIPS * out.numel()))
    assert flips <= allowed, f"{what}: {flips} of {out.numel()} elements differ, more than " \
                             f"{allowed} (rel {rel:.2e})"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _specs(preset: str):
    return qk._specs(FlintConfig.preset(preset), (1, 2, 4, 8))


def _positions(spec, case: str, gen: torch.Generator) -> list[int]:
    """Row positions for one case; every case puts a different position on each row."""
    b, p = spec["B"], spec["P"]
    edges = [0, 1, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p + 7]
    if case == "start":  # row 0 at position 0
        return edges[:b]
    if case == "edge":  # row 0 at P - 1, row 1 at P (next page, or the ring wraps)
        return (edges[2:] + edges[:2])[:b]
    if case == "large":  # near the context limit
        return [MAX_POS, MAX_POS - p, MAX_POS - 1, 200_003, 131_071, MAX_POS - 2 * p - 1,
                65_536, 99_999][:b]
    return torch.randint(0, MAX_POS + 1, (b,), generator=gen, device=gen.device).tolist()


SEEDS = {"start": 1, "edge": 2, "large": 3, "random": 4}  # position case -> seed


def _cases():
    return [(preset, s, case) for preset in PRESETS for s in _specs(preset) for case in SEEDS]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1].key}-{c[2]}")
def test_matches_reference(kset, case):
    preset, spec, which = case
    gen = _gen(SEEDS[which])
    pos = _positions(spec, which, gen)
    eps = FlintConfig.preset(preset).rms_norm_eps
    theta = FlintConfig.preset(preset).rope_theta
    args = qk.make_args(spec, gen=gen, device="cuda", positions=pos, eps=eps, theta=theta)
    kset.get("qk_norm_rope_kv", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    what = f"{spec.id} positions {pos}"
    q_ref, k_ref, v_ref = qk._reference(spec, *args[:OUT_Q], args[-1])

    q_out = args[OUT_Q]
    assert not q_out.isnan().any(), f"{what}: unwritten (NaN) q_out"
    _check_close(f"{what}: q_out", q_out, q_ref)

    pages, entries = qk.cache_entry(spec, args[1], args[2])
    for name, cache, ref in (("key", args[OUT_K], k_ref), ("value", args[OUT_V], v_ref)):
        got = cache[pages, :, entries]  # [B, HKV, D]
        assert not got.isnan().any(), f"{what}: {name} entry not (fully) written"
        if name == "key":
            _check_close(f"{what}: key", got, ref)
        else:
            assert torch.equal(got, ref), f"{what}: value entry is not v, bit for bit"
        cache[pages, :, entries] = float("nan")  # then every entry must be the poison
        poison = torch.full((), float("nan"), dtype=cache.dtype, device=cache.device)
        assert (cache.view(torch.int16) == poison.view(torch.int16)).all(), \
            f"{what}: the {name} cache changed outside the new entries"


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (the caches hold NaN poison, which torch.equal never calls equal)."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("spec", [s for s in _specs("full") if s["B"] in (1, 8)],
                         ids=lambda s: s.key)
def test_pdl_consumer_never_reads_its_input_early(kset, spec):
    """Behind a slow producer that overwrites qkv or the positions, every PDL replay must
    equal the run without PDL (tests/test_kernels_gpu.py's pattern). The table is left out:
    its stale words would be page ids out of range if the kernel did read them early."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    consumer = kset.get("qk_norm_rope_kv", **spec.as_dict())
    pos = [spec["P"] + 3 + 97 * i for i in range(spec["B"])]
    for target in (0, 1):  # qkv, positions
        args = qk.make_args(spec, gen=_gen(7), device="cuda", positions=pos)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        assert not want[0].isnan().any()
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert _same_bits(g, w), \
                    f"{spec.id}: read {qk.KERNEL.args(spec)[target].name} before the wait"
