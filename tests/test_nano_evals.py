"""The eval suite's logic (nano/evals.py, nano/eval_cli.py) without a trained model: held-out
cases, scoring of tool calls by schema, the noise rule of --compare, the planted bugs, and the
CLI's errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from flint_graph.checkpoints.checkpoint import LoadedCheckpoint, WeightFormat
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import InvalidRequestError
from flint_graph.nano import evals
from flint_graph.nano.plants import PLANTS, plant
from flint_graph.nano.curriculum import TOOLS, in_split
from flint_graph.checkpoints.synthetic import make_weights


def _msg(content="", calls=()):
    return SimpleNamespace(content=content, tool_calls=[
        SimpleNamespace(name=n, arguments=a) for n, a in calls])


def test_cases_are_held_out_and_reproducible():
    a = evals.build_cases(("tools", "arith", "recall"), 6, seed=3, contexts=(1024, 4096))
    b = evals.build_cases(("tools", "arith", "recall"), 6, seed=3, contexts=(1024, 4096))
    assert [c.messages for c in a] == [c.messages for c in b]
    assert [c.group for c in a].count("recall@4096") == 6
    arith = [c for c in a if c.suite == "arith"]
    assert all(len(c.expect) <= 4 for c in arith)
    tools = [c for c in a if c.suite == "tools"]
    assert all(any(t["function"]["name"] == "book_table" for t in c.tools) for c in tools)


def test_recall_asks_a_key_in_the_first_half():
    for c in evals.build_cases(("recall",), 5, seed=0, contexts=(4096,)):
        listing = c.messages[0]["content"]
        key = re.search(r"K(\d{4})", c.messages[2]["content"]).group(1)
        at = listing.index(f"K{key} =")
        assert at < len(listing) / 2
        assert f"K{key} = {c.expect}" in listing


def test_arith_cases_are_three_digit_held_out_pairs():
    for c in evals.build_cases(("arith",), 20, seed=1):
        nums = [int(t.strip("?.,")) for t in c.messages[0]["content"].split()
                if t.strip("?.,").isdigit()]
        assert len(nums) == 2 and all(100 <= n <= 999 for n in nums)
        assert in_split("heldout", *nums) or in_split("heldout", *nums[::-1])


def _tool_case():
    call = {"name": "get_weather", "arguments": {"city": "Hanoi", "days": 3, "metric": True}}
    return evals.Case("tools", 0, [], TOOLS["train"] + TOOLS["heldout"], call)


@pytest.mark.parametrize("calls, valid, exact", [
    ([("get_weather", {"city": "Hanoi", "days": 3, "metric": True})], True, True),
    ([("get_weather", {"city": "Hanoi", "days": 4, "metric": True})], True, False),
    ([("get_weather", {"city": "Hanoi", "days": "3", "metric": True})], False, False),
    ([("get_weather", {"city": "Hanoi", "days": 3, "metric": 1})], False, False),
    ([("get_weather", {"city": "Hanoi", "days": 3})], False, False),  # a required one missing
    ([("get_weather", {"city": "Hanoi", "days": 3, "metric": True, "x": 1})], False, False),
    ([("get_forecast", {"city": "Hanoi", "days": 3, "metric": True})], False, False),
    ([("get_weather", {"city": "Hanoi", "days": 3, "metric": True})] * 2, False, False),
    ([], False, False),
])
def test_tool_call_scoring(calls, valid, exact):
    assert evals.score(_tool_case(), _msg(calls=calls)) == {"valid": valid, "exact": exact}


def test_answer_scoring_strips_blanks_only():
    c = evals.Case("arith", 0, [], None, "1234")
    assert evals.score(c, _msg(" 1234\n")) == {"correct": True}
    assert evals.score(c, _msg("1234.")) == {"correct": False}


def _report(hits: list[bool]) -> dict:
    return evals.summarize([{"group": "arith", "index": i, "expect": "1", "got": str(int(h)),
                             "correct": h} for i, h in enumerate(hits)])


def test_targets_are_judged_only_over_enough_cases(capsys):
    """At --n 2 one miss reads as 50% of a 90% target: below JUDGE_MIN_N cases a target is
    shown "not judged" and --check ignores it (a new user's README run printed MISSED for a
    suite that scores 95% at --n 20, 2026-12-03); from JUDGE_MIN_N on it is met / MISSED."""
    from flint_graph.nano import eval_cli

    small = _report([True, False])
    assert small["targets"][0] == {"group": "arith", "metric": "correct", "target": 0.9,
                                   "value": 0.5, "met": False, "judged": False}
    big = _report([True] * (evals.JUDGE_MIN_N - 2) + [False] * 2)
    assert big["targets"][0]["judged"] and not big["targets"][0]["met"]
    assert eval_cli._verdict(small["targets"][0]) == f"not judged (n < {evals.JUDGE_MIN_N})"
    assert eval_cli._verdict(big["targets"][0]) == "MISSED"
    assert eval_cli._verdict({"met": True}) == "met"  # reports from before the rule


def test_a_95_percent_target_is_judged_from_20_cases():
    """The README's CPU run (--n 10) printed "tools valid 90.0% ≥95% MISSED" for a model at
    96.7% over 30 cases (a new user's trial, 2026-12-06): one miss in ten cannot meet 95%, so
    a target below 100% is judged only where one miss can still meet it (20 cases for 95%);
    90% targets keep 10, 100% targets JUDGE_MIN_N."""
    from flint_graph.nano import eval_cli

    def tools(hits):
        return evals.summarize([{"group": "tools", "index": i, "got": None, "valid": h,
                                 "exact": h} for i, h in enumerate(hits)])

    ten = {t["metric"]: t for t in tools([True] * 9 + [False])["targets"]}
    assert not ten["valid"]["judged"] and ten["exact"]["judged"] and ten["exact"]["met"]
    assert eval_cli._verdict(ten["valid"]) == "not judged (n < 20)"
    twenty = {t["metric"]: t for t in tools([True] * 18 + [False] * 2)["targets"]}
    assert twenty["valid"]["judged"] and eval_cli._verdict(twenty["valid"]) == "MISSED"
    assert [evals.judge_min_n(t) for t in (0.9, 0.95, 1.0)] == [10, 20, evals.JUDGE_MIN_N]


def test_compare_noise_rule():
    ref = _report([True] * 45 + [False] * 5)
    same = evals.compare(ref, ref)
    assert same["within_noise"] and same["identical_answers"] == 1.0 and same["passed"]
    near = evals.compare(_report([True] * 43 + [False] * 7), ref)  # 86% vs 90%: noise at n=50
    assert near["within_noise"]
    # ...but two answers in 50 changed: 96% identical passes; four (92%) fail
    assert near["identical_answers"] == 0.96 and near["passed"]
    four = evals.compare(_report([True] * 41 + [False] * 9), ref)
    assert four["within_noise"] and four["identical_answers"] == 0.92 and not four["passed"]
    far = evals.compare(_report([True] * 25 + [False] * 25), ref)  # 50% vs 90%
    assert not far["within_noise"] and far["rows"][0]["diff"] == -0.4
    assert ref["targets"][0]["met"] and not far["rows"][0]["within"]


@pytest.fixture(scope="module")
def nano_checkpoint(tmp_path_factory):
    cfg = FlintConfig.preset("nano")
    w = make_weights(cfg, 0, "cpu")
    return LoadedCheckpoint(cfg, w, WeightFormat.BF16, tmp_path_factory.mktemp("c"), {})


def test_plants(nano_checkpoint):
    ck = nano_checkpoint
    win = plant(ck, "window-1")
    assert win.cfg.sliding_window == ck.cfg.sliding_window - 1
    rope = plant(ck, "rope-on-nope")
    full = [i for i in range(ck.cfg.num_hidden_layers) if not ck.cfg.uses_rope(i)]
    assert rope.cfg.uses_rope(full[0]) and not rope.cfg.uses_rope(full[1])
    assert all(rope.cfg.uses_rope(i) for i in range(ck.cfg.num_hidden_layers) if i not in full)
    sink = plant(ck, "no-sink")
    assert all((lw.sinks <= -1e4).all() for lw in sink.weights.layers)
    assert all(lw.sinks.max() > -1e3 for lw in ck.weights.layers)  # the original is untouched
    bias = plant(ck, "router-bias-bf16")
    moe = [(a.ffn.router_bias, b.ffn.router_bias) for i, (a, b) in
           enumerate(zip(ck.weights.layers, bias.weights.layers)) if ck.cfg.is_moe(i)]
    assert moe and all(b.dtype == torch.float32 for _, b in moe)
    assert all(torch.equal(b, a.bfloat16().float()) for a, b in moe)
    assert any(not torch.equal(a, b) for a, b in moe)
    with pytest.raises(Exception, match="--plant"):
        plant(ck, "nope")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "flint_graph.cli", "eval", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["--suite", "tools,poetry"], "--suite"),
    (["--contexts", "4k,abc"], "--contexts"),
    (["--contexts", "64"], "--contexts"),
    (["/no/such/ckpt"], "no such checkpoint"),
    (["--json", __file__ + "/out.json"], "is a file, not a directory"),
    (["--plant", "typo"], "--plant"),
    (["--n", "0"], "--n"),
    (["--n", "100000000"], "--n"),  # used to hang building the cases
    (["--suite", "recall", "--contexts", "200000"], "at most 9000 keys"),
])
def test_cli_bad_input_is_one_line(args, needle):
    out = _cli(*args, "--quiet")
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_compare_refuses_a_non_report(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"groups": 3}))
    out = _cli("--compare", str(bad), "--quiet")
    assert out.returncode == 2 and "groups: expected an object" in out.stderr


def test_cli_compare_needs_cases_in_common(tmp_path):
    other = tmp_path / "r.json"
    other.write_text(json.dumps({"groups": {"recall@999": {"n": 1, "correct": 1.0}},
                                 "cases": [{"group": "recall@999", "index": 0, "got": "1",
                                            "correct": True}]}))
    out = _cli("--compare", str(other), "--suite", "arith", "--quiet", "--device", "cpu")
    assert out.returncode == 2 and "no case in common" in out.stderr


def test_tools_direct_cases_offer_tools_and_must_not_call():
    cases = [c for c in evals.build_cases(("tools",), 4, seed=0) if c.group == "tools-direct"]
    assert len(cases) == 4 and all(c.tools for c in cases)
    c = cases[0]
    assert evals.score(c, _msg(c.expect)) == {"correct": True}
    call = ("calculator", {"expression": "1 + 2"})
    assert evals.score(c, _msg(c.expect, calls=[call])) == {"correct": False}


def test_chain_cases_ask_a_second_request_after_an_answered_one():
    """The second request of a chat sees the first as chat shows an older turn: answered,
    reasoning dropped (as nano/curriculum's chain episodes train it)."""
    cases = evals.build_cases(("chain",), 4, seed=0)
    tools, arith = ([c for c in cases if c.group == g] for g in ("chain-tools", "chain-arith"))
    assert len(tools) == len(arith) == 4
    for c in cases:
        assert [m["role"] for m in c.messages][-1] == "user" and len(c.messages) >= 3
        assert all(m.get("reasoning_content") == "" for m in c.messages
                   if m["role"] == "assistant")
        assert c.messages[1]["content"] or c.messages[1].get("tool_calls")
    # the first request of chain-arith used a tool; the second must answer without one
    assert all(c.messages[2]["role"] == "tool" and c.tools for c in arith)
    c = arith[0]
    assert evals.score(c, _msg(c.expect)) == {"correct": True}
    assert evals.score(c, _msg(c.expect, calls=[("calculator", {"expression": "1"})])) == \
        {"correct": False}
    c = tools[0]
    call = (c.expect["name"], c.expect["arguments"])
    assert evals.score(c, _msg(calls=[call])) == {"valid": True, "exact": True}
    # the held-out eval cases of the other suites are the same with chain in the list
    assert [x.messages for x in evals.build_cases(("tools", "chain"), 4) if x.group == "tools"] \
        == [x.messages for x in evals.build_cases(("tools",), 4) if x.group == "tools"]


def test_chat_cases_ask_what_chat_users_asked():
    """chat-chain3: a third request after a tool request and an arithmetic one; chat-negative:
    a − b with a < b; chat-list: a short pasted list, tools offered in every other case. All
    scored as answers."""
    cases = evals.build_cases(("chat",), 6, seed=0)
    by = {g: [c for c in cases if c.group == g] for g in evals.CHAT_GROUPS}
    assert all(len(v) == 6 for v in by.values())
    for c in by["chat-chain3"]:
        roles = [m["role"] for m in c.messages]
        assert roles.count("user") == 3 and "tool" in roles and roles[-1] == "user" and c.tools
        assert all(m.get("reasoning_content") == "" for m in c.messages
                   if m["role"] == "assistant")
    for c in by["chat-negative"]:
        assert int(c.expect) < 0 and c.tools is None
        x, y = (int(v) for v in re.findall(r"\d+", c.messages[0]["content"])[:2])
        assert -int(c.expect) == abs(x - y)
    for c in by["chat-list"]:
        assert [m["role"] for m in c.messages] == ["user", "assistant", "user"]
        assert c.expect in c.messages[0]["content"]
    assert [bool(c.tools) for c in by["chat-list"]] == [False, True] * 3
    c = by["chat-list"][1]
    assert evals.score(c, _msg(c.expect)) == {"correct": True}
    assert evals.score(c, _msg(c.expect, calls=[("lookup", {"query": "K1"})])) == \
        {"correct": False}
    # the default suites' cases do not change with chat in the list
    assert evals.build_cases(evals.DEFAULT_SUITES, 3)[0].messages == \
        evals.build_cases(evals.DEFAULT_SUITES + ("chat",), 3)[0].messages


def test_compare_fails_on_log_probabilities_of_another_length():
    # the same text must have the same tokens; a cut list was compared on its prefix and passed
    ref = _good_report()
    run = _good_report()
    run["cases"][0]["logprobs"] = [-0.1]
    got = evals.compare(run, ref)
    assert got["logprob_length_mismatches"] == 1 and not got["passed"]
    assert evals.compare(_good_report(), ref)["passed"]


def test_compare_reports_logprob_distance_on_identical_outputs():
    def rep(lps, text="a"):
        return {"groups": {"arith": {"n": 1, "correct": 1.0}},
                "cases": [{"group": "arith", "index": 0, "got": "1", "text": text,
                           "logprobs": lps, "correct": True}]}
    c = evals.compare(rep([-0.1, -0.5]), rep([-0.1, -0.3]))
    assert c["logprob_tokens"] == 2 and c["logprob_max_abs_diff"] == 0.2
    assert abs(c["logprob_mean_abs_diff"] - 0.1) < 1e-9
    assert evals.compare(rep([-0.1], "a"), rep([-0.2], "b"))["logprob_tokens"] == 0


def test_compare_reports_the_top_logprob_distance_without_judging_it():
    """The ids both runs list at a step decoded alike are compared (TOP_LOGPROBS); the figure
    is reported but does not decide `passed` until its tolerance is measured."""
    def rep(top, text="a"):
        return {"groups": {"arith": {"n": 1, "correct": 1.0}},
                "cases": [{"group": "arith", "index": 0, "got": "1", "text": text,
                           "logprobs": [s[0][1] for s in top], "top": top, "correct": True}]}
    a = rep([[[5, -0.01], [7, -5.0], [9, -6.0]], [[3, -0.1], [4, -3.0]]])
    b = rep([[[5, -0.01], [7, -5.5], [8, -6.1]], [[3, -0.1], [4, -3.0]]])
    c = evals.compare(a, b)
    assert c["top_logprob_pairs"] == 4 and abs(c["top_logprob_mean_abs_diff"] - 0.125) < 1e-9
    assert c["passed"]  # informational
    assert evals.compare(a, rep(b["cases"][0]["top"], "b"))["top_logprob_pairs"] == 0
    assert evals.check_report(a, "r") is a


@pytest.mark.parametrize("top,word", [([[[5, -0.1]]], "as long as logprobs"),
                                      ([[[5, 0.5]], [[1, -1.0]]], "top\\[0\\]"),
                                      ([[[-1, -0.5]], [[1, -1.0]]], "top\\[0\\]"),
                                      ([[[5, -0.5, 1]], [[1, -1.0]]], "top\\[0\\]"),
                                      ([[[10**400, -0.5]], [[1, -1.0]]], "top\\[0\\]"),
                                      ([[[2, -0.1], [2, -0.2]], [[1, -1.0]]], "distinct"),
                                      ([[], [[1, -1.0]]], "1 to 20"),
                                      ([[[2, -0.9], [3, -0.1]], [[1, -1.0]]], "most likely"),
                                      ([[[1, -1.0]]] * 2 + [[[i, -1.0 - i] for i in range(21)]],
                                       "as long as logprobs"),
                                      ("x", "as long as logprobs")])
def test_bad_top_lists_in_a_report_are_refused(top, word):
    from flint_graph.errors import InvalidRequestError

    rep = {"groups": {"arith": {"n": 1, "correct": 1.0}},
           "cases": [{"group": "arith", "index": 0, "got": "1", "text": "a",
                      "logprobs": [-0.5, -1.0], "top": top, "correct": True}]}
    with pytest.raises(InvalidRequestError, match=word) as e:
        evals.check_report(rep, "r")
    assert '\\"' not in str(e.value)  # the value quoted once


def test_compare_logprob_tolerance_depends_on_the_setup():
    def rep(lp, engine="graph", device="cuda:0", batch=8, threads=None):
        return {"groups": {"arith": {"n": 1, "correct": 1.0}}, "engine": engine,
                "device": device, "batch": batch, "threads": threads,
                "cases": [{"group": "arith", "index": 0, "got": "1", "text": "a",
                           "logprobs": [-0.5, lp], "correct": True}]}
    ref = rep(-0.1, engine="reference", device="cuda")
    # H200, from the reference (mean over two tokens, one alike): clean engines 1.37e-4 ..
    # 2.36e-4 (the reference model's own prefill in 512-token chunks: 2.0e-4); the caught
    # plants 2.75e-4 (router-bias-bf16) and 4.2e-4 (no-sink)
    assert evals.compare(rep(-0.1 - 1e-4), ref)["passed"]
    assert evals.compare(rep(-0.1 - 2 * 2.36e-4), ref)["passed"]
    assert not evals.compare(rep(-0.1 - 2 * 2.75e-4), ref)["passed"]
    assert not evals.compare(rep(-0.1 - 2 * 4.2e-4), ref)["passed"]
    bad = evals.compare(rep(-0.1 - 7e-4), ref)
    assert not bad["logprob_within"] and not bad["passed"]
    assert bad["logprob_tolerance"] == evals.LOGPROB_TOL_OTHER
    # the same engine, device kind, batch and threads: any difference is a different function
    again = rep(-0.1, engine="reference", device="cuda:0")
    assert evals.compare(again, ref)["passed"]
    shifted = evals.compare(rep(-0.1 - 2e-5, engine="reference", device="cuda:0"), ref)
    assert shifted["logprob_tolerance"] == 0.0 and not shifted["passed"]
    other_batch = evals.compare(rep(-0.1 - 2e-5, engine="reference", batch=1), ref)
    assert other_batch["logprob_tolerance"] == evals.LOGPROB_TOL_OTHER and other_batch["passed"]
    # reports without log-probabilities are held to answers and metrics only
    old = {k: v for k, v in ref.items()}
    old["cases"] = [dict(ref["cases"][0], logprobs=[])]
    assert evals.compare(rep(-0.3), old)["passed"]


def _good_report():
    return {"groups": {"arith": {"n": 1, "correct": 1.0}}, "seed": 0, "n": 1,
            "cases": [{"group": "arith", "index": 0, "got": "1", "text": "a</think>1",
                       "logprobs": [-0.1, 0.0], "correct": True}]}


@pytest.mark.parametrize("change, field", [
    (lambda r: r["cases"][0].update(logprobs=["x"]), "cases[0].logprobs[0]"),
    (lambda r: r["cases"][0].update(logprobs=[None]), "cases[0].logprobs[0]"),
    (lambda r: r["cases"][0].update(logprobs=[float("nan")]), "cases[0].logprobs[0]"),
    (lambda r: r["cases"][0].update(logprobs=[float("-inf")]), "cases[0].logprobs[0]"),
    (lambda r: r["cases"][0].update(logprobs=[-10 ** 400]), "cases[0].logprobs[0]"),
    (lambda r: r["cases"][0].update(logprobs=5), "cases[0].logprobs"),
    (lambda r: r["cases"][0].update(logprobs={"a": 1}), "cases[0].logprobs"),
    (lambda r: r["cases"][0].pop("group"), "cases[0].group"),
    (lambda r: r["cases"][0].update(group=["arith"]), "cases[0].group"),
    (lambda r: r["cases"][0].pop("index"), "cases[0].index"),
    (lambda r: r["cases"][0].pop("got"), "cases[0].got"),
    (lambda r: r["cases"][0].pop("correct"), "cases[0]: expected a score"),
    (lambda r: r["cases"][0].update(correct="yes"), "cases[0].correct"),
    (lambda r: r["cases"][0].update(correct=None), "cases[0].correct"),
    (lambda r: r["cases"][0].update(text=3), "cases[0].text"),
    (lambda r: r["cases"][0].update(question=["a"]), "cases[0].question"),
    (lambda r: r.update(cases=[1, 2]), "cases[0]: expected an object"),
    (lambda r: r.update(cases=[]), "cases: expected a non-empty list"),
    (lambda r: r.pop("cases"), "cases: expected a non-empty list of scored cases, found nothing"),
    (lambda r: r["groups"].update(arith={"n": 0}), "groups.arith"),
    (lambda r: r["groups"]["arith"].update(correct=2), "groups.arith.correct"),
    (lambda r: r.update(weights=["986fd218945c1e1e"]), "weights: expected the weights'"),
    (lambda r: r.update(weights="986FD218945C1E1E"), "weights: expected the weights' fingerprint, 16 lower"),
    (lambda r: r.update(weights=None), "weights: expected the weights'"),
    (lambda r: r.update(plant=12), "plant: expected null or one of window-1"),
    (lambda r: r.update(plant="no-such"), "plant: expected null or one of"),
    (lambda r: r.update(weights="x" * 10000), "weights: expected the weights'"),
    (lambda r: r.update(seed="0"), "seed"),
    (lambda r: r.update(seed=True), "seed: expected an integer >= 0, found true"),
    # found by a bad-input helper: accepted, then compared with made-up or missing figures
    (lambda r: r["cases"][0].update(valid=True, exact=True), 'cases[0]: expected a score: '
                                                             '"correct" for group arith'),
    (lambda r: r["cases"][0].update(group="chain-tools"), "cases[0]: expected a score: "
                                                          '"valid" and "exact"'),
    (lambda r: r["cases"][0].update(group="bogus"), "cases[0].group: expected a group"),
    (lambda r: r["cases"].append(dict(r["cases"][0])), "cases[1]: expected one case per group"),
    (lambda r: r["groups"].update(bogus={"n": 1}), "groups.bogus.n: expected the number"),
    (lambda r: r["groups"]["arith"].update(n=10 ** 400), "groups.arith.n: expected the number"),
    (lambda r: r["groups"].pop("arith"), "groups.arith: expected the scores"),
])
def test_reports_are_checked_field_by_field_before_any_work(change, field):
    rep = _good_report()
    assert evals.check_report(rep, "R") is rep
    change(rep)
    with pytest.raises(InvalidRequestError, match=re.escape(f"R: {field}")):
        evals.check_report(rep, "R")


def test_old_reports_without_logprobs_or_text_are_accepted():
    rep = _good_report()
    rep["cases"][0].pop("logprobs")
    rep["cases"][0].pop("text")
    rep.pop("seed")
    assert evals.check_report(rep, "R") is rep


def test_cli_compare_refuses_bad_reports_and_keeps_the_reference(tmp_path):
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(_good_report()))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000 + "]" * 200000)
    for args, needle in (
            (["--compare", str(deep)], "nested too deeply"),
            (["--compare", str(ref), "--json", str(ref)], "is the --compare report"),
            (["--compare", str(ref), "--seed", "7"], "made with --seed 0"),
    ):
        out = _cli(*args, "--suite", "arith", "--quiet", "--device", "cpu")
        assert out.returncode == 2 and needle in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert json.loads(ref.read_text()) == _good_report()


