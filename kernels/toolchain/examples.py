"""Fresh random arguments for each kernel, shared by the GPU tests and the microbenchmark.

Never zeros (they hide unwritten outputs and wrong indexing, ../.library device METHOD): inputs
are Gaussian, weights Gaussian scaled like the synthetic checkpoints, NVFP4 codes and scale
bytes uniform over every byte value (so bit 7 of the scales, which the format ignores, and the
zero-decoding bytes 0x00 and 0x7F all occur), outputs poisoned with NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from flint_graph.kernels.toolchain.spec import DTYPES, KernelDef, ScalarArg, Spec, TensorArg

_DTYPE = {name: getattr(torch, torch_name) for name, (torch_name, _) in DTYPES.items()}


def example_args(kdef: KernelDef, spec: Spec, extents: dict[str, int], *,
                 gen: torch.Generator, device: str = "cuda",
                 scalars: dict[str, Any] | None = None) -> list[Any]:
    """One random argument list for `kdef` at `spec` with dynamic `extents` (e.g. {"N": 512}).

    Tensors are drawn on `gen`'s device (a CUDA generator keeps LM-head-sized draws fast) and
    moved to `device`. Scalars come from `scalars` (by argument name) or a default per name
    (eps 1e-5)."""
    out: list[Any] = []
    for a in kdef.args(spec):
        if isinstance(a, ScalarArg):
            out.append((scalars or {}).get(a.name, {"eps": 1e-5}.get(a.name, 0)))
            continue
        shape = tuple(extents[d] if isinstance(d, str) else d for d in a.shape)
        out.append(example_tensor(a, shape, gen, device))
    return out


def example_tensor(a: TensorArg, shape: tuple[int, ...], gen: torch.Generator,
                   device: str) -> torch.Tensor:
    """One fresh tensor for argument `a` with concrete `shape` (dtype from `a.dtype`), drawn on
    `gen`'s device and moved to `device`: outputs NaN (or -1) poisoned, the rest random as the
    module docstring says (integer workspaces, e.g. completion counters,
    zero). Lets a caller redraw inputs while keeping weights it already has."""
    dtype = _DTYPE[a.dtype]
    if a.role == "workspace" and not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype, device=device)  # counters start at zero
    if a.role in ("output", "workspace"):
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.fill_(float("nan")) if dtype.is_floating_point else t.fill_(-1)
    on = gen.device
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8, device=on).to(device)
    if not dtype.is_floating_point:
        return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=dtype,
                             device=on).to(device)
    t = torch.randn(shape, generator=gen, device=on)
    if a.name == "scale2":
        t = t.abs() * 0.01 + 1e-3  # per-tensor NVFP4 scale: positive, not a power of two
    elif a.role == "weight" and len(shape) == 2:
        t = t / math.sqrt(shape[1])  # keeps a GEMV's outputs O(1), like the checkpoints
    elif a.name == "w":
        t = 1.0 + 0.1 * t  # norm weights sit near 1
    return t.to(dtype).to(device)
