"""The rule the KV-reuse tests hold two runs' greedy outputs to (tests/greedy_match.py), on
hand-made outputs: where it must pass and where it must fail."""

from types import SimpleNamespace as Out

import pytest
from greedy_match import LOGPROB_NATS, NEAR_TIE_NATS, assert_greedy_match


def _out(ids, lps, tops):
    return Out(token_ids=ids, logprobs=lps, top_logprobs=tops)


A = _out([5, 6], [-1.0, -2.0], [[(5, -1.0), (9, -3.0)], [(6, -2.0), (7, -2.0)]])


def test_identical_outputs_match_on_both_engines():
    assert assert_greedy_match([A], [A], exact=True) is None
    assert assert_greedy_match([A], [A], exact=False) is None


def test_a_swap_of_two_candidates_tied_in_both_runs_is_allowed_and_ends_the_comparison():
    # 2026-12-05, the H200: two ids tied with reuse, 1/32 nat apart without
    got = _out([5, 7], [-1.0, -2.79], [[(5, -1.0)], [(7, -2.79), (6, -2.79)]])
    want = _out([5, 6], [-1.0, -2.78], [[(5, -1.0)], [(6, -2.78), (7, -2.78 - 1 / 32)]])
    later = _out([1], [-0.5], [[(1, -0.5)]])
    other = _out([2], [-0.1], [[(2, -0.1)]])  # after the tie: not compared
    assert assert_greedy_match([got, later], [want, other], exact=False) == 0
    with pytest.raises(AssertionError):
        assert_greedy_match([got], [want], exact=True)


@pytest.mark.parametrize("gap", [NEAR_TIE_NATS * 1.5, 0.4])
def test_a_swap_that_is_no_tie_in_one_run_fails(gap):
    got = _out([5, 7], [-1.0, -2.0], [[(5, -1.0)], [(7, -2.0), (6, -2.0)]])
    want = _out([5, 6], [-1.0, -2.0], [[(5, -1.0)], [(6, -2.0), (7, -2.0 - gap)]])
    with pytest.raises(AssertionError, match="no near tie"):
        assert_greedy_match([got], [want], exact=False)


def test_a_pick_missing_from_the_other_runs_top_list_fails():
    got = _out([7], [-2.0], [[(7, -2.0), (6, -2.01)]])
    want = _out([6], [-2.0], [[(6, -2.0), (8, -2.01)]])
    with pytest.raises(AssertionError, match="no near tie"):
        assert_greedy_match([got], [want], exact=False)


def test_same_tokens_with_drifting_log_probabilities_fail():
    # a wrong KV entry may keep the argmax yet move the distribution by more than the
    # engine's distance from the reference (LOGPROB_NATS)
    got = _out([5, 6], [-1.0, -2.0 - 2 * LOGPROB_NATS], A.top_logprobs)
    with pytest.raises(AssertionError, match="log-probabilities"):
        assert_greedy_match([got], [A], exact=False)
    with pytest.raises(AssertionError):
        assert_greedy_match([_out([5, 6], [-1.0, -2.0 - 1e-6], A.top_logprobs)], [A], exact=True)


def test_one_run_stopping_where_the_other_goes_on_fails():
    short = _out([5], [-1.0], A.top_logprobs[:1])
    with pytest.raises(AssertionError, match="stopped"):
        assert_greedy_match([short], [A], exact=False)


def test_the_tie_bound_grows_with_the_differences_seen_before():
    # two earlier tokens 0.1 nat apart in the two runs: RMS 0.1, a tie within 0.4 nat is
    # rounding; the same swap with identical earlier tokens is not
    def runs(d):
        g = _out([5, 7], [-1.0, -2.0], [[(5, -1.0), (9, -2.0)], [(7, -2.0), (6, -2.3)]])
        w = _out([5, 6], [-1.0 - d, -2.0], [[(5, -1.0 - d), (9, -2.0 - d)],
                                            [(6, -2.0), (7, -2.3)]])
        return [g], [w]
    assert assert_greedy_match(*runs(0.1), exact=False) == 0
    with pytest.raises(AssertionError, match="no near tie"):
        assert_greedy_match(*runs(0.0), exact=False)
