"""Runtime knobs (`EngineConfig`), as opposed to the model facts in `config.py` (STYLE §1, §3).

Each default is defined once here; the API and CLI read them from the dataclass. The CPU
thread policy (`apply_cpu_threads`) lives here too, so `LLM()` and the CLI share it.
"""

from __future__ import annotations

import contextlib
import numbers
import os
from dataclasses import dataclass

import torch

from flint_graph.errors import InvalidRequestError
from flint_graph.runtime.prefill_pacer import DEFAULT_STEP_MS


ENGINES = ("auto", "graph", "reference")
# How the graph engine prefills a prompt (capture/prefill.py): "kernel" = the CuTe DSL attention
# with cuBLAS / grouped GEMMs around it; "torch" = the same with torch's SDPA for attention (the
# torch-ops baseline); "reference" = the plain reference model (slow; the oracle).
PREFILLS = ("kernel", "torch", "reference")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model (not what the model is)."""

    max_slots: int = 8  # most sequences decoded together (DESIGN §3: the largest bucket)
    # prompt tokens per prefill forward (bounds memory); None = default_prefill_chunk(): 32768
    # on the graph engine's kernel prefill (a chunk's fixed cost spread over more tokens, and
    # more rows per expert: a 32K prompt 722 -> 640 ms on the H200), 2048 elsewhere (the
    # reference attention's score matrices)
    prefill_chunk_tokens: int | None = None
    # at most this many prompt tokens prefilled in one step (None = no cap)
    prefill_tokens_per_step: int | None = None
    # while other requests decode, a step's prefill is sized to take about this many ms
    # (predicted from the prefills timed so far, prefill_pacer.py); None = no timing: one
    # chunk per step, so the same requests split alike and a rerun repeats bit for bit
    prefill_step_ms: float | None = DEFAULT_STEP_MS
    cpu_threads: int | None = None  # torch CPU threads; None = automatic (apply_cpu_threads)
    # "graph": decode steps by CUDA-graph replay of the AOT kernels (CUDA and a kernel cache
    # needed); "reference": the plain PyTorch model; "auto": graph where it can run, else
    # reference (the reason is kept in Engine.fallback_reason).
    engine: str = "auto"
    max_context: int | None = None  # tokens per sequence (prompt + output); None: the graph
    # engine's KV holds what fits in 80% of free GPU memory, the reference engine the model's limit
    prefill: str = "kernel"  # graph engine's prefill path, one of PREFILLS
    # kernel prefill: replay chunks of up to prefill_chunk_tokens (≤ 8192) as CUDA graphs
    # captured at start-up, one per chunk-size bucket (capture/prefill.py GRAPH_BUCKETS)
    prefill_graphs: bool = True
    # graph engine, NVFP4 checkpoint: keep the dense projections (q, k, v, o, dense MLPs, shared
    # experts) decoded in BF16 for the prefill instead of decoding them per chunk (~2.4 GB at
    # full size, taken from the KV cache's share; bit for bit the same output; a 25-token
    # prefill ~1 ms faster on the H100, docs/perf-log.md twenty-ninth session)
    prefill_dense_bf16: bool = True
    # keep finished sequences' KV and serve a request from the one sharing the longest prefix
    # of token ids (flint_graph/runtime/prefix_cache.py); outputs equal a cold start's
    kv_reuse: bool = True
    # graph engine: launch each decode step before the host handles the previous step's tokens
    # (detokenizing, stop strings, the output parser run while the GPU computes), so a step's
    # host work no longer sits between two replays; False: one step at a time (comparisons)
    pipeline_decode: bool = True
    # graph engine: attention takes each layer's Q/K norm, RoPE and KV write itself (one launch
    # a layer fewer, kernels/decode/attn_decode.py QKN = 1); None: the model's default
    # (attn_decode.uses_fold), True / False to compare the two forms
    decode_attn_fold: bool | None = None


    def __post_init__(self) -> None:
        # numpy numbers (a sweep's np.arange) are numbers too, as SamplingParams takes them
        for name in ("max_slots", "prefill_chunk_tokens", "prefill_tokens_per_step",
                     "cpu_threads", "max_context", "prefill_step_ms"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
            elif name == "prefill_step_ms" and isinstance(value, numbers.Real) \
                    and not isinstance(value, (bool, numbers.Integral)):
                object.__setattr__(self, name, float(value))
        if self.engine not in ENGINES:
            raise InvalidRequestError(f"engine {self.engine!r}: expected one of "
                                      f"{', '.join(ENGINES)}")
        ms = self.prefill_step_ms
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float))
                               or not 0 < ms < float("inf")):
            raise InvalidRequestError(f"prefill_step_ms {ms!r}: expected a number of "
                                      "milliseconds > 0, or None")
        if not isinstance(self.kv_reuse, bool):
            raise InvalidRequestError(f"kv_reuse {self.kv_reuse!r}: expected True or False")
        if not isinstance(self.pipeline_decode, bool):
            raise InvalidRequestError(f"pipeline_decode {self.pipeline_decode!r}: expected "
                                      "True or False")
        if self.decode_attn_fold is not None and not isinstance(self.decode_attn_fold, bool):
            raise InvalidRequestError(f"decode_attn_fold {self.decode_attn_fold!r}: expected "
                                      "True (folded), False (plain) or None (the default "
                                      "form, kernels/decode/attn_decode.py FOLD_QK)")
        for name in ("prefill_graphs", "prefill_dense_bf16"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} {getattr(self, name)!r}: expected True or "
                                          "False")
        if self.prefill not in PREFILLS:
            raise InvalidRequestError(f"prefill {self.prefill!r}: expected one of "
                                      f"{', '.join(PREFILLS)}")
        optional = ("cpu_threads", "max_context", "prefill_tokens_per_step",
                    "prefill_chunk_tokens")
        for name in ("max_slots", "prefill_chunk_tokens", *optional):
            value = getattr(self, name)
            if name in optional and value is None:
                continue
            if type(value) is not int or value < 1:
                raise InvalidRequestError(f"{name} {value!r}: expected an integer >= 1")
        if self.cpu_threads is not None and self.cpu_threads > max_cpu_threads():
            # Far more threads than cores only contend, and a few thousand make OpenMP fail
            # to start them (a segfault or an abort inside torch).
            raise InvalidRequestError(
                f"cpu_threads {self.cpu_threads}: expected at most {max_cpu_threads()} (4 per "
                f"CPU; this machine has {os.cpu_count() or 1})")


def max_cpu_threads() -> int:
    """The most CPU threads `EngineConfig.cpu_threads` accepts: 4 per CPU of this machine."""
    return 4 * (os.cpu_count() or 1)


# At or below this hidden size a decode step's matmuls are too short to share between threads:
# extra OpenMP threads only contend (measured on 2 cores with one busy: tiny model 9 ms/token on
# one thread, 321 ms on two).
SMALL_MODEL_HIDDEN = 512
# torch's thread count when this module was first imported, and the last count set here: the
# count torch should have now (the last one set here, else the one at import); any other value
# was set by the user (torch.set_num_threads), whose choice the policy keeps. A call that sets
# torch's own count before the first LLM() changes nothing and cannot be told apart.
_THREADS_AT_IMPORT = torch.get_num_threads()
_threads_set_here: int | None = None
_auto_single = False  # the policy itself chose one thread (a small model), not the user
# A prefill of at least this many tokens is long enough to share between threads even for a
# small model: on this 2-core machine (2026-12-02) a 7,202-token flint-nano prompt took 14.4 s
# to its first token on one thread and 7.7 s on two, idle; decode steps keep the one thread.
# But threads beyond the free cores are ruinous: with the other core busy two threads took
# 26.1 s against 14.9 s on one, and on a machine at load 3-4 (a new-user trial beside a CI run)
# a 480-token prompt took 1.1-16 s against 0.5-0.7 s. So `prefill_threads` uses only the cores
# the 1-minute load average leaves (rounded; this process's own recent work counts as busy,
# which errs towards fewer threads).
PREFILL_THREADS_MIN_TOKENS = 256


def apply_cpu_threads(engine: EngineConfig, device: torch.device, hidden_size: int) -> None:
    """Set torch's (process-wide) CPU thread count for a model about to run on `device`.

    `engine.cpu_threads` wins when given. Otherwise a small model (hidden_size <=
    SMALL_MODEL_HIDDEN) on the CPU gets one thread, unless OMP_NUM_THREADS is set or the user
    already called torch.set_num_threads; anything else keeps torch's setting."""
    global _threads_set_here, _auto_single
    n = engine.cpu_threads
    _auto_single = False
    if n is None:
        current = torch.get_num_threads()
        expected = _THREADS_AT_IMPORT if _threads_set_here is None else _threads_set_here
        user_chose = current != expected  # e.g. set back to torch's default after an LLM()
        if (device.type != "cpu" or hidden_size > SMALL_MODEL_HIDDEN or user_chose
                or os.environ.get("OMP_NUM_THREADS")):
            return
        n = 1
        _auto_single = True
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _threads_set_here = n


