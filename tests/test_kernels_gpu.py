"""GPU tests of the AOT kernels against their plain-PyTorch references, and the PDL ordering test.

Run on the H200 through tools/gpu_check.sh with a kernel cache built on a CPU machine
(FLINT_GRAPH_CACHE points at it). Every case draws fresh random inputs (kernels/toolchain/examples.py)
and poisons outputs with NaN before the launch, so an unwritten element fails.

Tolerances (DESIGN §4): ‖out − ref‖/‖ref‖ ≤ 1e-2 for bf16 outputs. Both sides accumulate in
fp32 and round once to bf16, so the expected error is the bf16 output rounding (≤ 2^-9 per
element, ~2e-3 norm-wise) plus fp32 summation-order noise (~1e-6); 1e-2 leaves room for neither
more. The residual output of rmsnorm is one fp32 add of two bf16 values, rounded once: exact.
"""


import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import kernel_module, registry
from flint_graph.kernels.toolchain.examples import example_args
from flint_graph.kernels.toolchain.spec import BUCKETS, TensorArg

pytestmark = pytest.mark.gpu
# Kernels whose inputs are plain random tensors (kernels/toolchain/examples.py). The decode-step kernels
# read ids, positions and tables, so each builds valid arguments itself (its make_args) and
# has its own test file.
GENERIC = ("rmsnorm", "gemv_bf16", "gemv_nvfp4")
REL_TOL = 1e-2
SPIN_NS = 30_000  # the slow producer's delay: far longer than any consumer's prologue
REPLAYS = 40


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.kernels import TEST_KERNELS

    torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
    return KernelSet(kernels=registry(GENERIC + TEST_KERNELS))


TAIL_NS = (40, 1000)  # not multiples of a CTA's rows: the tail rows' predicate must hold


def _cases(name: str):
    """(preset, spec, extents) for every specialisation (every variant a kernel module lists in
    `bench_specs`, else its model specs) and every dense shape both configs need, plus output
    widths that end in a partial tile."""
    kdef = registry((name,))[0]
    module = kernel_module(name)
    out = []
    for preset in ("tiny", "full"):
        cfg = FlintConfig.preset(preset)
        ns: dict[int, set[int]] = {}
        for n, k in cfg.dense_linear_shapes().values():
            ns.setdefault(k, set()).update({n, *TAIL_NS})
        for spec in getattr(module, "bench_specs", kdef.specs)(cfg, BUCKETS):
            values = spec.as_dict()
            if "K" in values:
                out += [(preset, spec, {"N": n}) for n in sorted(ns[values["K"]])]
            else:
                out.append((preset, spec, {}))
    return out


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _outputs(kdef, spec, args):
    return [v for a, v in zip(kdef.args(spec), args) if isinstance(a, TensorArg)
            and a.role == "output"]


def _check_against_reference(kset, preset, spec, extents, seed):
    kdef = kset.defs[spec.kernel]
    eps = FlintConfig.preset(preset).rms_norm_eps
    args = example_args(kdef, spec, extents, gen=torch.Generator(device="cuda").manual_seed(seed),
                        scalars={"eps": eps})
    kset.get(spec.kernel, **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    inputs = [v for a, v in zip(kdef.args(spec), args) if getattr(a, "role", "") != "output"]
    refs = kdef.reference(spec, *inputs)
    refs = refs if isinstance(refs, tuple) else (refs,)
    for out, ref in zip(_outputs(kdef, spec, args), refs):
        assert not out.isnan().any(), f"{spec.id} {extents}: unwritten (NaN) outputs"
        rel = _rel(out, ref)
        assert rel <= REL_TOL, f"{spec.id} {extents}: rel err {rel:.2e} > {REL_TOL}"
    return args, refs


@pytest.mark.parametrize("case", _cases("rmsnorm"), ids=lambda c: f"{c[0]}-{c[1].key}")
def test_rmsnorm_matches_reference(kset, case):
    preset, spec, extents = case
    args, refs = _check_against_reference(kset, preset, spec, extents, seed=1)
    residual_out = args[3]
    assert torch.equal(residual_out, refs[0]), "the new residual must be bit-exact"


@pytest.mark.parametrize("name", ["gemv_bf16", "gemv_nvfp4"])
def test_gemv_matches_reference(kset, name):
    for i, (preset, spec, extents) in enumerate(_cases(name)):
        _check_against_reference(kset, preset, spec, extents, seed=100 + i)


@pytest.mark.parametrize("name", ["gemv_bf16", "gemv_nvfp4"])
def test_gemv_rows_are_batch_invariant(kset, name):
    """Each output row is bitwise the same computed alone (B = 1, batch column 0) as at its
    column of B = 2, 4, 8, for every variant: a row's summation order may not depend on its
    place in the batch (the V ≥ 3 split-K epilogue once summed in a column-dependent order)."""
    for i, (preset, spec, extents) in enumerate(_cases(name)):
        b = spec["B"]
        if b == 1:
            continue
        kdef = kset.defs[spec.kernel]
        eps = FlintConfig.preset(preset).rms_norm_eps
        args = example_args(kdef, spec, extents,
                            gen=torch.Generator(device="cuda").manual_seed(500 + i),
                            scalars={"eps": eps})
        kset.get(spec.kernel, **spec.as_dict()).launch(*args)
        (y,) = _outputs(kdef, spec, args)
        one = kdef.spec(**{**spec.as_dict(), "B": 1})
        for r in range(b):
            alone = [v[r:r + 1].contiguous() if a.name == "x" else
                     torch.full_like(v[:1], float("nan")) if getattr(a, "role", "") == "output"
                     else v for a, v in zip(kdef.args(spec), args)]
            kset.get(one.kernel, **one.as_dict()).launch(*alone)
            (y1,) = _outputs(kdef, one, alone)
            assert torch.equal(y1[0], y[r]), f"{spec.id} {extents}: row {r} differs alone"


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32).view(-1)


