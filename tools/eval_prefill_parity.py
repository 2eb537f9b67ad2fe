#!/usr/bin/env python3
"""flint-nano's eval on the graph engine with the prefill's parts swapped one at a time, each
held to a saved reference report: where the log-probability gap of `flint-graph eval --compare`
comes from (issue 21). GPU only; one device call.

    python tools/eval_prefill_parity.py --ref docs/nano/2026-12-03/eval-ref.json \
        [--variants kernel,kernel-refattn,torch-refattn,torch,torch-refattn-f32] [--model CK]
        [--out DIR] [--gemm-bias]

Variants (the decode graph is the same in all):
  kernel          the kernel prefill as shipped (CUDA graphs per chunk size)
  kernel-refattn  the kernel prefill's kernels for everything but attention, which is
                  `reference.attention` (fp32 throughout) on the gathered keys
  torch-refattn   the torch-ops prefill (cuBLAS, torch norms, grouped GEMMs) with
                  `reference.attention`
  torch           the torch-ops prefill with torch's SDPA (the baseline)
  reference       the reference model's prefill (fp32 GEMMs and attention, `reference.py`)
A variant may end in @N: prompts prefilled in chunks of N tokens (EngineConfig.
prefill_chunk_tokens; the same arithmetic, other fp32 summation orders).
  torch-refattn-f32  torch-refattn with every GEMM (F.linear, torch._grouped_mm) as an fp32
                  SIMT GEMM of the bf16 operands (no tensor cores): the reference prefill's
                  numerics through the Prefill class
--gemm-bias first times nothing but measures, at Flint's qkv shape, the signed error of a
bf16 tensor-core GEMM (fp32 accumulation) and of an fp32 SIMT GEMM against fp64: a rounding
that is not to nearest shows as a mean error of one sign.
A variant whose gap drops to the reference prefill's (1.37e-4 nats, perf log 2026-12-02) names
the part that makes the rest. Prints one line per variant and writes DIR/parity.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

VARIANTS = ("kernel", "kernel-refattn", "torch-refattn", "torch", "torch-refattn-f32",
            "reference")


def _f32_gemms():
    """Swap F.linear and torch._grouped_mm for fp32 SIMT GEMMs of their bf16 operands, bf16
    out (TF32 off): one rounding of a CUDA-core fp32 sum, as `reference.linear` on the GPU."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False

    def linear(x, w, b=None):
        return (x.float() @ w.float().t()).to(x.dtype)

    def grouped_mm(a, b, offs=None, **_):
        out = torch.zeros(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
        ends = offs.tolist()
        for e, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)):
            if hi > lo:
                out[lo:hi] = (a[lo:hi].float() @ b[e].float()).to(a.dtype)
        return out

    F.linear, torch._grouped_mm = linear, grouped_mm


def gemm_bias() -> dict:
    """Relative error, signed and absolute, and the share of outputs rounded toward zero, of
    a bf16 tensor-core GEMM and an fp32 SIMT GEMM against fp64, x [8192, 2048] @ w [5120, 2048]ᵀ
    (random normal, bf16 values), fp32 outputs."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8192, 2048, device="cuda", generator=g).bfloat16()
    w = (torch.randn(5120, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    exact = x.double() @ w.double().t()
    out = {}
    for name, y in (("bf16 tensor cores", torch.mm(x, w.t(), out_dtype=torch.float32)),
                    ("fp32 SIMT", x.float() @ w.float().t())):
        err = y.double() - exact
        rel = err / exact.abs().clamp_min(1e-30)
        toward_zero = (err * exact.sign() < 0).double().mean().item()
        out[name] = {"mean_signed_rel": rel.mean().item(), "mean_abs_rel": rel.abs().mean().item(),
                     "share_toward_zero": toward_zero,
                     "max_abs": err.abs().max().item()}
    return out


def run_variant(name: str, model: str, ref: dict, n: int) -> dict:
    """The eval report of one variant, with its comparison to `ref`."""
    import torch

    from flint_graph.api import LLM
    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.nano import evals
    from flint_graph.runtime.engine_config import EngineConfig

    variant, (name, _, chunk) = name, name.partition("@")
    kernel = name.startswith("kernel")
    if name.endswith("-f32"):
        _f32_gemms()  # for the rest of the process: put this variant last
    path = "kernel" if kernel else "reference" if name == "reference" else "torch"
    cfg = EngineConfig(engine="graph", prefill=path, prefill_graphs=name == "kernel",
                       prefill_chunk_tokens=int(chunk) if chunk else None)
    dev = torch.device("cuda")
    llm = LLM.from_checkpoint(load_checkpoint(model, None, dev, False), dev, cfg)
    if "refattn" in name:
        llm.engine.runner.prefiller.attention = "reference"
    cases = evals.build_cases(tuple(ref["suites"]), n, ref.get("seed", 0),
                              tuple(ref["contexts"]))
    t0 = time.perf_counter()
    rep = evals.run(llm, cases, ref.get("batch", 8), progress=False)
    rep.update(seed=ref.get("seed", 0), suites=ref["suites"], contexts=ref["contexts"],
               engine="graph", device="cuda", format=ref.get("format"), variant=variant)
    rep["compare"] = evals.compare(rep, ref)
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    del llm
    torch.cuda.empty_cache()
    return rep


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="reference eval report (flint-graph eval --json)")
    p.add_argument("--model", help="checkpoint (default: the embedded flint-nano, BF16)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--n", type=int, help="cases per suite (default: the reference report's)")
    p.add_argument("--out", default="out")
    p.add_argument("--gemm-bias", action="store_true")
    args = p.parse_args()
    ref = json.loads(Path(args.ref).read_text())
    model = args.model
    if model is None:
        from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

        model = str(ensure_default_checkpoint(progress=False))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    if args.gemm_bias:
        rows["gemm_bias"] = gemm_bias()
        print(json.dumps(rows["gemm_bias"], indent=1), flush=True)
    for name in args.variants.split(","):
        if name.partition("@")[0] not in VARIANTS:
            p.error(f"--variants {name}: expected some of {', '.join(VARIANTS)}")
        rep = run_variant(name, model, ref, args.n or ref["n"])
        c = rep["compare"]
        rows[name] = {"identical_answers": c["identical_answers"],
                      "logprob_mean_abs_diff": c["logprob_mean_abs_diff"],
                      "logprob_tokens": c["logprob_tokens"], "passed": c["passed"],
                      "seconds": rep["seconds"]}
        (out / f"eval-{name}.json").write_text(json.dumps(rep, indent=1) + "\n")
        print(f"{name:16s} identical {100 * c['identical_answers']:.1f}%  mean |Δlogprob| "
              f"{c['logprob_mean_abs_diff']:.3e} over {c['logprob_tokens']} tokens  "
              f"{'PASSED' if c['passed'] else 'FAILED'}  ({rep['seconds']} s)", flush=True)
    (out / "parity.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
