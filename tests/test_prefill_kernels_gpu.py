"""GPU tests of the prefill's elementwise kernels against their references: moe_combine
(kernels/prefill/moe_combine.py), qk_norm_rope (kernels/prefill/qk_norm_rope.py), swiglu
(kernels/prefill/swiglu.py) and rmsnorm_rows (kernels/prefill/rmsnorm_rows.py), both
configs, chunk lengths that are no multiple of anything (1, 77, 1000), padding rows, positions
near the context limit; and the PDL ordering test for each input behind a slow producer.

Every case draws fresh random inputs and NaN-poisoned outputs (each module's make_args).
Tolerances: moe_combine bitwise (it performs the reference's operations in its order, each
rounded on its own), its NORM = 1 output h as rmsnorm_rows' y; qk_norm_rope as the decode
kernel it shares its code with (tests/test_qk_norm_rope_kv_gpu.py): rel. ≤ 1e-2 and at most
1% of q/k elements different at all, values bit-exact; swiglu rel. ≤ 1e-2 and at most 1% of the elements different (the
hardware exp's last ulp may flip the one bf16 rounding); rmsnorm_rows the same for y (fp32
summation order and the hardware rsqrt against torch's), its residual output bitwise (one fp32
add of two bf16 values, rounded once).
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.prefill import moe_combine as mc
from flint_graph.kernels.prefill import qk_norm_rope as qr
from flint_graph.kernels.prefill import rmsnorm_rows as nr
from flint_graph.kernels.prefill import swiglu as sw

pytestmark = pytest.mark.gpu
PRESETS = ("tiny", "full")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("moe_combine", "qk_norm_rope", "swiglu",
                                        "rmsnorm_rows", "slow_producer", "qk_norm_rope_kv")))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("tokens,valid", [(1, 1), (77, 77), (77, 40), (1000, 999), (16, 0)])
def test_moe_combine_is_bitwise_the_reference(kset, preset, tokens, valid):
    """Every spec (NORM = 1 too: out bitwise, h as a layer norm's tolerance)."""
    for spec in mc._specs(FlintConfig.preset(preset)):
        args = mc.make_args(spec, gen=_gen(tokens + valid), tokens=tokens, valid=valid)
        want = mc._reference(spec, *[a.clone() if isinstance(a, torch.Tensor) else a
                                     for a in args])
        kset.get("moe_combine", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        outs = [a for a, d in zip(args, mc.KERNEL.args(spec)) if getattr(d, "role", "")
                == "output"]
        out = outs[0]
        what = f"{spec.id} T={tokens} valid={valid}"
        assert not out.isnan().any(), f"{what}: unwritten or NaN (a padding pair read into " \
                                      f"a real row?)"
        assert torch.equal(_bits(out), _bits(want[0])), \
            f"{what}: {int((out != want[0]).sum())} elements differ"
        if mc.norm_of(spec):
            assert not outs[1].isnan().any(), f"{what}: h unwritten"
            _check_close(f"{what}: h", outs[1], want[1])


def test_moe_combine_norm_of_a_row_is_the_same_alone(kset):
    """NORM = 1's h of a row depends on that row only: row 600 of a 1,000-row launch is bitwise
    row 0 of a launch of that row alone (a resumed prefill and a cold one norm a token alike)."""
    (spec,) = [s for s in mc._specs(FlintConfig.preset("full")) if mc.norm_of(s)]
    args = mc.make_args(spec, gen=_gen(31), tokens=1000)
    kernel = kset.get("moe_combine", **spec.as_dict())
    kernel.launch(*args)
    names = [d.name for d in mc.KERNEL.args(spec)]
    y, pos, w = args[:3]
    rows = pos[600].long()  # the row's K pairs, renumbered 0 … K − 1 in a y of their own
    alone = dict(zip(names, args))
    alone.update(y=y[rows].clone(), pos=torch.arange(spec["K"], dtype=torch.int32,
                                                     device="cuda")[None],
                 weights=w[600:601].clone(), shared=args[names.index("shared")][600:601].clone(),
                 x=args[names.index("x")][600:601].clone(),
                 valid=torch.ones(1, dtype=torch.int32, device="cuda"),
                 out=torch.full_like(args[names.index("out")][:1], float("nan")),
                 h_out=torch.full_like(args[names.index("h_out")][:1], float("nan")))
    kernel.launch(*[alone[n] for n in names])
    torch.cuda.synchronize()
    for n in ("out", "h_out"):
        assert torch.equal(_bits(args[names.index(n)][600:601]), _bits(alone[n])), \
            f"{spec.id}: {n} of row 600 differs alone"


def _check_close(what: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel <= 1e-2, f"{what}: rel err {rel:.2e} > 1e-2"
    flips, allowed = int((out != ref).sum()), max(2, int(0.01 * out.numel()))
    assert flips <= allowed, f"{what}: {flips} of {out.numel()} elements differ (rel {rel:.2e})"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("tokens,start", [(1, 0), (77, 0), (1000, 513), (77, 262_000)])
def test_qk_norm_rope_matches_reference(kset, preset, tokens, start):
    cfg = FlintConfig.preset(preset)
    for spec in qr._specs(cfg):
        args = qr.make_args(spec, gen=_gen(tokens + start), tokens=tokens, start=start,
                            theta=cfg.rope_theta, eps=cfg.rms_norm_eps)
        kset.get("qk_norm_rope", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        q_ref, k_ref, v_ref = qr._reference(spec, *args)
        what = f"{spec.id} T={tokens} start={start}"
        for name, got in zip(("q_out", "k_out", "v_out"), args[5:8]):
            assert not got.isnan().any(), f"{what}: {name} unwritten"
        _check_close(f"{what}: q_out", args[5], q_ref)
        _check_close(f"{what}: k_out", args[6], k_ref.reshape(args[6].shape))
        assert torch.equal(args[7], v_ref.reshape(args[7].shape)), f"{what}: v_out not a copy"


@pytest.mark.parametrize("preset", PRESETS)
def test_qk_norm_rope_rotates_as_the_decode_kernel(kset, preset):
    """The prefill build takes each row's (cos, sin) from a table its CTA computes once; the
    decode build computes them in every head's warp. Same function, same inputs: the same
    bits, for rows at positions up to 262,000 (q_out, and k_out against the key the decode
    kernel writes into its ring slot)."""
    from flint_graph.kernels.decode import qk_norm_rope_kv as dk

    cfg = FlintConfig.preset(preset)
    spec = next(s for s in qr._specs(cfg) if s["ROPE"])
    dspec = next(s for s in dk._specs(cfg) if s["ROPE"] and s["RING"] and s["B"] == 8)
    positions = [0, 1, 511, 512, 4095, 100_003, 200_000, 262_000]
    args = qr.make_args(spec, gen=_gen(11), tokens=8, theta=cfg.rope_theta,
                        eps=cfg.rms_norm_eps)
    args[1] = torch.tensor(positions, dtype=torch.int32, device="cuda")
    dargs = dk.make_args(dspec, gen=_gen(12), positions=positions, theta=cfg.rope_theta,
                         eps=cfg.rms_norm_eps)
    dargs[0], dargs[3], dargs[4], dargs[5] = args[0], args[2], args[3], args[4]
    kset.get("qk_norm_rope", **spec.as_dict()).launch(*args)
    kset.get("qk_norm_rope_kv", **dspec.as_dict()).launch(*dargs)
    torch.cuda.synchronize()
    assert torch.equal(_bits(args[5]), _bits(dargs[6])), f"{spec.id}: q_out differs"
    page, entry = dk.cache_entry(dspec, dargs[1], dargs[2])
    assert torch.equal(_bits(args[6]), _bits(dargs[7][page, :, entry])), \
        f"{spec.id}: k_out differs from the decode kernel's key"


@pytest.mark.parametrize("rows,width", [(1, 8), (77, 512), (3, 10944), (4099, 512)])
def test_swiglu_matches_reference(kset, rows, width):
    (spec,) = sw.KERNEL.specs(FlintConfig.preset("full"), ())
    args = sw.make_args(spec, gen=_gen(rows), rows=rows, width=width)
    kset.get("swiglu", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    (want,) = sw._reference(spec, *args)
    assert not args[2].isnan().any(), f"{rows}x{width}: unwritten"
    _check_close(f"swiglu {rows}x{width}", args[2], want)


def test_pdl_swiglu_reads_inputs_after_the_wait(kset):
    (spec,) = sw.KERNEL.specs(FlintConfig.preset("full"), ())
    args = sw.make_args(spec, gen=_gen(8), rows=300, width=512)
    _pdl_check(kset, sw.KERNEL, spec, args, ("g", "u"))


def _pdl_check(kset, kdef, spec, args, targets):
    from test_kernels_gpu import REPLAYS, _graph_outputs

    consumer = kset.get(spec.kernel, **spec.as_dict())
    names = [a.name for a in kdef.args(spec)]
    for name in targets:
        target = names.index(name)
        (want,) = _graph_outputs(kset, consumer, [a.clone() if isinstance(a, torch.Tensor)
                                                  else a for a in args], target, pdl=False,
                                 replays=1)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert torch.equal(_bits(g), _bits(w)), \
                    f"{spec.id}: read {name} before griddepcontrol.wait"


def test_pdl_moe_combine_reads_inputs_after_the_wait(kset):
    """Each float input overwritten by a slow producer gives the output without PDL (pos and
    valid are indices: a stale value would read out of bounds rather than differ; they are
    read at the same point, after the one wait at the top of the kernel)."""
    for spec in mc._specs(FlintConfig.preset("full")):
        args = mc.make_args(spec, gen=_gen(5), tokens=300, valid=290)
        _pdl_check(kset, mc.KERNEL, spec, args, ("y", "weights", "shared", "x"))


def test_pdl_qk_norm_rope_reads_inputs_after_the_wait(kset):
    cfg = FlintConfig.preset("full")
    for spec in qr._specs(cfg):
        args = qr.make_args(spec, gen=_gen(6), tokens=300, start=1000, theta=cfg.rope_theta,
                            eps=cfg.rms_norm_eps)
        _pdl_check(kset, qr.KERNEL, spec, args, ("qkv", "positions"))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("rows", [1, 77, 512, 4099])
def test_rmsnorm_rows_matches_reference(kset, preset, rows):
    cfg = FlintConfig.preset(preset)
    for spec in nr.KERNEL.specs(cfg, ()):
        args = nr.make_args(spec, gen=_gen(rows + spec["RES"]), rows=rows, eps=cfg.rms_norm_eps)
        kset.get("rmsnorm_rows", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        inputs = [a for a, d in zip(args, nr.KERNEL.args(spec))
                  if getattr(d, "role", "") != "output"]
        want = nr._reference(spec, *inputs)
        outs = [a for a, d in zip(args, nr.KERNEL.args(spec))
                if getattr(d, "role", "") == "output"]
        what = f"{spec.id} T={rows}"
        for got in outs:
            assert not got.isnan().any(), f"{what}: unwritten"
        if spec["RES"]:
            assert torch.equal(_bits(outs[0]), _bits(want[0])), \
                f"{what}: the new residual must be bit-exact"
        _check_close(f"{what}: y", outs[-1], want[-1])


def test_rmsnorm_rows_row_is_the_same_alone(kset):
    """A row's norm does not depend on the chunk around it (one warp a row): row 600 of a
    1,000-row launch is bitwise row 0 of a launch of that row alone, so a resumed prefill
    (issue 22) and a cold one normalise a token alike."""
    for spec in nr.KERNEL.specs(FlintConfig.preset("full"), ()):
        args = nr.make_args(spec, gen=_gen(30 + spec["RES"]), rows=1000)
        kset.get("rmsnorm_rows", **spec.as_dict()).launch(*args)
        decl = nr.KERNEL.args(spec)
        alone = [a[600:601].clone() if getattr(d, "role", "") == "input" else
                 torch.full_like(a[:1], float("nan")) if getattr(d, "role", "") == "output"
                 else a for a, d in zip(args, decl)]
        kset.get("rmsnorm_rows", **spec.as_dict()).launch(*alone)
        torch.cuda.synchronize()
        for a, b, d in zip(args, alone, decl):
            if getattr(d, "role", "") == "output":
                assert torch.equal(_bits(a[600:601]), _bits(b)), f"{spec.id}: {d.name} differs"


def test_pdl_rmsnorm_rows_reads_inputs_after_the_wait(kset):
    for spec in nr.KERNEL.specs(FlintConfig.preset("full"), ()):
        args = nr.make_args(spec, gen=_gen(9 + spec["RES"]), rows=300)
        _pdl_check(kset, nr.KERNEL, spec, args, ("x", "residual") if spec["RES"] else ("x",))
