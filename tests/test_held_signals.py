"""flint_graph/runtime/held_signals.py: Ctrl-C held over the engine's bookkeeping."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from flint_graph.runtime.held_signals import signals_held


def test_ctrl_c_is_raised_after_the_block_not_inside_it():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("rest of the block")
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_blocks_hold_until_the_outer_one_ends():
    seen = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            with signals_held():
                os.kill(os.getpid(), signal.SIGINT)
            seen.append("after the inner block")
    assert seen == ["after the inner block"]


def test_a_default_or_ignored_handler_is_left_alone_and_other_threads_hold_nothing():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with signals_held():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = []

    def worker():
        with signals_held():  # no signal.signal off the main thread (it would raise)
            out.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out == [signal.default_int_handler]
