"""GPU tests of attn_prefill (kernels/prefill/attn_prefill.py) and its wgmma form attn_prefill_wg
(kernels/prefill/attn_prefill_wg.py: the same arguments and reference; head dims 64 and 128, so
the full shapes only) against `reference.attention`.

Every case draws fresh Gaussian q, chunk keys and cache (full layers: a shuffled, non-contiguous
page table with spare pages; sliding layers: a ring among three), poisons every cache entry no
query may see and the output with NaN before the launch, and compares the kernel's output with
`reference.attention` on the keys `gather_keys` collects (the cached prefix, then the chunk).

Cases per layer kind, tiny (W = 17, G = 2, D = 32) and full (W = 513, G = 8, D = 128) shapes:
chunks of 1, 64, 512, 513, 514, 2048 and 8192 tokens (full shapes; tiny up to 514), no prefix
and a prefix already cached (in the middle of a page, and past several windows), lengths that
are no multiple of any tile, and sinks drawn N(0, 1), large and finite (+30: the sink dominates
every row, out ≈ 0 but its relative error still counts) and absent (−inf). attn_prefill_wg's
warp-specialized form (WS = 1: a producer warpgroup, mbarrier stages, ping-pong consumers)
and its form before FC (FC = 0: per-copy addresses and descriptors; the model's specs have
FC = 1) run every case at the full and flint-nano shapes, and the two forms must agree bit
for bit. Its split-KV specialisations (SPLITS, full
layers, short chunks) take the chunks up to 512 tokens
and short chunks after long prefixes (25 after 8,192, 48 after 8,229, 1 after 20,011, 512
after 8,192, 471 after 8,266: every split busy; 16 after 64 and 130 after 3,000: some splits
empty), and must leave their completion counters zero.

Tolerance: ‖out − ref‖/‖ref‖ ≤ 1e-2. The reference computes in fp32 and rounds once to bf16;
the kernel rounds the softmax weights P to bf16 before P·V (≤ 2^-9 relative per weight, averaging
over keys) and its output once (≤ 2^-9 per element), so ~3e-3 is expected; fp32 summation order
and ex2.approx (~2^-22) add nothing visible.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import attn_prefill as ap
from flint_graph.kernels.prefill import attn_prefill_wg as wg
from flint_graph.kernels import registry

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2
# each kernel (and attn_prefill_wg's bench variants: the other stage count, the
# warp-specialized form) by its specialisations per config
KERNELS = {"attn_prefill": ap._specs, "attn_prefill_wg": wg._specs,
           "attn_prefill_wg-ST3": lambda cfg: [s for s in wg.bench_specs(cfg) if s["ST"] == 3],
           "attn_prefill_wg-WS": lambda cfg: [s for s in wg.bench_specs(cfg) if wg._ws(s)],
           "attn_prefill_wg-FC0": lambda cfg: [s for s in wg.bench_specs(cfg)
                                               if not wg._fc(s) and not wg._ws(s)
                                               and s["ST"] == wg.STAGES]}
# (kernel, preset) pairs: attn_prefill_wg does not take the tiny config's head dim 32
CONFIGS = [("attn_prefill", "tiny"), ("attn_prefill", "full"), ("attn_prefill_wg", "full"),
           ("attn_prefill_wg-ST3", "full"), ("attn_prefill_wg-WS", "full"),
           ("attn_prefill_wg-WS", "nano"), ("attn_prefill_wg-FC0", "full"),
           ("attn_prefill_wg-FC0", "nano")]


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in true fp32
    return KernelSet(kernels=registry(("attn_prefill", "attn_prefill_wg", "slow_producer",
                                       "early_reader")))


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def _cases(preset: str) -> list[tuple[int, int]]:
    """(tokens, start) pairs worth checking at this preset's window."""
    w = FlintConfig.preset(preset).sliding_window
    out = [(1, 0), (64, 0), (w - 1, 0), (w, 0), (w + 1, 0), (3 * w + 5, 0), (1, 7), (37, 100),
           (w + 3, 2 * w + 11), (200, 4 * w)]
    if preset == "full":
        out += [(512, 0), (513, 0), (514, 0), (2048, 0), (8192, 0), (2048, 6000), (1, 9000)]
    return out


