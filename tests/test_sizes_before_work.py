"""Sizes refused before work (issue 26 item 6): a prompt that cannot fit the context by its
length alone is refused before it is tokenised (a 16 MB message took 9.6 s and 2.4 GB first; a
256 MB one aborted the process), naming both numbers; a tools file is read with a size cap
(`--tools /dev/zero` read until 6.7 GB)."""

import time

import pytest

from flint_graph.errors import ContextLengthError
from flint_graph.runtime.sampling import SamplingParams


@pytest.mark.parametrize("size", [16 << 20, 64 << 20])
def test_a_huge_message_is_refused_before_tokenising(tiny_llm, size):
    t0 = time.process_time()
    with pytest.raises(ContextLengthError, match=r"characters cannot fit the context limit of "
                                                 r"4,096 tokens"):
        tiny_llm.chat([{"role": "user", "content": "x" * size}])
    assert time.process_time() - t0 < 10


def test_a_huge_raw_prompt_is_refused_before_tokenising(tiny_llm):
    with pytest.raises(ContextLengthError, match="characters cannot fit"):
        tiny_llm.generate(["ab" * (8 << 20)], SamplingParams(max_tokens=1))


def test_the_bound_never_refuses_a_prompt_that_fits(tiny_llm):
    """The bound is the context times the longest token: a prompt below it goes on to the
    exact token count (here it fits and runs)."""
    text = "hello " * 50
    assert len(text) < tiny_llm.engine.context_limit * tiny_llm.tokenizer.max_token_chars
    out = tiny_llm.generate([text], SamplingParams(max_tokens=1))[0]
    assert len(out.token_ids) == 1


def test_tools_from_an_endless_file_are_refused(capsys, tiny_ckpt):
    from flint_graph.cli import main

    t0 = time.process_time()
    code = main(["generate", str(tiny_ckpt), "--prompt", "hi", "--tools", "/dev/zero",
                 "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "/dev/zero" in err and "MiB" in err, err
    assert time.process_time() - t0 < 20


@pytest.mark.parametrize("argv_of", [
    lambda f: ["eval", "--suite", "arith", "--n", "1", "--compare", f],
    lambda f: ["generate", "--prompt", "hi", "--tools", f],
    lambda f: ["bench", "--compare", f, f],
])
@pytest.mark.parametrize("make", ["device", "pipe", "big_int", "directory"])
def test_json_inputs_are_refused_by_kind_and_size_before_parsing(capsys, tmp_path, argv_of,
                                                                  make):
    """Every JSON file a user names (an eval report for --compare, a tools file, a saved bench
    result) is read by `jsonfile.read_capped`: a device or a pipe is refused unread (`eval
    --compare /dev/zero` filled 18 GB; a pipe with no writer blocked), and an integer past
    Python's 4,300 digits is invalid JSON (it was an internal error, exit 1)."""
    import os

    from flint_graph.cli import main

    if make == "device":
        f = "/dev/zero"
    elif make == "pipe":
        f = str(tmp_path / "fifo")
        os.mkfifo(f)
    elif make == "directory":
        f = str(tmp_path)
    else:
        f = str(tmp_path / "big.json")
        (tmp_path / "big.json").write_text('{"n": ' + "7" * 5000 + "}")
    t0 = time.process_time()
    code = main([str(a) for a in argv_of(f)])
    err = capsys.readouterr().err
    assert code == 2 and f in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert time.process_time() - t0 < 20


def test_a_prompt_a_growing_normalizer_could_blow_up_is_refused_before_tokenising(
        tiny_llm, monkeypatch):
    """A bad-input trial (2026-12-07): a normalizer that lengthens a text (here taken as
    10^6-fold) made a 170,000-character prompt an 11 GB allocation in Rust, which aborted the
    process. Past `max_text_chars` the prompt is refused by its length, naming the growth."""
    monkeypatch.setattr(tiny_llm.tokenizer, "text_growth", 1e6)
    assert tiny_llm.tokenizer.max_text_chars == 33
    for ask in (lambda: tiny_llm.generate(["h" * 34], SamplingParams(max_tokens=1)),
                lambda: tiny_llm.chat([{"role": "user", "content": "h" * 200}])):
        with pytest.raises(ContextLengthError, match=r"pre-tokenizer can lengthen a text up to "
                                                     r"1,000,000-fold, so at most 33 "):
            ask()
