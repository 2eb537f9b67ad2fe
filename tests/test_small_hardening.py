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
