"""Load AOT-compiled cubins with cuda-python and launch them with programmatic dependent launch.

DESIGN §3 (launch): `cuModuleLoadData` -> `cuModuleGetFunction` once per kernel (outside graph
capture, after torch has created the CUDA context), then `cuLaunchKernelEx` on torch's current
stream with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so the kernel may start while
its predecessor finishes and meets it at `griddepcontrol.wait`. Launches record into
`torch.cuda.graph` capture like any other stream work.

Arguments are checked on the host against the kernel's declaration (kernels/toolchain/spec.py) before
anything reaches the driver: dtype, device, dense layout, contiguity, static extents, equal
dynamic extents, pointer alignment; scalars' type (ints for i32/i64, never bool) and range.
They are packed by the manifest's parameter layout, which the build checked against the cubin's
own parameter table (and the cache checks again on load). Every driver call is checked; a
failure raises `LaunchError` naming the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import numbers
import struct
from typing import Any, Iterator, Sequence

import torch

from flint_graph.errors import FlintError
from flint_graph.kernels import registry
from flint_graph.kernels.toolchain.cache import CacheEntry, KernelCache, arch_for_capability
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg

_TORCH = {"bf16": (torch.bfloat16,), "f32": (torch.float32,), "f64": (torch.float64,),
          "u8": (torch.uint8,),
          "u32": (torch.int32, getattr(torch, "uint32", torch.int32)), "i32": (torch.int32,),
          "i64": (torch.int64,)}
_PACK = {"ptr": "Q", "i32": "i", "i64": "q", "f32": "f"}
_INT_RANGE = {"i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1)}
_F32_MAX = 3.4028234663852886e38


class LaunchError(FlintError):
    """A kernel could not be loaded or launched, or its arguments do not match its declaration."""


def _driver():
    from cuda.bindings import driver
    return driver


def _check(result: Any, what: str) -> Any:
    """Unwrap a cuda-python (err, *values) result; raise LaunchError naming `what` on failure."""
    cu = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise LaunchError(f"{what}: {name.decode() if isinstance(name, bytes) else err}")
    return values[0] if len(values) == 1 else values


def device_arch(device: torch.device | int | None = None) -> str:
    """The cubin arch of a CUDA device (sm_90a on an H200)."""
    return arch_for_capability(*torch.cuda.get_device_capability(device))


def check_args(name: str, decls: Sequence[TensorArg | ScalarArg], values: Sequence[Any],
               device_type: str = "cuda") -> dict[str, int]:
    """Validate launch arguments against a kernel's declaration; returns the dynamic extents.

    Raises LaunchError naming the kernel `name` and the argument."""
    if len(values) != len(decls):
        raise LaunchError(f"{name}: {len(values)} arguments, expected {len(decls)} "
                          f"({', '.join(a.name for a in decls)})")
    extents: dict[str, int] = {}
    for decl, v in zip(decls, values):
        where = f"{name}: argument {decl.name}"
        if isinstance(decl, ScalarArg):
            _check_scalar(where, decl.dtype, v)
            continue
        if not isinstance(v, torch.Tensor):
            raise LaunchError(f"{where}: expected a torch tensor, found {type(v).__name__}")
        if v.dtype not in _TORCH[decl.dtype]:
            raise LaunchError(f"{where}: dtype {v.dtype}, expected {_TORCH[decl.dtype][0]}")
        if v.device.type != device_type:
            raise LaunchError(f"{where}: on {v.device}, expected a {device_type} tensor")
        if v.dim() != len(decl.shape):
            raise LaunchError(f"{where}: shape {list(v.shape)}, expected {len(decl.shape)} "
                              f"dims {list(decl.shape)}")
        for i, (d, n) in enumerate(zip(decl.shape, v.shape)):
            if isinstance(d, str):
                if extents.setdefault(d, n) != n:
                    raise LaunchError(f"{where}: dim {i} is {n}, but {d} = {extents[d]} "
                                      f"from an earlier argument")
                if n < 1:
                    raise LaunchError(f"{where}: dim {i} ({d}) is {n}, expected ≥ 1")
            elif d != n:
                raise LaunchError(f"{where}: shape {list(v.shape)}, expected "
                                  f"{list(decl.shape)}")
        if v.layout != torch.strided:
            raise LaunchError(f"{where}: a {v.layout} tensor, expected a dense (strided) one")
        if not v.is_contiguous():
            raise LaunchError(f"{where}: not contiguous (strides {v.stride()})")
        if v.is_neg() or v.is_conj():  # lazy views: memory holds the unnegated values
            raise LaunchError(f"{where}: a lazily negated or conjugated view; pass "
                              f"resolve_neg() / resolve_conj() of it")
        if v.data_ptr() % decl.align:
            raise LaunchError(f"{where}: data pointer {v.data_ptr():#x} is not "
                              f"{decl.align}-byte aligned")
    return extents


def _check_scalar(where: str, dtype: str, v: Any) -> None:
    """A scalar argument: an int (Python or numpy, not bool) in the field's range for i32/i64;
    a real number that fits a float32 (inf and nan pass as themselves) for f32."""
    if dtype in _INT_RANGE:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise LaunchError(f"{where}: expected an integer ({dtype}), found {_show(v)}")
        lo, hi = _INT_RANGE[dtype]
        if not lo <= int(v) <= hi:
            raise LaunchError(f"{where}: {_show(v)} does not fit {dtype} ({lo} to {hi})")
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise LaunchError(f"{where}: expected a real number ({dtype}), found {_show(v)}")
    try:
        x = float(v)
    except OverflowError:  # an int beyond any float
        x = math.inf
    if (math.isinf(x) and not isinstance(v, numbers.Integral)) or math.isnan(x):
        return  # inf and nan pass as themselves
    if abs(x) > _F32_MAX:
        raise LaunchError(f"{where}: {_show(v)} is beyond the float32 range (±{_F32_MAX:.4g})")


def _show(v: Any) -> str:
    """A value for an error message: its type, and a short repr where it has one."""
    if isinstance(v, (int, float, complex, str, numbers.Number)) or v is None:
        text = repr(v)
        return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    return type(v).__name__


def pack_args(params: Sequence[dict[str, Any]], values: Sequence[Any],
              name: str = "kernel") -> list[bytes]:
    """Each kernel parameter's bytes, laid out by the manifest's `params` (fields: name, type,
    offset): tensor data pointers, dynamic extents and strides, scalars by value. Raises
    LaunchError naming `name` and the argument for a value its field cannot hold (check_args
    refuses those first)."""
    out = []
    for p, v in zip(params, values):
        buf = bytearray(p["size"])
        for field, typ, off in p["fields"]:
            try:
                if field == "data":
                    x = v.data_ptr()
                elif field == "value":
                    x = float(v) if typ == "f32" else int(v)
                elif field.startswith("shape"):
                    x = v.shape[int(field[5:])]
                else:
                    x = v.stride(int(field[6:]))
                struct.pack_into("<" + _PACK[typ], buf, off, x)
            except (struct.error, OverflowError, ValueError) as e:
                raise LaunchError(f"{name}: argument {p['arg']}: {field} does not fit its "
                                  f"{typ} parameter field ({e})") from None
        out.append(bytes(buf))
    return out


DEFAULT_SMEM = 48 * 1024  # bytes of shared memory per CTA a kernel gets without opting in


def needs_smem_opt_in(dynamic: int, static: int) -> bool:
    """Whether a kernel asking for `dynamic` bytes of dynamic shared memory beside `static`
    bytes of its own (the cubin's `.nv.shared.<kernel>` section: 0 to 2 KB in ours) should
    raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first. moe_down at B = 32 asked for
    exactly 48 KB of dynamic beside 2 KB static and failed to launch with
    CUDA_ERROR_INVALID_VALUE on the H200 (2026-12-03); opting in whenever the two together pass
    48 KB is always valid, so the rule errs that way."""
    return dynamic + static > DEFAULT_SMEM


class Kernel:
    """One loaded specialisation. `launch(*args)` checks, packs and launches on the current
    stream. Host cost is a few tens of µs per launch in Python: it only matters at capture."""

    def __init__(self, kdef: KernelDef, spec: Spec, entry: CacheEntry):
        self.kdef, self.spec, self.meta = kdef, spec, entry.meta
        self.name = f"{spec.id}@{entry.meta['arch']}"
        self.args: list[TensorArg | ScalarArg] = list(kdef.args(spec))
        self.launch_shape = Launch.from_json(entry.meta["launch"])
        self.waits = bool(entry.meta["pdl_wait"])
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # cuModuleLoadData needs the primary context torch makes
        cu = _driver()
        self._module = _check(cu.cuModuleLoadData(entry.cubin), f"{self.name}: cuModuleLoadData")
        self._fn = _check(cu.cuModuleGetFunction(self._module, entry.meta["symbol"].encode()),
                          f"{self.name}: cuModuleGetFunction")
        smem = self.launch_shape.smem
        if needs_smem_opt_in(smem, entry.meta.get("static_smem", 0)):
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(cu.cuFuncSetAttribute(self._fn, attr, smem), f"{self.name}: set smem {smem}")

    def launch(self, *values: Any, pdl: bool | None = None,
               stream: torch.cuda.Stream | None = None) -> None:
        """Launch on `stream` (default: torch's current stream). pdl: None = on when the kernel
        waits on its predecessor; False = plain stream order (for comparison). Raises
        LaunchError for bad arguments, for pdl=True on a kernel without a wait, and for driver
        errors."""
        extents = check_args(self.name, self.args, values)
        if pdl and not self.waits:
            raise LaunchError(f"{self.name}: has no griddepcontrol.wait, so it cannot be "
                              f"launched with programmatic dependent launch")
        use_pdl = self.waits if pdl is None else pdl
        cu = _driver()
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.launch_shape.grid_for(extents)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.launch_shape.block
        cfg.sharedMemBytes = self.launch_shape.smem
        cfg.hStream = (stream or torch.cuda.current_stream()).cuda_stream
        attrs = []
        if use_pdl:
            a = cu.CUlaunchAttribute()
            a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        cfg.attrs, cfg.numAttrs = attrs, len(attrs)
        keep = [ctypes.create_string_buffer(b, len(b))
                for b in pack_args(self.meta["params"], values, self.name)]
        arr = (ctypes.c_void_p * len(keep))(*[ctypes.addressof(b) for b in keep])
        # The driver copies the parameters during the call, so `keep` may go right after.
        _check(cu.cuLaunchKernelEx(cfg, self._fn, ctypes.addressof(arr), 0),
               f"{self.name}: cuLaunchKernelEx")


class KernelSet:
    """Kernels loaded from one cache for one GPU: `get(name, **values)` -> Kernel (cached)."""

    def __init__(self, cache: KernelCache | None = None, arch: str | None = None,
                 kernels: Sequence[KernelDef] | None = None):
        self.cache = cache or KernelCache()
        self.arch = arch or device_arch()
        self.defs = {k.name: k for k in (kernels or registry())}
        self._loaded: dict[Spec, Kernel] = {}

    def get(self, name: str, **values: int) -> Kernel:
        """The loaded kernel `name` specialised to `values`. Raises LaunchError for an unknown
        kernel and KernelCacheError when the cache lacks a valid entry."""
        if name not in self.defs:
            raise LaunchError(f"unknown kernel {name!r}; known: {', '.join(sorted(self.defs))}")
        kdef = self.defs[name]
        spec = kdef.spec(**values)
        if spec not in self._loaded:
            self._loaded[spec] = Kernel(kdef, spec, self.cache.get(kdef, spec, self.arch))
        return self._loaded[spec]


@contextlib.contextmanager
def capture_graph(graph: torch.cuda.CUDAGraph, **kwargs: Any) -> Iterator[None]:
    """`torch.cuda.graph(graph, **kwargs)` with Python's cyclic garbage collector paused.

    torch collects garbage before a capture starts, but a collection triggered during the
    capture can free another object's CUDA graph (cudaGraphExecDestroy) or a tensor whose
    block waits on events, both illegal while a stream captures: the capture is invalidated
    and the next launch fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (seen on the H200,
    2026-12-02: prefill captures failing now and then after an earlier engine was dropped,
    with torch's warning "operation not permitted when stream is capturing (function
    reset)")."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        if enabled:
            gc.enable()

