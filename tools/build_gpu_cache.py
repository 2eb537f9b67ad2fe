#!/usr/bin/env python3
"""Build the kernel cache the H200 runs carry (it has no CuTe DSL and never compiles there,
../shared/device.md): every model specialisation of the tiny, nano (flint-nano, issue 11) and
full configs, flint-nano with the planted config bugs of `flint-graph eval --plant` (window-1,
rope-on-nope), every variant a kernel module lists in `bench_specs`, and the test-only kernels,
for sm_90a, into .kcache/kernels (what tools/gpu_check.sh points FLINT_GRAPH_CACHE at).

    python tools/build_gpu_cache.py [--out .kcache/kernels] [--arch sm_90a] [--jobs N]
Incremental: entries already up to date are kept.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from flint_graph.config import FlintConfig
from flint_graph.kernels import MODEL_KERNELS, TEST_KERNELS, registry
from flint_graph.kernels.build import build_cache, model_specs
from flint_graph.kernels.spec import BUCKETS, unique_specs
from flint_graph.nano.plants import planted_config


def todo() -> list:
    """(KernelDef, Spec) pairs: model specs and bench variants of both presets, test kernels."""
    out = []
    for name in MODEL_KERNELS:
        (kdef,) = registry((name,))
        module = importlib.import_module(f"flint_graph.kernels.{name}")
        for preset in ("tiny", "nano", "full"):
            cfg = FlintConfig.preset(preset)
            specs = kdef.specs(cfg, BUCKETS)
            specs += getattr(module, "bench_specs", lambda c, b: [])(cfg, BUCKETS)
            out += [(kdef, s) for s in unique_specs(specs)]
        for bug in ("window-1", "rope-on-nope"):  # `eval --plant` on the graph engine
            out += [(kdef, s) for s in kdef.specs(planted_config(FlintConfig.preset("nano"), bug),
                                                  BUCKETS)]
    return out + model_specs(None, (), registry(TEST_KERNELS))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".kcache/kernels", help="cache directory")
    p.add_argument("--arch", action="append", choices=("sm_90a", "sm_100a"))
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU)")
    args = p.parse_args()
    t0 = time.perf_counter()
    counts = build_cache(args.out, todo(), args.arch or ["sm_90a"], workers=args.jobs)
    print(f"{args.out}: {counts} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
