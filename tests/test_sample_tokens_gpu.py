"""GPU tests of the sample_tokens kernel (kernels/decode/sample_tokens.py) against its `_reference`, and
its PDL ordering.

No tolerance: the contract is exact (integer weights from the same fp32 operations in torch, integer
sums), so every id must equal the reference's. Every case draws fresh inputs; ids are poisoned with
-7 before each launch (an unwritten id fails), and the workspaces must be zero after every launch
(the next launch relies on it). Cases: random logits (3 * N(0, 1) bf16) with mixed per-row
parameters (greedy, top-k, top-p, temperatures), rows full of exact ties, NaN / -inf / +inf rows, a
row spread over more live bins than the last CTA stages (its slow path), top_k around the top-k
path's bound (1 … 64 take it, 65 does not) with the cut key's ties spread across CTAs, VLIM < V,
every bucket of both presets; a row alone equals the same row among 7 others; back-to-back
launches; PDL.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.decode.sample_tokens import KERNEL, bench_specs, make_args
from flint_graph.kernels.toolchain.spec import BUCKETS

pytestmark = pytest.mark.gpu
PRESETS = ("tiny", "full")
LOGITS, TEMP, TOPK, TOPP, SEEDS, DRAW, IDS = range(7)
WORKSPACES = range(7, 12)
# (temperature, top_k, top_p) of row i, cycled: greedy, plain, Flint's defaults, top-1, top-p only,
# both tight, top-p tiny (argmax), hot
PARAMS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (1.0, 20, 0.95), (0.7, 1, 1.0), (1.3, 0, 0.9),
          (0.6, 1000, 0.5), (1.0, 50, 1e-4), (2.0, 0, 1.0)]


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("sample_tokens", "slow_producer")))


def _spec(preset: str, b: int, short: bool = False):
    """The model's spec (VLIM = V) or, short, the bench spec with VLIM < V (buckets 1 and 8)."""
    (spec,) = [s for s in bench_specs(FlintConfig.preset(preset), (b,))
               if (s["VLIM"] < s["V"]) == short]
    return spec


def _cases(short: bool = False):
    return [(p, b) for p in PRESETS for b in ((1, 8) if short else BUCKETS)]


def mixed_args(spec, seed: int, device: str = "cuda", shift: int = 0):
    """Fresh arguments (drawn on the CPU) with row i's parameters PARAMS[i + shift]."""
    rows = [PARAMS[(i + shift) % len(PARAMS)] for i in range(spec["B"])]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return make_args(spec, gen=gen, device=device, temperature=[r[0] for r in rows],
                     top_k=[r[1] for r in rows], top_p=[r[2] for r in rows])


def tie_args(spec, seed: int, device: str = "cuda"):
    """Logits on a 0.25 grid (hundreds of exact ties per value); row 0 all equal."""
    args = mixed_args(spec, seed, device, shift=seed)
    logits = (args[LOGITS].float() * 4).round() / 4
    logits[0] = 0.5
    args[LOGITS] = logits.bfloat16()
    return args


