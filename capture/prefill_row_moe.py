"""The MoE block of a short prefill chunk on the decode kernels: rows in groups of 32, 16 or 8
(GROUPS), each group one router, gate/up and down launch (kernels/decode/moe_router.py,
moe_gate_up.py, moe_down.py at B = the group's rows: the decode bucket 8 or the prefill-only
row groups 16 and 32 of spec.ROW_GROUPS).

Why: the prefill's grouped GEMMs read BF16 expert weights, so an NVFP4 layer first decodes every
touched expert into a BF16 scratch (nvfp4_unpack): write 4 bytes and read them back per 0.56
bytes of weight. At 25 tokens on the H200 that decode and the GEMMs took ~30 of a 46 ms prefill
(docs/perf-log.md). The decode kernels read the NVFP4 weights as they are (W4A16 in registers)
and fuse the residual add, the FFN norm, the routing, SwiGLU, the weighted combine with the
shared expert and the second residual add; each group reads only the experts its GROUP rows
pick. Their cost grows with the groups (each group reads its experts again), so the prefill
takes this path only up to `Prefill.row_moe_max` rows, and a chunk of up to 32 rows is one
group: in groups of 8, a 25-token NVFP4 prefill spent 8.5 of its 12.7 ms of kernel time in
these launches (4 groups per layer, each re-reading ~40 experts, 2026-12-02 trace).

The rows of a chunk are a batch here: group rows are consecutive chunk rows; padding rows
(row_mask 0) pick no expert, as in decode. Groups run one after another on one set of routing
buffers: each launch reads its predecessor's outputs only after griddepcontrol.wait, so a group
never overwrites what the previous one still reads (the decode step reuses them across layers
the same way).
"""

from __future__ import annotations

import torch

from flint_graph.capture.decode_layer import _weight_args, model_spec
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.weights import MoEWeights, NVFP4Weight

GROUPS = (32, 16, 8)  # group sizes, largest first; a chunk takes the largest that fits
GROUP = min(GROUPS)  # chunk rows must be a multiple of this


class RowGroupMoE:
    """The decode MoE kernels of `kset` at B = GROUP for every MoE layer of `weights`.

    `run(i, x, o, row_mask)`: layer i's residual stream x bf16 [T, H] (the layer input), the o
    projection o bf16 [T, H] and row_mask int32 [T] (0 for padding) -> bf16 [T, H], the layer's
    output x + o + moe(rms_norm(x + o)) with the decode kernels' rounding (tests/
    test_moe_*_gpu.py hold them to the reference). T must be a multiple of GROUP; rows go to
    groups of the largest size in GROUPS that the rows left fill. Raises
    ValueError when a kernel has no specialisation for the config (KernelCacheError /
    LaunchError when the cache lacks it)."""

    def __init__(self, kset, cfg: FlintConfig, layers, groups: tuple[int, ...] | None = None):
        self.cfg = cfg
        # group sizes, largest first (default GROUPS, read now: tools/bench_prefill.py
        # --row-groups compares others); GROUP must be one
        self.sizes = tuple(sorted(GROUPS if groups is None else groups, reverse=True))
        if GROUP not in self.sizes:
            raise ValueError(f"RowGroupMoE: groups {self.sizes} must include {GROUP}")
        k, e = cfg.num_experts_per_tok, cfg.n_routed_experts
        fmt = None
        self.args: dict[int, tuple[list, list]] = {}
        for i, lw in enumerate(layers):
            ffn = lw.ffn
            if not isinstance(ffn, MoEWeights):
                continue
            sh = ffn.shared
            gate_up = _weight_args(ffn.gate, e) + _weight_args(ffn.up, e)
            gate_up += _weight_args(sh.gate) + _weight_args(sh.up)
            down = _weight_args(ffn.down, e) + _weight_args(sh.down)
            self.args[i] = (gate_up, down)
            fmt = int(isinstance(ffn.gate, NVFP4Weight))
        if fmt is None:
            raise ValueError("RowGroupMoE: the model has no MoE layer")

        dev = layers[0].attn_norm.device
        m, ms = cfg.moe_intermediate_size, max(1, cfg.n_shared_experts * cfg.moe_intermediate_size)
        i32, f32, bf16 = torch.int32, torch.float32, torch.bfloat16
        self.counter = torch.zeros(1, dtype=i32, device=dev)  # the router resets it itself

        def t(*shape, dtype=bf16):
            return torch.empty(shape, dtype=dtype, device=dev)

        self.groups = {}  # rows -> (router, gate_up, down, buffers)
        for b in self.sizes:
            def pick(name, **want):
                spec = model_spec(kset.defs[name], cfg, b, **want)
                return kset.get(name, **spec.as_dict())

            s = min(e, b * k)
            bufs = dict(ids=t(b, k, dtype=i32), weights=t(b, k, dtype=f32),
                        experts=t(s, dtype=i32), slot_w=t(s, b, dtype=f32),
                        scores=t(b, e, dtype=f32), act=t(s, b, m), act_sh=t(b, ms))
            self.groups[b] = (pick("moe_router"), pick("moe_gate_up", TOPK=k, FMT=fmt),
                              pick("moe_down", TOPK=k, FMT=fmt), bufs)

    def run(self, i: int, lw, x: torch.Tensor, o: torch.Tensor,
            row_mask: torch.Tensor) -> torch.Tensor:
        """Layer i (weights lw) as above; returns a new tensor."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        t = x.shape[0]
        if t % GROUP:
            raise ValueError(f"RowGroupMoE: {t} rows; expected a multiple of {GROUP}")
        ffn = lw.ffn
        gate_up_w, down_w = self.args[i]
        residual2, h, out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        for r0, b in group_rows(t, self.sizes):
            router, gate_up, down, bf = self.groups[b]
            g = slice(r0, r0 + b)
            router.launch(o[g], x[g], row_mask[g], lw.ffn_norm, ffn.router, ffn.router_bias,
                          residual2[g], h[g], bf["ids"], bf["weights"], bf["experts"],
                          bf["slot_w"], bf["scores"], self.counter, eps,
                          cfg.routed_scaling_factor)
            gate_up.launch(h[g], bf["experts"], *gate_up_w, bf["act"], bf["act_sh"])
            down.launch(bf["act"], bf["act_sh"], bf["experts"], bf["slot_w"], residual2[g],
                        *down_w, out[g])
        return out


def group_rows(t: int, sizes: tuple[int, ...] = GROUPS) -> list[tuple[int, int]]:
    """(first row, rows) of each group of a t-row chunk (t a multiple of GROUP): the largest
    of `sizes` (descending, GROUP last) that the rows left fill, e.g. 56 -> (0, 32),
    (32, 16), (48, 8)."""
    out, r0 = [], 0
    while r0 < t:
        b = next(b for b in sizes if b <= t - r0)
        out.append((r0, b))
        r0 += b
    return out
