"""The plain-PyTorch Flint model: the numerical oracle every kernel and captured graph is compared
with (DESIGN §1 architecture, §4 rounding points). One readable file, gpt-fast `model.py` style.

Rounding (DESIGN §4): activations and the residual stream are BF16 between ops; each op below
computes in FP32 and rounds its output once to its `dtype` argument (default `ACT_DTYPE`, BF16).
Router logits, softmax statistics and the LM-head logits stay FP32; the MoE weighted sum (routed +
shared) is FP32, rounded once. The op functions are top level so kernels' `_ref` functions call
them instead of re-deriving them. The module constants are defaults, never reassigned:
`ReferenceModel` takes `act_dtype` and `kv_chunk_tokens` and passes them down explicitly; tests
pass act_dtype=float64 to check the model's logic apart from BF16 rounding noise.

Shape legend: T tokens, S keys, H hidden, Hq query heads, Hkv KV heads, G = Hq/Hkv, D head dim,
F MLP width, E routed experts, K top-k, V vocab.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError, ContextLengthError, InvalidRequestError
from flint_graph.checkpoints.weights import (FlintWeights, LayerWeights, Linear, MoEWeights, NVFP4Weight,
                                dense, expert_weight)

ACT_DTYPE = torch.bfloat16  # default activation / KV dtype (DESIGN §4)
KV_CHUNK_TOKENS = 256  # default: full-layer caches grow by this many tokens at a time
ATTN_BLOCK_ELEMS = 1 << 27  # fp32 logits per query block in `attention` (512 MiB) on CUDA
# on the CPU (float64 logits): blocks small enough to stay in cache-friendly sizes and to let a
# sliding layer's block skip the keys outside its window (`_visible_keys`): a 7K-token prompt on
# flint-nano spent most of its time allocating and filling 1 GiB blocks (2026-12-02)
ATTN_BLOCK_ELEMS_CPU = 1 << 21


# -- ops -------------------------------------------------------------------------------------


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the reference's matmuls and attention sums run in for a tensor on t's device:
    float64 on the CPU, float32 elsewhere. Why float64 on the CPU: its GEMMs and reductions add
    in an order that depends on how many rows (or keys) they are given, so in float32 a token's
    bf16 result could change with the chunk it was prefilled in or the batch it was decoded
    with, and a near-tie in the logits then flipped a greedy token (docs/kv-reuse.md). In
    float64 the order changes only the 53-bit sum, which then rounds to the same fp32/bf16
    value: the results are those of exact products and sums rounded once, as DESIGN §4 asks,
    whatever the chunking. CUDA keeps float32 (its tests hold kernels to tolerances, and its
    saved eval reports stay comparable)."""
    return torch.float64 if t.device.type == "cpu" else torch.float32


