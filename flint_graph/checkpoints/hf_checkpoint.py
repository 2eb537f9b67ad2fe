"""BF16 checkpoints in the HF layout: sharded safetensors named as GLM-4.5 names them (DESIGN §2).

`write_safetensors` writes `model-0000X-of-0000N.safetensors` shards plus
`model.safetensors.index.json`; `load_safetensors` validates every shard header against the
config (names, shapes, dtypes) before anything reaches the device, then reads tensor by tensor
through safetensors' memory map straight onto the device, stacking routed experts there.

Shape legend: V vocab, H hidden, Q = heads*head_dim, KV = kv_heads*head_dim, D head_dim,
I dense intermediate, M expert intermediate, S = n_shared_experts*M, E routed experts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.jsonfile import loads
from flint_graph.paths import name_problem, why_not_a_file
from flint_graph.errors import CheckpointError, shown
from flint_graph.terminal.progress import progress_bar
from flint_graph.checkpoints.weights import (FiniteCheck, FlintWeights, LayerWeights, MLPWeights, MoEWeights,
                                 NVFP4Weight, expert_weight)

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # HF's default shard size
_TORCH_DTYPE = {"BF16": torch.bfloat16, "F32": torch.float32}
_MAX_HEADER_BYTES = 100 * 1024**2  # safetensors itself refuses headers above 100 MB


@dataclass(frozen=True)
class TensorSpec:
    """What config.json implies for one stored tensor.

    shape: expected shape; dtype: safetensors dtype we write ("BF16" | "F32"); accepted: dtypes
    the loader takes (F32 parameters may arrive as BF16 and are widened exactly); implied_by:
    the config fields behind each dimension, e.g. "[hidden_size = 64]".
    """

    shape: tuple[int, ...]
    dtype: str
    accepted: tuple[str, ...]
    implied_by: str


def _spec(dtype: str, *dims: tuple[str, int]) -> TensorSpec:
    accepted = ("F32", "BF16") if dtype == "F32" else ("BF16",)
    return TensorSpec(tuple(n for _, n in dims), dtype, accepted,
                      "[" + ", ".join(f"{f} = {n}" for f, n in dims) + "]")


def expected_tensors(cfg: FlintConfig) -> dict[str, TensorSpec]:
    """Every tensor a BF16 checkpoint of `cfg` holds, in file order, name -> TensorSpec.

    Router weight, its e_score_correction_bias and the sinks are F32; all else BF16. q/k norms
    exist only with `qk_norm`, sinks only with `attention_sinks`, shared experts only with
    n_shared_experts > 0 (as in HF GLM-4.5, one tensor per routed expert).
    """
    h, v, d = ("hidden_size", cfg.hidden_size), ("vocab_size", cfg.vocab_size), \
        ("head_dim", cfg.head_dim)
    q = ("num_attention_heads * head_dim", cfg.q_dim)
    kv = ("num_key_value_heads * head_dim", cfg.kv_dim)
    out = {"model.embed_tokens.weight": _spec("BF16", v, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = _spec("BF16", h)
        for name, dims in (("q_proj", (q, h)), ("k_proj", (kv, h)), ("v_proj", (kv, h)),
                           ("o_proj", (h, q))):
            out[f"{p}self_attn.{name}.weight"] = _spec("BF16", *dims)
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = _spec("BF16", d)
            out[p + "self_attn.k_norm.weight"] = _spec("BF16", d)
        if cfg.attention_sinks:
            out[p + "self_attn.sinks"] = _spec("F32", ("num_attention_heads",
                                                       cfg.num_attention_heads))
        out[p + "post_attention_layernorm.weight"] = _spec("BF16", h)
        if not cfg.is_moe(i):
            out.update(_mlp_specs(p + "mlp.", ("intermediate_size", cfg.intermediate_size), h))
            continue
        e = ("n_routed_experts", cfg.n_routed_experts)
        out[p + "mlp.gate.weight"] = _spec("F32", e, h)
        out[p + "mlp.gate.e_score_correction_bias"] = _spec("F32", e)
        for j in range(cfg.n_routed_experts):
            out.update(_mlp_specs(f"{p}mlp.experts.{j}.",
                                  ("moe_intermediate_size", cfg.moe_intermediate_size), h))
        if cfg.n_shared_experts > 0:
            s = ("n_shared_experts * moe_intermediate_size",
                 cfg.n_shared_experts * cfg.moe_intermediate_size)
            out.update(_mlp_specs(p + "mlp.shared_experts.", s, h))
    out["model.norm.weight"] = _spec("BF16", h)
    out["lm_head.weight"] = _spec("BF16", v, h)
    return out


def _mlp_specs(prefix: str, f: tuple[str, int], h: tuple[str, int]) -> dict[str, TensorSpec]:
    return {prefix + "gate_proj.weight": _spec("BF16", f, h),
            prefix + "up_proj.weight": _spec("BF16", f, h),
            prefix + "down_proj.weight": _spec("BF16", h, f)}


# -- writing ---------------------------------------------------------------------------------

# HF suffix -> LayerWeights attribute, for the per-layer tensors outside the FFN
_ATTN_NAMES = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "q_proj",
               "self_attn.k_proj.weight": "k_proj", "self_attn.v_proj.weight": "v_proj",
               "self_attn.o_proj.weight": "o_proj", "self_attn.q_norm.weight": "q_norm",
               "self_attn.k_norm.weight": "k_norm", "self_attn.sinks": "sinks",
               "post_attention_layernorm.weight": "ffn_norm"}
_PARTS = ("gate", "up", "down")


def _plain(t: torch.Tensor | NVFP4Weight) -> torch.Tensor:
    return t.dequantize(torch.bfloat16) if isinstance(t, NVFP4Weight) else t


def _weight_getters(cfg: FlintConfig, w: FlintWeights) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a function returning that tensor (NVFP4 linears dequantised, expert slices cut)."""
    get: dict[str, Callable[[], torch.Tensor]] = {
        "model.embed_tokens.weight": lambda: _plain(w.embed),
        "model.norm.weight": lambda: w.final_norm, "lm_head.weight": lambda: _plain(w.lm_head)}
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}."
        for suffix, attr in _ATTN_NAMES.items():
            get[p + suffix] = lambda t=getattr(lw, attr): _plain(t)
        ffn = lw.ffn
        mlps = {p + "mlp.": ffn} if isinstance(ffn, MLPWeights) else {
            p + "mlp.shared_experts.": ffn.shared}
        for prefix, m in mlps.items():
            for part in _PARTS if m is not None else ():
                get[f"{prefix}{part}_proj.weight"] = lambda t=getattr(m, part): _plain(t)
        if isinstance(ffn, MoEWeights):
            get[p + "mlp.gate.weight"] = lambda t=ffn.router: t
            get[p + "mlp.gate.e_score_correction_bias"] = lambda t=ffn.router_bias: t
            for e, part in itertools.product(range(cfg.n_routed_experts), _PARTS):
                get[f"{p}mlp.experts.{e}.{part}_proj.weight"] = (
                    lambda t=getattr(ffn, part), e=e: _plain(expert_weight(t, e)))
    return get


