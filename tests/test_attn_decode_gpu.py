"""GPU tests of attn_decode (kernels/decode/attn_decode.py) against `reference.attention`.

Run on the H200 through tools/gpu_check.sh with a kernel cache holding attn_decode's
`bench_specs` (the model specs, the other form's, folded or not, and their SPLITS = 1
variants) for the tiny, full and flint-nano presets.

Every case draws fresh random q and cache (shuffled, non-contiguous page ids; every cache entry
no row sees is NaN, so a masked key that leaks into the output shows), poisons the output and
the fp32 workspaces with NaN, launches twice on the same workspaces (the second launch proves
the counters were reset) and checks the counters are all zero afterwards.

Tolerance: ‖out − ref‖/‖ref‖ ≤ 1e-2. Both sides compute in fp32 and round once to bf16, so
the expected error is the bf16 output rounding (≤ 2^-9 per element, ~2e-3 norm-wise) plus
the fp32 summation order, ex2/lg2.approx (~2^-22) and the kernel's hi/lo bf16 split of the
softmax weights (~2^-16): far below 1e-2. Split counts are compared with the SPLITS = 1
launch at the same tolerance (they differ only in the fp32 order of the combine).
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import attn_decode as ad
from flint_graph.kernels import registry

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2
PRESETS = ("tiny", "full", "nano")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
    return KernelSet(kernels=registry(("attn_decode", "qk_norm_rope_kv", "slow_producer")))


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _launch(kset, spec, args) -> torch.Tensor:
    """Launch twice on the same workspaces (output re-poisoned); returns the second output."""
    kernel = kset.get("attn_decode", **spec.as_dict())
    outs = []
    for _ in range(2):
        args[6].fill_(float("nan"))
        kernel.launch(*args)
        torch.cuda.synchronize()
        assert torch.equal(args[9], torch.zeros_like(args[9])), \
            f"{spec.id}: counters not reset: {args[9].tolist()}"
        outs.append(args[6].clone())
        assert not outs[-1].isnan().any(), \
            f"{spec.id} positions {args[4].tolist()}: NaN in the output"
    assert torch.equal(outs[0], outs[1]), f"{spec.id}: two launches differ"
    return outs[1]


def _check(kset, spec, seed, **case) -> torch.Tensor:
    args = ad.make_args(spec, gen=_gen(seed), device="cuda", **case)
    out = _launch(kset, spec, args)
    what = f"{spec.id} positions {args[4].tolist()} {case.get('sinks', '')}"
    (ref,) = ad._reference(spec, *[a for i, a in enumerate(args) if i != 6])
    rel = _rel(out, ref)
    assert rel <= REL_TOL, f"{what}: rel err {rel:.2e} > {REL_TOL}"
    return out


def _specs(preset: str):
    return ad._specs(FlintConfig.preset(preset), (1, 2, 4, 8))


def _lengths(spec) -> list[int]:
    """Keys a row sees (positions + 1) worth checking for this layer kind."""
    if spec["RING"]:
        w = spec["W"]  # shorter than, equal to, one more than, many times the window; wraps
        return [1, 2, w - 1, w, w + 1, 2 * w + 5, 7 * w + 3]
    p = spec["P"]  # one page and its edges, a few thousand keys
    return [1, 2, p - 1, p, p + 1, 3001]


def _cases():
    return [(preset, s) for preset in PRESETS for s in _specs(preset)]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_matches_reference(kset, case):
    """Every bucket and layer kind; each length lands on every row index of the batch."""
    _, spec = case
    lengths = _lengths(spec)
    b = spec["B"]
    for shift in range(len(lengths)):
        pos = [lengths[(shift + i) % len(lengths)] - 1 for i in range(b)]
        _check(kset, spec, seed=10 + shift, positions=pos)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_sinks_matter(kset, case):
    """A large finite sink (40: the softmax mass goes almost all to the sink, so the output is
    ~e^-40 small and only a correct single sink term gets it right), a very negative one (no
    effect) and the default N(0, 1) ones; the three outputs must differ."""
    _, spec = case
    pos = [min(3 * spec["P"], 700) + 11 * i for i in range(spec["B"])]
    outs = [_check(kset, spec, seed=3, positions=pos, sinks=s) for s in (40.0, -40.0, None)]
    assert outs[0].float().abs().max() < 1e-6 < outs[1].float().abs().max()
    assert not torch.equal(outs[1], outs[2])


def _split_cases():
    out = []
    for preset in PRESETS:
        for s in _specs(preset):
            if s["SPLITS"] > 1:
                out.append((preset, s))
    return out


def _position_for_splits(spec, n: int) -> int:
    """The smallest position whose visible range the kernel cuts into n splits."""
    w = spec["W"]
    for p in range(ad.min_tiles(w) * ad.TILE * spec["SPLITS"] + w + 1):
        lo, hi = ad.visible_range(p, w)
        if ad.row_splits(hi // ad.TILE - lo // ad.TILE + 1, spec["SPLITS"], w)[0] == n:
            return p
    raise AssertionError(f"{spec.id}: no position gives {n} splits")


def _position_with_empty_splits(spec) -> int | None:
    """A position whose row uses all SPLITS with the last chunks empty (n clamped), if any."""
    w = spec["W"]
    for p in range(ad.TILE * (ad.min_tiles(w) * spec["SPLITS"] + 1), 40_000, ad.TILE):
        lo, hi = ad.visible_range(p, w)
        tiles = hi // ad.TILE - lo // ad.TILE + 1
        n, chunk = ad.row_splits(tiles, spec["SPLITS"], w)
        if (n - 1) * chunk >= tiles:
            return p
    return None


def _compare_with_one_split(kset, spec, pos, seed):
    args = ad.make_args(spec, gen=_gen(seed), device="cuda", positions=pos)
    out = _launch(kset, spec, args)
    (ref,) = ad._reference(spec, *[a for i, a in enumerate(args) if i != 6])
    assert _rel(out, ref) <= REL_TOL, f"{spec.id} positions {pos}"
    one = ad.KERNEL.spec(**{**spec.as_dict(), "SPLITS": 1})
    args1 = list(args)
    args1[7] = torch.full_like(args[7][:, :, :1], float("nan"))
    args1[8] = torch.full_like(args[8][:, :, :1], float("nan"))
    out1 = _launch(kset, one, args1)
    rel = _rel(out, out1)
    assert rel <= REL_TOL, f"{spec.id} positions {pos}: rel {rel:.2e} to SPLITS=1"


@pytest.mark.parametrize("case", _split_cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_every_split_count_equals_one_split(kset, case):
    """Rows spread over every split count 1 … SPLITS the heuristic can pick, then rows whose
    last chunks are empty (full layers: 257 tiles in 32 splits of 9 leave 3 empty); each
    launch must equal the SPLITS = 1 launch on the same inputs (and the reference)."""
    _, spec = case
    b, splits = spec["B"], spec["SPLITS"]
    for start in range(0, splits, b):
        pos = [_position_for_splits(spec, (start + i) % splits + 1) for i in range(b)]
        _compare_with_one_split(kset, spec, pos, seed=start)
    p = _position_with_empty_splits(spec)
    if p is not None:
        _compare_with_one_split(kset, spec, [p + 7 * i for i in range(b)], seed=99)


@pytest.mark.parametrize("preset", PRESETS)
def test_rows_of_very_different_lengths(kset, preset):
    """One batch holding a 1-key row, a 5000-key row and others: each row's split count is
    its own, and a short row's CTAs must not wait for or mix with a long row's."""
    for spec in _specs(preset):
        if spec["B"] > 1:
            pos = [0, 4999, 17, 2 * spec["P"]][:spec["B"]] + [1000 * i for i in
                                                            range(spec["B"] - 4)]
            _check(kset, spec, seed=5, positions=pos)


def test_long_context_full_layer(kset):
    """100K keys at batch 1 (full preset, full layer): the model's largest split count, and
    pages spread over a 1563-page table."""
    spec = next(s for s in _specs("full") if s["B"] == 1 and not s["RING"])
    _check(kset, spec, seed=7, positions=[100_000 - 1])


@pytest.mark.parametrize("keys", [3_000, 20_000])
def test_flint_nano_full_layer_combines_its_128_splits(kset, keys):
    """flint-nano's full layers (one KV head: SPLITS = 128) combine in rounds of 16 partials
    (`unroll` above 64 splits, since the 32 of other configs spilled 624 bytes): a row using
    some and one using all 128 splits, every bucket, against the reference."""
    for spec in (s for s in _specs("nano") if not s["RING"] and s["SPLITS"] == 128):
        pos = [keys - 1 - 37 * i for i in range(spec["B"])]
        _check(kset, spec, seed=9, positions=pos)


def _pdl_specs():
    """Both forms, plain and folded (QKN = 1), at the full shape, B = 1 and 8."""
    cfg = FlintConfig.preset("full")
    return [s for fold in (False, True) for s in ad.specs_for(cfg, (1, 8), fold)]


@pytest.mark.parametrize("spec", _pdl_specs(), ids=lambda s: s.key)
def test_pdl_consumer_never_reads_its_input_early(kset, spec):
    """Behind a slow producer that overwrites q (folded: qkv, whence q and the new entry) or
    the positions, every PDL replay must equal the run without PDL (tests/test_kernels_gpu.py's
    pattern). The table is left out: its stale words would be page ids out of range if the
    kernel did read them early."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    consumer = kset.get("attn_decode", **spec.as_dict())
    pos = [2000 + 97 * i for i in range(spec["B"])]
    for target in (0, 4):  # q (or qkv), positions
        args = ad.make_args(spec, gen=_gen(7), device="cuda", positions=pos)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        assert not want[0].isnan().any()
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            assert torch.equal(got[0], want[0]), \
                f"{spec.id}: read {ad.KERNEL.args(spec)[target].name} before the wait"
        assert torch.equal(args[9], torch.zeros_like(args[9]))


