"""The prefill's layer norms over a chunk's T rows, with or without the residual add before
them: RES 1: r = bf16(residual + x), y = rmsnorm(r) · w (the norm after attention, where the
o projection joins the residual stream); RES 0: y = rmsnorm(x) · w (the norm at a layer's
start, whose input the previous layer's moe_combine already summed).

It is the decode step's norm (kernels/decode/rmsnorm.py, `build_norm`: one warp a row, the
weight loaded before `griddepcontrol.wait`) with the row count dynamic, so one cubin serves
every chunk. It must match `reference.residual_add` then `reference.rms_norm` (DESIGN §4: the
sum rounded once to bf16, the norm in fp32 from it, rounded once).

Why: capture/prefill.py ran these as torch ops, a layer_norm kernel (~5.8 µs at 512 rows on
the H100) twice a layer and an elementwise add (~4 µs), none with a PDL edge to its
neighbours. Traffic at T rows of H: RES 1 reads 2·T·H·2 bytes and writes as much (8 MB at 512
× 2048), RES 0 half that. Measured on the H100 (perf log, thirty-fifth session, `flint-graph
trace --preset full --prefill N`, NVFP4, against the torch ops on the same machine): 512 tokens
16.84 → 16.63 ms (medians of three runs), 8K 120.02 → 119.58 ms; 49 fewer launches a prefill.

PDL: x and residual are predecessors' outputs, read only after the wait, in every thread; w
is a weight.

Shape legend: T chunk rows (dynamic), H hidden.

Tolerance (GPU test): y within rel. 1e-2 of the reference (the bf16 output rounding plus a
different fp32 summation order and the hardware rsqrt) and at most 1% of its elements
different at all; the residual output bit-exact (one fp32 add of two bf16 values, rounded
once).
"""

import torch

from flint_graph import reference
from flint_graph.kernels.decode import rmsnorm as decode_norm
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg


def _args(spec: Spec):
    h = spec["H"]
    x = TensorArg("x", "bf16", ("T", h), "input")
    w = TensorArg("w", "bf16", (h,), "weight")
    y = TensorArg("y", "bf16", ("T", h), "output")
    if spec["RES"]:
        return (x, TensorArg("residual", "bf16", ("T", h), "input"), w,
                TensorArg("residual_out", "bf16", ("T", h), "output"), y, ScalarArg("eps", "f32"))
    return (x, w, y, ScalarArg("eps", "f32"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("T", 1), 1, 1), block=(32, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    """RES 0 and 1 at the config's hidden size (a multiple of 8, else ValueError)."""
    if cfg.hidden_size % decode_norm.VEC:
        raise ValueError(f"rmsnorm_rows: hidden_size {cfg.hidden_size} must be a multiple of "
                         f"{decode_norm.VEC}")
    return [KERNEL.spec(H=cfg.hidden_size, RES=r) for r in (0, 1)]


def _reference(spec: Spec, *inputs):
    """RES 1 (x, residual, w, eps) -> (residual_out, y); RES 0 (x, w, eps) -> (y,)."""
    if spec["RES"]:
        x, residual, w, eps = inputs
        r = reference.residual_add(residual, x)
        return r, reference.rms_norm(r, w, eps)
    x, w, eps = inputs
    return (reference.rms_norm(x, w, eps),)


def make_args(spec: Spec, *, gen: torch.Generator, rows: int = 77, eps: float = 1e-6,
              device: str = "cuda") -> list:
    """Fresh random arguments in declaration order: x and residual ~ N(0, 1) bf16 [rows, H]
    (an activation's scale), w ~ 1 + N(0, 0.1²) (a trained norm's gain), outputs NaN."""
    h, on = spec["H"], gen.device

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=on)).to(torch.bfloat16)

    def nan():
        return torch.full((rows, h), float("nan"), dtype=torch.bfloat16, device=on)

    x, w = rand(rows, h), (1 + 0.1 * torch.randn(h, generator=gen, device=on)).bfloat16()
    args = [x, rand(rows, h), w, nan(), nan(), eps] if spec["RES"] else [x, w, nan(), eps]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _build(spec: Spec):
    return decode_norm.build_norm(spec["H"], residual=bool(spec["RES"]))


KERNEL = KernelDef(name="rmsnorm_rows", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference,
                   source_files=("decode/rmsnorm.py", "toolchain/dsl_util.py"))
