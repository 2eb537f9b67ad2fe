"""GPU tests of kernels/decode/moe_gate_up.py (kernel 7) against its reference, and its PDL ordering.

Tolerance: ‖out − ref‖/‖ref‖ ≤ 1e-2 for act (per used slot) and act_sh. The weight products are
exact on both sides, so g and u differ from `reference.linear` only by the fp32 summation order
and the fp32 ·scale2 (~1e-6 relative), which can flip a bf16 rounding of g or u (2^-8, rarely);
silu·mul adds one fp32 op chain and the final bf16 rounding (≤ 2^-9): ~2e-3 expected.
act rows of unused slots (experts = −1) must stay untouched: still the NaN poison.

Cases, every bucket of both presets, both formats: MoE with every slot used (distinct experts,
the router's ascending order); MoE with −1 tail slots where every row picked the same TOPK
experts (so only TOPK slots are used) and the unpicked experts' weights (BF16) or scale2
(NVFP4) are NaN, so reading any of them shows; MoE with a single used slot; the dense MLP
(TOPK = 0). Slow-producer PDL case: full size, B = 1 and 8, both formats, MoE and dense, h and
experts each overwritten late by the producer.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import moe_gate_up as mgu
from flint_graph.kernels import registry
from flint_graph.kernels.toolchain.spec import BUCKETS

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2
REPLAYS = 40


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
    return KernelSet(kernels=registry(("moe_gate_up", "slow_producer")))


def _specs():
    """Every model spec and every bench spec (the other PD) of the tiny and full configs."""
    return [(p, s) for p in ("tiny", "full") for s in
            mgu.KERNEL.specs(FlintConfig.preset(p), BUCKETS)
            + mgu.bench_specs(FlintConfig.preset(p), BUCKETS)]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _cases(spec, gen):
    """(name, make_args keywords) of the expert lists to run for `spec`."""
    if spec["TOPK"] == 0:
        return [("dense", {})]
    e, s, topk = spec["E"], mgu.slots(spec), spec["TOPK"]
    same = sorted(torch.randperm(e, generator=gen, device=gen.device)[:topk].tolist())
    out = [("all-slots", {})]
    if topk < s:
        out.append(("same-experts-for-every-row", {"experts": same, "poison_unpicked": True}))
    out.append(("one-slot", {"experts": same[-1:], "poison_unpicked": True}))
    return out


@pytest.mark.parametrize("case", _specs(), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_moe_gate_up_matches_reference(kset, case):
    preset, spec = case
    kernel = kset.get(spec.kernel, **spec.as_dict())
    decls = mgu.KERNEL.args(spec)
    gen = torch.Generator(device="cuda").manual_seed(11 + spec["B"])
    for name, kw in _cases(spec, gen):
        args = mgu.make_args(spec, gen=gen, device="cuda", **kw)
        kernel.launch(*args)
        torch.cuda.synchronize()
        refs = mgu.KERNEL.reference(spec, *[t for a, t in zip(decls, args)
                                            if a.role != "output"])
        outs = [t for a, t in zip(decls, args) if a.role == "output"]
        where = f"{spec.id} {name}"
        act_sh, ref_sh = outs[-1], refs[-1]
        assert not act_sh.isnan().any(), f"{where}: act_sh unwritten (NaN) or read a NaN weight"
        assert _rel(act_sh, ref_sh) <= REL_TOL, f"{where}: act_sh rel {_rel(act_sh, ref_sh):.2e}"
        if spec["TOPK"] == 0:
            continue
        act, ref = outs[0], refs[0]
        for s, e in enumerate(args[1].tolist()):
            if e < 0:
                assert act[s].isnan().all(), f"{where}: slot {s} (unused) was written"
                continue
            assert not act[s].isnan().any(), f"{where}: slot {s} (expert {e}) has NaN"
            rel = _rel(act[s], ref[s])
            assert rel <= REL_TOL, f"{where}: slot {s} (expert {e}) rel err {rel:.2e}"


def _pdl_specs():
    full = FlintConfig.preset("full")
    return mgu.KERNEL.specs(full, (1, 8)) + mgu.bench_specs(full, (1, 8))


@pytest.mark.parametrize("spec", _pdl_specs(), ids=lambda s: s.key)
def test_pdl_moe_gate_up_never_reads_its_inputs_early(kset, spec):
    """Behind a slow producer with PDL on, every replay equals the run without PDL, for h and
    for experts (every slot used, so every output element is written)."""
    from test_kernels_gpu import _graph_outputs

    consumer = kset.get(spec.kernel, **spec.as_dict())
    decls = mgu.KERNEL.args(spec)
    targets = [i for i, a in enumerate(decls) if a.role == "input"]
    assert [decls[i].name for i in targets] == (["h", "experts"] if spec["TOPK"] else ["h"])
    for target in targets:
        args = mgu.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(7))
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        assert not any(w.isnan().any() for w in want)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert torch.equal(g, w), f"{spec.id}: read {decls[target].name} before " \
                                          f"griddepcontrol.wait"
