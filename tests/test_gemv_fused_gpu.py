"""GPU tests of the fused, normed QKV projection: gemv_nvfp4 / gemv_bf16 at `fused_qkv_spec`
(NORM=1: the attention RMSNorm of the residual stream x in the prologue; NVFP4 ROWSCALE=1:
scale2 per output row), against `_reference` (reference.rms_norm then reference.linear) and
against the unfused chain it replaces (rms_norm, then the q, k and v projections, each
NVFP4 weight with its own per-tensor scale2).

Every bucket, both presets, both formats, at the model's qkv width N = Q + 2·KV, plus output
widths ending in a partial tile (40, 1000). NVFP4 scale2: one value per segment (q, k, v),
none a power of two, all different, as stacking three checkpoints' tensors gives; the
partial-tile widths draw a different random scale2 per row. x is the residual stream
(N(0, 1)·3, far from unit RMS), the norm weight near 1 as in the checkpoints, eps the config's.

Tolerance: ‖y − ref‖/‖ref‖ ≤ 1e-2 (tests/test_kernels_gpu.py's GEMV tolerance). The kernel
forms h = bf16((x·rstd)·w) at the reference's rounding point; only the fp32 sum-of-squares
order and the hardware rsqrt can flip a bf16 of h (~1e-4 of them), then the GEMV's own fp32
order and the single bf16 rounding of y (~2e-3). The same 1e-2 holds against the unfused chain.
`python tests/test_gemv_fused_gpu.py` (on the GPU) times the fused launch against
rmsnorm + q + k + v (CUDA graph, PDL, weights rotated past L2).
"""

import statistics

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.decode import gemv_bf16, gemv_nvfp4
from flint_graph.kernels.toolchain.spec import BUCKETS
from flint_graph.checkpoints.weights import NVFP4Weight

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2
PRESETS = ("tiny", "full")
FORMATS = {"gemv_nvfp4": gemv_nvfp4, "gemv_bf16": gemv_bf16}
SEG_SCALE2 = (0.0123, 0.0371, 0.00517)  # q, k, v: not powers of two, all different
TAIL_NS = (40, 1000)


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
    return KernelSet(kernels=registry(("rmsnorm", "gemv_bf16", "gemv_nvfp4", "slow_producer")))


def _segments(cfg) -> tuple[int, int, int]:
    return cfg.q_dim, cfg.kv_dim, cfg.kv_dim