def _graph_outputs(kset, consumer, args, target, pdl: bool, replays: int, stale=None,
                   prepare=None):
    """Capture [reset target to stale, slow producer writes the true values, consumer] once,
    replay it; returns the consumer's outputs after each replay (cloned). stale: the values
    the target holds until the producer's write (default random; index inputs need values
    that stay in bounds); prepare: run before each replay instead of poisoning the outputs
    (NaN, or −1 for integers), for outputs that must start from a given state, and once before
    the true values are taken (a kernel that consumes an input, as moe_route's place resets
    counts, would otherwise leave the next call zeros as its true values)."""
    kdef = consumer.kdef
    if prepare is not None:
        prepare()
    true = args[target].clone()
    if stale is None:
        stale = torch.randn_like(args[target].float()).to(args[target].dtype)
    producer = kset.get("slow_producer")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            _words(args[target]).copy_(_words(stale))
            producer.launch(_words(true), _words(args[target]), SPIN_NS, pdl=pdl)
            consumer.launch(*args, pdl=pdl)
    outs = []
    for _ in range(replays):
        if prepare is not None:
            prepare()
        else:
            for o in _outputs(kdef, consumer.spec, args):
                o.fill_(float("nan") if o.dtype.is_floating_point else -1)
        graph.replay()
        torch.cuda.synchronize()
        outs.append([o.clone() for o in _outputs(kdef, consumer.spec, args)])
    return outs


def _pdl_cases():
    """Each kernel and variant at B = 1 and 8 on one full-size shape (the largest N that is
    not the LM head, so the producer and the consumer both span many CTAs)."""
    out, seen = [], set()
    for name in GENERIC:
        for preset, spec, ext in _cases(name):
            v = spec.as_dict()
            key = (spec.kernel, v.get("V"), v.get("B"))
            if preset == "full" and v.get("B") in (1, 8) and key not in seen \
                    and ext.get("N", 0) in (0, 4096) and v.get("K", 2048) == 2048:
                seen.add(key)
                out.append((preset, spec, ext))
    return out


@pytest.mark.parametrize("case", _pdl_cases(), ids=lambda c: f"{c[1].id}-{c[2]}")
def test_pdl_consumer_never_reads_its_input_early(kset, case):
    """Behind a slow producer with PDL on, every replay must equal the run without PDL, for
    each input the consumer reads (the producer overwrites one input per run)."""
    preset, spec, extents = case
    kdef = kset.defs[spec.kernel]
    consumer = kset.get(spec.kernel, **spec.as_dict())
    targets = [i for i, a in enumerate(kdef.args(spec)) if getattr(a, "role", "") == "input"]
    for target in targets:
        args = example_args(kdef, spec, extents, gen=torch.Generator(device="cuda").manual_seed(7))
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
            for g, w in zip(got, want):
                assert torch.equal(g, w), f"{spec.id}: read {kdef.args(spec)[target].name} " \
                                          f"before griddepcontrol.wait"


def test_pdl_test_catches_an_early_reader(kset):
    """The ordering test has teeth: a consumer that reads before the wait is caught."""
    early = kset.get("early_reader")
    n = 1 << 16
    args = [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda"),
            torch.empty(n, dtype=torch.int32, device="cuda")]
    (want,) = _graph_outputs(kset, early, args, 0, pdl=False, replays=1)
    got = _graph_outputs(kset, early, args, 0, pdl=True, replays=10)
    assert torch.equal(want[0], args[0])  # without PDL it copies the producer's values
    assert any(not torch.equal(g[0], want[0]) for g in got), \
        "the slow producer never overlapped its consumer: the PDL ordering test proves nothing"