def _mod(spec):
    """The module of `spec`'s kernel (make_args and KERNEL.reference; the output is argument 8,
    before attn_prefill_wg's split partials)."""
    return wg if spec.kernel == "attn_prefill_wg" else ap


def _split(spec) -> bool:
    return spec.as_dict().get("SPLITS", 1) > 1


def _check(kset, spec, tokens, start, seed, sinks=None) -> float:
    args = _mod(spec).make_args(spec, gen=torch.Generator(device="cuda").manual_seed(seed),
                                tokens=tokens, start=start, sinks=sinks)
    kset.get(spec.kernel, **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    out = args[8]
    what = f"{spec.id} tokens={tokens} start={start} sinks={sinks}"
    assert not out.isnan().any(), f"{what}: NaN in the output (a masked or unwritten key leaked)"
    if _split(spec):
        assert not args[-1].any(), f"{what}: completion counters not left zero"
    (ref,) = _mod(spec).KERNEL.reference(spec, *args)
    rel = _rel(out, ref)
    print(f"{what}: rel err {rel:.2e}")  # pytest -s: the errors, not only the verdicts
    assert rel <= REL_TOL, f"{what}: rel err {rel:.2e} > {REL_TOL}"
    return rel


# short chunks after long prefixes, the split-KV specialisations' case (and a few empty splits)
# (the last two: a ~470-token chat turn resumed on 8K of history, issue 22, whose 512-row chunk
# may split in two)
SPLIT_CASES = [(25, 8192), (48, 8229), (1, 20011), (16, 64), (130, 3000), (512, 8192),
               (471, 8266)]


@pytest.mark.parametrize("kernel,preset", CONFIGS)
def test_prefill_attention_matches_reference(kset, kernel, preset):
    specs = KERNELS[kernel](FlintConfig.preset(preset))
    assert specs, f"{kernel} has no specialisation for {preset}"
    for si, spec in enumerate(specs):
        cases = _cases(preset)
        if _split(spec):  # short chunks (its partials grow with T · SPLITS)
            cases = [c for c in cases if c[0] <= 512] + SPLIT_CASES
        for ci, (tokens, start) in enumerate(cases):
            _check(kset, spec, tokens, start, seed=1000 * si + ci)


@pytest.mark.parametrize("kernel,preset", CONFIGS)
@pytest.mark.parametrize("sinks", [30.0, -30.0, "none"])
def test_sinks_enter_each_row_once(kset, kernel, preset, sinks):
    """A dominant sink (+30) shrinks every row's output towards 0 and must do so by exactly
    e^(sink − m) once; a negligible one (−30) and none at all leave plain softmax."""
    for si, spec in enumerate(KERNELS[kernel](FlintConfig.preset(preset))):
        w = spec["W"] or 513
        _check(kset, spec, w + 7, 3, seed=77 + si, sinks=sinks)
        if _split(spec):  # the sink in split 0 only, the other splits' rows without it
            _check(kset, spec, 25, 5000, seed=177 + si, sinks=sinks)


@pytest.mark.parametrize("kernel,preset", CONFIGS)
@pytest.mark.parametrize("growth", [4.0, 40.0])
def test_row_max_growing_along_the_keys(kset, kernel, preset, growth):
    """Keys scaled up along the positions (×0.05 … ×`growth`), so each row's max keeps growing
    over its key tiles: attn_prefill_wg moves its reference max only when a tile's max passes
    it by more than RESCALE_AT (weights up to 2^8), and must then rescale O and l by exactly
    the move; ×40 puts scores past 100 (e^100 overflows fp32 without the max)."""
    for si, spec in enumerate(KERNELS[kernel](FlintConfig.preset(preset))):
        for tokens, start in [(1500, 0), (600, 300)]:
            args = _mod(spec).make_args(
                spec, gen=torch.Generator(device="cuda").manual_seed(91 + si), tokens=tokens,
                start=start, poison_unseen=False)
            k_new, k_cache = args[1], args[3]
            ramp = torch.linspace(0.05, growth, start + tokens, device="cuda")
            k_new.mul_(ramp[start:, None, None].to(k_new.dtype))
            if not spec["RING"]:  # the cached prefix's keys sit in pages table[pos // P]
                pos = torch.arange(start, device="cuda")
                page = args[5].long()[pos // spec["P"]]
                k_cache[page, :, pos % spec["P"]] *= ramp[:start, None, None].to(k_cache.dtype)
            else:  # the ring's entries of positions n − W + 1 … n − 1
                pos = torch.arange(max(0, start - spec["W"] + 1), start, device="cuda")
                ring = k_cache[int(args[5][0])]  # [HKV, P, D], a view
                ring[:, pos % spec["P"]] *= ramp[pos][None, :, None].to(k_cache.dtype)
            kset.get(spec.kernel, **spec.as_dict()).launch(*args)
            torch.cuda.synchronize()
            out = args[8]
            what = f"{spec.id} tokens={tokens} start={start} growth={growth}"
            assert not out.isnan().any() and not out.isinf().any(), f"{what}: non-finite"
            (ref,) = _mod(spec).KERNEL.reference(spec, *args)
            rel = _rel(out, ref)
            assert rel <= REL_TOL, f"{what}: rel err {rel:.2e} > {REL_TOL}"


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_pdl_consumer_never_reads_its_input_early(kset, kernel):
    """Behind a slow producer with PDL on, each input the kernel reads (q, the chunk's keys, the
    cache, the table, start) overwritten by the producer gives the same output as without PDL."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    for spec in KERNELS[kernel](FlintConfig.preset("full")):
        consumer = kset.get(spec.kernel, **spec.as_dict())
        decl = _mod(spec).KERNEL.args(spec)
        targets = [i for i, a in enumerate(decl) if getattr(a, "role", "") == "input"]
        for target in targets:
            # a split specialisation's case: a short chunk after a long prefix
            tokens, start = (30, 2000) if _split(spec) else (300, 700)
            args = _mod(spec).make_args(spec, gen=torch.Generator(device="cuda").manual_seed(5),
                                        tokens=tokens, start=start, poison_unseen=False)
            (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
            for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
                assert torch.equal(got[0], want[0]), \
                    f"{spec.id}: read {decl[target].name} before griddepcontrol.wait"


@pytest.mark.parametrize("preset", ["full", "nano"])
def test_run_copies_change_no_output_bit(kset, preset):
    """FC = 1 copies the same bytes into the same stages as the per-copy path, so its output
    equals the form before it (FC = 0) bit for bit: a cold chunk (every tile the chunk's own keys), a
    chunk after a prefix in the middle of a page or past several windows (tiles from the pages
    or the ring, one straddling the start, the ring's wrap), and a split short chunk."""
    cfg = FlintConfig.preset(preset)
    for si, spec in enumerate(wg._specs(cfg)):
        plain = wg.variant(spec, FC=0)
        cases = [(25, 5000), (471, 8266)] if _split(spec) else \
            [(2048, 0), (700, 1337), (1000, 3 * 513 + 40), (64, 0)]
        for ci, (tokens, start) in enumerate(cases):
            outs = []
            for s in (plain, spec):
                args = wg.make_args(s, gen=torch.Generator(device="cuda").manual_seed(
                    300 + 10 * si + ci), tokens=tokens, start=start)
                kset.get(s.kernel, **s.as_dict()).launch(*args)
                torch.cuda.synchronize()
                outs.append(args[8])
            assert torch.equal(outs[0], outs[1]), \
                f"{spec.id} tokens={tokens} start={start}: FC = 1 differs from FC = 0"
