"""The one CPU thread policy (`engine_config.apply_cpu_threads`), shared by `LLM()` and the CLI.

torch's thread count is process-wide, so every test here replaces torch.get/set_num_threads
with a fake and leaves the real setting alone."""

from __future__ import annotations

import pytest
import torch

from flint_graph.runtime import engine_config
from flint_graph.runtime.engine_config import EngineConfig, apply_cpu_threads
from flint_graph.errors import InvalidRequestError

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SMALL, BIG = 64, 5120  # hidden sizes: the tiny preset, the full model


@pytest.fixture
def threads(monkeypatch):
    """A fake torch thread count starting at torch's count at import; returns the set() calls."""
    state = {"n": engine_config._THREADS_AT_IMPORT, "calls": []}

    def set_threads(n):
        state["n"] = n
        state["calls"].append(n)

    monkeypatch.setattr(torch, "get_num_threads", lambda: state["n"])
    monkeypatch.setattr(torch, "set_num_threads", set_threads)
    monkeypatch.setattr(engine_config, "_threads_set_here", None)
    monkeypatch.setattr(engine_config, "_auto_single", False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return state


def _prefill(tokens: int, device=CPU) -> int:
    """The thread count torch has inside `prefill_threads` for a prefill of `tokens`."""
    with engine_config.prefill_threads(device, tokens):
        return torch.get_num_threads()


@pytest.fixture
def machine(monkeypatch):
    """8 cores, torch's default 8 threads, and a settable 1-minute load average."""
    load = {"1m": 0.2}
    monkeypatch.setattr(engine_config, "_THREADS_AT_IMPORT", 8)
    monkeypatch.setattr(engine_config.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(engine_config.os, "getloadavg", lambda: (load["1m"], 0.0, 0.0))
    return load


def test_a_long_cpu_prefill_of_a_small_model_shares_the_free_cores(threads, machine):
    threads["n"] = 8  # torch's default on this machine
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["n"] == 1
    n = engine_config.PREFILL_THREADS_MIN_TOKENS
    assert _prefill(n) == 8 and threads["n"] == 1  # back to one thread for decode
    assert _prefill(n - 1) == 1  # too short to share
    assert _prefill(n, CUDA) == 1
    machine["1m"] = 3.4  # three cores busy (this process's recent work included)
    assert _prefill(n) == 5
    machine["1m"] = 7.2  # one core left: no sharing (threads beyond free cores are ruinous)
    assert _prefill(n) == 1
    machine["1m"] = 0.2
    with pytest.raises(ZeroDivisionError):
        with engine_config.prefill_threads(CPU, n):
            1 / 0
    assert threads["n"] == 1  # restored after an error too


def test_a_chosen_count_is_kept_in_prefill(threads, machine, monkeypatch):
    threads["n"] = 8
    apply_cpu_threads(EngineConfig(cpu_threads=1), CPU, SMALL)  # EngineConfig / --threads 1
    assert _prefill(10_000) == 1
    apply_cpu_threads(EngineConfig(), CPU, BIG)  # a big model keeps torch's count
    threads["n"] = 3  # the user's torch.set_num_threads(3)
    assert _prefill(10_000) == 3


def test_small_model_on_cpu_gets_one_thread(threads):
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["n"] == 1
    apply_cpu_threads(EngineConfig(), CPU, SMALL)  # a second LLM: our own choice, not the user's
    assert threads["n"] == 1


@pytest.mark.parametrize("device, hidden", [(CPU, BIG), (CUDA, SMALL)])
def test_big_model_or_gpu_keeps_torch_default(threads, device, hidden):
    apply_cpu_threads(EngineConfig(), device, hidden)
    assert threads["calls"] == []


def test_omp_num_threads_and_user_choice_are_respected(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["calls"] == []
    monkeypatch.delenv("OMP_NUM_THREADS")
    threads["n"] = engine_config._THREADS_AT_IMPORT + 3  # the user called torch.set_num_threads
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["calls"] == []


def test_explicit_cpu_threads_wins(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    apply_cpu_threads(EngineConfig(cpu_threads=3), CPU, BIG)
    assert threads["n"] == 3


@pytest.mark.parametrize("value", [0, -1, 2.0, "2", True])
def test_cpu_threads_must_be_a_positive_int(value):
    with pytest.raises(InvalidRequestError, match="cpu_threads"):
        EngineConfig(cpu_threads=value)


@pytest.mark.parametrize("name", ["prefill_graphs", "prefill_dense_bf16", "kv_reuse"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_switches_must_be_bools(name, value):
    with pytest.raises(InvalidRequestError, match=f"{name} {value!r}: expected True or False"):
        EngineConfig(**{name: value})


def test_llm_applies_the_policy(threads, tiny_ckpt):
    from flint_graph import LLM

    LLM(tiny_ckpt, device="cpu", progress=False)  # the README's API example, on the CPU
    assert threads["n"] == 1
    LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(cpu_threads=2))
    assert threads["n"] == 2


def test_cpu_threads_beyond_four_per_cpu_are_refused(monkeypatch):
    # --threads 2048 made OpenMP segfault inside torch; 20000 aborted it with a multi-line
    # libgomp message. Refused up front, naming the bound.
    monkeypatch.setattr(engine_config.os, "cpu_count", lambda: 2)
    assert EngineConfig(cpu_threads=8).cpu_threads == 8
    with pytest.raises(InvalidRequestError, match=r"cpu_threads 9: expected at most 8 \(4 per"):
        EngineConfig(cpu_threads=9)


def test_user_choice_after_an_llm_is_kept_even_at_torchs_default(threads):
    # LLM() set one thread; the user then asked for torch's default count again (2 on a
    # 2-core machine) and a second LLM() put it back to 1, as if nobody had asked.
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["n"] == 1
    threads["n"] = engine_config._THREADS_AT_IMPORT  # torch.set_num_threads(default)
    apply_cpu_threads(EngineConfig(), CPU, SMALL)
    assert threads["n"] == engine_config._THREADS_AT_IMPORT and threads["calls"] == [1]


def test_engine_choice_and_max_context_are_validated():
    with pytest.raises(InvalidRequestError, match="engine 'fast': expected one of auto, graph"):
        EngineConfig(engine="fast")
    with pytest.raises(InvalidRequestError, match="max_context 0"):
        EngineConfig(max_context=0)


def test_graph_engine_on_the_cpu_says_it_needs_cuda_before_loading(tiny_ckpt, monkeypatch):
    from flint_graph import LLM, api
    from flint_graph.errors import ConfigError

    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the refusal")

    with monkeypatch.context() as m:
        m.setattr(api, "load_checkpoint", no_load)
        with pytest.raises(ConfigError, match="engine=graph \\(--engine graph\\): the graph "
                                              "engine needs CUDA and this run is on cpu; use "
                                              "engine auto or reference"):
            LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(engine="graph"))
    llm = LLM(tiny_ckpt, device="cpu", progress=False)  # auto falls back, saying why
    assert llm.engine.name == "reference" and "needs CUDA" in llm.engine.fallback_reason


@pytest.mark.parametrize("value", [1, "on", 0.0])
def test_decode_attn_fold_is_a_bool_or_none(value):
    """EngineConfig.decode_attn_fold: True / False pick attention's form for comparisons,
    None (the default) leaves it to the model (attn_decode.uses_fold)."""
    with pytest.raises(InvalidRequestError, match=f"decode_attn_fold {value!r}: expected "
                                                  r"True \(folded\), False \(plain\) or None"):
        EngineConfig(decode_attn_fold=value)
    for ok in (True, False, None):
        assert EngineConfig(decode_attn_fold=ok).decode_attn_fold is ok