def _spec_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * _TORCH_DTYPE[spec.dtype].itemsize


def _plan_shards(specs: dict[str, TensorSpec], max_shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, spec in specs.items():
        n = _spec_bytes(spec)
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_safetensors(out_dir: str | Path, cfg: FlintConfig, weights: FlintWeights,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                      progress: bool = True) -> list[Path]:
    """Write `weights` as HF-layout BF16 shards plus model.safetensors.index.json into out_dir.

    NVFP4 linears in `weights` are dequantised to BF16 (exact for power-of-two scale2). Tensors
    may live on any device; each shard is gathered on the host, written, then freed, so host
    memory stays near one shard. The index is written last. Returns the shard paths.
    Raises CheckpointError naming the tensor when `weights` disagree with `cfg`'s shapes.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = expected_tensors(cfg)
    getters = _weight_getters(cfg, weights)
    plan = _plan_shards(specs, max_shard_bytes)
    total = sum(_spec_bytes(s) for s in specs.values())
    weight_map, paths = {}, []
    with progress_bar(progress, "writing safetensors", total) as advance:
        for k, names in enumerate(plan):
            fname = f"model-{k + 1:05d}-of-{len(plan):05d}.safetensors"
            shard = {}
            for name in names:
                spec = specs[name]
                t = getters[name]().detach()
                if tuple(t.shape) != spec.shape:
                    raise CheckpointError(f"weights for {name} have shape {list(t.shape)}; "
                                          f"config implies {list(spec.shape)} {spec.implied_by}")
                # clone: expert slices share their stack's storage, which save_file refuses
                shard[name] = t.to("cpu", _TORCH_DTYPE[spec.dtype]).clone()
                weight_map[name] = fname
                advance(_spec_bytes(spec))
            save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
            (out_dir / fname).chmod(0o644)  # safetensors creates files owner-only (0600)
            paths.append(out_dir / fname)
            del shard
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return paths


# -- reading ---------------------------------------------------------------------------------

def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from one safetensors file's header, without reading tensor data.

    Raises CheckpointError naming `path` when it is not a safetensors file or is truncated
    (the header promises more data bytes than the file holds).
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(_MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path}: not a safetensors file (bad header length)")
        try:
            raw = loads(f.read(n))
        except ValueError as e:  # JSON, UTF-8 or nesting
            raise CheckpointError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a safetensors file (the header is a "
                              f"{type(raw).__name__}, expected a JSON object)")
    meta = raw.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: header __metadata__: expected an object of strings")
    out, spans = {}, []
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        dtype, shape, offs = _header_entry(path, name, entry)
        out[name] = (dtype, shape)
        spans.append((offs[0], offs[1], name))
    data = size - 8 - n
    spans.sort()
    at, last = 0, None
    for begin, end, name in spans:
        if begin < at:
            raise CheckpointError(f"{path}: tensor {_short(name)}'s data (bytes {begin}…{end}) "
                                  f"overlaps {_short(last)}'s")
        at, last = end, name
    if at > data:
        raise CheckpointError(f"{path}: truncated; the header describes {8 + n + at} bytes, "
                              f"the file holds {size}")
    if at < data:
        raise CheckpointError(f"{path}: {data - at} bytes after the last tensor's data (the "
                              "format has none: a corrupt or concatenated file)")
    return out


# bytes per element of the safetensors dtypes a checkpoint may hold
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _short(name: Any, limit: int = 60) -> str:
    text = str(name)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _header_entry(path: Path, name: str, entry: Any) -> tuple[str, tuple[int, ...],
                                                              tuple[int, int]]:
    """(dtype, shape, (begin, end)) of one safetensors header entry, each field checked:
    CheckpointError naming the file and the tensor otherwise."""
    where = f"{path}: header entry {_short(name)}"

    def is_count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: expected an object, found {type(entry).__name__}")
    dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES:
        raise CheckpointError(f"{where}: dtype {_short(dtype)} is not a safetensors dtype")
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise CheckpointError(f"{where}: shape {_short(shape)}: expected a list of integers "
                              ">= 0")
    if not (isinstance(offs, list) and len(offs) == 2 and all(is_count(o) for o in offs)
            and offs[0] <= offs[1]):
        raise CheckpointError(f"{where}: data_offsets {_short(offs)}: expected [begin, end] "
                              "with 0 <= begin <= end")
    count = 1
    for d in shape:
        count *= d
    if offs[1] - offs[0] != count * _DTYPE_BYTES[dtype]:
        raise CheckpointError(f"{where}: data_offsets span {offs[1] - offs[0]} bytes; its "
                              f"{dtype} shape {shape} needs {count * _DTYPE_BYTES[dtype]}")
    return dtype, tuple(shape), (offs[0], offs[1])


def _shard_map(model_dir: Path) -> dict[str, Path]:
    """name -> shard path from the index (or the single model.safetensors); checks shards exist."""
    index = model_dir / INDEX_NAME
    if not index.is_file():
        single = model_dir / SINGLE_NAME
        if not single.is_file():
            raise CheckpointError(f"{model_dir}: no {INDEX_NAME} and no {SINGLE_NAME}; "
                                  "not a BF16 safetensors checkpoint directory")
        return {name: single for name in read_safetensors_header(single)}
    try:
        # "utf-8-sig": a byte-order mark is no part of the JSON, as for the other JSON files
        # (it was "Unexpected UTF-8 BOM (decode using utf-8-sig)": a bad-input trial)
        weight_map = loads(index.read_text(encoding="utf-8-sig"))["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError(f"weight_map is {type(weight_map).__name__}, not an object")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("weight_map maps every tensor name to a shard file name")
        assignments = {k: model_dir / v for k, v in weight_map.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index}: malformed index ({type(e).__name__}: {e}); expected "
                              "JSON with a 'weight_map' object") from None
    for name, fname in weight_map.items():
        # shards are files beside the index (as the Hub's sharded checkpoints are): a path
        # elsewhere (`/etc/…`, `../../…`) had the loader open any file on the machine (a
        # bad-input trial, 2026-12-06)
        if fname in ("", ".", "..") or Path(fname).name != fname or "\\" in fname:
            raise CheckpointError(f"{index}: tensor {name!r} maps to {fname!r}; expected the "
                                  "file name of a shard in the same directory")
        problem = name_problem(model_dir / fname)  # a NUL in it: "internal error: ValueError"
        if problem:
            raise CheckpointError(f"{index}: tensor {shown(name, 60)} maps to "
                                  f"{shown(fname, 60)}: {problem}")
    for name, shard in assignments.items():
        if not shard.is_file():
            raise CheckpointError(f"{shard}: shard listed in {index} (for tensor {name}): "
                                  f"{why_not_a_file(shard)}")
    return assignments


def _validate(model_dir: Path, shards: dict[str, Path], specs: dict[str, TensorSpec]) -> None:
    headers = {p: read_safetensors_header(p) for p in sorted(set(shards.values()))}
    for name, spec in specs.items():
        if name not in shards:
            continue
        found = headers[shards[name]].get(name)
        if found is None:
            raise CheckpointError(f"{shards[name]}: does not hold tensor {name}, which "
                                  f"{INDEX_NAME} maps to it")
        dtype, shape = found
        if shape != spec.shape:
            raise CheckpointError(
                f"{shards[name]}: tensor {name} has shape {list(shape)}, but config.json "
                f"implies {list(spec.shape)} from {spec.implied_by}: config inconsistent with "
                "tensors")
        if dtype not in spec.accepted:
            raise CheckpointError(f"{shards[name]}: tensor {name} has dtype {dtype}; expected "
                                  f"{' or '.join(spec.accepted)}")
    hint = ("(config.json fields num_hidden_layers, first_k_dense_replace, n_routed_experts, "
            "n_shared_experts, qk_norm and attention_sinks decide which tensors exist)")
    missing = [n for n in specs if n not in shards]
    if missing:
        raise CheckpointError(f"{model_dir}: {len(missing)} expected tensor(s) missing: "
                              f"{', '.join(missing[:4])}{' ...' * (len(missing) > 4)} {hint}")
    unexpected = sorted(n for n in shards if n not in specs)
    if unexpected:
        raise CheckpointError(f"{model_dir}: {len(unexpected)} unexpected tensor(s): "
                              f"{', '.join(unexpected[:4])}{' ...' * (len(unexpected) > 4)} "
                              f"{hint}")


def load_safetensors(model_dir: str | Path, cfg: FlintConfig,
                     device: torch.device | str = "cpu", progress: bool = True) -> FlintWeights:
    """Load a BF16 HF-layout checkpoint of `cfg` onto `device` as FlintWeights.

    Validates first (nothing reaches the device before): the index (or a single
    model.safetensors), that every listed shard exists, and every expected tensor's presence,
    shape and dtype against `cfg`, refusing unexpected tensors. Then reads through safetensors'
    memory map (`safe_open(framework="pt", device=...)`) tensor by tensor onto `device` (copied,
    so nothing keeps the files mapped once it returns); routed
    experts are copied into stacks allocated there (gate/up [E, M, H], down [E, H, M]).
    Linears, norms, embeddings come back BF16; router [E, H], router_bias [E], sinks [heads] F32.
    Without `qk_norm` the q/k norms are ones [D]; without `attention_sinks` sinks are -inf.
    Raises CheckpointError naming the path/tensor, expected and found, and for NaN or infinite
    values in any floating tensor (`weights.FiniteCheck`).
    """
    model_dir, dev = Path(model_dir), torch.device(device)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    specs = expected_tensors(cfg)
    shards = _shard_map(model_dir)
    _validate(model_dir, shards, specs)
    total = sum(_spec_bytes(s) for s in specs.values())
    with contextlib.ExitStack() as stack, progress_bar(progress, "loading safetensors",
                                                       total) as advance:
        files = {p: stack.enter_context(safe_open(str(p), framework="pt", device=str(dev)))
                 for p in sorted(set(shards.values()))}

        finite = FiniteCheck()

        def get(name: str) -> torch.Tensor:
            spec = specs[name]
            # copied on the CPU: a tensor of the shard's memory map would read a file changed
            # or truncated while it runs (the weights switched unchecked, or SIGBUS killed
            # `serve`: a bad-input trial, 2026-12-06); on a GPU .to() copies anyway
            t = files[shards[name]].get_tensor(name).to(dev, _TORCH_DTYPE[spec.dtype],
                                                        copy=dev.type == "cpu")
            finite.add(name, t)
            advance(_spec_bytes(spec))
            return t

        layers = [_load_layer(cfg, i, get, dev, specs) for i in range(cfg.num_hidden_layers)]
        weights = FlintWeights(embed=get("model.embed_tokens.weight"), layers=layers,
                               final_norm=get("model.norm.weight"),
                               lm_head=get("lm_head.weight"))
    finite.raise_if_any(model_dir, shards.__getitem__)
    return weights


def _load_layer(cfg: FlintConfig, i: int, get: Callable[[str], torch.Tensor],
                dev: torch.device, specs: dict[str, TensorSpec]) -> LayerWeights:
    p = f"model.layers.{i}."
    attn = {attr: get(p + sfx) for sfx, attr in _ATTN_NAMES.items() if p + sfx in specs}
    if not cfg.qk_norm:  # identity weights; the model skips q/k norm when cfg.qk_norm is False
        attn["q_norm"] = attn["k_norm"] = torch.ones(cfg.head_dim, dtype=torch.bfloat16,
                                                     device=dev)
    if not cfg.attention_sinks:  # e^-inf = 0: a sink column that contributes nothing
        attn["sinks"] = torch.full((cfg.num_attention_heads,), -torch.inf, device=dev)
    if not cfg.is_moe(i):
        return LayerWeights(**attn, ffn=MLPWeights(*(get(f"{p}mlp.{x}_proj.weight")
                                                     for x in _PARTS)))
    e, m, h = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    stacks: dict[str, torch.Tensor] = {}
    for part, shape in zip(_PARTS, ((e, m, h), (e, m, h), (e, h, m))):
        stacks[part] = torch.empty(shape, dtype=torch.bfloat16, device=dev)
        for j in range(e):
            stacks[part][j].copy_(get(f"{p}mlp.experts.{j}.{part}_proj.weight"))
    shared = (MLPWeights(*(get(f"{p}mlp.shared_experts.{x}_proj.weight") for x in _PARTS))
              if cfg.n_shared_experts > 0 else None)
    return LayerWeights(**attn, ffn=MoEWeights(
        router=get(p + "mlp.gate.weight"), router_bias=get(p + "mlp.gate.e_score_correction_bias"),
        shared=shared, **stacks))
