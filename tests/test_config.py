"""FlintConfig: parsing, validation messages, derived figures (DESIGN §1, §5)."""

from __future__ import annotations

import json

import pytest

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ConfigError


def _full() -> dict:
    return FlintConfig.preset("full").to_dict()


def test_full_preset_matches_published_facts():
    c = FlintConfig.preset("full")
    assert (c.num_hidden_layers, c.num_sliding_layers, c.num_full_layers) == (49, 35, 14)
    assert c.kv_bytes_per_token == 28 * 1024  # DESIGN §1: 28 KiB of BF16 KV per token
    # DESIGN §1: 39.7B total, 2.43B active parameters.
    assert round(c.total_params / 1e9, 1) == 39.7
    assert round(c.active_params / 1e9, 2) == 2.43
    assert c.uses_rope(0) and not c.uses_rope(3)  # RoPE on sliding layers, NoPE on full ones
    assert not c.is_moe(1) and c.is_moe(2)


def test_decode_step_bytes_match_design_floors():
    c = FlintConfig.preset("full")
    # DESIGN §5 floors at 4.25 TB/s: NVFP4 0.45 ms at 1K and 1.12 ms at 100K; BF16 1.16 ms at
    # 1K. Our byte count (expected distinct experts, BF16 head) lands within 5% of each.
    for fmt, ctx, floor_ms in (("nvfp4", 1024, 0.45), ("nvfp4", 100_000, 1.12),
                               ("bf16", 1024, 1.16)):
        ms = c.decode_step_bytes(1, ctx, fmt)["total"] / 4.25e12 * 1e3
        assert ms == pytest.approx(floor_ms, rel=0.05), (fmt, ctx, ms)
    # More rows touch more experts, never fewer bytes.
    b = [c.decode_step_bytes(n, 1024, "nvfp4")["weights"] for n in (1, 2, 4, 8)]
    assert b == sorted(b) and b[-1] > b[0]


def test_round_trip_through_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_full()))
    assert FlintConfig.from_json(tmp_path) == FlintConfig.preset("full")


def test_null_model_type_and_dtype_mean_unset():
    """Hugging Face writes null for an unset field: accepted (the bad-input trial found null
    refused after the first check)."""
    raw = {**_full(), "model_type": None, "torch_dtype": None, "dtype": None}
    assert FlintConfig.from_dict(raw, source="cfg.json").hidden_size == _full()["hidden_size"]


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0},
                                     {"type": "linear", "factor": 2.0}, "dynamic", [1],
                                     {"rope_type": "default", "factor": 8.0},
                                     {"rope_type": "yarn", "factor": 1.0}])
def test_a_scaled_rope_is_refused_not_ignored(field, scaling):
    """A bad-input trial (2026-12-06): `rope_scaling` was ignored, so a checkpoint trained
    with a scaled RoPE would run with every sliding layer's angles wrong; a second found the
    same under transformers v5's `rope_parameters` and `partial_rotary_factor`."""
    with pytest.raises(ConfigError, match=rf"cfg\.json: field '{field}'.*unscaled"):
        FlintConfig.from_dict({**_full(), field: scaling}, source="cfg.json")


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("unset", [None, {}, {"rope_type": "default"}, {"type": "default"},
                                   {"rope_type": "default", "factor": 1.0},
                                   {"rope_type": "linear", "factor": 1.0},
                                   {"rope_type": "default", "rope_theta": 10000.0}])
def test_plain_rope_spelled_any_way_loads(field, unset):
    """Null, {} and Hugging Face's explicit unscaled forms load (the trial's false refusals)."""
    assert FlintConfig.from_dict({**_full(), field: unset}) == FlintConfig.preset("full")


def test_rope_theta_and_partial_rotation_must_agree():
    with pytest.raises(ConfigError, match="rope_parameters.*rope_theta 500000.0 disagrees"):
        FlintConfig.from_dict({**_full(), "rope_parameters": {"rope_type": "default",
                                                              "rope_theta": 500000.0}})
    with pytest.raises(ConfigError, match="partial_rotary_factor.*whole head"):
        FlintConfig.from_dict({**_full(), "partial_rotary_factor": 0.5})
    assert FlintConfig.from_dict({**_full(), "partial_rotary_factor": 1.0}).head_dim == 128


def test_gguf_rope_scaling_metadata_is_refused():
    cfg = FlintConfig.preset("full")
    meta = dict(cfg.gguf_metadata())
    cfg.check_gguf_metadata({**meta, "flint.rope.scaling.factor": 1.0}, "m.gguf")
    cfg.check_gguf_metadata({**meta, "flint.rope.scaling.type": "none"}, "m.gguf")
    for key, value in (("flint.rope.scaling.factor", 4.0), ("flint.rope.scaling.type", "yarn"),
                       ("flint.rope.scaling.original_context_length", 4096)):
        with pytest.raises(ConfigError, match=rf"m\.gguf: GGUF metadata {key}.*unscaled"):
            cfg.check_gguf_metadata({**meta, key: value}, "m.gguf")


