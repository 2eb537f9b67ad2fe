"""In-memory weights of one Flint model, whichever checkpoint format they came from.

Both loaders (`hf_checkpoint.py` for BF16 safetensors, `gguf_checkpoint.py` for the NVFP4 GGUF)
fill these containers; the reference model and, later, the engine read them. A linear weight is
either a BF16 tensor [N, K] (HF orientation: out x in) or an `NVFP4Weight` in NVIDIA's packed
layout (DESIGN §2). Expert stacks carry a leading expert dimension E.

Shape legend: V vocab, H hidden, Q = heads*head_dim, KV = kv_heads*head_dim, D head_dim,
I dense intermediate, M expert intermediate, E routed experts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch

from flint_graph.checkpoints import nvfp4


@dataclass
class NVFP4Weight:
    """A weight-only NVFP4 tensor in NVIDIA's layout (ModelOpt / CUTLASS order).

    codes:  uint8 [..., N, K/2]   element 2i in the low nibble, 2i+1 in the high nibble (E2M1).
    scales: uint8 [..., N, K/16]  raw unsigned-E4M3 bytes, one per 16 consecutive K elements;
            kept as bytes (not float8) so a GGUF's bytes survive bit for bit (DESIGN §2).
    scale2: float32 [] per tensor, or [E] per expert for stacks with a leading E dimension.
    Value = e2m1(code) * e4m3(scale byte) * scale2.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    scale2: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (dequantised) shape [..., N, K]."""
        return (*self.codes.shape[:-1], self.codes.shape[-1] * 2)

    @property
    def device(self) -> torch.device:
        """Device of the packed tensors."""
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """Bytes held: codes + scale bytes + scale2 (what a W4A16 GEMV reads)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.scale2))

    def expert(self, e: int) -> NVFP4Weight:
        """The 2-D weight of expert `e` from a stack [E, N, K/2] (scale2 [E] or [])."""
        s2 = self.scale2[e] if self.scale2.dim() == 1 else self.scale2
        return NVFP4Weight(self.codes[e], self.scales[e], s2)

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Dense [..., N, K] tensor of `dtype` (exact in fp32; BF16 holds every NVFP4 value
        exactly when scale2 is a power of two)."""
        return nvfp4.dequantize(self.codes, self.scales, self.scale2, dtype)

    def to(self, device: torch.device | str) -> NVFP4Weight:
        """The same packed weight on `device` (bytes unchanged)."""
        return NVFP4Weight(self.codes.to(device), self.scales.to(device), self.scale2.to(device))


Linear = torch.Tensor | NVFP4Weight


def dense(w: Linear, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """`w` as a dense tensor of `dtype` (dequantising NVFP4)."""
    return w.dequantize(dtype) if isinstance(w, NVFP4Weight) else w.to(dtype)


def expert_weight(w: Linear, e: int) -> Linear:
    """Expert `e`'s slice of an expert stack, BF16 or NVFP4."""
    return w.expert(e) if isinstance(w, NVFP4Weight) else w[e]


@dataclass
class MLPWeights:
    """A SwiGLU MLP: down(silu(gate(x)) * up(x)). gate/up [F, H], down [H, F] (F = I or M)."""

    gate: Linear
    up: Linear
    down: Linear


@dataclass
class MoEWeights:
    """Routed experts plus shared expert(s) of one MoE layer (DESIGN §1 router).

    router:      float32 [E, H]   router logits = x @ router.T (fp32)
    router_bias: float32 [E]      e_score_correction_bias, used only to pick experts
    gate, up:    [E, M, H]        expert stacks (BF16 tensor or NVFP4Weight)
    down:        [E, H, M]
    shared:      MLPWeights with F = n_shared_experts * M, or None without shared experts
    """

    router: torch.Tensor
    router_bias: torch.Tensor
    gate: Linear
    up: Linear
    down: Linear
    shared: MLPWeights | None


@dataclass
class LayerWeights:
    """One pre-norm decoder layer.

    attn_norm, ffn_norm: bf16 [H]; q_proj [Q, H]; k_proj, v_proj [KV, H]; o_proj [H, Q];
    q_norm, k_norm: bf16 [D]; sinks: float32 [num_heads]; ffn: dense MLP or MoE.
    """

    attn_norm: torch.Tensor
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    sinks: torch.Tensor
    ffn_norm: torch.Tensor
    ffn: MLPWeights | MoEWeights


