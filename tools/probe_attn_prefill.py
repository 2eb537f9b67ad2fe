#!/usr/bin/env python3
"""Probe a prefill attention kernel on the GPU with inputs that separate its two products, so a
layout fault shows where it is (written for attn_prefill_wg's first GPU run, 2026-12-02):

  * q = 0: every visible key gets the same score, so out = the mean of the visible values (plus
    the sink's share): a fault here is in the P·V product or the V layout;
  * v[key] = one-hot(key mod D) (with the chunk's keys only, start = 0): out row i holds the
    softmax weights of its keys in columns key mod D: a fault here is in S = Q·Kᵀ, the mask or
    the softmax;
  * random inputs, as the GPU test.

For each probe and kernel: ‖out − ref‖/‖ref‖, and where the error sits: per 64-column block of
the head dim, per query head of a KV group, per token mod 16 (a CTA's rows), the worst rows.

    python tools/probe_attn_prefill.py [--kernels attn_prefill,attn_prefill_wg] [--out DIR]

Needs a CUDA GPU and the kernel cache (FLINT_GRAPH_CACHE). Writes probe.json under --out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch


def _where(out: torch.Tensor, ref: torch.Tensor, hq: int, d: int) -> dict:
    """Relative error by column block, head and token mod 16, and the five worst rows."""
    t = out.shape[0]
    err = (out.float() - ref.float()).view(t, hq, d)
    den = ref.float().view(t, hq, d).norm().clamp_min(1e-30)
    blocks = {f"cols {b}-{b + 63}": (err[:, :, b:b + 64].norm() / den).item()
              for b in range(0, d, 64)}
    heads = [(err[:, h].norm() / den).item() for h in range(hq)]
    toks = [(err[i::16].norm() / den).item() for i in range(min(16, t))]
    rows = err.norm(dim=(1, 2))
    worst = rows.topk(min(5, t)).indices.tolist()
    return {"by_column_block": blocks, "by_head": [round(x, 5) for x in heads],
            "by_token_mod_16": [round(x, 5) for x in toks],
            "worst_tokens": worst, "nan": bool(out.isnan().any())}


def main() -> int:
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels import registry

    from flint_graph.capture.prefill import ATTN_KERNELS
    from flint_graph.errors import ConfigError

    p = ValueParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--kernels", default=",".join(ATTN_KERNELS),
                   help=f"comma-separated attention kernels to probe, of {', '.join(ATTN_KERNELS)}"
                        " (default: both)")
    p.add_argument("--preset", default="full",
                   help="config whose specialisations are probed: tiny, nano or full (default)")
    p.add_argument("--out", default="out", help="directory for probe.json (default: out)")
    args = p.parse_args()
    names = [k for k in args.kernels.split(",") if k]
    bad = [k for k in names if k not in ATTN_KERNELS]
    if bad or not names:
        p.error(f"--kernels {args.kernels!r}: expected one or more of {', '.join(ATTN_KERNELS)}")
    try:
        cfg = FlintConfig.preset(args.preset)
    except ConfigError as e:
        p.error(f"--preset: {e}")
    if not torch.cuda.is_available():
        print("probe_attn_prefill: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    kset = KernelSet(kernels=registry(tuple(names)))
    report = []
    for name in names:
        mod = __import__(f"flint_graph.kernels.prefill.{name}", fromlist=["KERNEL"])
        specs = mod.KERNEL.specs(cfg, ())
        if not specs:
            print(f"probe_attn_prefill: {name} has no specialisation for --preset {args.preset} "
                  "(its head dim)", file=sys.stderr)
        for spec in specs:
            hq, d = spec["HQ"], spec["D"]
            kernel = kset.get(name, **spec.as_dict())
            for probe, tokens, start in (("q=0", 300, 0), ("q=0", 200, 700),
                                         ("v=one-hot", 100, 0), ("v=one-hot", 16, 0),
                                         ("random", 1, 0), ("random", 300, 700)):
                a = mod.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(7),
                                  tokens=tokens, start=start, sinks="none")
                if probe == "q=0":
                    a[0].zero_()
                if probe == "v=one-hot":
                    keys = torch.arange(tokens, device="cuda")
                    a[2].zero_()
                    a[2][keys, :, keys % d] = 1.0
                kernel.launch(*a)
                torch.cuda.synchronize()
                (ref,) = mod.KERNEL.reference(spec, *a)
                out = a[8]  # before attn_prefill_wg's split partials
                rel = ((out.float() - ref.float()).norm()
                       / ref.float().norm().clamp_min(1e-30)).item()
                row = {"kernel": name, "spec": spec.key, "probe": probe, "tokens": tokens,
                       "start": start, "rel_err": rel, **_where(out, ref, hq, d)}
                report.append(row)
                print(f"{name} {spec.key} {probe} tokens={tokens} start={start}: "
                      f"rel {rel:.3e} nan={row['nan']} {row['by_column_block']} "
                      f"worst tokens {row['worst_tokens']}", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