# -- the folded form (QKN = 1): Q/K norm, RoPE and the KV write inside attention --------------
#
# Tolerances: out as above (≤ 1e-2 against the reference on the cache with the new entry
# written); the written key entries as tests/test_qk_norm_rope_kv_gpu.py has them (rel. ≤ 1e-2
# each, and over the launch at most max(2, 1%) elements different at all: the fp32
# sum-of-squares order, the hardware rsqrt and fma contraction in the rotation may flip a bf16
# rounding, ~1e-5 to 2e-5 of the elements, so a count per row of tiny's 64 would fail a
# correct kernel on one flip); the value entries are copies (bit for bit); every other cache
# entry is untouched (bit for bit, NaN included).

QK_REL, QK_DIFF = 1e-2, 0.01


def _flips_ok(flips: int, numel: int) -> bool:
    return flips <= max(2, QK_DIFF * numel)


def _folded_specs(preset: str):
    return ad.folded_specs(FlintConfig.preset(preset), (1, 2, 4, 8))


def _folded_cases():
    return [(preset, s) for preset in PRESETS for s in _folded_specs(preset)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _check_folded(kset, spec, seed, positions, twice: bool = True) -> torch.Tensor:
    """Launch the folded spec on fresh inputs (entry p of each row NaN in both caches), then
    check out, the written entries and every other entry; returns out."""
    from flint_graph.kernels.decode import qk_norm_rope_kv as qk

    args = ad.make_args(spec, gen=_gen(seed), device="cuda", positions=positions)
    k0, v0 = args[1].clone(), args[2].clone()
    what = f"{spec.id} positions {positions}"
    out = _launch(kset, spec, args) if twice else None
    if not twice:
        args[6].fill_(float("nan"))
        kset.get("attn_decode", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        out = args[6].clone()
        assert not out.isnan().any(), f"{what}: NaN in the output"
    ins = [a for i, a in enumerate(args) if i != 6]
    ins[1], ins[2] = k0, v0  # the reference writes the entries into its own copies
    q, k_want, v_want, k_new, v_new = ad.folded_inputs(spec, args[0], k0, v0, args[3], args[4],
                                                       *args[10:])
    (ref,) = ad._reference(spec, *ins)
    rel = _rel(out, ref)
    assert rel <= REL_TOL, f"{what}: rel err {rel:.2e} > {REL_TOL}"
    page, entry = qk.cache_entry(spec, args[4], args[3])
    flips = 0
    for b in range(spec["B"]):
        got_k, got_v = args[1][page[b], :, entry[b]], args[2][page[b], :, entry[b]]
        assert _same_bits(got_v, v_new[b]), f"{what} row {b}: value entry is not a copy"
        krel = _rel(got_k, k_new[b])
        assert krel <= QK_REL, f"{what} row {b}: key entry rel {krel:.2e}"
        flips += int((got_k != k_new[b]).sum())
    assert _flips_ok(flips, k_new.numel()), \
        f"{what}: {flips} of {k_new.numel()} key elements differ from the reference"
    # nothing else changed: the caches equal the reference's copies outside the new entries
    k_rest, v_rest = args[1].clone(), args[2].clone()
    for b in range(spec["B"]):
        k_rest[page[b], :, entry[b]] = k_want[page[b], :, entry[b]]
        v_rest[page[b], :, entry[b]] = v_want[page[b], :, entry[b]]
    assert _same_bits(k_rest, k_want) and _same_bits(v_rest, v_want), \
        f"{what}: a cache entry other than the rows' new ones changed"
    return out


@pytest.mark.parametrize("case", _folded_cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_folded_matches_reference(kset, case):
    """Every bucket and layer kind of the folded form: lengths as the plain form's test
    (window edges, ring wrap, page edges), each on every row index."""
    _, spec = case
    lengths = _lengths(spec)
    b = spec["B"]
    for shift in range(len(lengths)):
        pos = [lengths[(shift + i) % len(lengths)] - 1 for i in range(b)]
        _check_folded(kset, spec, seed=20 + shift, positions=pos, twice=shift % 2 == 0)


@pytest.mark.parametrize("case", _folded_cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_folded_equals_the_two_kernel_form(kset, case):
    """qk_norm_rope_kv then the plain attn_decode on the same inputs give the same output
    (within the tolerance: the norm's fp32 order differs) and the same cache entries."""
    from flint_graph.kernels.decode import qk_norm_rope_kv as qk

    _, spec = case
    pos = [min(3 * spec["P"], 700) + 13 * i for i in range(spec["B"])]
    args = ad.make_args(spec, gen=_gen(31), device="cuda", positions=pos)
    plain = ad.KERNEL.spec(**{k: v for k, v in spec.as_dict().items() if k not in ("QKN", "ROPE")})
    qspec = qk.KERNEL.spec(B=spec["B"], HQ=spec["HQ"], HKV=spec["HKV"], D=spec["D"],
                           P=spec["P"], RING=spec["RING"], ROPE=spec["ROPE"])
    k2, v2 = args[1].clone(), args[2].clone()
    q_out = torch.full((spec["B"], spec["HQ"], spec["D"]), float("nan"), dtype=torch.bfloat16,
                       device="cuda")
    kset.get("qk_norm_rope_kv", **qspec.as_dict()).launch(
        args[0], args[4], args[3], args[10], args[11], args[12], q_out, k2, v2, args[13])
    pargs = [q_out, k2, v2, *args[3:10]]
    pargs[6] = torch.full_like(args[6], float("nan"))
    kset.get("attn_decode", **plain.as_dict()).launch(*pargs)
    kset.get("attn_decode", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    rel = _rel(args[6], pargs[6])
    assert rel <= REL_TOL, f"{spec.id}: folded vs two kernels rel {rel:.2e}"
    assert _same_bits(args[2], v2), f"{spec.id}: value caches differ"
    flips = int((args[1].view(torch.int16) != k2.view(torch.int16)).sum())
    numel = spec["B"] * spec["HKV"] * spec["D"]
    assert _flips_ok(flips, numel), f"{spec.id}: {flips} of the {numel} written key elements differ"


def _folded_split_cases():
    return [(preset, s) for preset in PRESETS for s in _folded_specs(preset) if s["SPLITS"] > 1]


@pytest.mark.parametrize("case", _folded_split_cases(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_folded_every_split_count(kset, case):
    """Rows spread over every split count the heuristic can pick: key p's tile is in the last
    split of each, which alone writes the new entry, and every split count is checked against
    the reference, the entries and the untouched rest."""
    _, spec = case
    b, splits = spec["B"], spec["SPLITS"]
    for start in range(0, splits, b):
        pos = [_position_for_splits(spec, (start + i) % splits + 1) for i in range(b)]
        _check_folded(kset, spec, seed=40 + start, positions=pos, twice=False)
    p = _position_with_empty_splits(spec)
    if p is not None:
        _check_folded(kset, spec, seed=98, positions=[p + 7 * i for i in range(b)])


def test_folded_long_context_full_layer(kset):
    """100K keys at batch 1 (full preset, full layer) in the folded form."""
    spec = next(s for s in _folded_specs("full") if s["B"] == 1 and not s["RING"])
    _check_folded(kset, spec, seed=8, positions=[100_000 - 1])
