"""Holding two runs' greedy outputs to each other when one of them may round differently.

KV reuse, chunk sizes and batch buckets change which rows a GPU kernel sums together, so on
CUDA a resumed prefill or a decode-written KV entry can differ from a cold prefill's in the
last bit (docs/kv-reuse.md, "Chunk invariance"). The graph engine's LM head rounds each logit
to bf16 (docs/decode-kernels.md), one unit in the last place being 1/32 nat for logits in
[4, 8) (the tiny checkpoint's range) and 1/16 in [8, 16): two candidates within that of each
other are a tie the rounding decides, and a last-bit change upstream can swap them. The CPU
reference sums in float64 and is chunk-invariant, so there the outputs must be identical.

`assert_greedy_match` is the rule the reuse tests apply on both engines; the outputs need
`SamplingParams(logprobs=True, top_logprobs=k)` with k ≥ 2.
"""

# Bounds, from the H200 run of 2026-12-05 (the tool loop of test_kv_reuse.py, top-4 lists):
# reuse on against off differed by RMS 0.032 nat (max 0.25) over the log-probabilities both
# listed before their first differing pick, and the graph engine against the reference model
# by RMS 0.063 (max 0.51), the engine's accepted error (docs/perf-log.md: BF16 logits within
# ~5-10% relative of the reference's).
# a token both runs picked after the same history: within the engine's own distance from the
# reference; a wrong KV entry moves log-probabilities by more
LOGPROB_NATS = 1 / 2
# a swap of picks is a rounding tie when both runs have the two within this, or within
# TIE_SIGMAS x the RMS difference of the log-probabilities compared so far (~3 sigma of a
# difference of two values each off by that RMS), whichever is larger
NEAR_TIE_NATS = 1 / 16
TIE_SIGMAS = 4


def _lp(top: list[tuple[int, float]], token: int) -> float | None:
    return next((lp for t, lp in top if t == token), None)


def assert_greedy_match(got, want, exact: bool) -> int | None:
    """Assert that greedy outputs `got` equal `want`, output by output in the order the script
    made them (each has `token_ids`, `logprobs` and `top_logprobs`).

    exact: token for token and log-probability for log-probability (the CPU reference).
    Otherwise every id both runs list (pick or top list) at a token decoded after the same
    history has log-probabilities within LOGPROB_NATS, and the first differing pick must be a
    near tie in both runs: each run's log-probability of the other's pick within max(
    NEAR_TIE_NATS, TIE_SIGMAS x RMS of those differences) of its own pick. Outputs from that one
    on are not compared (later prompts contain it). Returns that output's index, or None.
    Raises AssertionError naming the output, the token position and the values."""
    assert len(got) == len(want), (len(got), len(want))
    if exact:
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        assert [g.logprobs for g in got] == [w.logprobs for w in want]
        return None
    sq, n = 0.0, 0
    for i, (g, w) in enumerate(zip(got, want)):
        a, b = list(g.token_ids), list(w.token_ids)
        same = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        for j in range(same):
            pairs = [(a[j], g.logprobs[j], w.logprobs[j])] + [
                (t, lp, _lp(w.top_logprobs[j], t)) for t, lp in g.top_logprobs[j] if t != a[j]]
            for t, x, y in pairs:
                if y is None:
                    continue
                assert abs(x - y) <= LOGPROB_NATS, (
                    f"output {i} token {j}: id {t}'s log-probabilities {x:.5f} vs {y:.5f}")
                sq, n = sq + (x - y) ** 2, n + 1
        if a == b:
            continue
        assert same < min(len(a), len(b)), (
            f"output {i}: one run stopped at token {same}, the other went on: {a} vs {b}")
        mine, theirs = a[same], b[same]
        gap_g = _lp(g.top_logprobs[same], mine) - (_lp(g.top_logprobs[same], theirs) or -1e9)
        gap_w = _lp(w.top_logprobs[same], theirs) - (_lp(w.top_logprobs[same], mine) or -1e9)
        tie = max(NEAR_TIE_NATS, TIE_SIGMAS * (sq / n) ** 0.5 if n else 0.0)
        assert gap_g <= tie and gap_w <= tie, (
            f"output {i} token {same}: {mine} vs {theirs} is no near tie (gaps {gap_g:.5f} and "
            f"{gap_w:.5f} nats, bound {tie:.5f}; top {g.top_logprobs[same]} vs "
            f"{w.top_logprobs[same]})")
        print(f"near tie at output {i} token {same}: {mine} vs {theirs} "
              f"(gaps {gap_g:.5f}, {gap_w:.5f} nats); later outputs not compared")
        return i
    return None
