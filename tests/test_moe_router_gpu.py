"""GPU tests of the moe_router kernel (kernels/decode/moe_router.py) against `reference.residual_add`,
`reference.rms_norm` and `reference.route`, and its PDL ordering.

Tolerances (module docstring of kernels/decode/moe_router.py):
- residual_out: bit-exact (one fp32 add of two bf16 values, rounded once).
- h: ‖h − ref‖/‖ref‖ ≤ 1e-2 (bf16 output; the hardware rsqrt and another summation order may
  flip the last bit of a few elements).
- routing: checked against `reference.route` run on the kernel's own h (one flipped h bit
  moves a logit by ~1e-4, far above fp32 noise; where h is bit-equal to the reference's, the
  usual case, this is the full reference). ids equal as ordered lists, except where the
  reference keys s + bias of the competing experts are within TIE_REL of each other (then the
  kernel's pick must be one of the tied ones); weights and the scores workspace within
  W_REL elementwise: both sides are fp32 dot products of the same bf16 h with fp32 weights,
  differing in summation order (~1e-7 on logits ~N(0, 1)), then sigmoid (ex2.approx, a few
  ulp) and one fp32 division: ~1e-6 at worst.
- experts / slot_w: exactly what the kernel's own ids and weights imply (`slot_list`).
Outputs are NaN / −1 poisoned before every launch; every case draws fresh inputs.
"""

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.decode.moe_router import KERNEL, make_args, slot_list
from flint_graph.kernels.toolchain.spec import BUCKETS

pytestmark = pytest.mark.gpu
H_REL = 1e-2
W_REL = 1e-5
TIE_REL = 1e-6
PRESETS = ("tiny", "full")
# argument positions (docs/decode-kernels.md, kernel 6)
X, RES, MASK, NORM_W, ROUTER, BIAS, R_OUT, H_OUT, IDS, WTS, EXPERTS, SLOT_W, SCORES, \
    COUNTER, EPS, SCALING = range(16)


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
    return KernelSet(kernels=registry(("moe_router", "slow_producer")))


def _spec(preset: str, b: int):
    (spec,) = KERNEL.specs(FlintConfig.preset(preset), (b,))
    return spec


def _cases():
    return [(p, b) for p in PRESETS for b in BUCKETS]


