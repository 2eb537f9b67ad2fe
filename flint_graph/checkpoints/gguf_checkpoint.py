"""NVFP4 GGUF checkpoints (DESIGN.md §2): write and load `FlintWeights` with gguf's GGUFWriter and
GGUFReader, repacking GGML type-40 blocks to NVIDIA's layout losslessly (`flint_graph.checkpoints.nvfp4`).

Tensor names follow llama.cpp: learned tensors end in `.weight`, the routing bias is
`exp_probs_b.bias`, and an NVFP4 tensor's FP32 second-level scale is the base name plus `.scale`
(`blk.3.ffn_gate_exps.weight` -> `blk.3.ffn_gate_exps.scale`, shape [1], or [E] per expert;
a file without any sidecar means scale2 = 1.0 everywhere; one with only some is refused).
Shapes are numpy order (outermost first); GGUF lists them reversed, e.g. `ffn_gate_exps` is
[E, M, H] here and [H, M, E] in the file's dims.

  token_embd.weight, output.weight    [V, H]      NVFP4 or BF16
  blk.i.attn_q / attn_k / attn_v      [Q|KV, H]   NVFP4 or BF16 (likewise every linear below)
  blk.i.attn_output                   [H, Q]
  blk.i.ffn_gate / ffn_up / ffn_down  [I, H] [I, H] [H, I]      dense layers (i < first_k_dense)
  blk.i.ffn_{gate,up}_exps            [E, M, H];  ffn_down_exps [E, H, M]
  blk.i.ffn_{gate,up}_shexp           [S*M, H];   ffn_down_shexp [H, S*M]   (S shared experts)
  blk.i.ffn_gate_inp.weight [E, H], blk.i.exp_probs_b.bias [E]   F32 (router)
  blk.i.attn_norm / ffn_norm [H], attn_q_norm / attn_k_norm [D], output_norm [H]   norms
  blk.i.attn_sinks.weight [num_heads]

Norms and sinks are written as F32 (llama.cpp's convention; exact for BF16 values) and read from
F32 or BF16 into the containers' dtypes: norms bf16, sinks/router/bias float32.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from flint_graph.checkpoints import nvfp4
from flint_graph.checkpoints.gguf_structure import check_gguf_structure
from flint_graph.checkpoints.config import GGUF_ARCH, FlintConfig
from flint_graph.errors import CheckpointError
from flint_graph.terminal.progress import progress_bar
from flint_graph.checkpoints.weights import (FiniteCheck, FlintWeights, LayerWeights, MLPWeights, MoEWeights,
                                 NVFP4Weight)

NVFP4, BF16, F32 = GGMLQuantizationType.NVFP4, GGMLQuantizationType.BF16, GGMLQuantizationType.F32
LINEAR, NORM, SINKS, FP32 = "linear", "norm", "sinks", "fp32"  # TensorSpec.kind
_ACCEPTED = {LINEAR: (NVFP4, BF16), NORM: (F32, BF16), SINKS: (F32, BF16), FP32: (F32,)}
_LOADED_DTYPE = {LINEAR: torch.bfloat16, NORM: torch.bfloat16, SINKS: torch.float32,
                 FP32: torch.float32}
# GGUF base name -> LayerWeights attribute, for the attention half and the norms.
_ATTN = {"attn_norm": "attn_norm", "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj",
         "attn_output": "o_proj", "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
         "attn_sinks": "sinks", "ffn_norm": "ffn_norm"}
_PROJ = ("gate", "up", "down")

# The largest scale2 whose largest weight, E2M1 6 · E4M3 448 · scale2, is finite in bf16.
MAX_SCALE2 = torch.finfo(torch.bfloat16).max / (nvfp4.E2M1_MAX * nvfp4.E4M3_MAX)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor the config implies: GGUF name, numpy-order shape, kind (LINEAR/NORM/...)."""

    name: str
    shape: tuple[int, ...]
    kind: str


def scale_name(name: str) -> str:
    """The `.scale` sidecar name of NVFP4 tensor `name` (`x.weight` -> `x.scale`)."""
    return name.removesuffix(".weight") + ".scale"