def linear(x: torch.Tensor, w: Linear, *, dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """x bf16 [..., K] @ w[N, K]ᵀ (BF16 or NVFP4, dequantised exactly) -> bf16 [..., N].

    Exact products, accumulation in `acc_dtype` (FP32, or FP64 on the CPU), one rounding to
    `dtype` (BF16, DESIGN §4)."""
    acc = acc_dtype(x)
    return (x.to(acc) @ dense(w, acc).T).to(dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, *,
             dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """RMSNorm over the last dim: x / sqrt(mean(x²) + eps) * w, in FP32, rounded once to bf16.

    x [..., N] any float dtype; w [N]. Used for the layer norms and per head for Q/K norm."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int,
                 theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin float32 [T, D] for int positions [T]: angle(p, i) = p · theta^(−2i/D) for the
    pair i = 0..D/2−1, repeated over both halves (HF rotate-half layout).

    Angles are taken in float64, cos/sin rounded to fp32: an fp32 angle at position 262,143 is
    off by up to ~0.016 rad, above the op tolerance, so kernels should read such tables."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = theta ** (-i / head_dim)  # [D/2]
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    ang = torch.cat([ang, ang], dim=-1)  # [T, D]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float, *,
               dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """Rotate x bf16 [T, heads, D] by its token positions int64 [T] (HF rotate-half:
    out = x·cos + cat(−x₂, x₁)·sin with x₁, x₂ the two halves of D). FP32, rounded once."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    return rotate(x, cos[:, None, :], sin[:, None, :], dtype=dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
           dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """`apply_rope`'s rotation with given tables: x [T, heads, D], cos and sin fp32 [T, 1, D]
    (`rope_cos_sin`; the prefill computes them once per chunk for every layer). FP32, rounded
    once."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
              k_pos: torch.Tensor, sinks: torch.Tensor | None, window: int | None,
              scale: float | None = None, *, dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """Causal GQA attention with optional sliding window and sink logits -> bf16 [T, Hq, D].

    q bf16 [T, Hq, D]; k, v bf16 [S, Hkv, D]; q_pos int64 [T], k_pos int64 [S] (any order, e.g.
    a ring buffer). Query head h reads KV head h // G. A query at p sees keys with positions
    p−window+1 … p (all ≤ p when window is None). Logits s = scale·q·k in fp32 (scale defaults
    to 1/sqrt(D)); sinks fp32 [Hq] add one logit per head that is not scaled and carries no
    value: out = Σ e^(s_j−m) v_j / (Σ e^(s_j−m) + e^(sink−m)). FP32 throughout, rounded once.
    Queries are processed in blocks so the logits never exceed ATTN_BLOCK_ELEMS floats
    (ATTN_BLOCK_ELEMS_CPU on the CPU, each over the keys some query of the block may see).
    """
    t, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    acc = acc_dtype(q)
    kf = k.to(acc).permute(1, 0, 2)  # [Hkv, S, D]
    vf = v.to(acc).permute(1, 0, 2)  # [Hkv, S, D]
    elems = ATTN_BLOCK_ELEMS_CPU if q.device.type == "cpu" else ATTN_BLOCK_ELEMS
    block = max(1, elems // (hq * max(1, k.shape[0])))
    out = []
    for b in range(0, t, block):
        qb = q[b:b + block].to(acc).view(-1, hkv, hq // hkv, d).permute(1, 2, 0, 3)
        kb, vb, kpos = kf, vf, k_pos
        if q.device.type == "cpu":  # elsewhere the block is all queries, and it would sync
            kb, vb, kpos = _visible_keys(kf, vf, k_pos, q_pos[b:b + block], window)
        s = (qb @ kb[:, None].transpose(-1, -2)) * scale  # [Hkv, G, Tb, S]
        qp, kp = q_pos[b:b + block, None], kpos[None, :]
        visible = kp <= qp
        if window is not None:
            visible &= kp > qp - window
        s = s.masked_fill(~visible, float("-inf"))
        m = s.amax(-1, keepdim=True)  # [Hkv, G, Tb, 1]
        if sinks is not None:
            sink = sinks.float().to(acc).view(hkv, -1, 1, 1)
            m = torch.maximum(m, sink)
        p = torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        if sinks is not None:
            den = den + torch.exp(sink - m)
        o = (p @ vb[:, None]) / den  # [Hkv, G, Tb, D]
        out.append(o.permute(2, 0, 1, 3).reshape(-1, hq, d))
    return torch.cat(out).to(dtype)


def _visible_keys(kf: torch.Tensor, vf: torch.Tensor, k_pos: torch.Tensor, q_pos: torch.Tensor,
                  window: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The keys (kf, vf [Hkv, S, D], k_pos [S]) that some query of a block at q_pos may see:
    positions up to its last query and, with a window, from its first query's window start.
    The others would get weight e^-inf = 0, so leaving them out changes no sum (the sums of
    `acc_dtype` round to the same values whatever their order); it saves computing a sliding
    layer's scores over the whole context (a 7K-token prompt on flint-nano: most of its CPU
    prefill time, 2026-12-02). All keys when every one is visible or none is."""
    lo = None if window is None else q_pos.min() - window + 1
    sel = k_pos <= q_pos.max()
    if lo is not None:
        sel &= k_pos >= lo
    n = int(sel.sum())
    if n == 0 or n == k_pos.numel():
        return kf, vf, k_pos
    idx = sel.nonzero().squeeze(1)
    return kf[:, idx], vf[:, idx], k_pos[idx]


def route(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor, top_k: int,
          scaling: float, norm: bool, *,
          logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 `noaux_tc` routing (DESIGN §1) -> (ids int64 [T, K], weights fp32 [T, K]).

    x bf16 [T, H]; router fp32 [E, H]; bias fp32 [E]. logits = x·routerᵀ in fp32, s = sigmoid;
    pick the top-k of s + bias; weights are the picked s (bias excluded), divided by their sum
    when `norm`, times `scaling`. `logits` fp32 [T, E], when given, stands for x·routerᵀ (a
    caller that computes the same sums faster, e.g. capture/prefill.py on tensor cores)."""
    acc = acc_dtype(x if logits is None else logits)
    if logits is None:
        logits = (x.to(acc) @ router.to(acc).T).float()
    # sigmoid of the fp32 logits in `acc`, rounded once: torch's fp32 sigmoid on the CPU takes
    # SIMD or scalar code per element by its place in the tensor, so a row's weights changed
    # in the last bit with the rows beside it (a bad-input trial, 2026-12-07)
    s = torch.sigmoid(logits.to(acc)).float()  # [T, E]
    ids = torch.topk(s + bias.float(), top_k, dim=-1).indices  # [T, K]
    w = s.gather(-1, ids)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    return ids, w * scaling


def swiglu(x: torch.Tensor, gate: Linear, up: Linear, down: Linear, *,
           dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """SwiGLU MLP down(silu(gate(x)) ⊙ up(x)): x bf16 [T, H] -> bf16 [T, H]; gate/up [F, H],
    down [H, F]. Each projection rounds to bf16; silu(g)·u is taken in `acc_dtype` (fp32, or
    fp64 on the CPU, where fp32 silu's bits depend on the tensor's size: `route`), rounded
    once."""
    g, u = linear(x, gate, dtype=dtype), linear(x, up, dtype=dtype)  # [T, F]
    acc = acc_dtype(x)
    return linear((F.silu(g.to(acc)) * u.to(acc)).to(dtype), down, dtype=dtype)


def moe(x: torch.Tensor, w: MoEWeights, top_k: int, scaling: float, norm: bool, *,
        dtype: torch.dtype = ACT_DTYPE,
        routing: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Routed experts plus shared expert: x bf16 [T, H] -> bf16 [T, H].

    Σ_i w_i·expert_i(x) + shared(x) summed in fp32 (each expert output is a bf16 projection
    result) and rounded once. Tokens are grouped per expert and only the picked experts are
    dequantised. A token's terms are added in ascending expert id whatever else is in the
    batch, so only matmul row counts (FP32 order) differ between batched and alone.
    `routing` (ids int [T, K], weights fp32 [T, K]) replaces `route`'s choice: tests use it to
    follow a kernel's pick where two experts tie within rounding."""
    ids, weights = routing or route(x, w.router, w.router_bias, top_k, scaling, norm)
    ids = ids.long()
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = swiglu(x[tok], expert_weight(w.gate, e), expert_weight(w.up, e),
                   expert_weight(w.down, e), dtype=dtype)
        acc.index_add_(0, tok, y.float() * weights[tok, slot, None])
    if w.shared is not None:
        acc += swiglu(x, w.shared.gate, w.shared.up, w.shared.down, dtype=dtype).float()
    return acc.to(dtype)


def residual_add(x: torch.Tensor, y: torch.Tensor, *,
                 dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """bf16 x + bf16 y, added in fp32 and rounded once (the residual stream stays bf16)."""
    return (x.float() + y.float()).to(dtype)


def embed(table: Linear, ids: torch.Tensor, *, dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """Rows `ids` int64 [T] of the embedding table [V, H] -> bf16 [T, H]; an NVFP4 table is
    dequantised only at those rows."""
    if isinstance(table, NVFP4Weight):
        rows = NVFP4Weight(table.codes[ids], table.scales[ids], table.scale2)
        return rows.dequantize(dtype)
    return table[ids].to(dtype)


# -- KV cache --------------------------------------------------------------------------------


def ring_at(ring: torch.Tensor, new: torch.Tensor, start: int, at: int, window: int,
            dim: int = 0) -> torch.Tensor:
    """A copy of a sliding layer's ring as it stands once positions before `at` are written:
    `ring` (entry p % window along `dim`) holds positions up to start − 1, `new` [T, ...] the
    K or V of positions start … start + T − 1 (start ≤ at < start + T). The rows at positions
    max(start, at − window) … at − 1 replace what the ring holds at their entries."""
    out = ring.clone()
    lo = max(start, at - window)
    rows = new[lo - start:at - start]
    out.index_copy_(dim, torch.arange(lo, at, device=ring.device) % window,
                    rows if dim == 0 else rows.transpose(0, dim))
    return out


class SequenceKV:
    """One sequence's KV cache of `dtype` (BF16): per sliding layer a ring of `window` entries
    (position p in slot p % window); per full layer a cache that grows `chunk_tokens` (≥ 1) at a
    time.

    `num_tokens` counts the tokens cached so far; the next token's position equals it.

    `snapshot_at` (a position, or None): the next `update` calls whose tokens reach past it
    save into `snapshot` (per layer (k, v) bf16 [W, Hkv, D] copies, None for a full layer) the
    rings as a prefill that stopped at that position would leave them, without stopping there
    (a KV-reuse resume point inside a chunk, flint_graph/runtime/prefix_cache.py)."""

    def __init__(self, windows: list[int | None], num_kv_heads: int, head_dim: int,
                 device: torch.device, *, dtype: torch.dtype = ACT_DTYPE,
                 chunk_tokens: int = KV_CHUNK_TOKENS):
        self.num_tokens = 0
        self.windows = windows  # per layer: ring length, or None for a full layer
        self.chunk_tokens = chunk_tokens
        self.k = [torch.empty((w or 0, num_kv_heads, head_dim), dtype=dtype, device=device)
                  for w in windows]
        self.v = [torch.empty_like(t) for t in self.k]
        self.snapshot_at: int | None = None
        self.snapshot: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(windows)

    def update(self, layer: int, k_new: torch.Tensor,
               v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k_new, v_new bf16 [T, Hkv, D] at positions num_tokens … num_tokens+T−1 and
        return (k, v, k_pos) of every key the new queries may see. Call `advance` once all
        layers have been updated."""
        n, t, w = self.num_tokens, k_new.shape[0], self.windows[layer]
        dev = k_new.device
        if w is None:
            if n + t > self.k[layer].shape[0]:
                cap = -(-(n + t) // self.chunk_tokens) * self.chunk_tokens
                for cache in (self.k, self.v):
                    grown = cache[layer].new_empty((cap, *cache[layer].shape[1:]))
                    grown[:n] = cache[layer][:n]
                    cache[layer] = grown
            self.k[layer][n:n + t] = k_new
            self.v[layer][n:n + t] = v_new
            pos = torch.arange(n + t, device=dev)
            return self.k[layer][:n + t], self.v[layer][:n + t], pos
        # the oldest key any new query sees is n − w + 1; read it before the ring is overwritten
        old = torch.arange(max(0, n - w + 1), n, device=dev)
        new = torch.arange(n, n + t, device=dev)
        k = torch.cat([self.k[layer][old % w], k_new])
        v = torch.cat([self.v[layer][old % w], v_new])
        at = self.snapshot_at
        if at is not None and n <= at < n + t:
            self.snapshot[layer] = tuple(
                ring_at(ring, new_kv, n, at, w) for ring, new_kv in
                ((self.k[layer], k_new), (self.v[layer], v_new)))
        keep = new[-w:]
        self.k[layer][keep % w] = k_new[-w:]
        self.v[layer][keep % w] = v_new[-w:]
        return k, v, torch.cat([old, new])

    def advance(self, num_tokens: int) -> None:
        """Count `num_tokens` more tokens as cached, after `update` has stored their K/V in
        every layer; the next call's tokens start at the new `num_tokens`."""
        self.num_tokens += num_tokens

    def prefix_copy(self, n: int) -> "SequenceKV":
        """A new sequence holding a copy of the full layers' K/V of positions 0 … n − 1 (n ≤
        num_tokens), its rings left unwritten for the caller to load from a snapshot (a KV-reuse
        fork, flint_graph/runtime/prefix_cache.py `Match.fork`; the graph engine's counterpart
        is `KVCache.copy_prefix`). Raises torch.OutOfMemoryError when the copy does not fit."""
        seq = SequenceKV(self.windows, self.k[0].shape[1], self.k[0].shape[2],
                         self.k[0].device, dtype=self.k[0].dtype, chunk_tokens=self.chunk_tokens)
        for i, w in enumerate(self.windows):
            if w is None:
                seq.k[i], seq.v[i] = self.k[i][:n].clone(), self.v[i][:n].clone()
        seq.num_tokens = n
        return seq


# -- model -----------------------------------------------------------------------------------


class ReferenceModel:
    """Plain Flint forward on BF16 or NVFP4 weights (dequantised on the fly), CPU or CUDA.

    Linears run on all sequences' new tokens concatenated; attention runs per sequence.
    `act_dtype` is the activation and KV dtype every op rounds to (BF16; tests pass float64);
    `kv_chunk_tokens` (≥ 1) is how many tokens a full-layer cache grows by at a time."""

    def __init__(self, cfg: FlintConfig, weights: FlintWeights,
                 device: torch.device | str | None = None, *,
                 act_dtype: torch.dtype = ACT_DTYPE, kv_chunk_tokens: int = KV_CHUNK_TOKENS):
        if kv_chunk_tokens < 1:
            raise InvalidRequestError(f"kv_chunk_tokens = {kv_chunk_tokens}; expected >= 1")
        self.cfg = cfg
        self.act_dtype, self.kv_chunk_tokens = act_dtype, kv_chunk_tokens
        self.device = torch.device(device) if device is not None else weights.embed.device
        _check_weights(cfg, weights)
        self.weights = weights.to(self.device)
        self.windows = [cfg.sliding_window if cfg.is_sliding(i) else None
                        for i in range(cfg.num_hidden_layers)]

    def new_sequence(self) -> SequenceKV:
        """An empty KV cache for one sequence on the model's device."""
        return SequenceKV(self.windows, self.cfg.num_key_value_heads, self.cfg.head_dim,
                          self.device, dtype=self.act_dtype, chunk_tokens=self.kv_chunk_tokens)

    def forward(self, seqs: list[SequenceKV], tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run tokens[i] (int [T_i], T_i ≥ 1) at positions seqs[i].num_tokens … on, append their
        K/V, and return float32 logits [T_i, V] per sequence.

        Raises InvalidRequestError for mismatched lists, empty/non-1-D/non-integer tokens or
        ids outside [0, V); ContextLengthError past cfg.max_position_embeddings."""
        return self._forward(seqs, tokens, last_only=False)

    def prefill(self, seq: SequenceKV, tokens: torch.Tensor,
                chunk_tokens: int = 2048) -> torch.Tensor:
        """Feed a prompt int [T] in chunks of `chunk_tokens`; return float32 logits [V] of its
        last token. Raises as `forward`, and InvalidRequestError for chunk_tokens < 1."""
        if chunk_tokens < 1:
            raise InvalidRequestError(f"chunk_tokens = {chunk_tokens}; expected >= 1")
        self._check([seq], [tokens])
        for b in range(0, tokens.shape[0], chunk_tokens):
            logits = self._forward([seq], [tokens[b:b + chunk_tokens]], last_only=True)[0]
        return logits[-1]

    def _check(self, seqs: list[SequenceKV], tokens: list[torch.Tensor]) -> None:
        if len(seqs) != len(tokens) or not seqs:
            raise InvalidRequestError(f"forward: {len(seqs)} sequences and {len(tokens)} token "
                                      "tensors; expected the same number, at least 1")
        v, limit = self.cfg.vocab_size, self.cfg.max_position_embeddings
        for i, (s, t) in enumerate(zip(seqs, tokens)):
            if t.dim() != 1 or t.numel() == 0 or t.is_floating_point() or t.is_complex():
                raise InvalidRequestError(f"tokens[{i}]: expected a non-empty 1-D integer "
                                          f"tensor, found {t.dtype} {tuple(t.shape)}")
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= v:
                raise InvalidRequestError(f"tokens[{i}]: ids span [{lo}, {hi}]; expected "
                                          f"[0, vocab_size = {v})")
            if s.num_tokens + t.numel() > limit:
                raise ContextLengthError(
                    f"tokens[{i}]: {s.num_tokens} cached + {t.numel()} new tokens exceed "
                    f"max_position_embeddings = {limit}")

    def _forward(self, seqs: list[SequenceKV], tokens: list[torch.Tensor],
                 last_only: bool, probe=None) -> list[torch.Tensor]:
        cfg, w, dt = self.cfg, self.weights, self.act_dtype
        self._check(seqs, tokens)
        tokens = [t.to(self.device, torch.int64) for t in tokens]
        lens = [t.numel() for t in tokens]
        x = embed(w.embed, torch.cat(tokens), dtype=dt)  # [ΣT, H]
        if probe is not None:
            probe("the embedding", x)
        for i, lw in enumerate(w.layers):
            x = decoder_layer(cfg, lw, i, x, seqs, lens, dtype=dt, probe=probe)
        for s, n in zip(seqs, lens):
            s.advance(n)
        ends = list(itertools.accumulate(lens))
        if last_only:
            x = x[[e - 1 for e in ends]]
            ends = list(range(1, len(lens) + 1))
        h = rms_norm(x, w.final_norm, cfg.rms_norm_eps, dtype=dt)
        logits = lm_head(h, w.lm_head)
        if probe is not None:
            probe("the final norm", h)
            probe("the LM head", logits)
        return list(logits.tensor_split(ends[:-1]))

    def first_non_finite(self, tokens: torch.Tensor, chunk_tokens: int = 2048) -> str | None:
        """Where NaN or inf first appears when int tokens [T] run from an empty cache: "the
        embedding", "layer 3 (attention)", "layer 3 (MoE)" (or "(MLP)"), "the final norm",
        "the LM head"; None when every activation stays finite. A diagnosis for a request that
        ended on non-finite logits (the engine's error path): it reruns the tokens with an
        isfinite check after each block, which the normal forward skips. Raises as
        `prefill`."""
        seen: list[str] = []

        def probe(where: str, x: torch.Tensor) -> None:
            if not seen and not bool(torch.isfinite(x).all()):
                seen.append(where)

        seq = self.new_sequence()
        self._check([seq], [tokens])
        for b in range(0, tokens.shape[0], chunk_tokens):
            self._forward([seq], [tokens[b:b + chunk_tokens]], last_only=True, probe=probe)
            if seen:
                break
        return seen[0] if seen else None


def lm_head(h: torch.Tensor, w: Linear) -> torch.Tensor:
    """Logits float32 [T, V] of the final-normed stream h bf16 [T, H] and the LM head w [V, H]:
    computed in fp32 and not rounded (the graph engine's GEMV rounds them to bf16)."""
    acc = acc_dtype(h)
    return (h.to(acc) @ dense(w, acc).T).float()


def decoder_layer(cfg: FlintConfig, lw: LayerWeights, layer: int, x: torch.Tensor,
                  seqs: list[SequenceKV], lens: list[int], *, dtype: torch.dtype = ACT_DTYPE,
                  routing: tuple[torch.Tensor, torch.Tensor] | None = None,
                  probe=None) -> torch.Tensor:
    """One pre-norm decoder layer (DESIGN §1) on x bf16 [ΣT, H], the new tokens of `seqs`
    (lens[i] each, at positions seqs[i].num_tokens …): attention block then FFN block, each
    added to the residual stream. Stores the tokens' K/V in `seqs` (the caller advances them).
    `routing` overrides the MoE routing as in `moe`; `probe(where, tensor)`, when given, sees
    the attention block's and the FFN block's outputs (`ReferenceModel.first_non_finite`)."""
    eps = cfg.rms_norm_eps
    h = rms_norm(x, lw.attn_norm, eps, dtype=dtype)
    a = linear(attention_block(cfg, lw, layer, h, seqs, lens, dtype=dtype), lw.o_proj,
               dtype=dtype)
    if probe is not None:
        probe(f"layer {layer} (attention)", a)
    x = residual_add(x, a, dtype=dtype)
    h = rms_norm(x, lw.ffn_norm, eps, dtype=dtype)
    if isinstance(lw.ffn, MoEWeights):
        y = moe(h, lw.ffn, cfg.num_experts_per_tok, cfg.routed_scaling_factor,
                cfg.norm_topk_prob, dtype=dtype, routing=routing)
    else:
        y = swiglu(h, lw.ffn.gate, lw.ffn.up, lw.ffn.down, dtype=dtype)
    if probe is not None:
        probe(f"layer {layer} ({'MoE' if isinstance(lw.ffn, MoEWeights) else 'MLP'})", y)
    return residual_add(x, y, dtype=dtype)


def attention_block(cfg: FlintConfig, lw: LayerWeights, layer: int, h: torch.Tensor,
                    seqs: list[SequenceKV], lens: list[int], *,
                    dtype: torch.dtype = ACT_DTYPE) -> torch.Tensor:
    """Q/K/V on all tokens, Q/K norm, RoPE (RoPE layers only), cache update and attention
    per sequence -> bf16 [ΣT, Q] (before the o projection). h bf16 [ΣT, H]."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = linear(h, lw.q_proj, dtype=dtype).view(-1, hq, d)
    k = linear(h, lw.k_proj, dtype=dtype).view(-1, hkv, d)
    v = linear(h, lw.v_proj, dtype=dtype).view(-1, hkv, d)
    if cfg.qk_norm:
        q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps, dtype=dtype)
        k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps, dtype=dtype)
    sinks = lw.sinks if cfg.attention_sinks else None
    window = cfg.sliding_window if cfg.is_sliding(layer) else None
    out = []
    for s, qs, ks, vs in zip(seqs, q.split(lens), k.split(lens), v.split(lens)):
        pos = torch.arange(s.num_tokens, s.num_tokens + qs.shape[0], device=h.device)
        if cfg.uses_rope(layer):
            qs = apply_rope(qs, pos, cfg.rope_theta, dtype=dtype)
            ks = apply_rope(ks, pos, cfg.rope_theta, dtype=dtype)
        k_all, v_all, k_pos = s.update(layer, ks, vs)
        out.append(attention(qs, k_all, v_all, pos, k_pos, sinks, window, dtype=dtype))
    return torch.cat(out).view(-1, hq * d)


def _check_weights(cfg: FlintConfig, w: FlintWeights) -> None:
    """Refuse weights whose layer count or embedding/LM-head shapes disagree with `cfg`."""
    if len(w.layers) != cfg.num_hidden_layers:
        raise CheckpointError(f"weights: {len(w.layers)} layers; expected num_hidden_layers = "
                              f"{cfg.num_hidden_layers}")
    want = (cfg.vocab_size, cfg.hidden_size)
    for name in ("embed", "lm_head"):
        found = tuple(getattr(w, name).shape)
        if found != want:
            raise CheckpointError(f"weights: {name} has shape {found}; expected {want}")
    for i, lw in enumerate(w.layers):
        if isinstance(lw.ffn, MoEWeights) != cfg.is_moe(i):
            kind = "MoE" if cfg.is_moe(i) else "dense MLP"
            raise CheckpointError(f"weights: layer {i} FFN is not a {kind} as the config says")