@contextlib.contextmanager
def prefill_threads(device: torch.device, tokens: int):
    """Around a CPU prefill of `tokens` tokens: the machine's free cores (torch's own thread
    count less the cores the 1-minute load average says are busy) instead of the one thread
    `apply_cpu_threads` chose for a small model, when the prefill has at least
    PREFILL_THREADS_MIN_TOKENS tokens and more than one core is free; the one thread again
    after. Nothing changes on CUDA or for a count the user chose (EngineConfig.cpu_threads,
    OMP_NUM_THREADS, torch.set_num_threads)."""
    many = _THREADS_AT_IMPORT
    try:  # leave the cores the load average says are busy (this process's own count too)
        many = min(many, (os.cpu_count() or 1) - round(os.getloadavg()[0]))
    except (AttributeError, OSError):  # no load average here (Windows)
        pass
    if (device.type != "cpu" or not _auto_single or tokens < PREFILL_THREADS_MIN_TOKENS
            or many <= 1 or torch.get_num_threads() != 1):
        yield
        return
    torch.set_num_threads(many)
    try:
        yield
    finally:
        torch.set_num_threads(1)


def pick_device(device: str | torch.device | None) -> torch.device:
    """The torch device to run on: `device` validated, or CUDA when present, else the CPU.

    Raises InvalidRequestError naming the value for anything but cpu / cuda / cuda:N, or for
    CUDA on a machine without it."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidRequestError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'") \
            from None
    if dev.type not in ("cpu", "cuda"):
        raise InvalidRequestError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cpu":
        return torch.device("cpu")  # "cpu:0" names the same device; loaders want plain "cpu"
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError(f"device {device!r}: CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InvalidRequestError(f"device {device!r}: this machine has "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
    return dev


# The kernel prefill's default chunk. Longer chunks cost less per token: the dense weights and
# the per-chunk launches are paid once per chunk, and the grouped expert GEMMs get more rows per
# expert. H200, `tools/bench_prefill.py --chunk C --tokens 32768 --kernel-tokens 100000`
# (2026-12-03, docs/perf-log.md), 32K / 100K prompt: NVFP4 721.5 / 3,999 ms at 8192, 668.0 /
# 3,868 at 16384, 639.5 / 3,781 at 32768; BF16 676.2 / 3,890, 649.5 / 3,831, 626.2 / 3,733.
# A chunk's transient buffers are ~3.5 GB at 32K tokens (the gathered expert rows dominate),
# inside the fifth of free memory the KV cache leaves (runner.KV_MEMORY_FRACTION). While other
# requests decode, the pacer's time budget sizes a step's prefill well below a chunk.
KERNEL_PREFILL_CHUNK = 32768


def default_prefill_chunk(engine: EngineConfig, kernel_prefill: bool) -> int:
    """Prompt tokens per prefill chunk: engine.prefill_chunk_tokens, else KERNEL_PREFILL_CHUNK
    where the graph engine's kernel prefill runs and 2048 elsewhere
    (EngineConfig.prefill_chunk_tokens)."""
    if engine.prefill_chunk_tokens is not None:
        return engine.prefill_chunk_tokens
    return KERNEL_PREFILL_CHUNK if kernel_prefill else 2048