def _args(spec, seed: int, device: str = "cuda", **case):
    """Fresh arguments (drawn on the CPU: the same values on any device)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return make_args(spec, gen=gen, device=device, **case)


def _rel(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _launch(kset, spec, args):
    kset.get("moe_router", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()


def check_outputs(spec, args) -> None:
    """Every check on the outputs of one launch (device-agnostic: the CPU dry run in
    tests/test_moe_router.py feeds it reference outputs)."""
    topk, norm = spec["TOPK"], bool(spec["NORM"])
    live = args[MASK] != 0
    r_ref, h_ref = KERNEL.reference(spec, *[a for i, a in enumerate(args)
                                             if i not in range(R_OUT, SCORES)])[:2]
    assert args[COUNTER].tolist() == [0], "the counter must be left zero"
    if live.any():
        assert torch.equal(args[R_OUT][live], r_ref[live]), "residual_out must be bit-exact"
        assert _rel(args[H_OUT][live], h_ref[live]) <= H_REL
    # routing against reference.route on the kernel's own h
    h = args[H_OUT]
    s_ref = torch.sigmoid(h.float() @ args[ROUTER].float().T)  # [B, E], as route computes it
    key_ref = s_ref + args[BIAS].float()
    r_ids, _ = reference.route(h, args[ROUTER], args[BIAS], topk, 1.0, False)
    ids, wts = args[IDS], args[WTS]
    for b in range(h.shape[0]):
        if not live[b]:
            assert ids[b].tolist() == [-1] * topk and wts[b].tolist() == [0.0] * topk, \
                f"padding row {b} must pick nothing"
            continue
        scores = args[SCORES][b]
        assert ((scores - s_ref[b]).abs() <= W_REL * s_ref[b].abs()).all(), \
            f"row {b}: scores workspace off the reference sigmoid"
        got, want = ids[b].long().tolist(), r_ids[b].tolist()
        assert len(set(got)) == topk and all(0 <= e < key_ref.shape[1] for e in got), \
            f"row {b}: ids {got}"
        for i, (g, w) in enumerate(zip(got, want)):
            kg, kw = key_ref[b, g].item(), key_ref[b, w].item()
            assert g == w or abs(kg - kw) <= TIE_REL * abs(kw), \
                f"row {b} rank {i}: picked {g} (key {kg}), reference {w} (key {kw})"
        s_pick = s_ref[b, ids[b].long()]
        w_ref = (s_pick / s_pick.sum() if norm else s_pick) * args[SCALING]
        assert ((wts[b] - w_ref).abs() <= W_REL * w_ref.abs()).all(), \
            f"row {b}: weights {wts[b].tolist()} vs {w_ref.tolist()}"
    _, _, experts, slot_w = slot_list(spec, ids, wts, args[MASK])
    assert torch.equal(args[EXPERTS], experts), f"experts {args[EXPERTS].tolist()}"
    assert torch.equal(args[SLOT_W], slot_w), "slot_w disagrees with the kernel's ids/weights"


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_matches_reference(kset, case):
    preset, b = case
    spec = _spec(preset, b)
    for seed in range(3):
        args = _args(spec, 100 * b + seed)
        _launch(kset, spec, args)
        check_outputs(spec, args)


def overlap_args(spec, seed: int, device: str = "cuda"):
    """B = 8 rows where rows 4..7 repeat rows 0..3 up to small noise in x: many shared picks."""
    args = _args(spec, seed, device)
    x = args[X].float()
    x[4:] = x[:4] + 0.01 * torch.randn(x[4:].shape, generator=torch.Generator().manual_seed(
        seed)).to(device)
    args[X] = x.bfloat16()
    args[RES][4:] = args[RES][:4]
    return args


@pytest.mark.parametrize("preset", PRESETS)
def test_overlapping_experts(kset, preset):
    spec = _spec(preset, 8)
    args = overlap_args(spec, 5)
    _launch(kset, spec, args)
    check_outputs(spec, args)
    picks = (args[SLOT_W] >= 0).sum(1)
    assert picks.max() >= 2, "the case must have experts picked by several rows"
    assert (args[EXPERTS] >= 0).sum() < 8 * spec["TOPK"], "some picks must be shared"


def biased_args(spec, seed: int, device: str = "cuda"):
    """A bias of +10 on the max(1, TOPK // 2) experts of lowest s in row 0: they must win every
    row, weighed by their unbiased s. Returns (args, those experts)."""
    args = _args(spec, seed, device)
    r = reference.residual_add(args[RES], args[X])
    h = reference.rms_norm(r, args[NORM_W], args[EPS])
    s = torch.sigmoid(h.float() @ args[ROUTER].T)
    low = s[0].argsort()[:max(1, spec["TOPK"] // 2)]
    args[BIAS] = args[BIAS].clone()
    args[BIAS][low] += 10.0
    return args, low.tolist()


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_bias_changes_the_winners(kset, case):
    spec = _spec(*case)
    args, low = biased_args(spec, 11)
    _launch(kset, spec, args)
    check_outputs(spec, args)
    for b in range(case[1]):
        assert set(low) <= set(args[IDS][b].tolist()), f"row {b}: biased experts {low} missed"


def bf16_bias_args(spec, seed: int, device: str = "cuda"):
    """Two experts e1, e2 whose keys s + bias are 6.001 and 6.0 in fp32 (the rest ~0.5), with
    bias values whose bf16 rounding reverses that order: only an fp32 bias picks e1 first.
    Returns (args, [e1, e2])."""
    args = _args(spec, seed, device)
    r = reference.residual_add(args[RES], args[X])
    h = reference.rms_norm(r, args[NORM_W], args[EPS])
    s = torch.sigmoid(h.float() @ args[ROUTER].T)[0]
    n = s.numel()
    for e1 in range(n):
        for e2 in range(n):
            if e1 == e2:
                continue
            bias = args[BIAS].clone()
            bias[e1], bias[e2] = 6.001 - s[e1], 6.0 - s[e2]
            k32 = s + bias
            k16 = s + bias.bfloat16().float()
            if k32[e1] > k32[e2] and k16[e1] < k16[e2]:
                args[BIAS] = bias
                return args, [e1, e2]
    raise AssertionError("no expert pair whose bf16 bias reverses the order")


@pytest.mark.parametrize("preset", PRESETS)
def test_bias_is_not_rounded_to_bf16(kset, preset):
    spec = _spec(preset, 1)
    args, pair = bf16_bias_args(spec, 13)
    _launch(kset, spec, args)
    check_outputs(spec, args)
    assert args[IDS][0, :2].tolist() == pair, f"ids {args[IDS][0].tolist()}, want {pair} first"


def tied_args(spec, seed: int, device: str = "cuda"):
    """Exact ties across CTAs: up to 3 experts spread over the expert range (first, middle,
    last CTA) get all-zero router rows (s = 0.5 exactly) and the same bias +10, so their keys
    are bit-equal and far above the rest. Returns (args, those experts ascending)."""
    args = _args(spec, seed, device)
    e = spec["E"]
    tied = sorted({1, e // 2, e - 2})[:min(3, spec["TOPK"])]
    args[ROUTER] = args[ROUTER].clone()
    args[BIAS] = args[BIAS].clone()
    args[ROUTER][tied] = 0.0
    args[BIAS][tied] = 10.0
    return args, tied


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_exact_ties_go_to_the_lower_expert_id(kset, case):
    spec = _spec(*case)
    args, tied = tied_args(spec, 19)
    _launch(kset, spec, args)
    check_outputs(spec, args)
    for b in range(case[1]):
        assert args[IDS][b, :len(tied)].tolist() == tied, \
            f"row {b}: ids {args[IDS][b].tolist()}, want the tied {tied} first, ascending"


def padding_args(spec, seed: int, device: str = "cuda"):
    """Odd rows are padding (B = 1: the only row is), their x and residual holding 1e30
    (finite: h comes out 0, which would route), NaN, inf, −inf in that order."""
    b = spec["B"]
    mask = [1 - i % 2 for i in range(b)] if b > 1 else [0]
    args = _args(spec, seed, device, row_mask=mask)
    pad = [i for i in range(b) if not mask[i]]
    for i, junk in zip(pad, [1e30, float("nan"), float("inf"), -float("inf")]):
        args[X][i] = junk
        args[RES][i] = junk
    return args


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_padding_rows_pick_nothing(kset, case):
    spec = _spec(*case)
    args = padding_args(spec, 17)
    _launch(kset, spec, args)
    check_outputs(spec, args)
    live = args[MASK] != 0
    assert (args[EXPERTS] >= 0).sum() <= live.sum() * spec["TOPK"]
    assert (args[SLOT_W][:, ~live] == -1.0).all(), "padding rows must have no slot weight"


@pytest.mark.parametrize("preset", PRESETS)
def test_repeated_launches_reuse_the_counter(kset, preset):
    """Launches on the same workspace, fresh inputs and poisoned outputs each time, then a
    burst of back-to-back launches (PDL overlaps their prologues): the counter is left zero
    by each, so every launch's last CTA does the top-k."""
    for b in BUCKETS:
        spec = _spec(preset, b)
        kernel = kset.get("moe_router", **spec.as_dict())
        args = _args(spec, 300 + b)
        for i in range(3):
            fresh = _args(spec, 400 + 10 * b + i)
            for k in (X, RES, R_OUT, H_OUT, IDS, WTS, EXPERTS, SLOT_W):
                args[k].copy_(fresh[k])
            _launch(kset, spec, args)
            check_outputs(spec, args)
        for _ in range(5):
            kernel.launch(*args)
        torch.cuda.synchronize()
        check_outputs(spec, args)


@pytest.mark.parametrize("b", [1, 8])
def test_pdl_consumer_never_reads_its_input_early(kset, b):
    """Behind a slow producer with PDL on, every replay equals the run without PDL, for each
    input (x, residual, row_mask) the producer writes late."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    spec = _spec("full", b)
    consumer = kset.get("moe_router", **spec.as_dict())
    for target in (X, RES, MASK):
        args = _args(spec, 7)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        check_outputs(spec, args)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert torch.equal(g, w), f"{spec.id}: read argument {target} before the wait"