def make_args(name: str, spec, cfg, n: int, gen: torch.Generator) -> list:
    """Declared-order arguments of a fused spec with n output rows (n = Q + 2·KV: per-segment
    scale2; other n: per-row random scale2)."""
    b, k = spec["B"], spec["K"]

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda")

    x = (3.0 * randn(b, k)).to(torch.bfloat16)
    norm_w = (1.0 + 0.1 * randn(k)).to(torch.bfloat16)
    y = torch.full((b, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    if name == "gemv_bf16":
        return [x, (randn(n, k) / k ** 0.5).to(torch.bfloat16), norm_w, y, cfg.rms_norm_eps]
    codes = torch.randint(0, 256, (n, k // 2), generator=gen, device="cuda", dtype=torch.uint8)
    scales = torch.randint(0, 256, (n, k // 16), generator=gen, device="cuda",
                           dtype=torch.uint8)
    if n == sum(_segments(cfg)):
        scale2 = torch.cat([torch.full((m,), s, device="cuda")
                            for m, s in zip(_segments(cfg), SEG_SCALE2)])
    else:
        scale2 = randn(n).abs() * 0.01 + 1e-3
    return [x, codes, scales, scale2.float(), norm_w, y, cfg.rms_norm_eps]


def _unfused(name: str, cfg, args) -> torch.Tensor:
    """rms_norm, then q, k and v as three projections (NVFP4: each its own scalar scale2)."""
    h = reference.rms_norm(args[0], args[-3], args[-1])
    outs, row = [], 0
    for m in _segments(cfg):
        rows = slice(row, row + m)
        if name == "gemv_bf16":
            w = args[1][rows]
        else:
            w = NVFP4Weight(args[1][rows], args[2][rows], args[3][row].clone())
        outs.append(reference.linear(h, w))
        row += m
    return torch.cat(outs, dim=1)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _cases():
    return [(name, preset, b, n) for name in FORMATS for preset in PRESETS for b in BUCKETS
            for n in (None, *TAIL_NS)]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]}-B{c[2]}-N{c[3]}")
def test_fused_qkv_matches_reference(kset, case):
    name, preset, b, n = case
    cfg = FlintConfig.preset(preset)
    spec = FORMATS[name].fused_qkv_spec(b, cfg)
    qkv_n = cfg.dense_linear_shapes()["qkv_proj"][0]
    args = make_args(name, spec, cfg, n or qkv_n, torch.Generator(device="cuda").manual_seed(b))
    kset.get(name, **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    y = args[-2]
    assert not y.isnan().any(), f"{spec.id} N={y.shape[1]}: unwritten (NaN) outputs"
    ref = kset.defs[name].reference(spec, *args[:-2], args[-1])
    rel = _rel(y, ref)
    assert rel <= REL_TOL, f"{spec.id} N={y.shape[1]}: rel err {rel:.2e} > {REL_TOL}"
    if n is None:
        rel = _rel(y, _unfused(name, cfg, args))
        assert rel <= REL_TOL, f"{spec.id}: rel err {rel:.2e} against the unfused chain"


@pytest.mark.parametrize("case", [(name, b) for name in FORMATS for b in (1, 8)],
                         ids=lambda c: f"{c[0]}-B{c[1]}")
def test_pdl_fused_qkv_never_reads_x_early(kset, case):
    """Behind a slow producer that writes x with PDL on, every replay equals the run without
    PDL (tests/test_kernels_gpu.py's ordering test): the sum of squares and the x fragments
    are both read after the wait."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    name, b = case
    cfg = FlintConfig.preset("full")
    spec = FORMATS[name].fused_qkv_spec(b, cfg)
    consumer = kset.get(name, **spec.as_dict())
    args = make_args(name, spec, cfg, cfg.dense_linear_shapes()["qkv_proj"][0],
                     torch.Generator(device="cuda").manual_seed(7))
    (want,) = _graph_outputs(kset, consumer, args, 0, pdl=False, replays=1)
    assert not want[0].isnan().any()
    for got in _graph_outputs(kset, consumer, args, 0, pdl=True, replays=REPLAYS):
        assert torch.equal(got[0], want[0]), f"{spec.id}: read x before griddepcontrol.wait"


def _graph_us(fns, reps: int = 20) -> float:
    """Median µs of one replay of a CUDA graph of the launches `fns`."""
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for f in fns:
            f()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for f in fns:
                f()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_fused_vs_chain(sets: int = 8, layers: int = 32) -> None:
    """Print µs per layer: the fused launch against rmsnorm + q + k + v (full preset, model
    variants, PDL on, `sets` weight sets in turn so the weights come from DRAM)."""
    from flint_graph.capture.launcher import KernelSet

    ks = KernelSet(kernels=registry(("rmsnorm", "gemv_bf16", "gemv_nvfp4")))
    cfg, gen = FlintConfig.preset("full"), torch.Generator(device="cuda").manual_seed(0)
    h = cfg.hidden_size
    for name, mod in FORMATS.items():
        for b in BUCKETS:
            spec = mod.fused_qkv_spec(b, cfg)
            fused = ks.get(name, **spec.as_dict())
            plain = {m: ks.get(name, **mod.spec_for(b, h, m).as_dict())
                     for m in set(_segments(cfg))}
            norm = ks.get("rmsnorm", B=b, H=h)
            fused_fns, chain_fns = [], []
            for i in range(sets):
                a = make_args(name, spec, cfg, sum(_segments(cfg)), gen)
                fused_fns.append(lambda a=a: fused.launch(*a))
                hbuf, res = torch.empty_like(a[0]), torch.empty_like(a[0])
                nargs = [a[0], a[0], a[-3], res, hbuf, cfg.rms_norm_eps]
                chain = [lambda nargs=nargs: norm.launch(*nargs)]
                row = 0
                for m in _segments(cfg):
                    w = [a[1][row:row + m].contiguous()] if name == "gemv_bf16" else [
                        a[1][row:row + m].contiguous(), a[2][row:row + m].contiguous(),
                        a[3][row:row + 1].clone()]
                    out = torch.empty((b, m), dtype=torch.bfloat16, device="cuda")
                    chain.append(lambda g=plain[m], h=hbuf, w=w, out=out: g.launch(h, *w, out))
                    row += m
                chain_fns.append(chain)
            per = layers // sets
            t_f = _graph_us([f for _ in range(per) for f in fused_fns]) / layers
            t_c = _graph_us([f for _ in range(per) for c in chain_fns for f in c]) / layers
            print(f"{name} B={b}: fused qkv {t_f:.2f} us, rmsnorm+q+k+v {t_c:.2f} us "
                  f"(4 launches), saved {t_c - t_f:.2f} us per layer", flush=True)


if __name__ == "__main__":
    time_fused_vs_chain()
