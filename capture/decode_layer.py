"""One decoder layer's decode step from the AOT kernels (docs/decode-kernels.md), and the
buffers it runs in: the piece the captured decode graph repeats 49 times.

`DecodeLayer(kset, cfg, layer, weights, batch)` picks each kernel's specialisation for the
layer's kind (sliding or full attention, MoE or dense MLP, BF16 or NVFP4) and bucket, holds the
weight tensors in the layouts the kernels read, and `launch(bufs, kv)` enqueues the layer's
kernels on the current stream, each with PDL. It computes what `ReferenceModel` computes for one
layer (DESIGN §1, §4): tests/test_decode_layer_gpu.py compares the two.

The residual stream enters and leaves a layer in `StepBuffers.stream` (bf16 [B, H]). Inside, no
kernel writes a buffer another CTA of the same launch may still read: the fused QKV GEMV reads
the stream and normalises it in its prologue, the router (or the dense layers' FFN norm) writes
stream + o projection to `residual2`, and `moe_down` writes residual2 + FFN output back to
`stream`. Seven launches per layer, six with the fold (attn_decode QKN = 1 takes
qk_norm_rope_kv's work: `DecodeLayer(fold=...)`, default `attn_decode.uses_fold`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import attn_decode, gemv_bf16, gemv_nvfp4
from flint_graph.kernels.decode.qk_norm_rope_kv import rope_inv_freq
from flint_graph.kernels.toolchain.spec import KV_PAGE, Spec
from flint_graph.checkpoints.weights import Linear, LayerWeights, MLPWeights, MoEWeights, NVFP4Weight

BF16 = torch.bfloat16


def model_spec(kdef, cfg: FlintConfig, batch: int, **want: int) -> Spec:
    """The model specialisation of `kdef` for bucket `batch` whose values include `want`'s,
    e.g. RING=1 for a sliding layer. Raises ValueError unless exactly one matches."""
    found = [s for s in kdef.specs(cfg, (batch,))
             if all(s.as_dict().get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise ValueError(f"{kdef.name}: {len(found)} specialisations for B={batch} {want}")
    return found[0]


def layer_kernels(cfg: FlintConfig, layer: int, moe: bool, fmt: int,
                  fold: bool = False) -> dict[str, dict[str, int]]:
    """The values that pick each per-layer kernel's specialisation (`model_spec`) for `layer`:
    name -> {spec key: value}. Every way two layers of one config can differ must be here (a
    config whose full layers differ in RoPE, as --plant rope-on-nope builds, found two
    qk_norm_rope_kv specialisations when only RING picked). `fmt` is 1 for NVFP4 weights;
    `fold`: attention takes Q/K norm, RoPE and the KV write (attn_decode QKN = 1), so the
    layer has no qk_norm_rope_kv."""
    sliding, topk = int(cfg.is_sliding(layer)), cfg.num_experts_per_tok if moe else 0
    rope = int(cfg.uses_rope(layer))
    out = {"rmsnorm": {}, "qk_norm_rope_kv": {"RING": sliding, "ROPE": rope},
           "attn_decode": {"RING": sliding}, "moe_gate_up": {"TOPK": topk, "FMT": fmt},
           "moe_down": {"TOPK": topk, "FMT": fmt}}
    if fold:
        del out["qk_norm_rope_kv"]
        out["attn_decode"] = {"RING": sliding, "QKN": 1, "ROPE": rope}
    if moe:
        out["moe_router"] = {}
    return out


def layer_spec(kdef, cfg: FlintConfig, batch: int, **want: int) -> Spec:
    """`model_spec`, except that attn_decode is picked among the specs of the form `want`
    asks for (QKN = 1 folded, else plain), whichever form the model's default is."""
    if kdef.name != "attn_decode":
        return model_spec(kdef, cfg, batch, **want)
    found = [s for s in attn_decode.specs_for(cfg, (batch,), bool(want.get("QKN", 0)))
             if all(s.as_dict().get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise ValueError(f"attn_decode: {len(found)} specialisations for B={batch} {want}")
    return found[0]


def _pick(kset, name: str, cfg: FlintConfig, batch: int, **want: int):
    """The loaded kernel `name` at its `layer_spec`."""
    return kset.get(name, **layer_spec(kset.defs[name], cfg, batch, **want).as_dict())


@dataclass
class StepBuffers:
    """Every activation and workspace of one decode step at bucket B, shared by all layers
    (layers run one after another). Names follow docs/decode-kernels.md; shapes in brackets."""

    stream: torch.Tensor  # bf16 [B, H], the residual stream between layers
    residual: torch.Tensor  # bf16 [B, H], the final norm's copy of the stream
    residual2: torch.Tensor  # bf16 [B, H], residual + attention output
    zeros: torch.Tensor  # bf16 [B, H], all zero: the attention norm's residual input
    h: torch.Tensor  # bf16 [B, H], the normed stream
    o: torch.Tensor  # bf16 [B, H], the o projection
    qkv: torch.Tensor  # bf16 [B, (HQ + 2·HKV)·D]: q heads, k heads, v heads
    q_out: torch.Tensor  # bf16 [B, HQ, D]
    attn: torch.Tensor  # bf16 [B, HQ·D]
    positions: torch.Tensor  # i32 [B]
    row_mask: torch.Tensor  # i32 [B], 0 for padding rows
    ring_table: torch.Tensor  # i32 [B, 1], each row's ring slot
    page_table: torch.Tensor  # i32 [B, T], each row's pages
    ids: torch.Tensor  # i32 [B, TOPK]
    weights: torch.Tensor  # f32 [B, TOPK]
    experts: torch.Tensor  # i32 [S]
    slot_w: torch.Tensor  # f32 [S, B]
    scores: torch.Tensor  # f32 [B, E] router workspace
    router_counter: torch.Tensor  # i32 [1]
    act: torch.Tensor  # bf16 [S, B, M]
    act_sh: torch.Tensor  # bf16 [B, MS]
    act_dense: torch.Tensor  # bf16 [B, I]
    o_part: dict  # SPLITS -> f32 [B, HKV, SPLITS, G, D]
    lse_part: dict  # SPLITS -> f32 [B, HKV, SPLITS, G]
    attn_counters: torch.Tensor  # i32 [B, HKV]

    @classmethod
    def allocate(cls, cfg: FlintConfig, batch: int, max_pages: int,
                 device="cuda") -> StepBuffers:
        """Buffers for bucket `batch` and block tables of `max_pages` pages per row."""
        b, h, d = batch, cfg.hidden_size, cfg.head_dim
        hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        s = min(e, b * k)
        m = cfg.moe_intermediate_size
        ms = max(1, cfg.n_shared_experts * m)

        def t(*shape, dtype=BF16):
            return torch.empty(shape, dtype=dtype, device=device)

        i32, f32 = torch.int32, torch.float32
        splits = sorted({attn_decode.splits_for(w, hkv) for w in (cfg.sliding_window, 0)})
        return cls(
            stream=t(b, h), residual=t(b, h), residual2=t(b, h),
            zeros=torch.zeros(b, h, dtype=BF16, device=device), h=t(b, h), o=t(b, h),
            qkv=t(b, (hq + 2 * hkv) * d), q_out=t(b, hq, d),
            attn=t(b, hq * d), positions=torch.zeros(b, dtype=i32, device=device),
            row_mask=torch.ones(b, dtype=i32, device=device),
            ring_table=torch.zeros(b, 1, dtype=i32, device=device),
            page_table=torch.zeros(b, max_pages, dtype=i32, device=device),
            ids=t(b, k, dtype=i32), weights=t(b, k, dtype=f32), experts=t(s, dtype=i32),
            slot_w=t(s, b, dtype=f32), scores=t(b, e, dtype=f32),
            router_counter=torch.zeros(1, dtype=i32, device=device), act=t(s, b, m),
            act_sh=t(b, ms), act_dense=t(b, cfg.intermediate_size),
            o_part={n: t(b, hkv, n, hq // hkv, d, dtype=f32) for n in splits},
            lse_part={n: t(b, hkv, n, hq // hkv, dtype=f32) for n in splits},
            attn_counters=torch.zeros(b, hkv, dtype=i32, device=device))


@dataclass
class LayerKV:
    """One layer's BF16 KV cache: k, v [NB, HKV, P, D]: pages of KV_PAGE tokens (full layers)
    or one ring of `sliding_window` entries per slot (sliding layers)."""

    k: torch.Tensor
    v: torch.Tensor
    ring: bool


def allocate_kv(cfg: FlintConfig, layer: int, num_pages: int, num_slots: int,
                device="cuda") -> LayerKV:
    """An uninitialised cache for `layer`: `num_slots` rings if sliding, else `num_pages`
    pages."""
    ring = cfg.is_sliding(layer)
    n, p = (num_slots, cfg.sliding_window) if ring else (num_pages, KV_PAGE)
    shape = (n, cfg.num_key_value_heads, p, cfg.head_dim)
    return LayerKV(torch.empty(shape, dtype=BF16, device=device),
                   torch.empty(shape, dtype=BF16, device=device), ring)


def _nvfp4_args(w: NVFP4Weight, lead: int | None = None) -> list[torch.Tensor]:
    """codes, scales, scale2 of an NVFP4 weight as the kernels take them: scale2 [1] for a
    matrix, [E] for a stack (a per-tensor scale2 of a stack repeated per expert)."""
    s2 = w.scale2.float().reshape(-1)
    if lead is not None and s2.numel() == 1:
        s2 = s2.expand(lead).contiguous()
    return [w.codes.contiguous(), w.scales.contiguous(), s2.contiguous()]


def _weight_args(w: Linear, lead: int | None = None) -> list[torch.Tensor]:
    return _nvfp4_args(w, lead) if isinstance(w, NVFP4Weight) else [w.contiguous()]


def fuse_qkv(w: LayerWeights) -> list[torch.Tensor]:
    """The fused QKV GEMV's weight arguments: the [q; k; v] rows stacked (NVFP4: codes, scales
    and scale2 per output row, each projection's own scale2 on its rows; BF16: one matrix).

    `w.q_proj`, `k_proj`, `v_proj` are rebound to row views of the stacked tensors, so the
    weights are held once (the reference path, prefill, reads the same memory); the stacked
    tensors are kept on `w` so every bucket's layer shares them."""
    parts = [w.q_proj, w.k_proj, w.v_proj]
    done = getattr(w, "_fused_qkv", None)
    if done is not None and all(a is b for a, b in zip(done[0], parts)):
        return done[1]  # still the views made last time: the weights were not replaced
    rows = [p.shape[0] for p in parts]
    if isinstance(w.q_proj, NVFP4Weight):
        codes = torch.cat([p.codes for p in parts])
        scales = torch.cat([p.scales for p in parts])
        scale2 = torch.cat([p.scale2.float().reshape(1).expand(n) for p, n in zip(parts, rows)])
        views = [NVFP4Weight(c, s, p.scale2) for c, s, p in
                 zip(codes.split(rows), scales.split(rows), parts)]
        out = [codes, scales, scale2.contiguous()]
    else:
        stacked = torch.cat(parts)
        views = list(stacked.split(rows))
        out = [stacked]
    w.q_proj, w.k_proj, w.v_proj = views
    w._fused_qkv = (views, out)
    return out


class DecodeLayer:
    """Layer `layer` of `cfg` at bucket `batch`, on the kernels of `kset` (a KernelSet).

    weights: the layer's `LayerWeights` on the GPU (BF16 or NVFP4 linears; all linears of one
    layer in one format). fold: attention takes Q/K norm, RoPE and the KV write itself
    (attn_decode QKN = 1, six launches instead of seven); None: the model's default,
    `attn_decode.uses_fold(cfg)`. Raises ValueError when a kernel has no specialisation for
    it, or fold = True for a config that cannot take it."""

    def __init__(self, kset, cfg: FlintConfig, layer: int, weights: LayerWeights, batch: int,
                 fold: bool | None = None):
        self.cfg, self.layer, self.batch = cfg, layer, batch
        self.fold = attn_decode.uses_fold(cfg) if fold is None else bool(fold)
        self.w = weights
        self.sliding = cfg.is_sliding(layer)
        self.moe = isinstance(weights.ffn, MoEWeights)
        nvfp4 = isinstance(weights.q_proj, NVFP4Weight)
        self.fmt = int(nvfp4)
        gemv = gemv_nvfp4 if nvfp4 else gemv_bf16

        n, k = weights.o_proj.shape
        spec: Spec = gemv.spec_for(batch, k, n)
        self.o = kset.get(spec.kernel, **spec.as_dict()), _weight_args(weights.o_proj)
        spec = gemv.fused_qkv_spec(batch, cfg)
        self.qkv = kset.get(spec.kernel, **spec.as_dict()), fuse_qkv(weights)
        want = layer_kernels(cfg, layer, self.moe, self.fmt, self.fold)
        picked = {name: _pick(kset, name, cfg, batch, **w) for name, w in want.items()}
        self.norm, self.attn = picked["rmsnorm"], picked["attn_decode"]
        self.prep = picked.get("qk_norm_rope_kv")  # None when folded
        self.splits = self.attn.spec["SPLITS"]
        self.gate_up, self.down = picked["moe_gate_up"], picked["moe_down"]
        if self.moe:
            self.router = picked["moe_router"]
        dev = weights.attn_norm.device
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, dev)
        self.sinks = (weights.sinks.float() if cfg.attention_sinks else
                      torch.full((cfg.num_attention_heads,), -math.inf, device=dev))
        self.ffn_args = self._ffn_args(weights.ffn)

    def _ffn_args(self, ffn: MLPWeights | MoEWeights) -> tuple[list, list]:
        """(gate_up weight args, down weight args) in the kernels' argument order."""
        if isinstance(ffn, MLPWeights):
            return (_weight_args(ffn.gate) + _weight_args(ffn.up), _weight_args(ffn.down))
        e = self.cfg.n_routed_experts
        sh = ffn.shared
        gate_up = _weight_args(ffn.gate, e) + _weight_args(ffn.up, e)
        gate_up += _weight_args(sh.gate) + _weight_args(sh.up)
        routed_down = _weight_args(ffn.down, e)
        gate_up += routed_down[:2]  # codes and scales (BF16: the matrix), for PD's prefetch
        down = routed_down + _weight_args(sh.down)
        return gate_up, down

    def launch(self, bufs: StepBuffers, kv: LayerKV, *, pdl: bool | None = None) -> None:
        """Enqueue the layer on the current stream: bufs.stream [B, H] in and out;
        bufs.positions / row_mask / ring_table / page_table must hold this step's rows."""
        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        bf = bufs
        table = bf.ring_table if self.sliding else bf.page_table
        kern, wargs = self.qkv  # the attention RMSNorm happens in its prologue
        kern.launch(bf.stream, *wargs, w.attn_norm, bf.qkv, eps, pdl=pdl)
        parts = (bf.o_part[self.splits], bf.lse_part[self.splits], bf.attn_counters)
        if self.fold:
            self.attn.launch(bf.qkv, kv.k, kv.v, table, bf.positions, self.sinks, bf.attn,
                             *parts, w.q_norm, w.k_norm, self.inv_freq, eps, pdl=pdl)
        else:
            self.prep.launch(bf.qkv, bf.positions, table, w.q_norm, w.k_norm, self.inv_freq,
                             bf.q_out, kv.k, kv.v, eps, pdl=pdl)
            self.attn.launch(bf.q_out, kv.k, kv.v, table, bf.positions, self.sinks, bf.attn,
                             *parts, pdl=pdl)
        kern, wargs = self.o
        kern.launch(bf.attn, *wargs, bf.o, pdl=pdl)
        gate_up_w, down_w = self.ffn_args
        if self.moe:
            ffn = w.ffn
            self.router.launch(bf.o, bf.stream, bf.row_mask, w.ffn_norm, ffn.router,
                               ffn.router_bias, bf.residual2, bf.h, bf.ids, bf.weights,
                               bf.experts, bf.slot_w, bf.scores, bf.router_counter, eps,
                               cfg.routed_scaling_factor, pdl=pdl)
            self.gate_up.launch(bf.h, bf.experts, *gate_up_w, bf.act, bf.act_sh, pdl=pdl)
            self.down.launch(bf.act, bf.act_sh, bf.experts, bf.slot_w, bf.residual2, *down_w,
                             bf.stream, pdl=pdl)
        else:
            self.norm.launch(bf.o, bf.stream, w.ffn_norm, bf.residual2, bf.h, eps, pdl=pdl)
            self.gate_up.launch(bf.h, *gate_up_w, bf.act_dense, pdl=pdl)
            self.down.launch(bf.act_dense, bf.residual2, *down_w, bf.stream, pdl=pdl)

    @property
    def kernels_per_launch(self) -> int:
        """Kernel launches `launch` enqueues: qkv (with the norm), qk_norm_rope_kv (unless
        folded into attention), attention, o, router (or the FFN norm), gate_up, down."""
        return 6 if self.fold else 7