@dataclass
class FlintWeights:
    """All weights: embed [V, H] (BF16 or NVFP4), layers, final_norm bf16 [H], lm_head [V, H]."""

    embed: Linear
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: Linear

    def nbytes(self) -> int:
        """Bytes held on the device by all tensors (codes + scales for NVFP4)."""
        return sum(_nbytes(v) for v in _walk(self))

    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over every 1-D tensor (norms, sinks, biases) as FP32, in
        walk order. Those are never quantized, so a BF16 checkpoint and its NVFP4 GGUF share
        it, while retraining changes it: an eval report records it, and `eval --compare`
        refuses a reference made from other weights (the reference of 2026-12-02, made before
        flint-nano step 6517 shipped, read as a 20x accuracy regression of the graph engine)."""
        import hashlib

        h = hashlib.sha256()
        for t in _walk(self):
            if isinstance(t, torch.Tensor) and t.dim() == 1:
                h.update(t.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def to(self, device: torch.device | str) -> FlintWeights:
        """A copy with every tensor moved to `device`."""
        return _map(self, lambda t: t.to(device))


def _walk(obj):
    if isinstance(obj, (torch.Tensor, NVFP4Weight)):
        yield obj
    elif isinstance(obj, list):
        for x in obj:
            yield from _walk(x)
    elif obj is not None and hasattr(obj, "__dataclass_fields__"):
        for f in fields(obj):
            yield from _walk(getattr(obj, f.name))


def _map(obj, fn):
    if isinstance(obj, (torch.Tensor, NVFP4Weight)):
        return fn(obj)
    if isinstance(obj, list):
        return [_map(x, fn) for x in obj]
    if obj is not None and hasattr(obj, "__dataclass_fields__"):
        return type(obj)(**{f.name: _map(getattr(obj, f.name), fn) for f in fields(obj)})
    return obj


def _nbytes(t) -> int:
    return t.nbytes if isinstance(t, NVFP4Weight) else t.numel() * t.element_size()


# A floating weight past this magnitude is damage, not training: trained LLM weights (norms,
# embeddings, projections, sinks, router biases) stay within a few hundred, and one value of
# 1e6 or more overflows the activations it feeds. Bytes of text written over a shard decode to
# values like 3e32: finite, so the NaN check passed them, and the model answered "!!!!" with
# exit 0 (a new user's trial, 2026-12-06).
WEIGHT_ABS_MAX = 1e6


class FiniteCheck:
    """Counts NaN, inf and values past ±WEIGHT_ABS_MAX in floating weights as a loader reads
    them, without a host sync per tensor, and names the offenders at the end: random bytes in a
    file whose header is intact otherwise load silently and decode to garbage or NaN logits.

    `add(name, t)` queues a count for a floating tensor (integer tensors: NVFP4 codes and
    scales, are skipped), `add_nvfp4(name, w)` one for an NVFP4 weight's largest value;
    `raise_if_any(path, file_of)` raises CheckpointError naming `path`, the first tensors with
    non-finite or out-of-range values and how many each holds, and with `file_of` (a tensor
    name -> its file) the files that hold them (a directory of shards named only the
    directory, 2026-12-03)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.counts: list[torch.Tensor] = []
        # what a count counts, per name: "values", "of E experts", "" (one NVFP4 tensor)
        self.units: list[str] = []

    def add(self, name: str, t: torch.Tensor) -> None:
        if t.is_floating_point():
            self.names.append(name)
            self.units.append("values")
            # NaN compares false and inf is past the bound: one pass counts all three
            self.counts.append(t.numel() - (t.abs() <= WEIGHT_ABS_MAX).sum())

    def add_nvfp4(self, name: str, w: NVFP4Weight) -> None:
        """Queue the bound of an NVFP4 tensor: its largest possible weight, E2M1's 6 · its
        largest E4M3 block scale · scale2 (per expert for a stack with scale2 [E]), past
        WEIGHT_ABS_MAX counts as one offending tensor (or expert). scale2 alone is checked
        when the file is opened; a huge finite one with ordinary block scales loaded and
        answered with id 0 throughout (a bad-input trial, 2026-12-06)."""
        # the E4M3 value grows with the byte's low 7 bits; 0x7F (NaN) decodes to 0, and a
        # byte with bit 7 set to the value of its low bits (nvfp4._ue4m3_value)
        low = torch.where(w.scales == 0x7F, 0, w.scales & 0x7F)
        top = low.flatten(1).amax(1) if w.scale2.numel() > 1 else low.amax()
        value = nvfp4.ue4m3_to_float(top | 0x80)  # | 0x80: the formula, 0x7F's 0 aside
        self.names.append(name)
        self.units.append(f"of {w.scale2.numel()} experts" if w.scale2.numel() > 1 else "")
        self.counts.append((value * nvfp4.E2M1_MAX * w.scale2.float() > WEIGHT_ABS_MAX).sum())

    def raise_if_any(self, path, file_of=None) -> None:
        from flint_graph.errors import CheckpointError

        if not self.counts:
            return
        counts = torch.stack(self.counts).tolist()  # one sync for the whole checkpoint
        bad = [(n, c, u) for n, c, u in zip(self.names, counts, self.units) if c]
        if bad:
            listed = ", ".join(f"{n} ({c} {u})" if u == "values" else
                               f"{n} (NVFP4: 6 · block scale · scale2 past the bound"
                               f"{f' in {c} {u}' if u else ''})" for n, c, u in bad[:5])
            more = f" and {len(bad) - 5} more tensors" if len(bad) > 5 else ""
            if file_of is not None:
                files = sorted({Path(file_of(n)).name for n, _, _ in bad})
                more += f", in {', '.join(files)}"
            raise CheckpointError(f"{path}: NaN, infinite or out-of-range (|w| > "
                                  f"{WEIGHT_ABS_MAX:g}) weights in {listed}{more}; the file is "
                                  "damaged or was not written by a float converter")