def test_cli_compare_refuses_a_report_of_other_cases_whatever_its_fields_say(tmp_path):
    """A bad-input trial (2026-12-07): a --seed 5 report with its "seed" key deleted was held
    to a --seed 0 run, paired by group and index with other questions, and failed the run
    ("identical answers: 0.0%"). Cases pair only where they ask the same: a report without
    "seed", or one from another version's suites (a changed question), is refused before any
    decoding, naming the case and both questions."""
    other = evals.question_text(evals.build_cases(("arith",), 1, 5, (1024,))[0])
    ours = evals.question_text(evals.build_cases(("arith",), 1, 0, (1024,))[0])
    assert other != ours
    for name, change, args, needle in (
            ("noseed", lambda r: r.pop("seed"), (), "made with other cases"),
            ("edited", lambda r: None, (), "made with other cases"),
            # its re-trial: questions of seed 5 under "seed": 0 sent the user from --seed 5 to
            # --seed 0, where the questions differ; the questions decide (--seed 5 runs)
            ("seed-edited", lambda r: r.update(seed=0), (), "made with other cases"),
            # no question and no seed: nothing tells which cases it ran (null questions had
            # turned the check off)
            ("nothing", lambda r: [r.pop("seed"), r["cases"][0].pop("question")], (),
             "records neither its --seed nor its cases' questions"),
            ("null", lambda r: r["cases"][0].update(question=None), (), "cases[0].question"),
            ("past-n", lambda r: r["cases"][0].update(index=7), (), "cases[0].index")):
        rep = _good_report()
        rep["cases"][0]["question"] = other
        change(rep)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rep))
        out = _cli("--compare", str(path), "--suite", "arith", "--n", "1", "--quiet",
                   "--device", "cpu", *args)
        assert out.returncode == 2 and needle in out.stderr, (name, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, (name, out.stderr)
        if needle == "made with other cases":
            assert "arith #0" in out.stderr


def test_two_questions_in_an_error_are_shown_where_they_differ():
    from flint_graph.nano.eval_cli import _differ

    a = "One more thing: What is 258 plus 459? Many thanks in advance."
    x, y = _differ(a, a + " ")
    assert x != y and x.startswith("'…") and y.endswith(" '")
    assert _differ("abc", "abd") == ("'abc'", "'abd'")


def test_cli_contexts_beyond_the_model_limit_fail_before_decoding():
    out = _cli("--suite", "recall", "--n", "1", "--contexts", "40000", "--quiet", "--device",
               "cpu")
    assert out.returncode == 2 and "--contexts 40000" in out.stderr
    assert "context limit of 32768" in out.stderr and "Traceback" not in out.stderr


def test_zero_tolerance_needs_the_same_case_list():
    def rep(n, lp):
        r = _good_report()
        r.update(engine="reference", device="cpu", batch=8, threads=None, suites=["arith"],
                 contexts=[1024], n=n)
        r["cases"][0]["logprobs"] = [lp]
        return r
    assert evals.compare(rep(3, -0.1), rep(3, -0.1))["logprob_tolerance"] == 0.0
    # another --n batches the requests differently: the cross-setup tolerance applies
    other = evals.compare(rep(5, -0.1 - 1e-7), rep(3, -0.1))
    assert other["logprob_tolerance"] == evals.LOGPROB_TOL_OTHER and other["passed"]


def test_cli_json_cannot_overwrite_the_embedded_checkpoint():
    from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

    config = ensure_default_checkpoint(progress=False) / "config.json"
    before = config.read_bytes()
    out = _cli("--json", str(config), "--suite", "arith", "--n", "1", "--quiet", "--device",
               "cpu")
    assert out.returncode == 2 and "would overwrite a file of the checkpoint" in out.stderr
    assert config.read_bytes() == before


def test_the_gpu_kernel_cache_covers_every_planted_config():
    # `eval --plant BUG --engine graph` needs the planted config's kernels on a machine that
    # cannot compile: tools/build_gpu_cache.py must list every one of them.
    from tool_module import tool_module

    from flint_graph.kernels.toolchain.build import model_specs
    from flint_graph.nano.plants import planted_config

    module = tool_module("build_gpu_cache")
    for presets in (module.PRESETS, ("nano",)):  # `--preset nano` is what gpu_eval_nano.sh needs
        listed = {(k.name, s.key) for k, s in module.todo(presets)}
        for bug in (None,) + PLANTS:
            cfg = FlintConfig.preset("nano")
            need = {(k.name, s.key) for k, s in model_specs(planted_config(cfg, bug) if bug
                                                              else cfg)}
            assert need <= listed, (presets, bug, sorted(need - listed)[:3])


@pytest.mark.parametrize("bug", (None,) + PLANTS)
def test_every_layer_picks_exactly_one_kernel_specialisation(bug):
    # The graph engine picks each layer's kernels from the bucket's specialisations by the
    # values in layer_kernels; two matches stopped `--plant rope-on-nope --engine graph` on the
    # H200 (its full layers differ in RoPE).
    from flint_graph.capture.decode_layer import layer_kernels, layer_spec
    from flint_graph.kernels import registry
    from flint_graph.kernels.toolchain.spec import BUCKETS
    from flint_graph.nano.plants import planted_config

    defs = {k.name: k for k in registry()}
    for preset in ("tiny", "nano", "full"):
        cfg = FlintConfig.preset(preset)
        cfg = planted_config(cfg, bug) if bug else cfg
        for layer in range(cfg.num_hidden_layers):
            for fmt, fold in ((0, False), (1, False), (0, True), (1, True)):
                kernels = layer_kernels(cfg, layer, cfg.is_moe(layer), fmt, fold)
                assert ("qk_norm_rope_kv" in kernels) != fold
                for name, want in kernels.items():
                    for b in BUCKETS:
                        layer_spec(defs[name], cfg, b, **want)  # raises unless exactly one


def test_cases_are_those_of_the_shipped_h200_report():
    # curriculum changes must leave the held-out cases alone, or reports stop being comparable
    from pathlib import Path

    rep = json.loads((Path(__file__).parent.parent / "docs/nano/step5929/eval-ref.json")
                     .read_text())
    assert rep["n"] == 30 and rep["seed"] == 0
    cases = evals.build_cases(evals.parse_suites(",".join(rep["suites"])), rep["n"], rep["seed"],
                              tuple(rep["contexts"]))
    want = {(c["group"], c["index"]): c["expect"] for c in rep["cases"]}
    assert {(c.group, c.index): c.expect for c in cases} == want


def test_cli_a_report_that_cannot_be_written_is_one_line(capsys, tmp_path, monkeypatch):
    """A report that fails only when it is written, after the run (a full disk): one line
    naming it and exit 2, the scores still shown. (/dev/full, which once stood for a full disk
    here, is now refused before the run: not a regular file.)"""
    from flint_graph import paths
    from flint_graph.cli import main

    target = tmp_path / "report.json"

    def no_room(fd):  # the replacement file is written whole or not at all (replace_file)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "fsync", no_room)
    code = main(["eval", "--suite", "arith", "--n", "1", "--quiet", "--json", str(target)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if "error" in ln] == [
        ln for ln in err.splitlines() if f"--json {target}: cannot write the file" in ln]
    code = main(["eval", "--suite", "arith", "--n", "1", "--quiet", "--json", "/dev/full"])
    assert code == 2 and "not a regular file" in capsys.readouterr().err
    assert "arith" in out


def test_cli_compare_says_a_foreign_json_is_not_a_report(tmp_path):
    """A JSON object with neither groups nor cases is named as no eval report (bad-input trial:
    "groups: expected an object of per-group scores, found nothing")."""
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"a": 1}))
    out = _cli("--compare", str(other), "--quiet")
    assert out.returncode == 2 and "not an eval report" in out.stderr, out.stderr


