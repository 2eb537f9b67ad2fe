"""Seeded synthetic Flint weights for any config, generated in memory (DESIGN §2 "Synthetic
checkpoints"): the tiny config on a CPU in milliseconds, the full 40B config straight on a GPU.

Scales (std of a truncated normal, cut at ±CLIP_SIGMAS so NVFP4 blocks see no outliers):
- embed: 1, so the residual stream starts at RMS ~1.
- q/k/v, dense and expert gate/up: 1/sqrt(fan_in); their input is RMS-normed, so outputs are ~1.
- o_proj and down: gain/sqrt(fan_in) with gain = `residual_gain(cfg)` = 1/sqrt(layers). Their
  inputs have RMS <= ~1 (attention averages values; silu(g)*u has RMS ~0.6), so each of the
  2 * layers residual branches adds variance <= 1/layers and the stream ends below RMS sqrt(3)
  whatever the depth. Expert down is further divided by routed_scaling_factor, because the
  routed weights sum to that factor instead of 1.
- router: 1/sqrt(H), giving router logits ~N(0, 1) that differ per token, so top-k picks spread
  over all experts; router_bias ~N(0, ROUTER_BIAS_STD). The bias must stay small next to the
  score gaps at the top-k cut: for top-6 of 256 the cut sits ~2.6σ out where sigmoid's slope
  is ~0.06, so a bias of std 0.02 would already shift an expert's pick rate by ~2.5x.
- norms: 1 + NORM_JITTER * N(0, 1), except q_norm/k_norm, which are QK_NORM_GAIN times that:
  Q/K norm makes every head RMS 1, so attention logits q·k/sqrt(D) have std QK_NORM_GAIN² = 2,
  sharp enough that a query leans on ~10 of 513 keys instead of averaging them all (with std
  1 the full config's attention output is a near-uniform average of RMS ~0.1).
- sinks ~N(0, 1); lm_head LOGIT_STD/sqrt(H), peaked enough that greedy choices are not coin
  flips between near-ties.

Each part draws from its own torch.Generator on `device`, seeded from (seed, part), so the same
seed gives bit-identical weights on the same device type (CUDA RNG output may differ between
GPU models and between CPU and CUDA), and one layer can be made alone (`make_layer_weights`),
which is how a checkpoint writer streams the full config. Everything is drawn directly in BF16
on `device` and scaled in place: no FP32 copy of a large tensor is ever made.
"""

from __future__ import annotations

import math

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ConfigError
from flint_graph.terminal.progress import progress_bar
from flint_graph.checkpoints.weights import FlintWeights, LayerWeights, MLPWeights, MoEWeights

CLIP_SIGMAS = 3.0
NORM_JITTER = 0.05
ROUTER_BIAS_STD = 0.005
LOGIT_STD = 2.0
QK_NORM_GAIN = math.sqrt(2.0)

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, part) over 63 bits
_PART_EMBED = 0
_PART_HEAD = 1
_PART_LAYER0 = 2


def _generator(seed: int, part: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * _SEED_MIX + part * 0x632BE59BD9B4E019 + 1) % (2**63 - 1))
    return g