def special_args(spec, seed: int, device: str = "cuda"):
    """Row i gets pattern (i + seed) % 6: a third of the logits -inf; a third NaN, the argmax
    among them; every logit NaN (id 0); every logit -inf but one; two +inf logits; and 'wide':
    logits +-2^e over every exponent (more live bins than the last CTA stages, at T = 1e6 all
    live), most of them on the lowest bin, so the draw lands in an unstaged bin."""
    args = mixed_args(spec, seed, device, shift=seed)
    gen = torch.Generator().manual_seed(seed)
    logits = args[LOGITS].float().cpu()
    vlim = spec["VLIM"]
    for i in range(spec["B"]):
        row = logits[i, :vlim]
        pick = torch.randperm(vlim, generator=gen)
        pattern = (i + seed) % 6
        if pattern == 0:
            row[pick[:vlim // 3]] = -float("inf")
        elif pattern == 1:
            row[pick[:vlim // 3]] = float("nan")
            row[row.nan_to_num(nan=-1e9).argmax()] = float("nan")
        elif pattern == 2:
            row[:] = float("nan")
        elif pattern == 3:
            row[:] = -float("inf")
            row[pick[0]] = -5.0
        elif pattern == 4:
            row[pick[:2]] = float("inf")
        else:
            e = torch.randint(-126, 4, (vlim,), generator=gen).float()
            sign = torch.where(torch.rand(vlim, generator=gen) < 0.5, -1.0, 1.0)
            row[:] = torch.where(torch.rand(vlim, generator=gen) < 0.8, -8.0, sign * 2.0 ** e)
            args[TEMP][i], args[TOPK][i], args[TOPP][i] = 1e6, 0, 1.0
    args[LOGITS] = logits.bfloat16().to(device)
    return args


TOPK_EDGES = [1, 2, 63, 64, 65, 20, 5, 64]  # around the top-k path's bound (KFAST = 64)


def topk_args(spec, seed: int, device: str = "cuda"):
    """Row i: top_k TOPK_EDGES[i + seed], T = 1, top-p 0.95 on odd rows; even rows random,
    odd rows on a 0.5 grid whose top value recurs in every CTA's range (the cut key's ties,
    taken in id order, cross CTA boundaries)."""
    b = spec["B"]
    ks = [TOPK_EDGES[(i + seed) % len(TOPK_EDGES)] for i in range(b)]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    args = make_args(spec, gen=gen, device="cpu", temperature=[1.0] * b, top_k=ks,
                     top_p=[1.0 if i % 2 == 0 else 0.95 for i in range(b)])
    logits = args[LOGITS].float()
    logits[1::2] = (logits[1::2] * 0.5).round() / 0.5
    logits[1::2, :spec["VLIM"]:997] = logits[1::2].max(dim=1, keepdim=True).values
    args[LOGITS] = logits.bfloat16()
    return [a.to(device) for a in args]


def short_args(spec, seed: int, device: str = "cuda"):
    """VLIM < V: the ids at and above VLIM hold the row's largest logits (they must never win)."""
    args = mixed_args(spec, seed, device, shift=seed)
    args[LOGITS][:, spec["VLIM"]:] = 30.0
    return args


def check_outputs(spec, args) -> None:
    """Every check on one launch's outputs (device-agnostic: tests/test_sample_tokens.py feeds
    it reference outputs)."""
    want = KERNEL.reference(spec, *args[:IDS])
    got = args[IDS].cpu()
    assert torch.equal(got, want.cpu()), f"{spec.id}: ids {got.tolist()}, want {want.tolist()}"
    assert ((got >= 0) & (got < spec["VLIM"])).all()
    for i in WORKSPACES:
        assert not args[i].any(), f"{spec.id}: workspace {i} not left zero"


def _launch(kset, spec, args):
    kset.get("sample_tokens", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_matches_reference(kset, case):
    spec = _spec(*case)
    for seed in range(4):
        args = mixed_args(spec, 100 * case[1] + seed, shift=seed)
        _launch(kset, spec, args)
        check_outputs(spec, args)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_ties_and_special_values(kset, case):
    spec = _spec(*case)
    for seed in range(6 if case[1] < 6 else 2):
        for build in (tie_args, special_args):
            args = build(spec, 200 + seed)
            _launch(kset, spec, args)
            check_outputs(spec, args)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_top_k_path_edges(kset, case):
    """top_k 1, 2, 5, 20, 63, 64 (the top-k path) and 65 (the histogram path), with ties at
    the cut across CTAs."""
    spec = _spec(*case)
    for seed in range(4):
        args = topk_args(spec, 600 + seed)
        _launch(kset, spec, args)
        check_outputs(spec, args)


@pytest.mark.parametrize("case", _cases(short=True), ids=lambda c: f"{c[0]}-B{c[1]}")
def test_ids_at_or_above_vlim_never_win(kset, case):
    spec = _spec(*case, short=True)
    for seed in range(3):
        args = short_args(spec, 300 + seed)
        _launch(kset, spec, args)
        check_outputs(spec, args)


@pytest.mark.parametrize("preset", PRESETS)
def test_a_row_alone_equals_the_row_in_a_batch(kset, preset):
    """Batch invariance: each row of a B = 8 launch, launched alone at B = 1, gives the same id."""
    big, one = _spec(preset, 8), _spec(preset, 1)
    args = mixed_args(big, 400)
    _launch(kset, big, args)
    check_outputs(big, args)
    for i in range(8):
        alone = mixed_args(one, 401 + i)
        for k in range(IDS):
            alone[k] = args[k][i:i + 1].clone()
        alone[IDS].fill_(-7)
        _launch(kset, one, alone)
        assert alone[IDS].item() == args[IDS][i].item(), f"row {i}"


@pytest.mark.parametrize("preset", PRESETS)
def test_repeated_launches_reuse_the_workspaces(kset, preset):
    """Fresh inputs on the same workspaces, then a burst of back-to-back launches (PDL overlaps
    their starts): each launch leaves the workspaces zero for the next."""
    for b in BUCKETS:
        spec = _spec(preset, b)
        kernel = kset.get("sample_tokens", **spec.as_dict())
        args = mixed_args(spec, 500 + b)
        for i in range(3):
            fresh = mixed_args(spec, 510 + 10 * b + i, shift=i)
            for k in range(IDS + 1):
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
    input the producer writes late."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    spec = _spec("full", b)
    consumer = kset.get("sample_tokens", **spec.as_dict())
    for target in range(IDS):
        args = mixed_args(spec, 7, shift=2)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        check_outputs(spec, args)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert torch.equal(g, w), f"{spec.id}: read argument {target} before the wait"
