"""CuTe DSL kernels (`flint_graph.kernels`), one family per file with its plain-PyTorch
reference, compiled ahead of time into a cubin cache. Grouped by what a reader looks for:

| folder | holds |
|---|---|
| `toolchain/` | declaring a kernel (`spec.py`); the AOT build (`build.py`: needs the DSL, |
| | no GPU); reading and verifying the cache (`cache.py`: no DSL, the GPU box's side); |
| | cubin and SASS readers (`cubin.py`, `sass.py`); one-instruction DSL helpers |
| | (`dsl_util.py`); fresh random test arguments (`examples.py`) |
| `decode/` | the decode step's kernels (docs/decode-kernels.md): `rmsnorm`, the GEMVs |
| | (`gemv_bf16`, `gemv_nvfp4` with `gemv_mma`), `qk_norm_rope_kv`, `attn_decode`, |
| | `moe_router`, `moe_gate_up`, `moe_down`, `sample_tokens` |
| `prefill/` | the prefill's kernels (docs/prefill.md): `attn_prefill` (and its wgmma |
| | form `attn_prefill_wg`), `nvfp4_unpack`, `moe_combine`, `qk_norm_rope`, `swiglu`, |
| | `grouped_w4a16` (and `grouped_w4a16_wg`), `moe_route`, `kv_write`, `rmsnorm_rows` |
| `pdl_check/` | test-only: the PDL ordering test's slow producer, and a consumer that |
| | breaks the rule on purpose |

Each kernel's GPU test is `tests/test_<name>_gpu.py`, its CPU checks `tests/test_<name>.py`.
"""

from __future__ import annotations

import importlib

# Kernel families the model runs, by module name (each defines KERNEL = KernelDef(...)).
MODEL_KERNELS = ("rmsnorm", "gemv_bf16", "gemv_nvfp4", "qk_norm_rope_kv", "attn_decode",
                 "moe_router", "moe_gate_up", "moe_down", "sample_tokens",
                 "attn_prefill", "nvfp4_unpack", "moe_combine", "qk_norm_rope",
                 "swiglu", "grouped_w4a16", "moe_route", "attn_prefill_wg",
                 "grouped_w4a16_wg", "kv_write", "rmsnorm_rows")
# Test-only kernels, built into every cache so the GPU tests can run wherever the cache goes.
TEST_KERNELS = ("slow_producer", "early_reader")
# The folder of each kernel module (and of the decode GEMVs' shared building blocks).
FOLDER = {**{n: "decode" for n in MODEL_KERNELS[:9] + ("gemv_mma",)},
          "attn_prefill": "prefill", "nvfp4_unpack": "prefill", "moe_combine": "prefill",
          "qk_norm_rope": "prefill", "swiglu": "prefill", "grouped_w4a16": "prefill",
          "moe_route": "prefill", "attn_prefill_wg": "prefill", "grouped_w4a16_wg": "prefill",
          "kv_write": "prefill", "rmsnorm_rows": "prefill", "slow_producer": "pdl_check",
          "early_reader": "pdl_check"}


def kernel_module(name: str):
    """The module of kernel family `name` (e.g. "attn_decode" -> flint_graph.kernels.decode.
    attn_decode). Raises KeyError for a name that is not a kernel module."""
    return importlib.import_module(f"{__name__}.{FOLDER[name]}.{name}")


def source_path(name: str) -> str:
    """A kernel module's file relative to this package, e.g. "decode/attn_decode.py"."""
    return f"{FOLDER[name]}/{name}.py"


def registry(names=MODEL_KERNELS):
    """The KernelDef of each named kernel module (imports no DSL)."""
    return [kernel_module(n).KERNEL for n in names]