def _normal(shape: tuple[int, ...], std: float, g: torch.Generator, device: torch.device,
            dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """N(0, std²) clipped at ±CLIP_SIGMAS·std, drawn directly in `dtype` on `device`."""
    t = torch.randn(shape, generator=g, device=device, dtype=dtype)
    t.clamp_(-CLIP_SIGMAS, CLIP_SIGMAS)
    return t.mul_(std)


def _norm_weight(n: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    return _normal((n,), NORM_JITTER, g, device).add_(1.0)


def _mlp(h: int, f: int, down_std: float, g: torch.Generator,
         device: torch.device) -> MLPWeights:
    return MLPWeights(
        gate=_normal((f, h), 1 / math.sqrt(h), g, device),
        up=_normal((f, h), 1 / math.sqrt(h), g, device),
        down=_normal((h, f), down_std, g, device),
    )


def residual_gain(cfg: FlintConfig) -> float:
    """Std multiplier of the residual-branch outputs (o_proj, down): 1/sqrt(layers)."""
    return 1 / math.sqrt(cfg.num_hidden_layers)


def make_layer_weights(cfg: FlintConfig, seed: int, layer: int,
                       device: torch.device | str = "cpu") -> LayerWeights:
    """Weights of decoder layer `layer` alone; identical to `make_weights(...).layers[layer]`.

    Shapes/dtypes as in `LayerWeights`: BF16 linears [out, in], norms bf16, sinks float32
    [num_heads]; MoE router float32 [E, H], router_bias float32 [E], stacks bf16 [E, M, H] /
    [E, H, M]. Raises ConfigError when `layer` is out of range.
    """
    if not 0 <= layer < cfg.num_hidden_layers:
        raise ConfigError(f"layer {layer}; expected 0 <= layer < num_hidden_layers = "
                          f"{cfg.num_hidden_layers}")
    dev = torch.device(device)
    g = _generator(seed, _PART_LAYER0 + layer, dev)
    h, q, kv, d = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.head_dim
    gain = residual_gain(cfg)
    attn = dict(
        attn_norm=_norm_weight(h, g, dev),
        q_proj=_normal((q, h), 1 / math.sqrt(h), g, dev),
        k_proj=_normal((kv, h), 1 / math.sqrt(h), g, dev),
        v_proj=_normal((kv, h), 1 / math.sqrt(h), g, dev),
        o_proj=_normal((h, q), gain / math.sqrt(q), g, dev),
        q_norm=_norm_weight(d, g, dev).mul_(QK_NORM_GAIN),
        k_norm=_norm_weight(d, g, dev).mul_(QK_NORM_GAIN),
        sinks=_normal((cfg.num_attention_heads,), 1.0, g, dev, torch.float32),
        ffn_norm=_norm_weight(h, g, dev),
    )
    if not cfg.is_moe(layer):
        f = cfg.intermediate_size
        return LayerWeights(**attn, ffn=_mlp(h, f, gain / math.sqrt(f), g, dev))
    e, m = cfg.n_routed_experts, cfg.moe_intermediate_size
    shared = None
    if cfg.n_shared_experts > 0:
        fs = cfg.n_shared_experts * m
        shared = _mlp(h, fs, gain / math.sqrt(fs), g, dev)
    expert_down_std = gain / math.sqrt(m) / cfg.routed_scaling_factor
    moe = MoEWeights(
        router=_normal((e, h), 1 / math.sqrt(h), g, dev, torch.float32),
        router_bias=_normal((e,), ROUTER_BIAS_STD, g, dev, torch.float32),
        gate=_normal((e, m, h), 1 / math.sqrt(h), g, dev),  # [E, M, H]
        up=_normal((e, m, h), 1 / math.sqrt(h), g, dev),  # [E, M, H]
        down=_normal((e, h, m), expert_down_std, g, dev),  # [E, H, M]
        shared=shared,
    )
    return LayerWeights(**attn, ffn=moe)


def make_weights(cfg: FlintConfig, seed: int, device: torch.device | str = "cpu",
                 progress: bool = False, layer_hook=None) -> FlintWeights:
    """All weights of `cfg`, seeded by `seed`, generated directly on `device` (BF16 linears in
    HF orientation [out, in], see `flint_graph.checkpoints.weights`).

    Deterministic: the same (cfg, seed) on the same device type gives bit-identical tensors.
    The full config needs ~80 GB of device memory (BF16). `progress` shows a rich progress bar
    (one step per layer; on CUDA each step waits for its kernels so the bar is honest).
    layer_hook(LayerWeights), if given, runs on each layer as soon as it is made (e.g.
    `make_checkpoint.make_nvfp4_weights` snaps it to NVFP4, so the BF16 model never exists).
    """
    dev = torch.device(device)
    h, v = cfg.hidden_size, cfg.vocab_size

    def step(advance) -> None:
        if progress and dev.type == "cuda":
            torch.cuda.synchronize(dev)  # so the bar shows finished work, not queued kernels
        advance(1)

    with progress_bar(progress, "synthetic weights", cfg.num_hidden_layers + 2,
                      unit="steps") as advance:
        g = _generator(seed, _PART_EMBED, dev)
        embed = _normal((v, h), 1.0, g, dev)
        step(advance)
        layers = []
        for i in range(cfg.num_hidden_layers):
            layers.append(make_layer_weights(cfg, seed, i, dev))
            if layer_hook is not None:
                layer_hook(layers[-1])
            step(advance)
        g = _generator(seed, _PART_HEAD, dev)
        final_norm = _norm_weight(h, g, dev)
        lm_head = _normal((v, h), LOGIT_STD / math.sqrt(h), g, dev)
        step(advance)
    return FlintWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
