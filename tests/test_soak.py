"""The CPU soak (tools/soak.py, issue 26 item 8) in CI size: 8 streams for 15 s against one
reference engine on the tiny checkpoint, with cancellations, after a 5 s warm-up; every answer
equal to its solo run, every cancelled one a prefix of it, nothing left in the engine and
RssAnon back within the tool's slack. The 10-minute run and its numbers are in
docs/hardening.md.

Every cancellation mode the tool has runs here. Two of them first failed for reasons in
flint_graph/api.py, each now a regression test below: `cancel()` before the first read (the
engine queued and ran the finished request; `Engine.add` now skips a finished request), and
`close()` from another thread between two reads (it ran the generator's cleanup in the closing
thread, so the reader's next read raised "generator already executing"; `RequestStream.close`
now aborts in the engine and leaves the generator to its reader)."""

import json
import sys
import threading
import time

import pytest
from tool_module import tool_module


CI_MODES = "close-before-read,cancel-before-read,close-after,cancel-from-thread,close-from-thread"


def _soak():
    return tool_module("soak", register=True)  # its dataclasses look their module up there


def _llm(tiny_ckpt):
    from flint_graph import LLM
    from flint_graph.runtime.engine_config import EngineConfig

    return LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(engine="reference"))


def test_short_soak_matches_solo_runs_and_gives_everything_back(tiny_ckpt, tmp_path):
    soak = _soak()
    out = tmp_path / "soak.json"
    args = soak.parser().parse_args(["--minutes", "0.25", "--warmup-seconds", "5", "--pool", "48",
                                     "--modes", CI_MODES, "--sample-seconds", "5",
                                     # twice the default share: every mode gets some requests
                                     # even when a loaded machine completes fewer
                                     "--cancel-rate", "0.6",
                                     "--report", str(out)])
    report = soak.soak(args, llm=_llm(tiny_ckpt))
    out.write_text(json.dumps(report, indent=1))
    assert report["passed"], (report["failures"], report["failure_examples"])
    r = report["requests"]
    # ~100 requests in 15 s alone on 2 cores, fewer beside the other test worker: what matters
    # is that every mode ran (below), not the machine's throughput
    assert r["total"] >= 40 and r["run_to_end"] > 0 and r["tokens_compared_equal"] > 0, r
    assert set(r["by_mode"]) == {"none", *CI_MODES.split(",")}, r["by_mode"]
    # whether a timed cross-thread cancel lands mid-answer or after the end depends on the
    # machine's load; the mid-answer case is pinned down without timing in the test below
    assert r["by_mode"]["cancel-from-thread"] > 0, r
    after = report["end_state"]["after_drop"]
    assert after["retained"] == after["waiting"] == after["running"] == 0, after
    assert not any(after["internal"].values()), after
    m = report["memory"]
    assert m["growth_bytes"] <= m["slack_bytes"], m


def test_the_checks_catch_a_wrong_or_overlong_answer():
    soak = _soak()
    tally = soak.Tally()
    spec = soak.Spec(0, "raw", "hi", 4, True)
    solo = soak.Solo([5, 6, 7, 8], "length", 0.0)
    soak._check(tally, spec, solo, "none", [5, 6, 7, 8], "length", 1, [5, 6, 7, 8])
    soak._check(tally, spec, solo, "cancel-from-thread", [5, 6], "abort", 0, None)
    assert not tally.failures
    soak._check(tally, spec, solo, "none", [5, 6, 9, 8], "length", 1, [5, 6, 9, 8])
    soak._check(tally, spec, solo, "none", [5, 6, 7, 8], "length", 2, [5, 6, 7])
    soak._check(tally, spec, solo, "close-after", [5, 9], "abort", 0, None)
    soak._check(tally, spec, solo, "cancel-before-read", [5], "length", 0, None)
    assert set(tally.failures) == {
        "differs from its solo run", "finish reason not delivered once",
        "deltas do not add up to the output", "cancelled output is not a prefix of its solo run",
        "a request cancelled before its first read generated or finished otherwise "
        "[cancel-before-read]"}, tally
    assert tally.examples["differs from its solo run"][0]["first_difference"] == 2


def test_cancel_before_the_first_read_runs_nothing(tiny_ckpt):
    from flint_graph import SamplingParams

    llm = _llm(tiny_ckpt)
    stream = llm.stream("hello there", SamplingParams(temperature=0.0, max_tokens=1,
                                                      ignore_eos=True))
    stream.cancel()  # as another thread's cancel landing before the reader starts
    assert [d.finish_reason for d in stream] == ["abort"] and not stream.token_ids
    llm.engine.step()  # any other stream's next step
    assert not stream.token_ids and stream.output.finish_reason == "abort", \
        (stream.token_ids, stream.output.finish_reason)  # it was [id], "length"
    assert not llm.engine.has_work and len(llm.engine.prefix_cache) == 0


def test_cancel_from_another_thread_mid_answer_ends_it_with_a_prefix(tiny_ckpt):
    from flint_graph import SamplingParams

    llm = _llm(tiny_ckpt)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    solo = list(llm.generate(["hello there"], params)[0].token_ids)
    stream = llm.stream("hello there", params)
    reader = iter(stream)
    next(reader)  # the reference engine steps only on reads: the answer is now mid-way
    canceller = threading.Thread(target=stream.cancel)
    canceller.start()
    canceller.join(10)
    rest = list(reader)
    ids = list(stream.token_ids)
    assert stream.output.finish_reason == "abort", stream.output.finish_reason
    assert [d.finish_reason for d in rest][-1:] == ["abort"], rest
    assert 0 < len(ids) < len(solo) and ids == solo[:len(ids)], (ids, solo)
    assert not llm.engine.has_work


def _inside(thread: threading.Thread, function: str) -> bool:
    """Whether `thread` is running `function` now (anywhere on its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_close_from_another_thread_between_two_reads(tiny_ckpt):
    from flint_graph import SamplingParams

    llm = _llm(tiny_ckpt)
    eng = llm.engine
    stream = llm.stream("hello there", SamplingParams(temperature=0.0, max_tokens=50,
                                                      ignore_eos=True))
    reader = iter(stream)
    next(reader)  # the reader is between two reads (e.g. writing to its socket)
    released = threading.Event()

    def step_in_progress():  # another stream's engine step holds the engine for a while
        with eng._lock:
            released.wait(10)

    holder = threading.Thread(target=step_in_progress)
    holder.start()
    closer = threading.Thread(target=stream.close)
    closer.start()
    deadline = time.monotonic() + 10
    while not _inside(closer, "abort") and time.monotonic() < deadline:
        time.sleep(0.001)  # until close() waits in Engine.abort (it did so inside the generator)
    threading.Timer(0.2, released.set).start()
    try:
        rest = list(reader)  # it raised ValueError: generator already executing
    finally:
        released.set()
        holder.join()
        closer.join()
    assert stream.output.finish_reason == "abort" and all(
        d.finish_reason in (None, "abort") for d in rest)
    assert not eng.has_work


def test_the_graph_engine_soak_needs_cuda(capsys):
    """--engine graph (the H200 soak of issue 26) is refused off CUDA before any work."""
    with pytest.raises(SystemExit) as e:
        _soak().main(["--engine", "graph", "--device", "cpu"])
    assert e.value.code == 2 and "CUDA only" in capsys.readouterr().err
