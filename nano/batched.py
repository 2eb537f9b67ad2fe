"""A batched, differentiable Flint forward for training flint-nano (issue 11).

It computes the reference model's function (`flint_graph/reference.py`: pre-norm layers, Q/K
RMSNorm, RoPE on the sliding layers only, causal GQA attention with the sliding window and
learned sinks, DeepSeek-V3 sigmoid routing with the correction bias, shared expert) on a padded
batch of whole sequences, with no KV cache and without the reference's per-op BF16 rounding, so
that training runs as a few large kernels: attention is `scaled_dot_product_attention` and the
routed experts are computed densely and weighted by the routing (zero for unpicked experts).
tests/test_nano_batched.py checks it against `ReferenceModel(act_dtype=float32)`.

The sinks ride through SDPA as one extra key per head: every query gets a constant extra
component 1/scale and the sink key carries the sink logit in that component (zero elsewhere,
zero value), so its logit is exactly the sink and it adds only to the softmax denominator, and
its gradient reaches the sink through an ordinary key. A boolean mask keeps SDPA's
memory-efficient kernel usable on CUDA.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.reference import rope_cos_sin
from flint_graph.checkpoints.weights import FlintWeights, MoEWeights

_PAD = 8  # extra head dims carrying the sink (kept a multiple of 8 for the fused kernels)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention_mask(t: int, window: int | None, device) -> torch.Tensor:
    """bool [T, T+1]: query i sees key j ≤ i (and j > i − window on a sliding layer) and the
    sink column T."""
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    ok = j <= i
    if window is not None:
        ok &= j > i - window
    return torch.cat([ok, torch.ones(t, 1, dtype=torch.bool, device=device)], dim=1)


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None,
                   mask: torch.Tensor) -> torch.Tensor:
    """q [B, T, Hq, D], k/v [B, T, Hkv, D], sinks float [Hq] or None, mask bool [T, T+1]
    (`attention_mask`) -> [B, T, Hq, D]; query head h reads KV head h // (Hq/Hkv)."""
    b, t, hq, d = q.shape
    g = hq // k.shape[2]
    scale = 1.0 / math.sqrt(d)
    q, k, v = (x.transpose(1, 2) for x in (q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)))
    extra = torch.zeros(b, hq, t, _PAD, dtype=q.dtype, device=q.device)
    qe = extra.clone()
    qe[..., 0] = 1.0 / scale
    q = torch.cat([q, qe], -1)
    k = torch.cat([k, extra], -1)
    v = torch.cat([v, extra], -1)
    if sinks is None:  # no sink: a zero key that no query can see
        sink_k = torch.zeros(b, hq, 1, d + _PAD, dtype=q.dtype, device=q.device)
        mask = mask.clone()
        mask[:, -1] = False
    else:
        z = torch.zeros(b, hq, 1, d, dtype=q.dtype, device=q.device)
        sink_k = torch.cat([z, sinks.to(q.dtype).view(1, hq, 1, 1).expand(b, hq, 1, 1),
                            z[..., :_PAD - 1]], -1)
    k = torch.cat([k, sink_k], 2)
    v = torch.cat([v, torch.zeros_like(sink_k)], 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out[..., :d].transpose(1, 2)


def forward(cfg: FlintConfig, w: FlintWeights, ids: torch.Tensor,
            loads: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Final hidden states float [B, T, H] of token ids int64 [B, T] (each row from position 0;
    right padding only affects the padded positions). `loads`, when given, receives per MoE
    layer the tokens routed to each expert, int64 [E] (for the correction-bias update)."""
    eps = cfg.rms_norm_eps
    b, t = ids.shape
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = w.embed[ids].float()
    cos, sin = rope_cos_sin(torch.arange(t, device=ids.device), d, cfg.rope_theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    masks = {}
    for i, lw in enumerate(w.layers):
        window = cfg.sliding_window if cfg.is_sliding(i) else None
        if window not in masks:
            masks[window] = attention_mask(t, window, ids.device)
        h = _rms(x, lw.attn_norm, eps)
        q = (h @ lw.q_proj.T).view(b, t, hq, d)
        k = (h @ lw.k_proj.T).view(b, t, hkv, d)
        v = (h @ lw.v_proj.T).view(b, t, hkv, d)
        if cfg.qk_norm:
            q, k = _rms(q, lw.q_norm, eps), _rms(k, lw.k_norm, eps)
        if cfg.uses_rope(i):
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        dt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(
            x.device.type) else q.dtype
        a = sink_attention(q.to(dt), k.to(dt), v.to(dt),
                           lw.sinks if cfg.attention_sinks else None, masks[window])
        x = x + a.reshape(b, t, hq * d) @ lw.o_proj.T
        h = _rms(x, lw.ffn_norm, eps).view(b * t, -1)
        if isinstance(lw.ffn, MoEWeights):
            y = _moe(cfg, lw.ffn, h, loads)
        else:
            y = _swiglu(h, lw.ffn.gate, lw.ffn.up, lw.ffn.down)
        x = x + y.view(b, t, -1)
    return _rms(x, w.final_norm, eps)


def _swiglu(h, gate, up, down):
    return (F.silu(h @ gate.T) * (h @ up.T)) @ down.T


def _moe(cfg: FlintConfig, m: MoEWeights, h: torch.Tensor, loads) -> torch.Tensor:
    with torch.autocast(h.device.type, enabled=False):  # router logits stay fp32 (DESIGN §4)
        s = torch.sigmoid(h.float() @ m.router.float().T)  # [N, E]
    ids = torch.topk(s.detach() + m.router_bias.detach().float(), cfg.num_experts_per_tok,
                     dim=-1).indices
    wts = s.gather(-1, ids)
    if cfg.norm_topk_prob:
        wts = wts / wts.sum(-1, keepdim=True)
    gates = torch.zeros_like(s).scatter(-1, ids, wts * cfg.routed_scaling_factor)  # [N, E]
    if loads is not None:
        loads.append(torch.bincount(ids.flatten(), minlength=s.shape[1]))
    g = torch.einsum("nh,emh->nem", h, m.gate)
    u = torch.einsum("nh,emh->nem", h, m.up)
    act = F.silu(g) * u * gates[..., None].to(g.dtype)  # [N, E, M]
    e, hid, mw = m.down.shape
    y = act.reshape(act.shape[0], e * mw) @ m.down.permute(0, 2, 1).reshape(e * mw, hid)
    if m.shared is not None:
        y = y + _swiglu(h, m.shared.gate, m.shared.up, m.shared.down)
    return y


def logits(w: FlintWeights, hidden: torch.Tensor) -> torch.Tensor:
    """LM-head logits float32 [..., V] of final-normed states [..., H]."""
    with torch.autocast(hidden.device.type, enabled=False):
        return hidden.float() @ w.lm_head.float().T
