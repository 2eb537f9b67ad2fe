"""CuTe DSL kernels (`flint_graph.kernels`), one family per file with its plain-PyTorch
reference, compiled ahead of time into a cubin cache.

| file | owns |
|---|---|
| `spec.py` | how a kernel is declared: arguments, specialisations, launch shape |
| `build.py` | the AOT compile (needs the DSL, no GPU) into cubins + manifest |
| `cache.py` | reading and verifying the cache (no DSL: what the GPU box uses) |
| `cubin.py` | reading parameter layout, block and registers out of a cubin |
| `rmsnorm.py`, `gemv_bf16.py`, `gemv_nvfp4.py`, ... | one decode kernel family each |
| `attn_prefill.py`, `nvfp4_unpack.py` | the prefill's kernels (docs/prefill.md) |
| `examples.py` | fresh random arguments for each kernel (GPU tests, microbenchmark) |
| `slow_producer.py`, `early_reader.py` | test-only: the PDL ordering test's slow producer, and |
| | a consumer that breaks the rule on purpose |
"""

from __future__ import annotations

import importlib

# Kernel families the model runs, by module name (each defines KERNEL = KernelDef(...)).
MODEL_KERNELS = ("rmsnorm", "gemv_bf16", "gemv_nvfp4", "qk_norm_rope_kv", "attn_decode",
                 "moe_router", "moe_gate_up", "moe_down", "sample_tokens",
                 "attn_prefill", "nvfp4_unpack")
# Test-only kernels, built into every cache so the GPU tests can run wherever the cache goes.
TEST_KERNELS = ("slow_producer", "early_reader")


def registry(names=MODEL_KERNELS):
    """The KernelDef of each named kernel module (imports no DSL)."""
    return [importlib.import_module(f"{__name__}.{n}").KERNEL for n in names]