def tensor_specs(cfg: FlintConfig) -> list[TensorSpec]:
    """Every tensor of a Flint GGUF for `cfg`, in file order (sidecars not included)."""
    h, v, q, kv, d = cfg.hidden_size, cfg.vocab_size, cfg.q_dim, cfg.kv_dim, cfg.head_dim
    attn = {"attn_norm": ((h,), NORM), "attn_q": ((q, h), LINEAR), "attn_k": ((kv, h), LINEAR),
            "attn_v": ((kv, h), LINEAR), "attn_output": ((h, q), LINEAR),
            "attn_q_norm": ((d,), NORM), "attn_k_norm": ((d,), NORM),
            "attn_sinks": ((cfg.num_attention_heads,), SINKS), "ffn_norm": ((h,), NORM)}
    # q/k norms exist only with qk_norm, sinks only with attention_sinks (as in the BF16
    # layout): a file that has them under a config that says otherwise is refused, never
    # loaded and ignored
    if not cfg.qk_norm:
        del attn["attn_q_norm"], attn["attn_k_norm"]
    if not cfg.attention_sinks:
        del attn["attn_sinks"]
    out = [TensorSpec("token_embd.weight", (v, h), LINEAR)]
    for i in range(cfg.num_hidden_layers):
        p = f"blk.{i}."
        out += [TensorSpec(f"{p}{g}.weight", shape, kind) for g, (shape, kind) in attn.items()]
        if cfg.is_moe(i):
            e, m = cfg.n_routed_experts, cfg.moe_intermediate_size
            f = cfg.n_shared_experts * m
            out += [TensorSpec(f"{p}ffn_gate_inp.weight", (e, h), FP32),
                    TensorSpec(f"{p}exp_probs_b.bias", (e,), FP32)]
            out += [TensorSpec(f"{p}ffn_{x}_exps.weight", s, LINEAR)
                    for x, s in zip(_PROJ, ((e, m, h), (e, m, h), (e, h, m)))]
            if f:
                out += [TensorSpec(f"{p}ffn_{x}_shexp.weight", s, LINEAR)
                        for x, s in zip(_PROJ, ((f, h), (f, h), (h, f)))]
        else:
            n = cfg.intermediate_size
            out += [TensorSpec(f"{p}ffn_{x}.weight", s, LINEAR)
                    for x, s in zip(_PROJ, ((n, h), (n, h), (h, n)))]
    return out + [TensorSpec("output_norm.weight", (h,), NORM),
                  TensorSpec("output.weight", (v, h), LINEAR)]


def _flatten(w: FlintWeights) -> dict[str, Any]:
    """GGUF name -> tensor or NVFP4Weight (inverse of `_assemble`)."""
    d = {"token_embd.weight": w.embed, "output_norm.weight": w.final_norm,
         "output.weight": w.lm_head}
    for i, lw in enumerate(w.layers):
        p = f"blk.{i}."
        d.update({f"{p}{g}.weight": getattr(lw, a) for g, a in _ATTN.items()})
        f = lw.ffn
        if isinstance(f, MoEWeights):
            d[f"{p}ffn_gate_inp.weight"], d[f"{p}exp_probs_b.bias"] = f.router, f.router_bias
            d.update({f"{p}ffn_{x}_exps.weight": getattr(f, x) for x in _PROJ})
            if f.shared is not None:
                d.update({f"{p}ffn_{x}_shexp.weight": getattr(f.shared, x) for x in _PROJ})
        else:
            d.update({f"{p}ffn_{x}.weight": getattr(f, x) for x in _PROJ})
    return d


def _assemble(cfg: FlintConfig, t: dict[str, Any]) -> FlintWeights:
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"blk.{i}."
        if cfg.is_moe(i):
            shared = (MLPWeights(*(t[f"{p}ffn_{x}_shexp.weight"] for x in _PROJ))
                      if cfg.n_shared_experts else None)
            ffn = MoEWeights(t[f"{p}ffn_gate_inp.weight"], t[f"{p}exp_probs_b.bias"],
                             *(t[f"{p}ffn_{x}_exps.weight"] for x in _PROJ), shared)
        else:
            ffn = MLPWeights(*(t[f"{p}ffn_{x}.weight"] for x in _PROJ))
        attn = {a: t[f"{p}{g}.weight"] for g, a in _ATTN.items() if f"{p}{g}.weight" in t}
        dev = t["token_embd.weight"].device
        if not cfg.qk_norm:  # identity: the model skips the q/k norm when qk_norm is False
            attn["q_norm"] = attn["k_norm"] = torch.ones(cfg.head_dim, dtype=torch.bfloat16,
                                                         device=dev)
        if not cfg.attention_sinks:  # e^-inf = 0: a sink column that contributes nothing
            attn["sinks"] = torch.full((cfg.num_attention_heads,), -torch.inf, device=dev)
        layers.append(LayerWeights(**attn, ffn=ffn))
    return FlintWeights(t["token_embd.weight"], layers, t["output_norm.weight"],
                        t["output.weight"])


