"""Smaller hostile-input cases (issue 26 item 7): untrusted text in error messages is cut, stop
strings with lone surrogates are refused like every other text field, and a stream closed from
another thread while it is being iterated aborts its request instead of raising."""

import threading

import pytest

from flint_graph.errors import MAX_MESSAGE, ConfigError, FlintError, InvalidRequestError
from flint_graph.runtime.sampling import SamplingParams


def test_a_huge_architecture_name_is_cut_in_the_message():
    from flint_graph.checkpoints.config import FlintConfig

    raw = FlintConfig.preset("tiny").to_dict()
    raw["architectures"], raw["model_type"] = ["A" * 100_000], "other"
    with pytest.raises(ConfigError) as e:
        FlintConfig.from_dict(raw, source="config.json")
    msg = str(e.value)
    assert len(msg) <= MAX_MESSAGE + 60 and "characters cut" in msg
    assert msg.startswith("config.json: unknown architecture")


def test_short_messages_are_kept_whole():
    assert str(FlintError("x" * 999)) == "x" * 999


@pytest.mark.parametrize("stop", ["\ud800", "ok\udfff", ["fine", "\udc80x"]])
def test_stop_strings_with_lone_surrogates_are_refused(stop):
    with pytest.raises(InvalidRequestError, match="stop.*surrogate"):
        SamplingParams(stop=stop)


def test_close_from_another_thread_aborts_the_request(tiny_llm):
    stream = tiny_llm.stream("count with me", SamplingParams(max_tokens=2000, temperature=1,
                                                             ignore_eos=True))
    seen = threading.Event()
    done = []

    def consume():
        for i, _ in enumerate(stream):
            if i == 3:
                seen.set()
        done.append(stream.output.finish_reason)

    t = threading.Thread(target=consume)
    t.start()
    assert seen.wait(60)
    stream.close()  # from this thread, while `consume` iterates: no "already executing"
    t.join(60)
    assert done == ["abort"]
    assert len(stream.output.token_ids) < 2000


def test_non_finite_logits_end_the_request_with_an_error(tiny_ckpt):
    """Issue 26 item 4: NaN logits sampled id 0 forever ("!!", finish "length", no error);
    now the request ends with finish reason "error" naming the cause, and the engine goes on
    serving (a second, healthy request on the same engine completes)."""
    import torch

    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    head = llm.engine.model.weights.lm_head if hasattr(llm.engine, "model") else None
    saved = head.clone()
    head.fill_(float("nan"))
    try:
        out = llm.generate(["hello"], SamplingParams(max_tokens=8))[0]
    finally:
        head.copy_(saved)
    assert out.finish_reason == "error" and "not finite" in " ".join(out.errors), out
    assert not llm.engine.running and not llm.engine.waiting
    again = llm.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert again.finish_reason == "length" and len(again.token_ids) == 3
    del torch


@pytest.mark.parametrize("field,value", [("rms_norm_eps", 1e308), ("routed_scaling_factor", 1e30),
                                         ("rope_theta", 1e300)])
def test_settings_that_make_every_activation_useless_are_refused(field, value):
    from flint_graph.checkpoints.config import FlintConfig

    raw = FlintConfig.preset("tiny").to_dict()
    raw[field] = value
    with pytest.raises(ConfigError, match=f"'{field}'.*at most"):
        FlintConfig.from_dict(raw)
