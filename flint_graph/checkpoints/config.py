"""Model facts (`FlintConfig`) from an HF-style config.json, cross-checked with GGUF metadata.

Follows DESIGN.md §1-§2 and `presets/full.json` (our reconstruction of the 40B config). Nothing
architectural is hard-coded elsewhere: layer kinds, window, heads, experts and vocab are read here.
Every validation failure raises `ConfigError` naming the field, the expected and the found value.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from flint_graph.errors import ConfigError, kind as json_kind, shown
from flint_graph.checkpoints.jsonfile import read_json_object

SLIDING = "sliding_attention"
FULL = "full_attention"
ARCHITECTURE = "FlintForCausalLM"
PRESETS = ("tiny", "full", "nano")  # nano: flint-nano's shape (issue 11), every feature at small scale

# NVFP4 quantises along K in 64-value GGML blocks (DESIGN §2), so every K of a linear must divide.
NVFP4_BLOCK = 64

# Upper bounds of the size fields, far above any real Flint (40B: 49 layers, 256 experts, hidden
# 2048, 262K context): a config past them is refused before tensors, lists or caches are sized
# from it (issue 26: num_hidden_layers 1e6 hung building the expected-tensor list).
SIZE_LIMITS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_hidden_layers": 1024,
               "sliding_window": 1 << 24, "num_attention_heads": 1024,
               "num_key_value_heads": 1024, "head_dim": 1024,
               "max_position_embeddings": 1 << 24, "intermediate_size": 1 << 20,
               "moe_intermediate_size": 1 << 18, "n_routed_experts": 4096,
               "num_experts_per_tok": 256, "n_shared_experts": 64}
GGUF_ARCH = "flint"
# config.json's torch_dtype / dtype: the weights' dtype as HF names it (loading checks tensors)
WEIGHT_DTYPES = ("bfloat16", "float16", "float32", "auto")
GGML_EXPERT_GATING_SIGMOID = 2  # llama.cpp LLM_EXPERT_GATING_FUNC_TYPE_SIGMOID
# The `flint.*` keys DESIGN §2 names: a Flint GGUF must carry them.
GGUF_REQUIRED_KEYS = (
    "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
    "attention.sliding_window", "attention.sliding_window_pattern", "expert_count",
    "expert_used_count", "expert_shared_count", "leading_dense_block_count",
    "expert_gating_func", "expert_weights_norm", "expert_weights_scale")


def _unscaled_rope(scaling: Any) -> bool:
    """Whether a config.json `rope_scaling` / `rope_parameters` value means plain RoPE: absent
    or null, {}, Hugging Face's explicit {"rope_type": "default"} (older files: "type"), or a
    "default" or "linear" one with factor 1; `rope_theta` inside it is checked elsewhere."""
    if scaling is None or scaling == {}:
        return True
    if not isinstance(scaling, dict):
        return False
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    rest = set(scaling) - {"rope_type", "type", "rope_theta"}
    factor = scaling.get("factor", 1.0)
    one = isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor == 1.0
    return kind in ("default", "linear") and rest <= {"factor"} and one


def _check_rope_fields(raw: dict[str, Any], source: str) -> None:
    """Refuse what would change RoPE's angles and this runtime would otherwise ignore: a scaled
    RoPE under `rope_scaling` or transformers v5's `rope_parameters` (YaRN, dynamic, linear
    with a factor...), a `rope_theta` there that disagrees with the top-level one, or a
    `partial_rotary_factor` other than 1 (Flint rotates the whole head). Raises ConfigError
    naming the field."""
    for name in ("rope_scaling", "rope_parameters"):
        value = raw.get(name)
        if not _unscaled_rope(value):
            raise ConfigError(f"{source}: field {name!r}: Flint's RoPE is unscaled (rope_theta "
                              f"alone); found {shown(value, 80)}, which this runtime does not "
                              "implement; expected null, no field or {\"rope_type\": "
                              "\"default\"}")
        theta = value.get("rope_theta") if isinstance(value, dict) else None
        if theta is not None and theta != raw.get("rope_theta", theta):
            raise ConfigError(f"{source}: field {name!r}: rope_theta {shown(theta, 40)} "
                              f"disagrees with the top-level rope_theta "
                              f"{shown(raw.get('rope_theta'), 40)}")
    partial = raw.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        raise ConfigError(f"{source}: field 'partial_rotary_factor': Flint rotates the whole "
                          f"head (1); found {shown(partial, 40)}, which this runtime does not "
                          "implement")


@dataclass(frozen=True)
class FlintConfig:
    """The Flint architecture, one field per config.json key (units in the trailing comments)."""

    vocab_size: int  # rows of the embedding and LM head (may exceed the tokenizer's size)
    hidden_size: int  # residual stream width
    num_hidden_layers: int  # decoder layers
    layer_types: tuple[str, ...]  # per layer: "sliding_attention" (RoPE) | "full_attention" (NoPE)
    sliding_window: int  # keys a sliding layer sees, the current one included (tokens)
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # KV heads (GQA)
    head_dim: int  # per head
    attention_sinks: bool  # one learned sink logit per query head
    qk_norm: bool  # RMSNorm over head_dim on every q and k head
    rope_theta: float  # RoPE base
    rope_layers: str  # layer type that gets RoPE; the other kind is NoPE
    max_position_embeddings: int  # context limit (tokens)
    rms_norm_eps: float
    hidden_act: str  # "silu" (SwiGLU)
    first_k_dense_replace: int  # leading layers with a dense MLP instead of MoE
    intermediate_size: int  # dense MLP width
    moe_intermediate_size: int  # routed and shared expert width
    n_routed_experts: int
    num_experts_per_tok: int  # top-k
    n_shared_experts: int
    scoring_func: str  # "sigmoid"
    topk_method: str  # "noaux_tc": pick with e_score_correction_bias, weigh without
    n_group: int
    topk_group: int
    norm_topk_prob: bool  # renormalise the picked weights to sum 1
    routed_scaling_factor: float  # applied after renormalisation
    tie_word_embeddings: bool
    attention_bias: bool

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> FlintConfig:
        """Build and validate from a parsed config.json mapping.

        Raises ConfigError naming `source` and the field for an unknown architecture, a missing
        or mistyped field, an inconsistent value, or a scaled RoPE (`rope_scaling` or
        `rope_parameters`: YaRN, dynamic, ...; `partial_rotary_factor`), which would otherwise
        be ignored and every rotation silently wrong.
        """
        archs = raw.get("architectures") or []
        if not isinstance(archs, list):
            raise ConfigError(f"{source}: field 'architectures': expected a list of names, "
                              f"found {json_kind(archs)}")
        if ARCHITECTURE not in archs and raw.get("model_type") != GGUF_ARCH:
            raise ConfigError(
                f"{source}: unknown architecture {shown(archs or raw.get('model_type'), 80)}; "
                f"expected architectures to contain {ARCHITECTURE!r} (model_type 'flint')"
            )
        kind = raw.get("model_type")
        if kind not in (None, GGUF_ARCH):  # architectures alone had let "llama" through
            raise ConfigError(f"{source}: field 'model_type': expected {GGUF_ARCH!r} (or none), "
                              f"found {shown(kind, 80)}")
        for key in ("torch_dtype", "dtype"):  # HF's name for it, old and new
            if raw.get(key) is not None and raw[key] not in WEIGHT_DTYPES:  # null: unset
                raise ConfigError(f"{source}: field {key!r}: expected one of "
                                  f"{', '.join(WEIGHT_DTYPES)}, found {shown(raw[key], 80)}")
        _check_rope_fields(raw, source)  # a scaled RoPE changes every sliding layer's angles
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in raw:
                raise ConfigError(f"{source}: missing field {f.name!r}")
            values[f.name] = _coerce(source, f.name, f.type, raw[f.name])
        cfg = cls(**values)
        cfg.validate(source)
        return cfg

    @classmethod
    def from_json(cls, path: str | Path) -> FlintConfig:
        """Read `path` (a config.json file or a directory holding one).

        Raises ConfigError naming the path when it is missing or not JSON.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        raw = read_json_object(path, ConfigError, "config file not found")
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def preset(cls, name: str) -> FlintConfig:
        """The packaged `tiny` (CPU-sized, every feature present), `nano` (flint-nano: Flint's
        layer pattern, window, GQA group and head size at ~16M parameters) or `full` (40B)
        config."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
        text = resources.files("flint_graph.presets").joinpath(f"{name}.json").read_text()
        return cls.from_dict(json.loads(text), source=f"preset {name}")

    def to_dict(self) -> dict[str, Any]:
        """The config.json mapping (with `architectures` and `model_type`)."""
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        return {"architectures": [ARCHITECTURE], "model_type": GGUF_ARCH, **d,
                "torch_dtype": "bfloat16"}

    # -- validation ---------------------------------------------------------------------------

    def validate(self, source: str = "config") -> None:
        """Raise ConfigError for the first inconsistent field (names field, expected, found)."""

        def bad(name: str, expected: str) -> ConfigError:
            return ConfigError(
                f"{source}: field {name!r} = {shown(getattr(self, name))}; expected {expected}"
            )

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "sliding_window",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings", "intermediate_size", "moe_intermediate_size",
                     "n_routed_experts", "num_experts_per_tok"):
            if getattr(self, name) <= 0:
                raise bad(name, "a positive integer")
            if getattr(self, name) > SIZE_LIMITS[name]:
                raise bad(name, f"at most {SIZE_LIMITS[name]:,} (sizes are bounded before "
                                "anything is allocated or built from them)")
        if self.sliding_window > self.max_position_embeddings:
            raise bad("sliding_window",
                      f"at most max_position_embeddings = {self.max_position_embeddings}")
        if self.n_shared_experts > SIZE_LIMITS["n_shared_experts"]:
            raise bad("n_shared_experts", f"at most {SIZE_LIMITS['n_shared_experts']}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{source}: field 'layer_types' has {len(self.layer_types)} entries; expected "
                f"num_hidden_layers = {self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in (SLIDING, FULL):
                raise ConfigError(
                    f"{source}: layer_types[{i}] = {shown(kind)}; expected {shown(SLIDING)} or "
                    f"{shown(FULL)}"
                )
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad("num_attention_heads",
                      f"a multiple of num_key_value_heads = {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise bad("head_dim", "an even number (RoPE rotates pairs)")
        if self.rope_layers not in (SLIDING, FULL):
            raise bad("rope_layers", f"{SLIDING!r} or {FULL!r}")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise bad("first_k_dense_replace", f"between 0 and {self.num_hidden_layers}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise bad("num_experts_per_tok", f"at most n_routed_experts = {self.n_routed_experts}")
        if self.n_shared_experts < 0:
            raise bad("n_shared_experts", "0 or more")
        for name, want in (("hidden_act", "silu"), ("scoring_func", "sigmoid"),
                           ("topk_method", "noaux_tc")):
            if getattr(self, name) != want:
                raise bad(name, f"{want!r} (the only value Flint uses)")
        for name in ("n_group", "topk_group"):  # name the field that is wrong
            if getattr(self, name) != 1:
                raise bad(name, "1 (grouped routing is not part of Flint)")
        if self.attention_bias:
            raise bad("attention_bias", "false (Flint's projections have no bias)")
        if self.tie_word_embeddings:
            raise bad("tie_word_embeddings", "false (Flint ships a separate lm_head)")
        for name, top in (("rms_norm_eps", 0.1), ("rope_theta", 1e12),
                          ("routed_scaling_factor", 1e3)):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= top):
                # far past any real model's value, each makes every activation 0 or inf
                raise bad(name, f"a positive number at most {top:g}")
        for name, k in self.nvfp4_k_dims().items():
            if k % NVFP4_BLOCK:
                raise ConfigError(
                    f"{source}: {name} = {k} is the K dimension of an NVFP4 linear; expected a "
                    f"multiple of {NVFP4_BLOCK}"
                )

    def nvfp4_k_dims(self) -> dict[str, int]:
        """Every K (input) dimension an NVFP4 linear has, keyed by the field that sets it."""
        return {
            "hidden_size": self.hidden_size,
            "num_attention_heads * head_dim": self.q_dim,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
        }

    def dense_linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(N, K) of every non-expert linear a decode step runs as a GEMV: the attention
        projections (also as one fused qkv_proj over the stacked q, k, v weights), the dense
        MLP of the leading layers and the LM head."""
        h, i = self.hidden_size, self.intermediate_size
        return {"q_proj": (self.q_dim, h), "k_proj": (self.kv_dim, h), "v_proj": (self.kv_dim, h),
                "qkv_proj": (self.q_dim + 2 * self.kv_dim, h),
                "o_proj": (h, self.q_dim), "gate_proj": (i, h), "up_proj": (i, h),
                "down_proj": (h, i), "lm_head": (self.vocab_size, h)}

    # -- layer structure ----------------------------------------------------------------------

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (elements)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all KV heads together (elements)."""
        return self.num_key_value_heads * self.head_dim

    def is_sliding(self, layer: int) -> bool:
        """True when `layer` is a sliding-window layer."""
        return self.layer_types[layer] == SLIDING

    def uses_rope(self, layer: int) -> bool:
        """True when `layer` applies RoPE (Flint: the sliding layers; full layers are NoPE)."""
        return self.layer_types[layer] == self.rope_layers

    def is_moe(self, layer: int) -> bool:
        """True when `layer`'s FFN is the routed MoE (False: dense SwiGLU MLP)."""
        return layer >= self.first_k_dense_replace

    @property
    def num_sliding_layers(self) -> int:
        """Layers with sliding-window attention."""
        return sum(t == SLIDING for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        """Layers with full-context attention."""
        return sum(t == FULL for t in self.layer_types)

    # -- derived figures (bench) --------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """BF16 K+V bytes one token adds over the full layers (sliding layers use fixed rings).

        Full 40B config: 14 layers x 2 x 4 heads x 128 x 2 bytes = 28,672 bytes (28 KiB).
        """
        return self.num_full_layers * 2 * self.kv_dim * 2

    @property
    def sliding_kv_bytes_per_slot(self) -> int:
        """BF16 bytes of the sliding-window rings of one sequence (window entries per layer)."""
        return self.num_sliding_layers * self.sliding_window * 2 * self.kv_dim * 2

    def param_counts(self) -> dict[str, int]:
        """Parameter counts by part: attention, dense_mlp, expert (one routed expert, one
        layer), shared, router, norms, embed, lm_head."""
        h, layers = self.hidden_size, self.num_hidden_layers
        n_moe = layers - self.first_k_dense_replace
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        return {
            "attention": layers * attn,
            "attention_small": layers * (2 * self.head_dim + self.num_attention_heads + 2 * h),
            "dense_mlp": self.first_k_dense_replace * 3 * h * self.intermediate_size,
            "expert": 3 * h * self.moe_intermediate_size,
            "routed": n_moe * self.n_routed_experts * 3 * h * self.moe_intermediate_size,
            "shared": n_moe * self.n_shared_experts * 3 * h * self.moe_intermediate_size,
            "router": n_moe * self.n_routed_experts * (h + 1),
            "embed": self.vocab_size * h,
            "lm_head": self.vocab_size * h + h,
        }

    @property
    def total_params(self) -> int:
        """All parameters (elements), embeddings and LM head included."""
        c = self.param_counts()
        return sum(v for k, v in c.items() if k != "expert")

    @property
    def active_params(self) -> int:
        """Parameters one token touches: top-k routed experts per MoE layer, one embedding row
        excluded (a gather), the LM head included."""
        c = self.param_counts()
        n_moe = self.num_hidden_layers - self.first_k_dense_replace
        return (c["attention"] + c["attention_small"] + c["dense_mlp"] + c["shared"]
                + c["router"] + c["lm_head"] + n_moe * self.num_experts_per_tok * c["expert"])

    def prefill_flops(self, tokens: int, start: int = 0) -> dict[str, float]:
        """Matmul FLOPs of prefilling `tokens` tokens after `start` cached ones (2 per
        multiply-add), counted from the config: {"linear", "attention", "lm_head", "total"}.

        linear: 2 × the parameters a token touches in its projections, router, dense MLP,
        shared and top-k experts (DESIGN §3: 4.24 GFLOP per token at full size); attention:
        4·D·Hq per visible (query, key) pair (QKᵀ and PV; causal, the window on sliding layers);
        lm_head: 2·V·H for the last token only."""
        c = self.param_counts()
        per_token = 2 * (self.active_params - c["lm_head"])
        pairs_full = sum(start + i + 1 for i in range(tokens)) if tokens < 4096 else (
            tokens * start + tokens * (tokens + 1) // 2)
        w = self.sliding_window
        pairs_sliding = sum(min(start + i + 1, w) for i in range(tokens))
        attn = 4 * self.head_dim * self.num_attention_heads * (
            self.num_full_layers * pairs_full + self.num_sliding_layers * pairs_sliding)
        head = 2 * self.vocab_size * self.hidden_size
        linear = float(per_token * tokens)
        return {"linear": linear, "attention": float(attn), "lm_head": float(head),
                "total": linear + attn + head}

    def expected_experts_touched(self, batch: int) -> float:
        """Expected distinct routed experts per MoE layer for `batch` tokens routed uniformly
        at random: E * (1 - (1 - k/E)^batch)."""
        e, k = self.n_routed_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** batch)

    def decode_step_bytes(self, batch: int, context_tokens: int, weight_format: str,
                          lm_head_bf16: bool = True) -> dict[str, float]:
        """Fewest bytes one decode step must read: weights once, KV of every sequence.

        Args:
            batch: rows in the step (sequences).
            context_tokens: tokens already in each sequence's KV cache.
            weight_format: "bf16" (2 bytes/param) or "nvfp4" (0.5 byte codes + 1/16 byte E4M3
                scale per param = 0.5625 bytes) for the linears; norms, sinks and the FP32
                router are counted at their stored width.
            lm_head_bf16: count the LM head at 2 bytes/param (DESIGN §5 keeps it BF16).

        Returns: {"weights", "kv", "total"} in bytes. Raises ConfigError for an unknown format.
        """
        if weight_format not in ("bf16", "nvfp4"):
            raise ConfigError(f"weight_format {weight_format!r}; expected 'bf16' or 'nvfp4'")
        per = 2.0 if weight_format == "bf16" else 0.5 + 1 / 16
        c = self.param_counts()
        n_moe = self.num_hidden_layers - self.first_k_dense_replace
        linears = (c["attention"] + c["dense_mlp"] + c["shared"]
                   + n_moe * self.expected_experts_touched(batch) * c["expert"])
        head = self.vocab_size * self.hidden_size * (2.0 if lm_head_bf16 else per)
        small = 2 * c["attention_small"] + 4 * c["router"]
        embed_rows = batch * self.hidden_size * 2
        weights = linears * per + head + small + embed_rows
        # A sliding layer reads at most its window of keys.
        window_fraction = min(context_tokens, self.sliding_window) / self.sliding_window
        kv = batch * (self.kv_bytes_per_token * context_tokens
                      + self.sliding_kv_bytes_per_slot * window_fraction)
        return {"weights": weights, "kv": float(kv), "total": weights + kv}

    # -- GGUF metadata ------------------------------------------------------------------------

    def gguf_metadata(self) -> dict[str, Any]:
        """The `flint.*` GGUF metadata this config implies (DESIGN §2), key -> value.

        Used by the writer and, key by key, by the loader's cross-check.
        """
        a = GGUF_ARCH
        return {
            f"{a}.vocab_size": self.vocab_size,
            f"{a}.context_length": self.max_position_embeddings,
            f"{a}.embedding_length": self.hidden_size,
            f"{a}.block_count": self.num_hidden_layers,
            f"{a}.feed_forward_length": self.intermediate_size,
            f"{a}.expert_feed_forward_length": self.moe_intermediate_size,
            f"{a}.attention.head_count": self.num_attention_heads,
            f"{a}.attention.head_count_kv": self.num_key_value_heads,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.sliding_window": self.sliding_window,
            f"{a}.attention.sliding_window_pattern": [t == SLIDING for t in self.layer_types],
            f"{a}.attention.layer_norm_rms_epsilon": self.rms_norm_eps,
            f"{a}.rope.freq_base": self.rope_theta,
            f"{a}.expert_count": self.n_routed_experts,
            f"{a}.expert_used_count": self.num_experts_per_tok,
            f"{a}.expert_shared_count": self.n_shared_experts,
            f"{a}.leading_dense_block_count": self.first_k_dense_replace,
            f"{a}.expert_gating_func": GGML_EXPERT_GATING_SIGMOID,
            f"{a}.expert_weights_norm": self.norm_topk_prob,
            f"{a}.expert_weights_scale": self.routed_scaling_factor,
        }

    def check_gguf_metadata(self, found: dict[str, Any], source: str) -> None:
        """Refuse GGUF metadata that disagrees with this config.

        Args:
            found: key -> value read from the GGUF (`general.architecture` is checked by the
                loader). The structural keys DESIGN §2 lists must be present; the others
                (context length, rope base, ...) are compared when present.
            source: the GGUF path, for the message.
        Raises ConfigError naming the key, the config.json value and the GGUF value, or the
        missing key.
        """
        for key in found:  # llama.cpp's names for a scaled RoPE: ignored, every angle differs
            if key.startswith(f"{GGUF_ARCH}.rope.scaling.") and not (
                    key.endswith(".type") and found[key] in ("none", "linear")
                    or key.endswith(".factor") and _plain(found[key]) in (0, 1)):
                raise ConfigError(f"{source}: GGUF metadata {key} = {_plain(found[key])!r}: "
                                  "Flint's RoPE is unscaled, which this runtime implements "
                                  "alone; expected no rope.scaling keys")
        for key, want in self.gguf_metadata().items():
            if key not in found:
                if key.removeprefix(f"{GGUF_ARCH}.") in GGUF_REQUIRED_KEYS:
                    raise ConfigError(f"{source}: GGUF metadata lacks {key} (config.json has "
                                      f"{_plain(want)!r}); expected it in a Flint GGUF")
                continue
            got = _plain(found[key])
            kind = _kind(want)
            if _kind(got) != kind and not (kind == "a number" and _kind(got) == "an integer"):
                shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:60] + "…"
                raise ConfigError(f"{source}: GGUF metadata {key} = {shown}: expected {kind} "
                                  f"(config.json has {_plain(want)!r})")
            same = (math.isclose(float(got), float(want), rel_tol=1e-6)
                    if isinstance(want, float) else got == _plain(want))
            if not same:
                raise ConfigError(
                    f"{source}: GGUF metadata {key} = {_plain(got)!r} disagrees with config.json "
                    f"({_plain(want)!r})"
                )


def _kind(v: Any) -> str:
    """The JSON-ish kind of a metadata value, for type checks and messages."""
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, (list, tuple)):
        return "a list"
    return "a string" if isinstance(v, str) else json_kind(v)


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, bool):
        return v
    if hasattr(v, "item"):
        return v.item()
    return v


def _coerce(source: str, name: str, typ: Any, value: Any) -> Any:
    typ = str(typ)
    if typ.startswith("tuple"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: field {name!r} must be a list of strings")
        return tuple(value)
    expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[typ]
    ok = isinstance(value, expected) and not (typ in ("int", "float") and isinstance(value, bool))
    if not ok:  # in JSON's words: config.json is JSON (a bad-input trial read Python's)
        want = {"int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string"}[typ]
        raise ConfigError(f"{source}: field {name!r} = {shown(value)}; expected {want}")
    return float(value) if typ == "float" else value