@pytest.mark.parametrize("change, match", [
    ({"layer_types": ["sliding_attention"] * 48}, "layer_types.*48 entries.*49"),
    ({"layer_types": ["sliding_attention"] * 48 + ["global"]}, r"layer_types\[48\]"),
    ({"num_attention_heads": 30}, "num_attention_heads.*multiple of num_key_value_heads"),
    ({"moe_intermediate_size": 500}, "moe_intermediate_size = 500.*multiple of 64"),
    ({"hidden_size": 2000}, "hidden_size = 2000.*multiple of 64"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "unknown architecture"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
    # the bad-input trial: a Flint architecture with another model_type, and a dtype no
    # loader knows, were accepted unchecked
    ({"model_type": "llama"}, r"field 'model_type': expected 'flint' \(or none\), found \"llama\""),
    ({"model_type": ["flint"]}, r"model_type.*found \["),
    ({"torch_dtype": "bf16"}, r"field 'torch_dtype': expected one of bfloat16, float16, "
                              r"float32, auto, found \"bf16\""),
    ({"dtype": 16}, "field 'dtype'.*found 16"),
    ({"rope_theta": float("nan")}, "rope_theta"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    # in JSON's words, not Python's (a bad-input trial, 2026-12-05: '64', True, [])
    ({"vocab_size": "151552"}, r"field 'vocab_size' = \"151552\"; expected an integer"),
    ({"hidden_size": True}, r"field 'hidden_size' = true; expected an integer"),
    ({"qk_norm": 1}, r"field 'qk_norm' = 1; expected true or false"),
    ({"rope_layers": []}, r"field 'rope_layers' = \[\]; expected a string"),
    # the field that is wrong is the one named (n_group was blamed for topk_group)
    ({"topk_group": 0}, r"field 'topk_group' = 0; expected 1 \(grouped routing"),
    ({"n_group": 8}, r"field 'n_group' = 8; expected 1"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
])
def test_validation_names_field_and_expected_value(change, match):
    raw = {**_full(), **change}
    with pytest.raises(ConfigError, match=match):
        FlintConfig.from_dict(raw, source="cfg.json")


def test_missing_field_and_missing_file(tmp_path):
    raw = _full()
    del raw["sliding_window"]
    with pytest.raises(ConfigError, match="missing field 'sliding_window'"):
        FlintConfig.from_dict(raw)
    with pytest.raises(ConfigError, match="config file not found"):
        FlintConfig.from_json(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ConfigError, match="not valid JSON"):
        FlintConfig.from_json(tmp_path)


def test_gguf_metadata_cross_check():
    c = FlintConfig.preset("tiny")
    meta = c.gguf_metadata()
    c.check_gguf_metadata(meta, "x.gguf")  # consistent: no error
    with pytest.raises(ConfigError, match="flint.block_count = 7.*config.json.*6"):
        c.check_gguf_metadata({**meta, "flint.block_count": 7}, "x.gguf")
    pattern = [not s for s in meta["flint.attention.sliding_window_pattern"]]
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        c.check_gguf_metadata({**meta, "flint.attention.sliding_window_pattern": pattern}, "x")


def test_tiny_preset_has_every_feature():
    t = FlintConfig.preset("tiny")
    assert t.num_sliding_layers and t.num_full_layers and t.first_k_dense_replace
    assert t.n_shared_experts and t.attention_sinks and t.qk_norm
    assert t.sliding_window < 64  # small enough that tests cross it
    kinds = list(t.layer_types)
    assert kinds != sorted(kinds)  # interleaved, not one block of each kind


@pytest.mark.parametrize("field,value", [
    ("sliding_window", 10 ** 9), ("sliding_window", 2 ** 63), ("n_routed_experts", 10 ** 7),
    ("num_hidden_layers", 10 ** 6), ("vocab_size", 2 ** 40), ("hidden_size", 2 ** 31),
    ("max_position_embeddings", 2 ** 62), ("head_dim", 1 << 20), ("n_shared_experts", 10 ** 6),
])
def test_sizes_past_their_bound_are_refused_before_use(field, value):
    """Issue 26 item 2: sizes that fit no real model (sliding_window 1e9 allocated 128 GB,
    2^63 raised TypeError, 1e6 layers hung building the expected-tensor list) are one
    ConfigError naming the field, at once."""
    import time

    raw = FlintConfig.preset("tiny").to_dict()
    raw[field] = value
    if field == "num_hidden_layers":
        raw["layer_types"] = ["full_attention"] * value
    t0 = time.process_time()
    with pytest.raises(ConfigError, match=f"'{field}'.*at most"):
        FlintConfig.from_dict(raw, source="cfg.json")
    assert time.process_time() - t0 < 2
