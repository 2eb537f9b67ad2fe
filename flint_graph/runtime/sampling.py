"""Per-request sampling parameters and the graph-safe batched sampler (DESIGN §3 "Sampling").

Order: temperature → top-k → top-p → draw; temperature 0 is greedy. Defaults come from the
checkpoint's generation_config.json (glm47-format.md: Flint ships temperature 1.0, top-p 0.95,
top-k 20). `sample` never syncs with the host (no `.item()`, no branching on tensor values, no
data-dependent shapes), so it can sit inside the captured decode graph.

Randomness is counter-based: a row's draw is one uniform from a splitmix64 hash of (seed,
position) in int64 torch ops, then inverse CDF over the row's filtered distribution in
descending-logit order (stable sort: ties go to the lower id). One hash per row, not per vocab
entry, so the cost is the sort plus the cumsum top-p needs anyway. A seeded request gets the same
token whatever else is in the batch and whichever bucket runs it. The hash is bit-identical on
CPU and CUDA and the math after it is float64, so the two agree unless a uniform lands within
~1e-15 of a CDF step (checked on the H200 by the gpu test). This is the reference engine's
sampler (and the graph engine's for rows resampled on the host); the captured decode graph runs
the same order of operations in one kernel, `kernels/decode/sample_tokens.py`, with integer weights.

Shape legend: B batch rows, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

import torch

from flint_graph.errors import ConfigError, InvalidRequestError, not_utf8, shown

_INT64_LIMIT = 1 << 63  # top_k and seeds travel in int64 buffers
# Values used when generation_config.json lacks a key: no scaling and no filtering (vLLM does
# the same); Flint's own file sets temperature 1.0, top_p 0.95, top_k 20.
# max_tokens when neither the request nor the checkpoint's generation_config.json
# (max_new_tokens) sets one: an answer that never ends stops here instead of at the context
# end (262K tokens for Flint; issue 25). Long enough for a long reasoning trace.
DEFAULT_MAX_TOKENS = 4096
NEUTRAL_TEMPERATURE = 1.0
NEUTRAL_TOP_P = 1.0
NEUTRAL_TOP_K = 0
MIN_REPEAT_WINDOW, MAX_REPEAT_WINDOW = 8, 4096  # stop_on_repeat's range (tokens)
# stop strings per request and characters per stop string: each generated token is checked
# against every one (2.5 million stop strings held a shared engine step ~2 s a token, 2026-12-03;
# OpenAI allows 4)
MAX_STOP, MAX_STOP_CHARS = 64, 1000
TOP_LOGPROBS_MAX = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler and of the stop logic.

    temperature: logit divisor, >= 0; 0 = greedy; None = the checkpoint default.
    top_p: nucleus mass in (0, 1]; None = the checkpoint default.
    top_k: keep the k most likely tokens, 0 = off; None = the checkpoint default.
    seed: int in [0, 2**63) for reproducible draws; None = the engine picks a fresh one.
    max_tokens: most tokens to generate (reasoning included), >= 1; None = the checkpoint's
        generation_config.json max_new_tokens (512 for flint-nano), else DEFAULT_MAX_TOKENS
        (`with_defaults`), and never past the context limit.
    min_tokens: stop token ids are ignored until this many tokens precede them (0..max_tokens).
    stop: stop strings (non-empty); the matched one is not part of the output. A single str is
        taken as one stop string, None as none. Stored as a tuple.
    stop_token_ids: ids that end the request; None = the checkpoint's EOS ids. After
        `with_defaults` it holds the explicit ids plus the EOS ids (the EOS ids left out when
        ignore_eos). Stored as a tuple.
    ignore_eos: keep generating through EOS ids (explicit stop_token_ids still stop).
    logprobs: record each generated token's log-probability (natural log) under the model's
        own distribution: the softmax of its logits, before temperature, top-k and top-p.
    top_logprobs: with logprobs, also record each step's this many most likely ids with their
        log-probabilities (OpenAI's top_logprobs, 0 to TOP_LOGPROBS_MAX = 20); 0 = none.
    stop_on_repeat: end the request (finish reason "repeat") once its last N generated tokens are
        one block of at most min(N / 4, 32) tokens said over and over ("dddd…", "rererere…", a
        phrase looping); 0 = off (None too), else 8 to MAX_REPEAT_WINDOW
        (runtime/stopping.py, RepeatDetector).

    Raises InvalidRequestError (from `validate`, run on construction and on `dataclasses.replace`)
    naming the argument, the expected range and the value found.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    logprobs: bool = False
    stop_on_repeat: int = 0
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        # Normalise containers so the frozen object is hashable and immune to caller mutation.
        # (`or ()` would ask a numpy array for its truth value: a bare ValueError)
        stop = (self.stop,) if isinstance(self.stop, str) else (
            () if self.stop is None else self.stop)
        if isinstance(stop, Sequence) and not isinstance(stop, (bytes, bytearray)):
            object.__setattr__(self, "stop", tuple(stop))
        if self.stop_on_repeat is None:  # as the other optional fields: None is the default
            object.__setattr__(self, "stop_on_repeat", 0)
        if isinstance(self.stop_token_ids, Sequence) and not isinstance(self.stop_token_ids, str):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self.validate()
        for name in ("temperature", "top_p"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("top_k", "seed", "max_tokens", "min_tokens", "top_logprobs",
                     "stop_on_repeat"):  # numpy integers become ints
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    def validate(self) -> None:
        """Check every field; raise InvalidRequestError naming the first bad one."""
        t = self.temperature
        if t is not None and not (_finite(t) and t >= 0):
            _bad("temperature", "a finite number >= 0", t)
        p = self.top_p
        if p is not None and not (_is_real(p) and 0 < p <= 1):
            _bad("top_p", "a number in (0, 1]", p)
        if self.top_k is not None and not (_is_int(self.top_k) and 0 <= self.top_k < _INT64_LIMIT):
            _bad("top_k", "an integer in [0, 2**63) (0 = off)", self.top_k)
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < _INT64_LIMIT):
            _bad("seed", "an integer in [0, 2**63)", self.seed)
        if self.max_tokens is not None and not (_is_int(self.max_tokens) and self.max_tokens >= 1):
            _bad("max_tokens", "an integer >= 1", self.max_tokens)
        upper = self.max_tokens if self.max_tokens is not None else math.inf
        if not (_is_int(self.min_tokens) and 0 <= self.min_tokens <= upper):
            limit = "" if self.max_tokens is None else f" and <= max_tokens ({self.max_tokens})"
            _bad("min_tokens", f"an integer >= 0{limit}", self.min_tokens)
        if not isinstance(self.stop, tuple):
            _bad("stop", "a list of strings", self.stop)
        if len(self.stop) > MAX_STOP:
            _bad("stop", f"at most {MAX_STOP} strings", len(self.stop))
        for s in self.stop:
            if not (isinstance(s, str) and s):
                _bad("stop", "non-empty strings", s)
            if len(s) > MAX_STOP_CHARS:
                _bad("stop", f"strings of at most {MAX_STOP_CHARS} characters", s)
            try:  # every other text field refuses a lone surrogate: so do stop strings
                s.encode("utf-8")
            except UnicodeEncodeError as e:
                why = not_utf8(s, e)
                raise InvalidRequestError(f"stop: {why}", field="stop", detail=why) from None
        ids = self.stop_token_ids
        if ids is not None:
            if not isinstance(ids, tuple):
                _bad("stop_token_ids", "a list of token ids", ids)
            for i in ids:
                if not (_is_int(i) and i >= 0):
                    _bad("stop_token_ids", "integers >= 0", i)
        if not isinstance(self.ignore_eos, bool):
            _bad("ignore_eos", "a bool", self.ignore_eos)
        if not isinstance(self.logprobs, bool):
            _bad("logprobs", "a bool", self.logprobs)
        k = self.top_logprobs
        if not (_is_int(k) and 0 <= k <= TOP_LOGPROBS_MAX):
            _bad("top_logprobs", f"an integer from 0 to {TOP_LOGPROBS_MAX}", k)
        if k and not self.logprobs:
            _bad("top_logprobs", "0 unless logprobs=True (they come with the log-probabilities)",
                 k)
        n = self.stop_on_repeat
        if not (_is_int(n) and (n == 0 or MIN_REPEAT_WINDOW <= n <= MAX_REPEAT_WINDOW)):
            _bad("stop_on_repeat", f"0 (off) or a token count from {MIN_REPEAT_WINDOW} to "
                 f"{MAX_REPEAT_WINDOW}", n)

    def with_defaults(self, generation_config: dict[str, Any]) -> SamplingParams:
        """Fill the None fields from a parsed generation_config.json.

        Reads temperature (0, greedy, when do_sample is false), top_p, top_k, max_new_tokens
        (the default max_tokens, as in Hugging Face's GenerationConfig; absent:
        DEFAULT_MAX_TOKENS) and eos_token_id (an
        int or a list of ints); a missing or null key gives the neutral value (temperature 1.0,
        top_p 1.0, top_k 0) or no EOS id.
        stop_token_ids becomes the explicit ids followed by the EOS ids not already in them
        (EOS left out when ignore_eos). Raises ConfigError naming the generation_config.json
        field for a malformed value.
        """
        gen = generation_config
        temperature = _gen_value(gen, "temperature", NEUTRAL_TEMPERATURE,
                                 lambda v: _finite(v) and v >= 0,
                                 "a finite number >= 0")
        # "do_sample": false says greedy whatever the temperature (Hugging Face's reading; a
        # checkpoint with it and no temperature sampled at 1.0 here, a bad-input trial of
        # 2026-12-06); true or absent leaves the temperature as given (vLLM's reading)
        if _gen_value(gen, "do_sample", True, lambda v: isinstance(v, bool),
                      "true or false") is False:
            temperature = 0.0
        top_p = _gen_value(gen, "top_p", NEUTRAL_TOP_P, lambda v: _is_real(v) and 0 < v <= 1,
                           "a number in (0, 1]")
        top_k = _gen_value(gen, "top_k", NEUTRAL_TOP_K,
                           lambda v: _is_int(v) and 0 <= v < _INT64_LIMIT,
                           "an integer in [0, 2**63)")
        max_new = _gen_value(gen, "max_new_tokens", DEFAULT_MAX_TOKENS,
                             lambda v: _is_int(v) and v >= 1, "an integer >= 1")
        if self.max_tokens is None and self.min_tokens > max_new:  # the check in __post_init__
            # would name a max_tokens the caller never set (a bad-input trial, 2026-12-07)
            raise InvalidRequestError(
                f"min_tokens: {self.min_tokens} is more than the default max_tokens "
                f"({max_new}: generation_config.json max_new_tokens"
                f"{'' if 'max_new_tokens' in gen else ', absent, so DEFAULT_MAX_TOKENS'}); "
                "set max_tokens too", field="min_tokens")
        eos = _gen_value(gen, "eos_token_id", [], _is_id_list, "a token id or a list of ids")
        eos = [eos] if _is_int(eos) else list(eos)
        ids = list(self.stop_token_ids or ())
        if not self.ignore_eos:
            ids += [i for i in eos if i not in ids]
        return replace(
            self,
            max_tokens=max_new if self.max_tokens is None else self.max_tokens,
            temperature=temperature if self.temperature is None else self.temperature,
            top_p=top_p if self.top_p is None else self.top_p,
            top_k=top_k if self.top_k is None else self.top_k,
            stop_token_ids=tuple(ids),
        )


# generation_config.json keys that change what is sampled and that flint-graph does not apply,
# with the value that means "off" (None: any value is a note); `unapplied_generation_keys`
# (None, or an empty list, string or object, is "off" for every key)
_UNAPPLIED = {"repetition_penalty": 1.0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
              "eta_cutoff": 0.0, "no_repeat_ngram_size": 0, "presence_penalty": 0.0,
              "frequency_penalty": 0.0, "num_beams": 1, "max_length": None,
              # the rest were dropped without the note too (a bad-input trial, 2026-12-06)
              "stop_strings": None, "min_new_tokens": 0, "min_length": 0, "bad_words_ids": None,
              "suppress_tokens": None, "begin_suppress_tokens": None,
              "forced_bos_token_id": None, "forced_eos_token_id": None, "sequence_bias": None,
              "num_beam_groups": 1, "diversity_penalty": 0.0, "length_penalty": 1.0,
              "exponential_decay_length_penalty": None, "guidance_scale": 1.0,
              "renormalize_logits": False}


def unapplied_generation_keys(generation_config: dict[str, Any]) -> list[str]:
    """The keys of a parsed generation_config.json that would change sampling or length and
    that `with_defaults` does not apply (a repetition penalty, min-p, beams, max_length: the
    prompt's length plus the answer's, where flint-graph reads max_new_tokens), in file order;
    the CLI prints them in a note, since they were dropped in silence (a bad-input trial,
    2026-12-06). A key set to its "off" value is not listed."""
    out = []
    for key, value in generation_config.items():
        if key in _UNAPPLIED and value not in (None, [], "", {}) and (
                _UNAPPLIED[key] is None or value != _UNAPPLIED[key]):
            out.append(key)
    return out


def _is_real(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _finite(v: object) -> bool:
    """A real number that is finite (an int too large for a float is not: math.isfinite
    would raise OverflowError on it)."""
    if not _is_real(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _is_int(v: object) -> bool:
    """An integer (numpy's too, as numbers.Integral), not a bool."""
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_id_list(v: object) -> bool:
    if _is_int(v):
        return v >= 0
    return isinstance(v, list) and all(_is_int(i) and i >= 0 for i in v)


def _bad(name: str, expected: str, found: object) -> None:
    what = f"expected {expected}, found {shown(found)}"
    raise InvalidRequestError(f"sampling argument '{name}': {what}", field=name, detail=what)


def _gen_value(gen: dict[str, Any], key: str, neutral: Any, ok, expected: str) -> Any:
    value = gen.get(key)
    if value is None:
        return neutral
    if not ok(value):
        raise ConfigError(f"generation_config.json field '{key}': expected {expected}, "
                          f"found {shown(value)}")
    return value


# splitmix64 constants (Steele, Lea & Flood 2014), as signed int64 because torch has no uint64
# arithmetic; int64 add/mul wrap modulo 2**64 on CPU and CUDA, which is the arithmetic we need.
def _as_int64(c: int) -> int:
    return c - (1 << 64) if c >= (1 << 63) else c


_GOLDEN = _as_int64(0x9E3779B97F4A7C15)
_MUL1 = _as_int64(0xBF58476D1CE4E5B9)
_MUL2 = _as_int64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; masking off the copied sign bits makes it logical.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def counter_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform per row from (seed, position) alone: float64 [B], strictly inside (0, 1).

    seeds, positions: int64 [B]. The value is output number `position` of a splitmix64 stream
    whose state starts at mix64(seed + golden); its top 52 bits k give u = (k + 0.5) / 2**52.
    """
    key = _mix64(seeds + _GOLDEN)
    h = _mix64(key + (positions + 1) * _GOLDEN)
    return (_shr(h, 12).to(torch.float64) + 0.5) * (2.0 ** -52)


_SCAN_BLOCK = 128  # row cumsum in blocks: see _row_cumsum


def _row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """cumsum along the last dim of [B, V], as a scan of 128-wide blocks plus block offsets.

    CUDA's per-row scan runs one long row at a time and took ~230 us for [8, 151552] float64 on
    the H200, against ~10 us for many short rows. Each row is still computed on its own, the
    same way whatever B is, so batch invariance holds.
    """
    B, V = x.shape
    pad = (-V) % _SCAN_BLOCK  # 0 for Flint's 151552; a shape fact, so no data-dependent branch
    blocks = (torch.nn.functional.pad(x, (0, pad)) if pad else x).view(B, -1, _SCAN_BLOCK)
    inner = torch.cumsum(blocks, dim=-1)  # [B, V/128, 128]
    totals = torch.cumsum(inner[:, :, -1], dim=-1)  # [B, V/128]
    offsets = torch.cat([torch.zeros_like(totals[:, :1]), totals[:, :-1]], dim=-1)
    return (inner + offsets[:, :, None]).view(B, -1)[:, :V]


def _filter_sorted(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
    """Filter in descending-logit order: (ids [B,V], weights f64 [B,V], cdf f64 [B,V], kept [B]).

    weights are exp((l - l_max) / T) for ranks < top_k, else 0 (unnormalised); cdf is their
    cumsum; ranks < kept (int64) also survive top-p and are exactly the tokens that may be drawn.
    Each full [B, V] pass costs ~5 us at B=8 on the H200, so the passes are kept few.
    """
    V = logits.shape[-1]
    sorted_logits, ids = torch.sort(logits.float(), dim=-1, descending=True, stable=True)
    # Greedy rows still run the filter (with T=1) so the graph has one path; `sample` picks
    # rank 0 for them afterwards.
    t = torch.where(temperature > 0, temperature, 1.0).to(torch.float64)[:, None]
    rank = torch.arange(V, device=logits.device)
    num_k = torch.where(top_k > 0, top_k.clamp(max=V), V)  # [B]
    # float32 - float64 promotes inside one kernel: the softmax math is float64 from here on.
    z = (sorted_logits - sorted_logits[:, :1].to(torch.float64)) / t
    w = torch.exp(torch.where(rank < num_k[:, None], z, -math.inf))  # [B, V], w[:, 0] = 1
    cdf = _row_cumsum(w)
    # Top-p keeps the smallest prefix whose mass reaches p: rank r > 0 stays while the mass
    # before it, cdf[r - 1], is below p of the top-k mass; rank 0 always stays.
    total = cdf[:, -1:]
    below = (cdf[:, :-1] < top_p.to(torch.float64)[:, None] * total).sum(dim=-1)
    num_p = torch.where(top_p >= 1, V, below + 1)
    # min() rather than trusting the float cumsum to stay flat after rank num_k - 1.
    kept = torch.minimum(num_k, num_p)
    return ids, w, cdf, kept


def _check_inputs(logits: torch.Tensor, **rows: torch.Tensor) -> None:
    # Shapes and dtypes are metadata: checking them costs no sync, and a captured graph runs
    # this Python once, at capture.
    if logits.dim() != 2 or not logits.is_floating_point():
        raise InvalidRequestError(f"sample: logits must be a floating [B, V] tensor, found "
                                  f"{logits.dtype} {tuple(logits.shape)}")
    B = logits.shape[0]
    for name, x in rows.items():
        want_float = name in ("temperature", "top_p")
        ok_dtype = x.is_floating_point() if want_float else x.dtype == torch.int64
        if tuple(x.shape) != (B,) or not ok_dtype:
            want = "floating" if want_float else "int64"
            raise InvalidRequestError(f"sample: {name} must be a {want} [{B}] tensor, found "
                                      f"{x.dtype} {tuple(x.shape)}")


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """The distribution `sample` draws from, in vocab order: float64 [B, V], rows sum to 1.

    logits: float [B, V]; temperature: float [B] (0 = greedy → one-hot at the argmax, lowest id
    on ties); top_k: int64 [B] (0 = off); top_p: float [B] in (0, 1]. Raises InvalidRequestError
    for wrong shapes or dtypes.
    """
    _check_inputs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    ids, w, cdf, kept = _filter_sorted(logits, temperature, top_k, top_p)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    probs = torch.where(rank < kept[:, None], w, 0.0) / cdf.gather(1, (kept - 1)[:, None])
    greedy = torch.zeros_like(probs)
    greedy[:, 0] = 1.0
    probs = torch.where((temperature == 0)[:, None], greedy, probs)
    return torch.zeros_like(probs).scatter(1, ids, probs)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """`sample` for rows that are all greedy (temperature 0), without its sort and cumsums:
    int64 [B] of float32 logits [B, V]. The highest logit, the lowest id among equal ones
    (torch.argmax returns the first maximum; -0 equals +0), as `sample`'s rank 0 of a stable
    descending sort. Logits must hold no NaN (the engine ends such rows first)."""
    return logits.float().argmax(dim=-1)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: int64 [B]. Host-sync free; safe inside a CUDA graph.

    logits: float32 [B, V] (LM-head output); temperature: float32 [B] (0 = greedy argmax);
    top_k: int64 [B] (0 = off); top_p: float32 [B] in (0, 1]; seeds: int64 [B] in [0, 2**63);
    positions: int64 [B], the token index the draw is for (e.g. tokens generated so far).
    Rows are independent: a row's token depends only on its own logits, parameters, seed and
    position. Parameter values are not checked here (SamplingParams validates them); shapes and
    dtypes are, raising InvalidRequestError.
    """
    _check_inputs(logits, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                  positions=positions)
    ids, _, cdf, kept = _filter_sorted(logits, temperature, top_k, top_p)
    mass = cdf.gather(1, (kept - 1)[:, None])  # [B, 1], the kept prefix's mass
    u = counter_uniform(seeds, positions)[:, None]
    # Inverse CDF: the drawn rank is the number of ranks whose cdf is <= u * mass. cdf keeps
    # reaches mass > u * mass at rank kept - 1 and never falls after, so the count stays in the
    # prefix; the clamp only matters if u * mass rounds up to mass (u within 2**-52 of 1).
    count = (cdf <= u * mass).sum(dim=-1, keepdim=True)
    drawn = ids.gather(1, torch.minimum(count, (kept - 1)[:, None]))[:, 0]
    return torch.where(temperature == 0, ids[:, 0], drawn)


class OneRowSampleGraph:
    """`sample` for one row (B = 1) captured as a CUDA graph: the first token of each prompt
    on the graph engine. Launched op by op, `sample` is ~40 kernels (the sort, the float64
    filter, the scan, the draw) whose host launches took ~1.5 ms of a 25-token prompt's
    ~11 ms time to first token on the H200 (tools/ttft_breakdown.py, 2026-12-03); one replay
    runs the same kernels, so the token is the one `sample` draws, bit for bit.

    vocab: V of the logits it takes; device: a CUDA device. Raises RuntimeError from CUDA when
    the capture fails (the engine then keeps the eager `sample`)."""

    def __init__(self, vocab: int, device: torch.device):
        self.vocab = vocab
        self.logits = torch.zeros(1, vocab, dtype=torch.float32, device=device)
        self.floats = torch.ones(2, dtype=torch.float32, device=device)  # temperature, top_p
        self.ints = torch.zeros(3, dtype=torch.long, device=device)  # top_k, seed, position
        self._host_f = torch.ones(2, dtype=torch.float32).pin_memory()
        self._host_i = torch.zeros(3, dtype=torch.long).pin_memory()
        args = (self.floats[0:1], self.ints[0:1], self.floats[1:2], self.ints[1:2],
                self.ints[2:3])
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch asks
            sample(self.logits, *args)
        torch.cuda.current_stream(device).wait_stream(side)
        from flint_graph.capture.launcher import capture_graph  # CUDA-only: imported here

        self.graph = torch.cuda.CUDAGraph()
        with capture_graph(self.graph):  # the garbage collector paused, as every capture
            self.out = sample(self.logits, *args)

    def draw(self, logits: torch.Tensor, params: SamplingParams, seed: int,
             position: int) -> torch.Tensor:
        """Replay the graph on float logits [V] or [1, V] with `params`' temperature, top_k and
        top_p, `seed` and `position` (the request's tokens generated so far): int64 [1] on
        the device, the token `sample` draws, without a host sync. The result and the pinned
        parameter buffers are reused by the next call: read the token (which waits for the
        replay) before drawing again."""
        self.logits.copy_(logits.reshape(1, -1))
        self._host_f[0], self._host_f[1] = params.temperature, params.top_p
        self._host_i[0], self._host_i[1], self._host_i[2] = params.top_k, seed, position
        self.floats.copy_(self._host_f, non_blocking=True)
        self.ints.copy_(self._host_i, non_blocking=True)
        self.graph.replay()
        return self.out

    def __call__(self, logits: torch.Tensor, params: SamplingParams, seed: int,
                 position: int) -> int:
        """`draw`'s token as an int (waits for the replay)."""
        return int(self.draw(logits, params, seed, position)[0])
