"""How a kernel is declared: its arguments, its specialisations and its launch shape.

Every kernel file in this package defines one module-level `KernelDef` (see `rmsnorm.py` for the
smallest). The AOT build (`build.py`) turns each `Spec` it lists into a cubin plus a manifest
entry; the launcher (`flint_graph.capture.launcher`) checks torch arguments against the same
declarations and packs them by the manifest's parameter layout. Nothing here imports the DSL, so
the GPU box (which has no CuTe DSL) can read declarations, manifests and references.

Conventions (../shared/cute-dsl-aot.md §2): the `@cute.jit` function a kernel's `build` returns
takes exactly the declared arguments in order, then a stream, and launches one `@cute.kernel`
with them unchanged, so kernel parameter i is declared argument i. Tensors are row-major;
an extent named by a string is dynamic (one int32 field in the parameter struct), every other
extent and every stride is static.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

# Our dtype names -> (torch dtype name, bytes). The DSL names live in build.py.
DTYPES = {
    "bf16": ("bfloat16", 2),
    "f32": ("float32", 4),
    "f64": ("float64", 8),
    "u8": ("uint8", 1),
    "u32": ("int32", 4),  # torch has no uint32 arithmetic; the bits travel in an int32 tensor
    "i32": ("int32", 4),
    "i64": ("int64", 8),
}
ROLES = ("weight", "input", "output", "workspace")
BUCKETS = (1, 2, 4, 8)  # decode batch buckets (DESIGN §3)
KV_PAGE = 64  # tokens per page of a full layer's paged KV cache (docs/decode-kernels.md)
MAX_BATCH = max(BUCKETS)  # the kernels handle at most this many rows (a compile-time value B)
_SCALAR_BYTES = {"f32": 4, "i32": 4, "i64": 8}


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument.

    shape: ints are static extents; a str names a dynamic extent (equal names must be equal at
    launch). role: "weight" (read-only for the whole step; may be loaded before
    griddepcontrol.wait), "input" (written by a predecessor: read only after the wait) or
    "output"; "workspace": scratch the kernel reads and writes for itself (split-KV partials,
    completion counters), read only after the wait like an input; integer workspaces must be
    zero before the first launch and are left zero by every launch.
    align: byte alignment of the data pointer the kernel assumes (16 for 128-bit loads); every
    row whose byte stride is static must keep it (`check_spec`).
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    role: str
    align: int = 16

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"argument {self.name}: dtype {self.dtype!r}; expected one of {list(DTYPES)}")
        if self.role not in ROLES:
            raise ValueError(f"argument {self.name}: role {self.role!r}; expected one of {ROLES}")


@dataclass(frozen=True)
class ScalarArg:
    """A scalar argument passed by value: dtype "f32", "i32" or "i64"."""

    name: str
    dtype: str


Arg = TensorArg | ScalarArg


@dataclass(frozen=True)
class Launch:
    """Launch shape. grid entries: an int, or (dynamic extent name, items per CTA) meaning
    ceil(extent / items). block is baked into the cubin (.reqntid) and must be launched as is.
    smem: dynamic shared memory in bytes, passed explicitly at launch."""

    grid: tuple[int | tuple[str, int], int, int]
    block: tuple[int, int, int]
    smem: int = 0

    def grid_for(self, extents: dict[str, int]) -> tuple[int, int, int]:
        """The concrete grid for the dynamic extents of one launch."""
        out = []
        for g in self.grid:
            if isinstance(g, int):
                out.append(g)
            else:
                name, per = g
                out.append(max(1, math.ceil(extents[name] / per)))
        return tuple(out)  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return {"grid": [g if isinstance(g, int) else list(g) for g in self.grid],
                "block": list(self.block), "smem": self.smem}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Launch:
        return cls(grid=tuple(g if isinstance(g, int) else (g[0], int(g[1])) for g in d["grid"]),
                   block=tuple(d["block"]), smem=int(d["smem"]))


@dataclass(frozen=True)
class Spec:
    """One specialisation: the kernel name and its compile-time values, e.g. gemv_bf16 B=1,K=2048."""

    kernel: str
    values: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, kernel: str, **values: int) -> Spec:
        return cls(kernel, tuple(sorted(values.items())))

    @property
    def key(self) -> str:
        """Stable text key, e.g. "B=1,K=2048" (the manifest keys on kernel/key@arch)."""
        return ",".join(f"{k}={v}" for k, v in self.values)

    @property
    def id(self) -> str:
        """kernel/key, e.g. "gemv_bf16/B=1,K=2048"."""
        return f"{self.kernel}/{self.key}"

    def __getitem__(self, name: str) -> int:
        for k, v in self.values:
            if k == name:
                return v
        raise KeyError(f"{self.id}: no compile-time value {name!r}")

    def as_dict(self) -> dict[str, int]:
        return dict(self.values)


@dataclass(frozen=True)
class KernelDef:
    """One kernel family, declared once in its own file.

    name: the kernel's name (also its file's name).
    args(spec): the arguments in order (shapes may use the spec's values).
    launch(spec): grid (possibly in dynamic extents), block, dynamic smem.
    specs(cfg, buckets): every specialisation the model `cfg` (a FlintConfig) needs.
    build(spec): the `@cute.jit` function for one specialisation (imports the DSL; compile side
        only). Its parameters: the declared args in order, then the stream. With
        `build_takes_arch`, build(spec, arch) ("sm_90a", "sm_100a"): one arch's ptxas may need
        another tiling to fit the registers, inside the same declared launch.
    reference(spec, *tensors): plain-PyTorch outputs from flint_graph/reference.py's ops, the
        oracle the GPU tests compare with (same argument order as the kernel, outputs returned).
    source_files: files besides the kernel's own module whose change makes its cubins stale.
    routed_weights: which weights a CTA reads depends on an input (the routing result, e.g. a
        tile's expert), so none can be loaded before griddepcontrol.wait; the build checks
        then do not expect weight loads there.
    """

    name: str
    args: Callable[[Spec], Sequence[Arg]]
    launch: Callable[[Spec], Launch]
    specs: Callable[[Any, Sequence[int]], list[Spec]]
    build: Callable[[Spec], Callable[..., Any]]
    reference: Callable[..., Any]
    source_files: tuple[str, ...] = field(default=())
    build_takes_arch: bool = False
    routed_weights: bool = False

    def spec(self, **values: int) -> Spec:
        """A Spec of this kernel from keyword values."""
        return Spec.of(self.name, **values)


def param_layout(arg: TensorArg | ScalarArg) -> tuple[list[list[Any]], int]:
    """The C struct a declared argument becomes as a kernel parameter: ([name, type, offset]
    fields, size in bytes). A tensor is {void* data; int32 dynamic extents...; int64 dynamic
    strides...} in mode order, naturally aligned, padded to 8 (cute-dsl-aot.md §2); a scalar is
    its value. Row-major strides are dynamic exactly when a later extent is dynamic."""
    if isinstance(arg, ScalarArg):
        return [["value", arg.dtype, 0]], _SCALAR_BYTES[arg.dtype]
    fields = [("data", "ptr", 8)]
    fields += [(f"shape{i}", "i32", 4) for i, d in enumerate(arg.shape) if isinstance(d, str)]
    fields += [(f"stride{i}", "i64", 8) for i in range(len(arg.shape))
               if any(isinstance(d, str) for d in arg.shape[i + 1:])]
    out, off = [], 0
    for name, typ, size in fields:
        off = -(-off // size) * size
        out.append([name, typ, off])
        off += size
    return out, -(-off // 8) * 8


def check_spec(kdef: KernelDef, spec: Spec) -> tuple[list[Arg], Launch]:
    """The declared arguments and launch shape of `spec`, after the checks every declaration
    implies. Raises ValueError saying what is wrong (the caller names the specialisation): a
    compile-time value that is not an int, a value the kernel lacks or does not know, a batch B
    outside 1..MAX_BATCH, a static extent outside 1..2^31-1, or a static row stride that is not
    a multiple of the argument's declared alignment (its 128-bit loads would straddle rows)."""
    for name, v in spec.values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"compile-time value {name} = {v!r}; expected an int")
    b = spec.as_dict().get("B")
    if b is not None and not 1 <= b <= MAX_BATCH:
        raise ValueError(f"batch B = {b}; expected 1 to {MAX_BATCH} (the kernels handle at "
                         f"most {MAX_BATCH} rows)")
    try:
        args, launch = list(kdef.args(spec)), kdef.launch(spec)
    except (KeyError, ValueError, TypeError, IndexError) as e:
        why = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ValueError(f"not a specialisation of {kdef.name} ({type(e).__name__}: "
                         f"{why})") from None
    for a in args:
        if isinstance(a, ScalarArg):
            continue
        for d in a.shape:
            if isinstance(d, int) and not 1 <= d < 2**31:
                raise ValueError(f"argument {a.name}: extent {d} in shape {list(a.shape)}; "
                                 f"expected 1 to 2^31-1")
        for i in range(len(a.shape) - 1):
            rest = a.shape[i + 1:]
            if all(isinstance(d, int) for d in rest):
                stride = DTYPES[a.dtype][1] * math.prod(rest)
                if stride % a.align:
                    raise ValueError(f"argument {a.name}: rows of {stride} bytes "
                                     f"(shape {list(a.shape)}, {a.dtype}) break its declared "
                                     f"{a.align}-byte alignment")
    return args, launch


def unique_specs(specs: Sequence[Spec]) -> list[Spec]:
    """Specs without repeats, in first-seen order (shapes repeat across layers and configs)."""
    seen: dict[Spec, None] = {}
    for s in specs:
        seen.setdefault(s, None)
    return list(seen)