@pytest.mark.parametrize("content", ['{"a": 1}', "notes\n", "[1]"])
def test_cli_json_never_replaces_a_file_that_is_not_a_report(tmp_path, content):
    """--json replaces an earlier report only; any other file is refused before the run and
    kept (bad-input trial: an unrelated JSON file was overwritten without notice)."""
    keep = tmp_path / "precious.json"
    keep.write_text(content)
    out = _cli("--json", str(keep), "--quiet")
    assert out.returncode == 2 and "is not an eval report" in out.stderr, out.stderr
    assert keep.read_text() == content


def test_cli_compare_refuses_a_reference_from_other_weights(tmp_path, capsys):
    """A reference made from other weights (a retrained flint-nano) is refused before any case
    runs: the 2026-12-02 reference, made before step 6517 shipped, read as a 20x regression of
    the graph engine (mean |Δ log p| 4.3e-3 nats) on 2026-12-03. A report records the weights'
    fingerprint; one without it is taken with a warning."""
    from flint_graph.cli import main

    ours = tmp_path / "ours.json"
    assert main(["eval", "--suite", "arith", "--n", "1", "--quiet", "--device", "cpu",
                 "--json", str(ours)]) == 0
    rep = json.loads(ours.read_text())
    assert re.fullmatch(r"[0-9a-f]{16}", rep["weights"])
    # each case says what it asked (a new-user trial could not tell what a wrong answer was for)
    q = rep["cases"][0]["question"]
    assert isinstance(q, str) and 0 < len(q) <= evals.QUESTION_CHARS + 1
    capsys.readouterr()
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(rep, weights="0123456789abcdef")))
    assert main(["eval", "--suite", "arith", "--n", "1", "--quiet", "--device", "cpu",
                 "--compare", str(other)]) == 2
    err = capsys.readouterr().err
    assert "made from other weights (fingerprint 0123456789abcdef" in err
    assert rep["weights"] in err and "Traceback" not in err
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in rep.items() if k != "weights"}))
    assert main(["eval", "--suite", "arith", "--n", "1", "--quiet", "--device", "cpu",
                 "--compare", str(old), "--check"]) == 0
    assert "does not say which weights made it" in capsys.readouterr().err


def test_the_fingerprint_is_shared_by_both_formats_and_changed_by_training():
    """BF16 and its NVFP4 GGUF agree (the 1-D tensors are never quantized); a changed norm
    weight (what a training step does) changes it; a plant applied after it does not matter."""
    import torch

    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

    d = ensure_default_checkpoint(progress=False)
    bf16 = load_checkpoint(d, None, torch.device("cpu"), False)
    nvfp4 = load_checkpoint(d / "model-nvfp4.gguf", None, torch.device("cpu"), False)
    fp = bf16.weights.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp) and nvfp4.weights.fingerprint() == fp
    bf16.weights.final_norm[0] += 0.25
    assert bf16.weights.fingerprint() != fp


def test_a_long_question_keeps_its_end():
    long = evals.Case("arith", 0, [{"role": "user", "content": "x" * 5000 + " what is 2 + 2?"}],
                      None, "4")
    q = evals.question_text(long)
    assert q.startswith("…") and q.endswith("what is 2 + 2?")
    assert len(q) == evals.QUESTION_CHARS + 1
    recall = evals.build_cases(("recall",), 1, seed=0, contexts=(1024,))[0]
    assert "K" in evals.question_text(recall) and len(evals.question_text(recall)) < 200


def test_cli_compare_refuses_a_planted_reference_unless_the_same_plant(tmp_path, capsys):
    """A report made with --plant is a bug on purpose: held to it, a clean run 'FAILED' with
    nothing saying why (bad-input trial, 2026-12-03). Refused unless this run has the same
    plant (a plant's rerun)."""
    from flint_graph.cli import main

    planted = tmp_path / "planted.json"
    args = ["eval", "--suite", "arith", "--n", "1", "--quiet", "--device", "cpu"]
    assert main(args + ["--plant", "no-sink", "--json", str(planted)]) == 0
    capsys.readouterr()
    assert main(args + ["--compare", str(planted)]) == 2
    err = capsys.readouterr().err
    assert "made with --plant no-sink (a deliberate bug)" in err and "Traceback" not in err
    assert main(args + ["--plant", "no-sink", "--compare", str(planted), "--check"]) == 0


@pytest.mark.parametrize("field, value, word", [
    ("contexts", "abc", "contexts: expected a list of context lengths"),
    ("contexts", [1024, "x"], "contexts: expected a list of context lengths"),
    ("suites", ["bogus"], "suites: expected a non-empty list of suite names"),
    ("suites", [], "suites: expected a non-empty list of suite names"),
    ("engine", "turbo", 'engine: expected "reference" or "graph"'),
    ("device", 3, "device: expected a device name"),
    ("batch", 0, "batch: expected an integer >= 1"),
    ("threads", 1.5, "threads: expected null or an integer >= 1"),
    # the suites and scores its cases give (a bad-input trial, 2026-12-06)
    ("suites", ["tools", "arith"], "suites: expected the suites its cases come from"),
    ("suites", ["arith", "arith"], "suites: expected the suites its cases come from"),
    ("groups", {"arith": {"n": 1, "correct": 0.0}}, "groups.arith.correct: expected the score"),
    ("groups", {"arith": {"n": 1, "valid": 1.0}}, "groups.arith.valid: expected the score"),
    ("groups", {"arith": {"n": 1}}, "groups.arith.correct: expected the score"),
])
def test_a_reports_setup_fields_are_checked(field, value, word):
    """A --compare reference edited to `"contexts": "abc"` or `"suites": ["bogus"]` was taken,
    and since the setup no longer matched, the run was held to another setup's looser
    log-probability tolerance and PASSED (a hostile-input trial)."""
    from flint_graph.errors import InvalidRequestError

    rep = {"groups": {"arith": {"n": 1, "correct": 1.0}}, "engine": "graph", "device": "cuda",
           "suites": ["arith"], "contexts": [1024], "batch": 8, "threads": None,
           "cases": [{"group": "arith", "index": 0, "got": "1", "correct": True}]}
    assert evals.check_report(dict(rep), "r")
    with pytest.raises(InvalidRequestError, match=f"^r: {word}"):
        evals.check_report({**rep, field: value}, "r")


def test_a_long_eval_on_the_cpu_says_so_before_it_starts(tmp_path, capsys, monkeypatch):
    """A new user's trial (2026-12-05): the README's first eval line on the CPU showed a bar
    at 0/400 and nothing else for what would take well over an hour. A run past --n 10 or
    recall past 4,096 tokens now says so on stderr before its cases run (after the checks that
    can still refuse it: a note followed by an error read as two verdicts, a trial of
    2026-12-07); a short one does not."""
    from flint_graph.cli import main
    from flint_graph.errors import InvalidRequestError
    from flint_graph.nano import evals

    def stop(*a, **k):
        raise InvalidRequestError("stopped here by the test")

    monkeypatch.setattr(evals, "run", stop)
    for argv, long in ((["--suite", "arith", "--n", "2"], False),
                       (["--suite", "arith", "--n", "11"], True),
                       (["--suite", "recall", "--n", "1", "--contexts", "1024,8192"], True)):
        assert main(["eval", "--quiet", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err
        assert "stopped here by the test" in err
        assert ("a long run" in err and "--n 10 --contexts 1024,4096 takes about 4 minutes"
                in err) == long, (argv, err)
    # refused for the model's context limit: the error alone, no note before it
    assert main(["eval", "--quiet", "--device", "cpu", "--suite", "recall", "--n", "1",
                 "--contexts", "40000"]) == 2
    err = capsys.readouterr().err
    assert "does not fit the model's context limit" in err and "a long run" not in err, err


def test_result_suite_cases():
    """--suite result: the turn after a held-out tool call with its JSON result; every other
    case sends the call back without its reasoning (as an OpenAI-style client does), and the
    answer expected is "Result: " and the JSON exactly."""
    import json

    from flint_graph.nano.evals import build_cases, score

    cases = build_cases(("result",), 6)
    assert [c.group for c in cases] == ["result"] * 6
    for c in cases:
        user, call, tool = c.messages
        assert user["role"] == "user" and call["tool_calls"] and tool["role"] == "tool"
        assert bool(call.get("reasoning_content")) == (c.index % 2 == 0)
        assert c.expect == "Result: " + tool["content"]
        json.loads(tool["content"])

    class Msg:
        tool_calls, finish_reason = [], "stop"

        def __init__(self, content):
            self.content = content

    assert score(cases[0], Msg(cases[0].expect)) == {"correct": True}
    renamed = cases[0].expect.replace('{"', '{"ok_', 1)
    assert score(cases[0], Msg(renamed)) == {"correct": False}


@pytest.mark.parametrize("args, words", [
    (["--suite", "tools,bogus"], "('bogus' is not one)"),
    (["--suite", "result,result"], "result given more than once"),
    (["--suite", "tools,"], "an empty name between commas"),
    (["--suite", "tools,,arith"], "an empty name between commas"),
    (["--n", "٣"], "--n: expected a case count"),
    (["--n", "1_0"], "--n: expected a case count"),
    (["--contexts", "٣٠٠"], "--contexts: expected comma-separated recall contexts"),
    (["--contexts", "1_024"], "--contexts: expected comma-separated recall contexts"),
])  # fmt: skip
def test_eval_flags_name_what_is_wrong(capsys, args, words):
    """A bad-input trial (2026-12-06): `--suite tools,bogus` did not say which name was bad,
    `--suite result,result` ran once without a word (a repeated --contexts value is refused),
    and `--n ٣`, `--n 1_0`, `--contexts ٣٠٠` ran (int() reads them; flags take plain
    digits)."""
    from flint_graph.cli import main

    assert main(["eval", *args, "--device", "cpu"]) == 2
    assert words in capsys.readouterr().err


def test_a_reader_that_leaves_ends_a_report_with_exit_0():
    """`eval … | head -1` ended with exit 1 and no word (rich's console exits 1 on a broken
    pipe, the code of a missed --check target); the report console raises BrokenPipeError,
    which the CLI answers as for generate: exit 0."""
    from flint_graph.perf.cli import report_console

    with pytest.raises(BrokenPipeError):
        report_console().on_broken_pipe()


def test_contexts_matter_to_the_setup_only_with_recall():
    """A --suite result run with other --contexts than its reference was held to the looser
    other-setup tolerance, though contexts shape only the recall cases (a bad-input trial)."""
    base = {"engine": "graph", "device": "cuda", "batch": 8, "threads": None, "n": 4,
            "seed": 0}
    a = {**base, "suites": ["result"], "contexts": [1024]}
    assert evals.same_setup(a, {**a, "contexts": [4096]})
    r = {**base, "suites": ["recall"], "contexts": [1024]}
    assert not evals.same_setup(r, {**r, "contexts": [4096]})


def test_the_progress_bar_weighs_a_long_recall_case_above_a_short_one(tiny_llm):
    """A new user's trial (2026-12-07): the bar counted cases, so after the quick ones it said
    ~3 minutes were left of a run of more than an hour (the 16K-token recall cases come last).
    Each case now weighs its estimated seconds: a 16K recall list many times a tool call."""
    tools = evals.build_cases(("tools",), 2)[:1]
    long = evals.build_cases(("recall",), 2, contexts=(16384,))[:1]
    short, big = evals.case_costs(tiny_llm, tools + long, batch=8)
    assert big > 20 * short > 0


def test_the_weighted_bar_counts_items_and_writes_plain_lines_off_a_terminal(monkeypatch):
    from rich.console import Console

    from flint_graph.terminal.progress import plain_count_lines, weighted_progress_bar

    def never():
        raise AssertionError("weights computed for work that ended before its first line")

    with weighted_progress_bar(True, "eval", never) as advance:  # stderr not a terminal
        advance(1)
    # off a terminal: a plain line every few seconds (`eval 2>err.log` wrote nothing for
    # minutes: a new user's trial, 2026-12-07)
    lines = []
    with plain_count_lines("eval", lambda: [1.0, 9.0, 5.0], every_s=0.05,
                           write=lines.append) as advance:
        advance(2)
        import time
        time.sleep(0.3)
    assert lines and lines[-1].startswith("eval: 2 of 3 cases done (67% of the estimated "
                                          "work), 0 s"), lines
    seen = []
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    import rich.progress

    update = rich.progress.Progress.update

    def spy(self, task, **kw):
        seen.append((kw.get("advance"), kw.get("items")))
        return update(self, task, **kw)

    monkeypatch.setattr(rich.progress.Progress, "update", spy)
    with weighted_progress_bar(True, "eval", lambda: [1.0, 9.0, 5.0]) as advance:
        advance(2)
        advance(1)
    assert seen == [(10.0, 2), (5.0, 3)]


def test_every_report_in_docs_passes_the_report_check():
    """A report of every suite can be a --compare reference: step 9521's `--suite follow`
    report failed the check (follow-arith was no known group), found scanning docs/ in the
    thirty-fifth session."""
    import gzip
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    seen = 0
    for path in [*docs.rglob("*.json"), *docs.rglob("*.json.gz")]:
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt") as f:
                rep = json.load(f)
        except (ValueError, OSError):
            continue
        if isinstance(rep, dict) and "cases" in rep and "groups" in rep:
            evals.check_report(rep, str(path))
            seen += 1
    assert seen >= 50
