"""The MoE block of a short prefill chunk on the decode kernels: rows in groups of GROUP, each
group one decode step's router, gate/up and down launches (kernels/decode/moe_router.py,
moe_gate_up.py, moe_down.py at bucket B = GROUP).

Why: the prefill's grouped GEMMs read BF16 expert weights, so an NVFP4 layer first decodes every
touched expert into a BF16 scratch (nvfp4_unpack): write 4 bytes and read them back per 0.56
bytes of weight. At 25 tokens on the H200 that decode and the GEMMs took ~30 of a 46 ms prefill
(docs/perf-log.md). The decode kernels read the NVFP4 weights as they are (W4A16 in registers)
and fuse the residual add, the FFN norm, the routing, SwiGLU, the weighted combine with the
shared expert and the second residual add; each group reads only the experts its GROUP rows
pick. Their cost grows with the groups (each group reads its experts again), so the prefill
takes this path only up to `Prefill.row_moe_max` rows.

The rows of a chunk are a batch here: row r of group g is chunk row g·GROUP + r; padding rows
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

GROUP = 8  # rows per group: the decode kernels' largest bucket


class RowGroupMoE:
    """The decode MoE kernels of `kset` at B = GROUP for every MoE layer of `weights`.

    `run(i, x, o, row_mask)`: layer i's residual stream x bf16 [T, H] (the layer input), the o
    projection o bf16 [T, H] and row_mask int32 [T] (0 for padding) -> bf16 [T, H], the layer's
    output x + o + moe(rms_norm(x + o)) with the decode kernels' rounding (tests/
    test_moe_*_gpu.py hold them to the reference). T must be a multiple of GROUP. Raises
    ValueError when a kernel has no specialisation for the config (KernelCacheError /
    LaunchError when the cache lacks it)."""

    def __init__(self, kset, cfg: FlintConfig, layers):
        self.cfg = cfg
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
            routed_down = _weight_args(ffn.down, e)
            gate_up += routed_down[:2]  # codes and scales (BF16: the matrix), for PD's prefetch
            down = routed_down + _weight_args(sh.down)
            self.args[i] = (gate_up, down)
            fmt = int(isinstance(ffn.gate, NVFP4Weight))
        if fmt is None:
            raise ValueError("RowGroupMoE: the model has no MoE layer")

        def pick(name, **want):
            spec = model_spec(kset.defs[name], cfg, GROUP, **want)
            return kset.get(name, **spec.as_dict())

        self.router = pick("moe_router")
        self.gate_up = pick("moe_gate_up", TOPK=k, FMT=fmt)
        self.down = pick("moe_down", TOPK=k, FMT=fmt)
        dev = layers[0].attn_norm.device
        s, m = min(e, GROUP * k), cfg.moe_intermediate_size
        ms = max(1, cfg.n_shared_experts * m)
        i32, f32, bf16 = torch.int32, torch.float32, torch.bfloat16

        def t(*shape, dtype=bf16):
            return torch.empty(shape, dtype=dtype, device=dev)

        self.ids, self.weights = t(GROUP, k, dtype=i32), t(GROUP, k, dtype=f32)
        self.experts, self.slot_w = t(s, dtype=i32), t(s, GROUP, dtype=f32)
        self.scores = t(GROUP, e, dtype=f32)
        self.counter = torch.zeros(1, dtype=i32, device=dev)  # the router resets it itself
        self.act, self.act_sh = t(s, GROUP, m), t(GROUP, ms)

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
        for r0 in range(0, t, GROUP):
            g = slice(r0, r0 + GROUP)
            self.router.launch(o[g], x[g], row_mask[g], lw.ffn_norm, ffn.router,
                               ffn.router_bias, residual2[g], h[g], self.ids, self.weights,
                               self.experts, self.slot_w, self.scores, self.counter, eps,
                               cfg.routed_scaling_factor)
            self.gate_up.launch(h[g], self.experts, *gate_up_w, self.act, self.act_sh)
            self.down.launch(self.act, self.act_sh, self.experts, self.slot_w, residual2[g],
                             *down_w, out[g])
        return out
