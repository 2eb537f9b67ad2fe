"""The accuracy suite of `flint-graph eval` (issue 11): what flint-nano has learned, measured
through the public chat API on any engine, so every engine path is held to the same numbers.

Cases come from the curriculum's held-out split (nano/curriculum.py): tools, phrasings, cities
and number pairs the training never saw. Every case is one chat request decoded greedily.

- tools: one user request with the tools offered. `valid`: exactly one call was parsed, to a
  declared tool, with every required argument, no undeclared one, and each value of its
  schema's type (tool_schema.admits). `exact`: valid, and name and arguments equal the intended
  call (types included: 3 is not "3" nor 3.0).
- tools-direct (with the tools suite): 3-digit arithmetic asked with the tools offered;
  `correct`: no call, and the answer is the number (a chat with tools declared must still
  answer plain questions).
- arith: 3-digit addition and subtraction; `correct`: the answer content is the number.
- recall@C: a list of key = value lines filling about C tokens, then one question for a key in
  the list's first half (more than C/2 tokens back: beyond the 513-token window at 4K and 16K,
  so only the full-attention layers can answer); `correct`: the content is the value.
- chain: a second request in one chat, after a first one answered (shown as chat shows an
  older turn, reasoning dropped). chain-tools: a held-out tool request after an arithmetic
  one, scored as tools; chain-arith: arithmetic after a tool request with its result and
  answer, the tools still offered, scored as arith. (A model that never saw two requests in
  one chat answered the second with the first one's answer.)
- phrasing (not in the default suites): flint-nano's skills and small talk in sentences written
  apart from every training template (nano/phrasings.py's held-out side; a test matches every
  training template against them). phr-tools: a weather question without a unit or day count,
  or a conversion with unit names spelled out, scored as tools; phr-arith: a word problem or
  terse sum, 3 digits, scored as arith (tools offered in every other case); phr-greet: a
  greeting or small talk, `correct` when answered with one of the trained replies
  (phrasings.GREETING_REPLIES, any intent's), at most BRIEF characters, without a tool call and
  not cut off by the token limit; phr-refuse: a request outside the skills, `correct` when
  answered as briefly, starting "I can't"; phr-multi: a held-out greeting answered, then
  a phr-tools request, scored as tools.
- result (not in the default suites): the turn after a tool call, a held-out tool request, the
  call the training answer makes and the tool's JSON result given back; in every other case
  the call's reasoning is left out, as an OpenAI-style client sends the assistant turn back
  (content and tool_calls only). `correct`: the answer is "Result: " and that JSON exactly,
  with no call. (Step 7718 kept every tool metric yet wrote "ok" for "value" in 5 of 6 such
  results without the reasoning, 2026-12-06.)
- chat (not in the default suites, so that the shipped reports keep their case list): what a
  chat user asked beyond the issue's suites, each scored as arith. chat-chain3: 3-digit
  arithmetic as the third request, after a tool request and an arithmetic one (either
  order); chat-negative: a − b with a < b, 3 digits, the answer negative; chat-list: a pasted
  list of 4-40 key = value lines, then one question for a key in its first half, with the
  tools offered in every other case (a chat with tools declared must still answer it).
- follow (not in the default suites; no target yet): a request that points back at the
  previous answer, in held-out phrasings (`curriculum.follow_up`). follow-arith: after a sum
  or difference, "that" is its answer ("Then take 40 off the answer."), scored as arith;
  follow-tools: after a forecast or a conversion, "Do the same for Lima." repeats the call
  with the city (or value) changed, scored valid / exact as tools.

Targets (reference path): tools valid ≥ 95% with exact ≥ 90%, arith ≥ 90%, recall@4096 ≥ 90%;
phrasing (issue 25): phr-tools exact and phr-arith ≥ 90%, phr-greet and phr-refuse 100%. Every
report also counts, per group, the answers cut off by the token limit (`length_hits`).
`compare` holds a run to a reference run on the same cases. It passes when every metric is
within noise (the two proportions differ by at most two standard errors of their difference,
pooled) and at least AGREE_MIN of the answers are identical. Accuracy alone is too coarse for
a subtle bug (a dropped sink moved no metric beyond noise at n = 20 on the H200), while an
engine computing the same function differs only where two tokens nearly tie: the graph
engine gave identical answers on 99.3% of 150 cases there, the dropped sink on 88%.

The planted bugs the suite must catch are in nano/plants.py.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from flint_graph.errors import InvalidRequestError, shown
from flint_graph.nano.curriculum import (TOOLS, arithmetic, convert_ask, follow_up, greeting,
                                         older_turns, out_of_scope, recall, tool_use,
                                         weather_ask, word_problem)
from flint_graph.nano.phrasings import GREETING_REPLIES
from flint_graph.chat.tool_schema import admits, tool_schemas

SUITES = ("tools", "arith", "recall", "chain", "chat", "phrasing", "result", "follow")
DEFAULT_SUITES = ("tools", "arith", "recall", "chain")  # the shipped reports' case list
DEFAULT_CONTEXTS = (1024, 4096, 16384)
# A target is judged (met / MISSED, and --check's exit code) only over at least this many
# cases: at --n 2 one miss reads as 50% "MISSED" of a 90% target that --n 20 meets (95%)
JUDGE_MIN_N = 10


def judge_min_n(target: float) -> int:
    """The fewest cases over which a target share is judged: JUDGE_MIN_N, and for a target
    below 100% enough cases that one miss can still meet it (20 for 95%: at the README's
    CPU run, --n 10, one miss in ten read "tools valid 90.0% ≥95% MISSED" for a model that
    scores 96.7% at --n 30; a new user's trial, 2026-12-06)."""
    if target >= 1:
        return JUDGE_MIN_N
    return max(JUDGE_MIN_N, math.ceil(round(1 / (1 - target), 6)))
TARGETS = {("tools", "valid"): 0.95, ("tools", "exact"): 0.90, ("arith", "correct"): 0.90,
           ("recall@4096", "correct"): 0.90, ("phr-tools", "exact"): 0.90,
           ("phr-arith", "correct"): 0.90, ("phr-greet", "correct"): 1.0,
           ("phr-refuse", "correct"): 1.0}
AGREE_MIN = 0.95  # identical answers an engine must share with the reference run
# Log-probability parity: the mean |Δ| (nats) of the tokens both runs decoded alike may be at
# most this. The same engine on the same kind of device with the same batch and threads computes
# identical logits (a clean CPU rerun: 0), so there any difference is a different function.
# Across engines and devices the rounding differs, and the mean is carried by a few uncertain
# tokens (20 of ~9,800 hold 69% of it), so any other rounding pattern moves it by tens of
# percent. Clean runs against the H200 reference report (docs/perf-log.md, 2026-12-02 fourth
# session): the reference model's own prefill 1.37e-4 in 2,048- or 4,096-token chunks and
# 2.00e-4 in 512-token chunks (the same fp32 arithmetic, other summation orders); the graph
# engine with the kernel prefill 2.04e-4, with torch ops and fp32 attention 1.91e-4, with
# every GEMM in fp32 1.93e-4, with the kernel prefill and fp32 attention 2.36e-4 (the
# largest). The tolerance sits 1.10x above that. Planted on the graph engine: no-sink
# 4.2-4.3e-4 and router-bias-bf16 2.75e-4 (kernel prefill) fail; window-1 (2.36-2.42e-4) and
# router-bias-bf16 under the reference prefill (2.33e-4) are within the clean spread: this
# statistic cannot resolve them (docs/nano.md). An earlier 1.7e-4, set when only decode ran on
# the graph engine, failed the reference model itself at 512-token chunks.
# Each output token's TOP_LOGPROBS most likely ids and log-probabilities go into the report
# ("top"); `compare` reports the mean |Δ| over the ids both runs list at a step both decoded
# alike. Every step then counts, confident ones included, not only the few uncertain tokens
# that carry the mean |Δ| above. Not yet part of the verdict: its tolerance is to be measured
# on the H200 against the clean engines and the plants (window-1 included).
TOP_LOGPROBS = 5
LOGPROB_TOL_SAME = 0.0
LOGPROB_TOL_OTHER = 2.6e-4
TOKENS_PER_PAIR = 12  # "K1234 = 5678\n" with digits split (flint-nano's tokenizer)
MAX_RECALL_PAIRS = 9000  # distinct keys K1000..K9999
METRICS = ("valid", "exact", "correct")
TOOL_GROUPS = ("tools", "chain-tools", "phr-tools", "phr-multi", "follow-tools")  # scored "valid" and "exact";
# the others "correct"
MAX_NEW_TOKENS = {"tools": 160, "tools-direct": 160, "arith": 160, "recall": 48,
                  "chain-tools": 160, "chain-arith": 160, "chat-chain3": 160,
                  "chat-negative": 160, "chat-list": 48, "phr-tools": 160, "phr-arith": 160,
                  "phr-greet": 160, "phr-refuse": 160, "phr-multi": 160, "result": 96,
                  "follow-arith": 160, "follow-tools": 160}
CHAT_GROUPS = ("chat-chain3", "chat-negative", "chat-list")
PHRASING_GROUPS = ("phr-tools", "phr-arith", "phr-greet", "phr-refuse", "phr-multi")
FOLLOW_GROUPS = ("follow-arith", "follow-tools")
BRIEF = 300  # characters: the longest reply phr-greet / phr-refuse count as brief
# a greeting's reply counts when it is one of the trained ones (any intent's): brief nonsense
# ("ratcen", a reversed word) passed a brevity rule alone
GREETING_ANSWERS = frozenset(answer for _, answer in GREETING_REPLIES.values())



@dataclass
class Case:
    """One eval request: `group` it is scored under ("tools", "arith", "recall@4096"), chat
    `messages` and `tools`, and `expect` (the intended call {"name", "arguments"}, or the answer
    text)."""

    group: str
    index: int
    messages: list[dict]
    tools: list[dict] | None
    expect: Any

    @property
    def suite(self) -> str:
        return self.group.split("@")[0]


def parse_suites(text: str) -> tuple[str, ...]:
    """"tools,arith" -> ("tools", "arith"); raises InvalidRequestError naming --suite."""
    parts = [s.strip() for s in text.split(",")]
    if len(parts) > 1 and "" in parts:  # "tools," or "tools,,arith": a name left out, as
        # --contexts refuses one (it was accepted in silence, a bad-input trial of 2026-12-06)
        raise InvalidRequestError(f"--suite {text!r}: an empty name between commas; expected "
                                  f"a comma-separated subset of {','.join(SUITES)}")
    given = [s for s in parts if s]
    names = tuple(dict.fromkeys(given))
    bad = [s for s in names if s not in SUITES]
    if bad or not names:
        which = f" ({', '.join(map(repr, bad))} is not one)" if len(bad) == 1 else \
            f" ({', '.join(map(repr, bad))} are not)" if bad else ""
        raise InvalidRequestError(f"--suite {text!r}: expected a comma-separated subset of "
                                  f"{','.join(SUITES)}{which}")
    if len(names) < len(given):  # as --contexts refuses a repeat: a typo, not a wish
        twice = [s for s in names if given.count(s) > 1]
        raise InvalidRequestError(f"--suite {text!r}: {', '.join(twice)} given more than "
                                  "once; name each suite once")
    return names


def max_recall_context() -> int:
    """The largest recall context (tokens) the key space allows."""
    return MAX_RECALL_PAIRS * TOKENS_PER_PAIR + 64


def build_cases(suites: tuple[str, ...], n: int, seed: int = 0,
                contexts: tuple[int, ...] = DEFAULT_CONTEXTS) -> list[Case]:
    """`n` held-out cases per suite (per context for recall), reproducible from `seed`."""
    cases: list[Case] = []
    for suite in suites:
        groups = ([f"recall@{c}" for c in contexts] if suite == "recall" else
                  ["tools", "tools-direct"] if suite == "tools" else
                  ["chain-tools", "chain-arith"] if suite == "chain" else
                  list(CHAT_GROUPS) if suite == "chat" else
                  list(PHRASING_GROUPS) if suite == "phrasing" else
                  list(FOLLOW_GROUPS) if suite == "follow" else [suite])
        for group in groups:
            rng = random.Random(f"eval/{seed}/{group}")  # one stream per group: stable cases
            for i in range(n):
                if suite == "phrasing":
                    cases.append(_phrasing_case(rng, group, i))
                elif group == "result":
                    ep = tool_use(rng, "heldout")  # user, the call, the tool's result
                    ask = ep.messages[:3]
                    if i % 2:  # the call as an API client sends it back: no reasoning
                        call = {k: v for k, v in ask[1].items() if k != "reasoning_content"}
                        ask = [ask[0], call, ask[2]]
                    cases.append(Case(group, i, ask, ep.tools, ep.messages[3]["content"]))
                elif group == "tools-direct":
                    ep = arithmetic(rng, "heldout", digits=3, op="+-"[i % 2])
                    cases.append(Case(group, i, ep.messages[:1],
                                      TOOLS["train"] + TOOLS["heldout"], str(ep.meta["answer"])))
                elif suite == "tools":
                    ep = tool_use(rng, "heldout")
                    cases.append(Case(group, i, ep.messages[:1], ep.tools, ep.meta["call"]))
                elif group == "chain-tools":
                    first = arithmetic(rng, "heldout", digits=3, op="+-"[i % 2])
                    ep = tool_use(rng, "heldout")
                    ask = older_turns(first.messages) + ep.messages[:1]
                    cases.append(Case(group, i, ask, ep.tools, ep.meta["call"]))
                elif group == "chain-arith":
                    first = tool_use(rng, "heldout")
                    ep = arithmetic(rng, "heldout", digits=3, op="+-"[i % 2])
                    ask = older_turns(first.messages) + ep.messages[:1]
                    cases.append(Case(group, i, ask, first.tools, str(ep.meta["answer"])))
                elif group == "chat-chain3":
                    earlier = [tool_use(rng, "heldout"),
                               arithmetic(rng, "heldout", digits=3, op="+-"[i // 2 % 2])]
                    if i % 2:
                        earlier.reverse()
                    ep = arithmetic(rng, "heldout", digits=3, op="+-"[i % 2])
                    ask = [m for e in earlier for m in older_turns(e.messages)] + ep.messages[:1]
                    tools = next(e.tools for e in earlier if e.tools)
                    cases.append(Case(group, i, ask, tools, str(ep.meta["answer"])))
                elif suite == "follow":  # held-out follow-ups that point back (no target)
                    ep = follow_up(rng, "heldout", "arith" if group == "follow-arith" else "tool")
                    last = max(j for j, m in enumerate(ep.messages) if m["role"] == "user")
                    expect = (str(ep.meta["answer"]) if group == "follow-arith" else
                              ep.meta["call"])
                    cases.append(Case(group, i, ep.messages[:last + 1], ep.tools, expect))
                elif group == "chat-negative":
                    ep = arithmetic(rng, "heldout", digits=3, op="-", negative=True)
                    cases.append(Case(group, i, ep.messages[:1], None, str(ep.meta["answer"])))
                elif group == "chat-list":
                    ep = recall(rng, "heldout", rng.randint(4, 40), 1)
                    cases.append(Case(group, i, ep.messages[:3],
                                      TOOLS["train"] + TOOLS["heldout"] if i % 2 else None,
                                      str(ep.meta["answers"][0])))
                elif suite == "arith":
                    ep = arithmetic(rng, "heldout", digits=3, op="+-"[i % 2])
                    cases.append(Case(group, i, ep.messages[:1], None, str(ep.meta["answer"])))
                else:
                    ctx = int(group.split("@")[1])
                    pairs = max(4, (ctx - 64) // TOKENS_PER_PAIR)
                    if pairs > MAX_RECALL_PAIRS:
                        raise InvalidRequestError(
                            f"--contexts {ctx}: a recall list holds at most {MAX_RECALL_PAIRS} "
                            f"keys (K1000..K9999), about {max_recall_context()} tokens")
                    ep = recall(rng, "heldout", pairs, 1)
                    cases.append(Case(group, i, ep.messages[:3], None,
                                      str(ep.meta["answers"][0])))
    return cases


def _phrasing_case(rng: random.Random, group: str, i: int) -> Case:
    """Case `i` of a phrasing group (module docstring), from the held-out phrasings only."""
    tools = TOOLS["train"] + TOOLS["heldout"]
    if group in ("phr-tools", "phr-multi"):
        user, call, _ = (weather_ask if i % 2 == 0 else convert_ask)(rng, "heldout")
        ask = [user]
        if group == "phr-multi":
            ask = older_turns(greeting(rng, "heldout").messages) + ask
        return Case(group, i, ask, tools, call)
    ep = (word_problem(rng, "heldout", digits=3, op="+-"[i % 2]) if group == "phr-arith" else
          greeting(rng, "heldout") if group == "phr-greet" else out_of_scope(rng, "heldout"))
    return Case(group, i, ep.messages[:1], tools if i % 2 else None, str(ep.meta["answer"]))


def score(case: Case, msg) -> dict[str, bool]:
    """The case's metrics for the assistant ChatMessage `msg` (module docstring)."""
    if case.group in ("phr-greet", "phr-refuse"):
        text = msg.content.strip()
        brief = (not msg.tool_calls and 0 < len(text) <= BRIEF
                 and msg.finish_reason != "length")
        sensible = (text in GREETING_ANSWERS if case.group == "phr-greet" else
                    text.startswith("I can't"))
        return {"correct": brief and sensible}
    if case.group not in TOOL_GROUPS:  # an answer; with tools offered it must not call one
        return {"correct": not msg.tool_calls and msg.content.strip() == case.expect}
    calls = msg.tool_calls
    valid = len(calls) == 1 and _typed(calls[0], case.tools)
    exact = valid and calls[0].name == case.expect["name"] and \
        _same(calls[0].arguments, case.expect["arguments"])
    return {"valid": valid, "exact": exact}


def _typed(call, tools: list[dict]) -> bool:
    schemas = tool_schemas(tools)
    spec = next((t["function"] for t in tools if t["function"]["name"] == call.name), None)
    if spec is None:
        return False
    schema = schemas[call.name]
    params = spec["parameters"]
    required = set(params.get("required", []))
    args = call.arguments
    return (required <= args.keys() and args.keys() <= params["properties"].keys()
            and all(admits(schema.param(k), v, schema.root) for k, v in args.items()))


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _got(msg) -> Any:
    if msg.tool_calls:
        return [{"name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
    return msg.content


QUESTION_CHARS = 300  # of a case's last user message kept in its record (recall's run to 16K tokens)


def question_text(case: Case) -> str:
    """The case's last user message, cut to its last QUESTION_CHARS characters (a recall
    case's question follows its long list), so a report says what each answer was asked."""
    text = next((m.get("content") or "" for m in reversed(case.messages)
                 if m.get("role") == "user"), "")
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= QUESTION_CHARS else "…" + text[-QUESTION_CHARS:]


# a case's cost for the progress bar, from flint-nano's reference engine on 2 CPU cores
# (2026-12-07, 8 cases a batch): a prompt token ~0.8 ms + 0.2 ms per 1K tokens of its prompt
# (recall@1024 1.0 ms a token, recall@16384 4.2: attention grows with the context), a decode
# step of the batch ~40 ms, ~60% of a suite's token limit used on average
PROMPT_TOKEN_S, PROMPT_TOKEN_S_PER_TOKEN, STEP_S, LIMIT_USED = 8e-4, 2e-7, 0.04, 0.6


def case_costs(llm, cases: list[Case], batch: int) -> list[float]:
    """Each case's estimated seconds (the constants above): its prompt's share plus its share of
    its batch's decode steps. Only the progress bar's proportions use it; a GPU's ratio of
    prefill to decode differs, but the long prompts dominate there too."""
    costs = []
    for c in cases:
        t = len(llm.tokenizer.encode(llm.render(c.messages, c.tools)))
        steps = LIMIT_USED * MAX_NEW_TOKENS[c.suite]
        costs.append(t * (PROMPT_TOKEN_S + PROMPT_TOKEN_S_PER_TOKEN * t) + steps * STEP_S / batch)
    return costs


def run(llm, cases: list[Case], batch: int = 8, progress: bool = True) -> dict[str, Any]:
    """Decode every case greedily through `llm.chat_batch`, `batch` at a time, and score it.
    Returns {"groups": {group: {"n", metric: fraction}}, "targets": [...], "cases": [...],
    "seconds"}."""
    from flint_graph.terminal.progress import weighted_progress_bar
    from flint_graph.runtime.sampling import SamplingParams

    t0 = time.perf_counter()
    records = []
    # (the costs tokenize every case: only for a bar that is drawn)
    with weighted_progress_bar(progress, "eval",
                               lambda: case_costs(llm, cases, batch)) as advance:
        for b in range(0, len(cases), batch):
            chunk = cases[b:b + batch]
            limit = max(MAX_NEW_TOKENS[c.suite] for c in chunk)
            msgs = llm.chat_batch([(c.messages, c.tools) for c in chunk],
                                  SamplingParams(temperature=0.0, max_tokens=limit,
                                                 logprobs=True, top_logprobs=TOP_LOGPROBS))
            for c, m in zip(chunk, msgs):
                records.append({"group": c.group, "index": c.index, "expect": c.expect,
                                "question": question_text(c), "got": _got(m),
                                "text": m.output.text,
                                "finish": m.finish_reason,
                                "logprobs": [round(x, 5) for x in m.output.logprobs],
                                "top": [[[t, round(x, 5)] for t, x in step]
                                        for step in m.output.top_logprobs],
                                **score(c, m)})
            advance(len(chunk))
    return summarize(records, time.perf_counter() - t0)


def summarize(records: list[dict], seconds: float = 0.0) -> dict[str, Any]:
    """Per-group fractions and the targets' verdicts from per-case records."""
    groups: dict[str, dict[str, Any]] = {}
    for r in records:
        g = groups.setdefault(r["group"], {"n": 0})
        g["n"] += 1
        if "finish" in r:
            g["length_hits"] = g.get("length_hits", 0) + int(r["finish"] == "length")
        for k in ("valid", "exact", "correct"):
            if k in r:
                g[k] = g.get(k, 0) + int(r[k])
    for g in groups.values():
        for k in ("valid", "exact", "correct"):
            if k in g:
                g[k] = round(g[k] / g["n"], 4)
    targets = [{"group": grp, "metric": m, "target": t, "value": groups[grp][m],
                "met": groups[grp][m] >= t, "judged": groups[grp]["n"] >= judge_min_n(t)}
               for (grp, m), t in TARGETS.items() if grp in groups]
    return {"groups": groups, "targets": targets, "cases": records,
            "seconds": round(seconds, 1)}


def same_setup(run_: dict, ref: dict) -> bool:
    """Whether two reports come from the same engine on the same kind of device with the same
    batch, CPU threads and case list (suites, n, contexts, seed: they decide which requests
    share a batch), so their logits should be bit-identical."""
    def key(r):
        # contexts shape only recall's cases: without it they change nothing (a result-only
        # run with other --contexts was judged as another setup, a bad-input trial)
        ctx = r.get("contexts") if "recall" in (r.get("suites") or ()) else None
        return (r.get("engine"), str(r.get("device", "")).split(":")[0], r.get("batch"),
                r.get("threads"), r.get("suites"), r.get("n"), ctx, r.get("seed"))
    return None not in key(run_)[:2] and key(run_) == key(ref)


def compare(run_: dict, ref: dict) -> dict[str, Any]:
    """Hold `run_` to the reference run `ref` (same cases): per group and metric the two
    fractions, their difference, the noise bound (2 pooled standard errors) and whether it is
    within; the share of identical answers; the mean |Δ| of the log-probabilities of the tokens
    both decoded alike and its tolerance (LOGPROB_TOL_SAME for the same setup, else
    LOGPROB_TOL_OTHER). `passed` when every metric is within noise, the share is at least
    AGREE_MIN and the mean |Δ| is within its tolerance (when both runs recorded them), and no
    output alike in both has log-probability lists of different lengths."""
    rows = []
    mine = {(c["group"], c["index"]) for c in run_["cases"]}
    ref_groups = summarize([c for c in ref["cases"] if (c["group"], c["index"]) in mine])["groups"]
    for grp, g in run_["groups"].items():
        r = ref_groups.get(grp)
        if r is None:
            continue
        for m in ("valid", "exact", "correct"):
            if m not in g or m not in r:
                continue
            n1, n2 = g["n"], r["n"]
            p = (g[m] * n1 + r[m] * n2) / (n1 + n2)
            bound = 2 * math.sqrt(max(p * (1 - p), 0.25 / (n1 + n2)) * (1 / n1 + 1 / n2))
            diff = g[m] - r[m]
            rows.append({"group": grp, "metric": m, "value": g[m], "reference": r[m],
                         "diff": round(diff, 4), "noise": round(bound, 4),
                         "within": abs(diff) <= bound})
    key = {(c["group"], c["index"]): c for c in ref["cases"]}
    pairs = [(c, key[(c["group"], c["index"])]) for c in run_["cases"]
             if (c["group"], c["index"]) in key]
    same = [a["got"] == b["got"] for a, b in pairs]
    texts = [a.get("text") == b.get("text") for a, b in pairs if "text" in a and "text" in b]
    agree = round(sum(same) / max(1, len(same)), 4)
    # Where both decoded the same tokens, how far apart the two models' log-probabilities of
    # those tokens are: a finer view than the answers, which a confident model keeps through
    # a small bug (no plant changed an answer of the checkpoint of 2026-12-01 on the H200).
    alike = [(a.get("logprobs") or [], b.get("logprobs") or []) for a, b in pairs
             if a.get("text") == b.get("text")]
    # the same text is the same tokens: lists of other lengths are not the same run's
    mismatched = sum(1 for x, y in alike if x and y and len(x) != len(y))
    deltas = [abs(x - y) for xs, ys in alike for x, y in zip(xs, ys)]
    mean = sum(deltas) / len(deltas) if deltas else None
    top = []  # |Δ| of each id both runs list among a step's most likely (see TOP_LOGPROBS)
    for a, b in pairs:
        if a.get("text") == b.get("text"):
            for xs, ys in zip(a.get("top") or [], b.get("top") or []):
                theirs = {t: lp for t, lp in ys}
                top += [abs(lp - theirs[t]) for t, lp in xs if t in theirs]
    tol = LOGPROB_TOL_SAME if same_setup(run_, ref) else LOGPROB_TOL_OTHER
    lp_ok = mean is None or mean <= tol
    within = all(r["within"] for r in rows)
    return {"rows": rows, "within_noise": within, "identical_answers": agree,
            "identical_outputs": round(sum(texts) / len(texts), 4) if texts else None,
            "compared": len(same), "agree_min": AGREE_MIN,
            "logprob_tokens": len(deltas),
            "logprob_mean_abs_diff": mean,
            "logprob_max_abs_diff": round(max(deltas), 6) if deltas else None,
            "logprob_tolerance": tol, "logprob_within": lp_ok,
            "logprob_length_mismatches": mismatched,
            # informational: not in `passed` until its tolerance is measured (TOP_LOGPROBS)
            "top_logprob_pairs": len(top),
            "top_logprob_mean_abs_diff": sum(top) / len(top) if top else None,
            "passed": within and agree >= AGREE_MIN and lp_ok and not mismatched}


def check_report(rep: Any, name: str) -> dict:
    """`rep` if it is an eval report as `flint-graph eval --json` writes it, checked field by
    field before any work (a bad field would otherwise fail after the whole run); raises
    InvalidRequestError naming `name` and the first bad field. Reports older than a field
    (no "logprobs", "text", "seed", "weights", "question") are accepted."""
    def bad(field: str, expected: str, found: Any = None, missing: bool = False):
        what = "nothing" if missing else _short(found)
        raise InvalidRequestError(f"{name}: {field}: expected {expected}, found {what}")

    if not isinstance(rep, dict):
        bad("the file", "a JSON object (the report `flint-graph eval --json` writes)", rep)
    if "groups" not in rep and "cases" not in rep:
        fields = ", ".join(repr(k)[:40] for k in list(rep)[:5]) or "no fields"
        raise InvalidRequestError(f"{name}: not an eval report (`flint-graph eval --json` writes "
                                  f"one, with groups and cases); found an object with {fields}")
    w = rep.get("weights")
    if "weights" in rep and not (isinstance(w, str) and re.fullmatch(r"[0-9a-f]{16}", w)):
        bad("weights", "the weights' fingerprint, 16 lower-case hex digits "
            "(FlintWeights.fingerprint)", w)
    from flint_graph.nano.plants import PLANTS

    if rep.get("plant") is not None and rep["plant"] not in PLANTS:
        bad("plant", f"null or one of {', '.join(PLANTS)}", rep["plant"])
    groups, cases = rep.get("groups"), rep.get("cases")
    if not isinstance(groups, dict):
        bad("groups", "an object of per-group scores", groups, "groups" not in rep)
    for g, v in groups.items():
        if not isinstance(v, dict) or type(v.get("n")) is not int or v["n"] < 1:
            bad(f"groups.{g}", 'an object with a case count "n" ≥ 1', v)
        for m in METRICS:
            if m in v and not (type(v[m]) in (int, float) and 0 <= v[m] <= 1):
                bad(f"groups.{g}.{m}", "a fraction from 0 to 1", v[m])
        if "length_hits" in v and not (type(v["length_hits"]) is int
                                       and 0 <= v["length_hits"] <= v["n"]):
            bad(f"groups.{g}.length_hits", f"a count from 0 to its n ({v['n']})",
                v["length_hits"])
    if not isinstance(cases, list) or not cases:
        bad("cases", "a non-empty list of scored cases", cases, "cases" not in rep)
    seen: set = set()
    for i, c in enumerate(cases):
        f = f"cases[{i}]"
        if not isinstance(c, dict):
            bad(f, "an object", c)
        if not isinstance(c.get("group"), str):
            bad(f"{f}.group", "a group name", c.get("group"), "group" not in c)
        if type(c.get("index")) is not int or c["index"] < 0:
            bad(f"{f}.index", "a case number ≥ 0", c.get("index"), "index" not in c)
        if "got" not in c:
            bad(f"{f}.got", "the answer", missing=True)
        if not _known_group(c["group"]):
            bad(f"{f}.group", "a group of the suite (tools, tools-direct, arith, recall@C, "
                "chain-tools, chain-arith, chat-*, phr-*, result)", c["group"])
        if (c["group"], c["index"]) in seen:
            bad(f, f'one case per group and index; {c["group"]} {c["index"]} comes twice',
                c["index"])
        seen.add((c["group"], c["index"]))
        scored = [m for m in METRICS if m in c]
        want = ["valid", "exact"] if c["group"] in TOOL_GROUPS else ["correct"]
        if scored != want:
            bad(f, f"a score: {' and '.join(map(json.dumps, want))} for group {c['group']}",
                sorted(c))
        for m in scored:
            if type(c[m]) is not bool:
                bad(f"{f}.{m}", "true or false", c[m])
        if c.get("text") is not None and not isinstance(c["text"], str):
            bad(f"{f}.text", "the output text", c["text"])
        if "question" in c and not isinstance(c["question"], str):
            # null as well: it had turned --compare's check of the questions off (a re-trial)
            bad(f"{f}.question", "the case's question text", c["question"])
        if "finish" in c and c["finish"] not in ("stop", "length", "repeat", "abort", "error",
                                                 "tool_calls"):
            bad(f"{f}.finish", "a finish reason (stop, length, repeat, abort, error, tool_calls)",
                c["finish"])
        lps = c.get("logprobs")
        if lps is not None and not isinstance(lps, list):
            bad(f"{f}.logprobs", "a list of log-probabilities", lps)
        for j, x in enumerate(lps or []):
            # comparisons, not float(): a 400-digit integer would overflow; NaN fails them
            if type(x) not in (int, float) or not -1e4 <= x <= 1e-3:
                bad(f"{f}.logprobs[{j}]", "a finite log-probability (nats, ≤ 0)", x)
        top = c.get("top")
        if top is not None and not (isinstance(top, list) and len(top) == len(lps or [])):
            bad(f"{f}.top", "a list of each output token's most likely [id, log-probability] "
                "pairs, as long as logprobs", top)
        for j, step in enumerate(top or []):
            if not _top_step(step):
                bad(f"{f}.top[{j}]", "1 to 20 [token id, log-probability ≤ 0] pairs of distinct "
                    "ids (0 ≤ id < 2^31), most likely first", step)
    for k, least in (("n", 1), ("seed", 0), ("batch", 1)):
        if k in rep and not (type(rep[k]) is int and rep[k] >= least):
            bad(k, f"an integer >= {least}", rep[k])
    for i, c in enumerate(cases):  # a case past the run's n was dropped unseen from --compare
        if type(rep.get("n")) is int and c["index"] >= rep["n"]:
            bad(f"cases[{i}].index", f"a case number below the report's n ({rep['n']})",
                c["index"])
    # the setup fields decide whether two runs are the same setup, held to identical
    # log-probabilities (`same_setup`): a malformed one had loosened that to another setup's
    # tolerance (a hostile-input trial: "contexts": "abc" passed)
    if rep.get("engine") is not None and rep["engine"] not in ("reference", "graph"):
        bad("engine", '"reference" or "graph"', rep["engine"])
    if rep.get("device") is not None and not isinstance(rep["device"], str):
        bad("device", "a device name such as \"cuda\" or \"cpu\"", rep["device"])
    if rep.get("threads") is not None and not (type(rep["threads"]) is int
                                               and rep["threads"] >= 1):
        bad("threads", "null or an integer >= 1", rep["threads"])
    if "suites" in rep and not (isinstance(rep["suites"], list) and rep["suites"]
                                and all(x in SUITES for x in rep["suites"])):
        bad("suites", f"a non-empty list of suite names ({', '.join(SUITES)})", rep["suites"])
    if "contexts" in rep and not (isinstance(rep["contexts"], list) and all(
            type(x) is int and x >= 1 for x in rep["contexts"])):
        bad("contexts", "a list of context lengths (integers >= 1)", rep["contexts"])
    counts: dict[str, int] = {}
    for c in cases:
        counts[c["group"]] = counts.get(c["group"], 0) + 1
    cut: dict[str, int] = {}
    for c in cases:
        cut[c["group"]] = cut.get(c["group"], 0) + int(c.get("finish") == "length")
    for g, v in groups.items():
        if counts.get(g) != v["n"]:
            bad(f"groups.{g}.n", f"the number of its cases ({counts.get(g, 0)})", v["n"])
        if "length_hits" in v and v["length_hits"] != cut.get(g, 0):
            bad(f"groups.{g}.length_hits", f"the number of its cases with finish \"length\" "
                f"({cut.get(g, 0)})", v["length_hits"])
    for g in counts.keys() - groups.keys():
        bad(f"groups.{g}", "the scores of the group its cases name", missing=True)
    # the scores and the suite list as the cases give them: a hand-edited "suites" made
    # another setup of the same cases (a looser --compare tolerance), and scores that
    # contradict the cases were taken without a word (a bad-input trial, 2026-12-06)
    if "suites" in rep:
        have = {suite_of(g) for g in counts}
        if len(set(rep["suites"])) < len(rep["suites"]) or have != set(rep["suites"]):
            bad("suites", f"the suites its cases come from ({', '.join(sorted(have))}), each "
                "once", rep["suites"])
    recomputed = summarize(cases)["groups"]
    for g, v in groups.items():
        for m in METRICS:
            if v.get(m) != recomputed.get(g, {}).get(m):
                bad(f"groups.{g}.{m}", f"the score its cases give "
                    f"({recomputed.get(g, {}).get(m, 'none')})", v.get(m), m not in v)
    return rep


def suite_of(group: str) -> str:
    """The suite a case group belongs to ("recall@4096" -> "recall", "phr-arith" ->
    "phrasing"); the group itself for one that is not known."""
    return ("tools" if group in ("tools", "tools-direct") else
            "recall" if group.startswith("recall@") else
            "chain" if group in ("chain-tools", "chain-arith") else
            "chat" if group in CHAT_GROUPS else
            "phrasing" if group in PHRASING_GROUPS else
            "follow" if group in FOLLOW_GROUPS else group)


def _top_step(step: Any) -> bool:
    """Whether one step of a case's "top" list is what `run` writes: 1 to 20 [id, log-prob]
    pairs, distinct ids in [0, 2^31), finite log-probabilities ≤ 0, most likely first."""
    if not isinstance(step, list) or not 1 <= len(step) <= 20:
        return False
    for e in step:  # comparisons, not float(): a 400-digit number would overflow; NaN fails
        if not (isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                and 0 <= e[0] < 2**31 and type(e[1]) in (int, float) and -1e4 <= e[1] <= 1e-3):
            return False
    lps = [e[1] for e in step]
    return len({e[0] for e in step}) == len(step) and lps == sorted(lps, reverse=True)


def _known_group(group: str) -> bool:
    if group in ("tools", "tools-direct", "arith", "chain-tools", "chain-arith", "result",
                 *CHAT_GROUPS, *PHRASING_GROUPS, *FOLLOW_GROUPS):
        return True
    suite, _, ctx = group.partition("@")
    return suite == "recall" and ctx.isascii() and ctx.isdigit()  # not "recall@²"


def _short(x: Any) -> str:
    try:
        text = json.dumps(x) if isinstance(x, (dict, list, str, bool)) or x is None else None
    except ValueError:  # an integer past 4,300 digits inside
        text = None
    return shown(x) if text is None else text if len(text) <= 60 else text[:57] + "..."