# -- writing ----------------------------------------------------------------------------------

def _write_plan(cfg: FlintConfig, weights: FlintWeights, write_scales: bool) -> list[tuple]:
    """[(name, byte-or-element shape, numpy dtype, raw GGML type | None, nbytes, producer)]."""
    objs, specs = _flatten(weights), tensor_specs(cfg)
    names = {s.name for s in specs}
    optional = ("attn_q_norm.weight", "attn_k_norm.weight", "attn_sinks.weight")
    objs = {k: v for k, v in objs.items() if k in names or not k.endswith(optional)}
    if set(objs) != names:
        odd = sorted(set(objs) ^ names)[:8]
        raise CheckpointError(f"weights do not match the config's layer structure (tensors "
                              f"{', '.join(odd)} are missing on one side)")
    plan = []
    for s in specs:
        obj = objs[s.name]
        if tuple(obj.shape) != s.shape:
            raise CheckpointError(f"tensor {s.name!r}: shape {list(obj.shape)}; expected "
                                  f"{list(s.shape)}")
        plan += _entries(s, obj, write_scales)
    return plan


def _entries(s: TensorSpec, obj: Any, write_scales: bool) -> list[tuple]:
    """The write-plan entries of one tensor (two for NVFP4 with its `.scale` sidecar)."""
    if isinstance(obj, NVFP4Weight) and s.kind == LINEAR:
        n = obj.scale2.numel()
        if obj.scale2.dim() > 1 or n not in (1, s.shape[0] if len(s.shape) == 3 else 1):
            raise CheckpointError(f"tensor {s.name!r}: scale2 has shape "
                                  f"{list(obj.scale2.shape)}; expected [] or [E] for a stack")
        byte_shape = (*s.shape[:-1], s.shape[-1] // nvfp4.GGML_BLOCK * nvfp4.GGML_BLOCK_BYTES)
        out = [(s.name, byte_shape, np.uint8, NVFP4, int(np.prod(byte_shape)),
                lambda: nvfp4.to_ggml_blocks(obj.codes, obj.scales).cpu().numpy())]
        if write_scales:
            out.append((scale_name(s.name), (n,), np.float32, None, 4 * n,
                        lambda: obj.scale2.detach().float().reshape(-1).cpu().numpy()))
        return out
    if s.kind == LINEAR and isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16:
        byte_shape = (*s.shape[:-1], 2 * s.shape[-1])  # BF16 travels as raw bytes
        return [(s.name, byte_shape, np.uint8, BF16, 2 * obj.numel(),
                 lambda: obj.detach().contiguous().view(torch.uint8).cpu().numpy())]
    if s.kind != LINEAR and isinstance(obj, torch.Tensor) and obj.is_floating_point():
        return [(s.name, s.shape, np.float32, None, 4 * obj.numel(),
                 lambda: obj.detach().float().contiguous().cpu().numpy())]
    found = obj.dtype if isinstance(obj, torch.Tensor) else type(obj).__name__
    want = "NVFP4Weight or a bfloat16 tensor" if s.kind == LINEAR else "a float tensor"
    raise CheckpointError(f"tensor {s.name!r}: found {found}; expected {want}")


def write_gguf(path: str | Path, cfg: FlintConfig, weights: FlintWeights, progress: bool = True,
               write_scales: bool = True) -> None:
    """Write `weights` as a Flint NVFP4 GGUF, streaming one tensor at a time.

    NVFP4Weight linears become GGML type 40 plus an F32 `.scale` sidecar ([1], or [E] for a
    per-expert stack) unless `write_scales` is False; BF16 linears become BF16; norms, sinks,
    router and bias become F32. Metadata: general.architecture = "flint" and
    `cfg.gguf_metadata()`. Header and tensor infos go first, then each tensor's data, copied to
    the host one at a time, so host RAM never holds a second copy of the model.

    Raises CheckpointError naming the tensor when `weights` does not fit `cfg` (shape, kind or
    layer structure). A partial file is removed when writing fails.
    """
    path = Path(path)
    plan = _write_plan(cfg, weights, write_scales)
    writer = GGUFWriter(path, GGUF_ARCH)
    for key, value in cfg.gguf_metadata().items():
        add = {bool: writer.add_bool, int: writer.add_uint32, float: writer.add_float32,
               list: writer.add_array}[type(value)]
        add(key, value)
    for name, shape, np_dtype, raw, nbytes, _ in plan:
        writer.add_tensor_info(name, shape, np.dtype(np_dtype), nbytes, raw_dtype=raw)
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with progress_bar(progress, f"writing {path.name}", sum(p[4] for p in plan)) as advance:
            for *_, nbytes, produce in plan:
                writer.write_tensor_data(produce())
                advance(nbytes)
        writer.close()
    except BaseException:
        writer.close()
        path.unlink(missing_ok=True)
        raise


# -- reading ----------------------------------------------------------------------------------

def _open(path: str | Path) -> tuple[Path, GGUFReader]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file not found")
    check_gguf_structure(path)  # bounds, UTF-8, alignment, overlaps: before the reader trusts it
    try:
        # Copy-on-write mapping: tensors view the file without a host copy and stay writable.
        return path, GGUFReader(path, "c")
    except Exception as e:  # any parse failure means the file is unusable; say why
        raise CheckpointError(f"{path}: not a readable GGUF file (truncated or corrupt?): "
                              f"{type(e).__name__}: {e}") from None


def _metadata(reader: GGUFReader) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All key/value metadata of the GGUF at `path` (key -> Python value; arrays as lists).

    Raises CheckpointError naming the path when it is missing, truncated or corrupt.
    """
    return _metadata(_open(path)[1])


def _np_shape(t) -> tuple[int, ...]:
    return tuple(int(x) for x in reversed(t.shape.tolist()))


def _check(path: Path, s: TensorSpec, t, found: dict) -> Any:
    """Refuse a wrong type or shape of tensor `t` (spec `s`); return its `.scale` or None."""
    kind = GGMLQuantizationType(t.tensor_type)
    if kind not in _ACCEPTED[s.kind]:
        raise CheckpointError(f"{path}: tensor {s.name!r} has type {kind.name}; expected "
                              f"{' or '.join(k.name for k in _ACCEPTED[s.kind])}")
    if _np_shape(t) != s.shape:
        raise CheckpointError(f"{path}: tensor {s.name!r} has shape {list(_np_shape(t))}; "
                              f"expected {list(s.shape)} (numpy order, outermost first)")
    side = found.get(scale_name(s.name)) if kind == NVFP4 else None
    if side is not None:
        ok = [(1,)] if len(s.shape) == 2 else [(1,), (s.shape[0],)]
        if side.tensor_type != F32 or _np_shape(side) not in ok:
            raise CheckpointError(
                f"{path}: tensor {side.name!r} has type "
                f"{GGMLQuantizationType(side.tensor_type).name} and shape "
                f"{list(_np_shape(side))}; expected F32 of shape "
                f"{' or '.join(str(list(o)) for o in ok)}")
        if not (np.isfinite(side.data).all() and (side.data > 0).all()):
            raise CheckpointError(f"{path}: tensor {side.name!r} holds a scale2 that is not a "
                                  "positive finite number")
        if (side.data > MAX_SCALE2).any():  # finite, yet every weight would dequantise to inf
            raise CheckpointError(
                f"{path}: tensor {side.name!r} holds a scale2 of {float(side.data.max()):.3g}; "
                f"expected at most {MAX_SCALE2:.3g}, so that the largest NVFP4 weight "
                f"(6 · 448 · scale2) stays finite in bf16")
    return side


def _validate(cfg: FlintConfig, reader: GGUFReader, path: Path) -> list[tuple]:
    """Check every tensor's presence, type and shape; return [(spec, tensor, sidecar | None)]."""
    found = {t.name: t for t in reader.tensors}
    plan, missing = [], []
    for s in tensor_specs(cfg):
        if s.name in found:
            plan.append((s, found[s.name], _check(path, s, found[s.name], found)))
        else:
            missing.append(s.name)
    used = {t.name for _, t, _ in plan} | {side.name for *_, side in plan if side is not None}
    extra = [n for n in found if n not in used]
    if missing:
        raise CheckpointError(f"{path}: missing tensors for this config: {_few(missing)}")
    if extra:
        # A `.scale` left over here names no tensor, or a tensor that is not NVFP4.
        why = (" (a .scale sidecar belongs only to an NVFP4 tensor of the same base name)"
               if all(n.endswith(".scale") for n in extra) else "")
        raise CheckpointError(f"{path}: unexpected tensors for this config: {_few(extra)}{why}")
    # scale2 is all or nothing. A file with no sidecars means 1.0 throughout (DESIGN §2); one
    # with some lacks the others by damage or a faulty conversion, and taking 1.0 for them
    # would silently rescale those tensors (by 4,096 where the lost scale was 2^-12).
    quantized = [(t, side) for _, t, side in plan if t.tensor_type == NVFP4]
    lacking = [scale_name(t.name) for t, side in quantized if side is None]
    if lacking and len(lacking) < len(quantized):
        raise CheckpointError(
            f"{path}: {len(lacking)} of {len(quantized)} NVFP4 tensors lack their scale2 "
            f"sidecar while the others have one; missing: {_few(lacking)} (a file carries "
            ".scale for every NVFP4 tensor, or for none when all scale2 are 1.0)")
    return plan


def _few(names: list[str], limit: int = 8) -> str:
    """`names` joined for a message: the first `limit`, then how many more."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _synced_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _load_one(spec: TensorSpec, t, side, device: torch.device,
              timings: dict[str, float] | None = None) -> torch.Tensor | NVFP4Weight:
    host = torch.from_numpy(t.data)
    if t.tensor_type == NVFP4:
        # Permute on the device; copy=True so a CPU result never aliases the file mapping.
        blocks = host.to(device, copy=True)
        t0 = _synced_clock(device)
        codes, scales = nvfp4.from_ggml_blocks(blocks)
        if timings is not None:
            timings["repack_s"] = timings.get("repack_s", 0.0) + _synced_clock(device) - t0
        if side is None:
            scale2 = torch.ones((), dtype=torch.float32)
        else:
            scale2 = torch.from_numpy(np.array(side.data, dtype=np.float32))
            scale2 = scale2.reshape(()) if side.data.size == 1 else scale2.reshape(-1)
        return NVFP4Weight(codes, scales, scale2.to(device))
    if t.tensor_type == BF16:
        host = host.view(torch.bfloat16)  # uint8 [..., 2K] -> bf16 [..., K]
    return host.to(device=device, dtype=_LOADED_DTYPE[spec.kind], copy=True)


def load_gguf(path: str | Path, cfg: FlintConfig, device: torch.device | str,
              progress: bool = True, timings: dict[str, float] | None = None) -> FlintWeights:
    """Load a Flint NVFP4 GGUF into `FlintWeights` on `device`.

    Everything is validated before any tensor goes to the device: the file (exists, parses),
    general.architecture == "flint", `cfg.check_gguf_metadata`, and every expected tensor's
    presence, type and shape, with no unexpected tensors, and every `.scale` sidecar (F32, [1] or
    [E], positive, finite, at most MAX_SCALE2). NVFP4 blocks are then repacked into NVIDIA's
    layout on `device` (codes uint8 [..., N, K/2], scales uint8 [..., N, K/16]). A file with no `.scale` sidecar at
    all gives scale2 = 1.0 everywhere; one where some NVFP4 tensors have a sidecar and others do
    not is refused, naming the missing sidecars. BF16 linears stay bf16; norms load as bf16;
    sinks, router and bias as float32.

    Raises CheckpointError naming the path and tensor (expected vs found, or NaN/infinite values
    in a BF16/F32 tensor) or ConfigError naming the metadata key. When loading fails part
    way, nothing it allocated stays on the device.
    `timings`, when given, gets "repack_s": seconds spent permuting NVFP4 blocks (the device
    synchronised around each, so the figure is the repack's own; the rest of the load is the
    file read and the copy to the device).
    """
    path, reader = _open(path)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch != GGUF_ARCH:
        raise CheckpointError(f"{path}: unknown architecture {arch!r} in general.architecture; "
                              f"expected {GGUF_ARCH!r}")
    cfg.check_gguf_metadata(meta, str(path))
    plan = _validate(cfg, reader, path)
    device = torch.device(device)
    loaded: dict[str, Any] = {}
    finite = FiniteCheck()
    try:
        total = sum(t.n_bytes for _, t, _ in plan)
        with progress_bar(progress, f"loading {path.name}", total) as advance:
            for spec, t, side in plan:
                loaded[spec.name] = _load_one(spec, t, side, device, timings)
                if isinstance(loaded[spec.name], torch.Tensor):
                    finite.add(spec.name, loaded[spec.name])
                else:
                    finite.add_nvfp4(spec.name, loaded[spec.name])
                advance(t.n_bytes)
        finite.raise_if_any(path)
        return _assemble(cfg, loaded)
    except BaseException:
        loaded.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise
