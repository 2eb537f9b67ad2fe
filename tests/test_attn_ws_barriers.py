"""CPU check of the named-barrier protocol of attn_prefill_wg's warp-specialized form (WS = 1,
kernels/prefill/attn_prefill_wg.py `attn_prefill_ws_kernel`), which no GPU has run yet: a wrong
count there hangs the first device run. Each warp's barrier calls are written out below in the
kernel's order and conditions (producer: empty waits before refilling a stage, full arrivals
once its copies are in; consumers: the Q barrier, the ping-pong turns, full waits, empty
arrivals only where a later tile refills the stage), then run under many random schedules of
the 12 warps with the hardware's rule: a barrier completes when the threads counted reach its
expected number (a `bar.sync` counts its own warp and blocks until completion, a `bar.arrive`
does not block), and more arrivals than that within one phase is an error. Every schedule must
finish with every barrier back at zero: no deadlock, no phase mixing, arrivals equal waits.
This checks the protocol as written here, not the kernel's code: keep the two in step."""

import random

import pytest

from flint_graph.kernels.prefill import attn_prefill_wg as wg

EVERYONE, CONSUMERS, WARP = 384, 256, 32
ST = wg.STAGES


def producer_ops(ntiles: int) -> list[tuple[str, int, int]]:
    ops = []
    for it in range(ntiles):
        s = it % ST
        if it >= ST:
            ops.append(("sync", wg.WS_EMPTY_K + s, EVERYONE))
        if it >= 1:
            ops.append(("arrive", wg.WS_FULL_V + (it - 1) % ST, EVERYONE))
        if it >= ST:
            ops.append(("sync", wg.WS_EMPTY_V + s, EVERYONE))
        ops.append(("arrive", wg.WS_FULL_K + s, EVERYONE))
    ops.append(("arrive", wg.WS_FULL_V + (ntiles - 1) % ST, EVERYONE))
    return ops


def consumer_ops(ntiles: int, c: int) -> list[tuple[str, int, int]]:
    mine, other = wg.WS_TURN_BAR + c, wg.WS_TURN_BAR + 1 - c
    ops = [("sync", wg.WS_Q_BAR, CONSUMERS)]
    if c == 1:
        ops.append(("arrive", wg.WS_TURN_BAR, CONSUMERS))
    ops += [("sync", wg.WS_FULL_K, EVERYONE), ("sync", mine, CONSUMERS),
            ("arrive", other, CONSUMERS)]
    if ntiles > ST:
        ops.append(("arrive", wg.WS_EMPTY_K, EVERYONE))
    for it in range(1, ntiles):  # the kernel's three runs walk these tiles in order
        s_k, s_v = it % ST, (it - 1) % ST
        ops += [("sync", wg.WS_FULL_K + s_k, EVERYONE), ("sync", wg.WS_FULL_V + s_v, EVERYONE),
                ("sync", mine, CONSUMERS), ("arrive", other, CONSUMERS)]
        if it + ST < ntiles:
            ops.append(("arrive", wg.WS_EMPTY_K + s_k, EVERYONE))
        if it - 1 + ST < ntiles:
            ops.append(("arrive", wg.WS_EMPTY_V + s_v, EVERYONE))
    ops += [("sync", wg.WS_FULL_V + (ntiles - 1) % ST, EVERYONE), ("sync", mine, CONSUMERS)]
    if c == 0:
        ops.append(("arrive", other, CONSUMERS))
    return ops


def run(ntiles: int, rng: random.Random) -> None:
    """One random schedule of warps 0-7 (consumers) and 8-11 (producer) to its end; raises
    AssertionError on a deadlock or on more arrivals than a barrier's count in one phase."""
    warps = [consumer_ops(ntiles, w // 4) for w in range(8)] + \
        [producer_ops(ntiles) for _ in range(4)]
    pc = [0] * len(warps)
    count: dict[int, int] = {}
    expected: dict[int, int] = {}
    blocked: dict[int, list[int]] = {}  # barrier -> warps waiting in bar.sync
    waiting = set()
    while True:
        runnable = [w for w in range(len(warps)) if pc[w] < len(warps[w]) and w not in waiting]
        if not runnable:
            stuck = {w: warps[w][pc[w]] for w in waiting}
            assert not stuck, f"deadlock at ntiles={ntiles}: {stuck}"
            break
        w = rng.choice(runnable)
        op, bar, n = warps[w][pc[w]]
        assert expected.setdefault(bar, n) == n, f"barrier {bar} used with counts {n} and " \
                                                  f"{expected[bar]}"
        count[bar] = count.get(bar, 0) + WARP
        assert count[bar] <= n, f"barrier {bar}: more than {n} threads in one phase"
        pc[w] += 1
        if op == "sync":
            waiting.add(w)
            blocked.setdefault(bar, []).append(w)
        if count[bar] == n:  # the phase completes: its waiters go on
            count[bar] = 0
            for v in blocked.pop(bar, []):
                waiting.discard(v)
                # a bar.sync's warp resumes after its own op (pc already moved past it)
    assert all(v == 0 for v in count.values()), f"ntiles={ntiles}: left {count}"


@pytest.mark.parametrize("ntiles", [1, 2, 3, 4, 5, 8, 17])
def test_every_schedule_finishes_with_balanced_barriers(ntiles):
    rng = random.Random(ntiles)
    for _ in range(300):
        run(ntiles, rng)


def test_the_barrier_ids_are_distinct_hardware_ones():
    ids = [0, wg.WS_Q_BAR, wg.WS_TURN_BAR, wg.WS_TURN_BAR + 1] + [
        b + s for b in (wg.WS_FULL_K, wg.WS_FULL_V, wg.WS_EMPTY_K, wg.WS_EMPTY_V)
        for s in range(ST)]
    assert len(set(ids)) == len(ids) and max(ids) < 16  # 16 named barriers per CTA


def test_a_wrong_count_is_caught():
    """The check itself: a consumer that releases the last stage too (no tile refills it)
    leaves arrivals nobody waits for."""
    original = consumer_ops

    def leaky(ntiles, c):
        return original(ntiles, c) + [("arrive", wg.WS_EMPTY_K, EVERYONE)]

    globals()["consumer_ops"] = leaky
    try:
        with pytest.raises(AssertionError, match="left|more than"):
            for seed in range(50):
                run(4, random.Random(seed))
    finally:
        globals()["consumer_ops"] = original
