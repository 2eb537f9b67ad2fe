"""How many prompt tokens a step may prefill (DESIGN §3 "Scheduler", issue 21 item 2).

While other requests are decoding, every step's prefill delays their next token, so a step
prefills only as many tokens as fit in `step_ms`, predicted from the prefills this engine has
timed. A prefill of n tokens after s cached ones costs about

    ms(n, s) ≈ a + d·s + n·(b + c·s)

a fixed part per call (the expert weights read once, thousands of small kernels; on the
reference engine the cache gathered once per layer: d·s) and a part per token (the GEMMs, b,
and attention over the prefix, c·s). The four coefficients are a least-squares fit over the last
SAMPLES calls; with too few distinct samples for that, a line in n alone; with less, the budget
is FIRST_TOKENS. With nothing decoding a step may take longer, IDLE_STEP_MS, but still ends
after at most one chunk: the engine takes new requests and aborts only between steps, so one
long prompt must not hold it for minutes (a 32K prompt on the CPU's reference engine took ~12
minutes in one step, while the server's other requests and a client's disconnect waited,
2026-12-03).

Timed budgets make a prompt's chunk boundaries depend on how fast earlier prefills ran, and a
prefill split at other boundaries rounds differently (the reference engine's attention and
matmuls see other shapes), so two runs of the same requests may differ in the last bits of
their log-probabilities and, rarely, in a greedy token: flint-nano's eval on the H200 reran
the reference engine with mean |Δ log p| 1.2e-5 nats instead of 0 (2026-12-03). step_ms=None
turns timing off altogether: every step takes one chunk, so runs repeat bit for bit; the eval
(`flint-graph eval`) runs that way.

Two floors keep a long prompt moving: at least MIN_TOKENS, and at least as many tokens as the
fixed part is worth (n·per-token ≥ fixed), so even where the fixed part alone passes `step_ms`
(late in a very long prompt) a step spends at most half its time on it.

The trade-off, in numbers from the H200 (full size, `flint-graph bench --interleave 8k,32k`,
docs/perf-log.md): a chunk has a fixed cost of ~15-35 ms beside ~0.03-0.05 ms per token, so a
small step budget spends most of each step on the fixed part. At 50 ms a running stream kept a
p50 / p99 time per token of 54 / 79 ms (BF16) while an 8K and a 32K prompt arrived, but the 32K
prompt's first token took 22 s instead of 1.5 s; unpaced (before step_ms=None meant a chunk a
step), the stream stalled once for 1.8 s.
200 ms gave 217 / 272 ms per token and 2.1 s for the 32K prompt (2026-12-01). With today's
prefill (NVFP4, graph engine, `tools/probe_pacing.py`, an H100, 2026-12-07) the fixed part is
small, and the budget trades evenly: 200 ms gave a stream p50 / p99 201 / 209 ms per token and
the 32K prompt 865 ms to its first token; 100 ms 101 / 112 ms and 1,020 ms (+18%); 50 ms 53 /
61 ms and 1,272 ms (+47%); 25 ms 27 / 73 ms and 1,838 ms; one chunk a step 392 / 559 ms and
783 ms. The 8K prompt's first token took 201-222 ms at every budget. The default, 100 ms,
halves the running streams' time per token for a sixth more on the long prompt's first token.
"""

from __future__ import annotations

import math
from collections import deque

SAMPLES = 32  # prefill calls the fit remembers
DEFAULT_STEP_MS = 100.0  # the step budget's default (module docstring: the trade-off)
FIRST_TOKENS = 256  # the budget while decoding, before anything is known
MIN_TOKENS = 64  # the least a step prefills while decoding: a prompt always moves on
MAX_TOKENS = 1 << 30  # where a budget stops being a bound
IDLE_STEP_MS = 1000.0  # the prefill time of a step with nothing decoding (at most one chunk)


def least_squares(rows: list[list[float]], y: list[float]) -> list[float]:
    """x (k floats) minimising ‖rows·x − y‖₂ for `rows` m lists of k floats (k ≤ 4 here) and
    `y` m floats, by modified Gram-Schmidt on the columns scaled to unit size; a column that
    the earlier ones (nearly) span gets 0, as a rank-revealing solver's basic solution would.
    Raises nothing for finite input (no rows: []).

    Plain Python on purpose: it runs on the engine's step path, between a request's admission
    and its prefill, and the first fit of a process is where issue 22's turn-2 stall sat (the
    "admit" phase, 49-99 ms; the first torch.linalg.lstsq of a process took 67 ms on the GPU
    machine: docs/perf-log.md, twenty-fifth session). A 32 × 4 solve needs no library, and no
    library's first call can stall a request."""
    k = len(rows[0]) if rows else 0
    # the columns (1, s, n, n·s) differ by orders of magnitude: each scaled to at most 1
    scale = [max(1.0, max(abs(r[j]) for r in rows)) for j in range(k)]
    cols = [[r[j] / scale[j] for r in rows] for j in range(k)]
    q: list[list[float] | None] = []
    r = [[0.0] * k for _ in range(k)]
    for j in range(k):
        v = cols[j][:]
        norm0 = math.sqrt(sum(t * t for t in v))
        for i, qi in enumerate(q):
            if qi is None:
                continue
            r[i][j] = sum(a * b for a, b in zip(qi, v))
            v = [a - r[i][j] * b for a, b in zip(v, qi)]
        norm = math.sqrt(sum(t * t for t in v))
        if norm <= 1e-10 * max(norm0, 1e-300) or norm == 0.0:
            q.append(None)  # dependent on the columns before it: coefficient 0
            continue
        r[j][j] = norm
        q.append([t / norm for t in v])
    x = [0.0] * k
    for j in reversed(range(k)):
        if q[j] is None:
            continue
        acc = sum(a * b for a, b in zip(q[j], y))
        acc -= sum(r[j][i] * x[i] for i in range(j + 1, k))
        x[j] = acc / r[j][j]
    return [x[j] / scale[j] for j in range(k)]


def _finite_positive(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v > 0)


class PrefillPacer:
    """Prefill token budget per engine step.

    step_ms: the prefill time a step may add while other requests decode (None: no time
    bound); max_tokens: a hard cap per step either way (None: none). Raises ValueError for a
    step_ms that is not a finite number > 0 or a max_tokens that is not an int ≥ 1."""

    def __init__(self, step_ms: float | None = DEFAULT_STEP_MS, max_tokens: int | None = None):
        if step_ms is not None and not _finite_positive(step_ms):
            raise ValueError(f"step_ms {step_ms!r}: expected a finite number > 0 (or None)")
        if max_tokens is not None and (not isinstance(max_tokens, int)
                                       or isinstance(max_tokens, bool) or max_tokens < 1):
            raise ValueError(f"max_tokens {max_tokens!r}: expected an int >= 1 (or None)")
        self.step_ms, self.max_tokens = step_ms, max_tokens
        self.samples: deque[tuple[int, int, float]] = deque(maxlen=SAMPLES)
        # the fit of the current samples, kept until the next observe(): a least-squares
        # solve in torch each step cost ~40 µs of host time per decode step (CPU, 2026-12-05)
        self._fit: tuple[float, float, float, float] | None = None
        self._fitted = False

    def observe(self, tokens: int, ms: float, start: int = 0) -> None:
        """Record one prefill call: `tokens` prompt tokens after `start` cached ones took `ms`
        milliseconds. Anything but finite positive numbers is ignored."""
        if (_finite_positive(tokens) and _finite_positive(ms) and tokens < MAX_TOKENS
                and isinstance(start, (int, float)) and math.isfinite(start) and start >= 0):
            self.samples.append((int(tokens), int(start), float(ms)))
            self._fitted = False

    def cost(self) -> tuple[float, float, float, float] | None:
        """(a, d, b, c) of ms(n, s) ≈ a + d·s + n·(b + c·s) fitted to the samples (d = c = 0
        when the starts do not vary enough; all ≥ 0), or None before two distinct sizes.
        Computed once per set of samples."""
        if not self._fitted:
            self._fit, self._fitted = self._solve(), True
        return self._fit

    def _solve(self) -> tuple[float, float, float, float] | None:
        if len({n for n, _, _ in self.samples}) < 2:
            return None
        rows = [[1.0, float(s), float(n), float(n * s)] for n, s, _ in self.samples]
        y = [m for _, _, m in self.samples]
        if len({s for _, s, _ in self.samples}) < 2 or len(self.samples) < 4:
            rows = [[r[0], r[2]] for r in rows]
        sol = least_squares(rows, y)
        coef = [max(0.0, v) if math.isfinite(v) else 0.0 for v in sol]
        a, d, b, c = coef if len(coef) == 4 else (coef[0], 0.0, coef[1], 0.0)
        if b + c <= 0:  # noise: fall back to the mean cost per token, no fixed part
            b = sum(m for _, _, m in self.samples) / sum(n for n, _, _ in self.samples)
        return a, d, b, c

    def predict_ms(self, tokens: int, start: int = 0) -> float | None:
        """Predicted ms of prefilling `tokens` after `start` cached, or None while unknown."""
        fit = self.cost()
        if fit is None:
            return None
        a, d, b, c = fit
        return a + d * start + tokens * (b + c * start)

    def budget(self, decoding: bool, start: int = 0, chunk: int | None = None) -> int | None:
        """Prompt tokens this step may prefill for a prompt with `start` tokens already cached:
        None = no bound (no `chunk` and no max_tokens, and nothing decoding or no step_ms),
        else an int ≥ 1 (≥ MIN_TOKENS unless max_tokens or `chunk` is lower). chunk: the
        engine's prefill chunk, the most a step with nothing decoding takes (less where
        IDLE_STEP_MS fits fewer tokens by the timings so far). With step_ms None the budget
        is `chunk` (capped by max_tokens) whatever was timed, decoding or not."""
        cap = self.max_tokens
        if self.step_ms is None:  # no timing at all: the same prompt splits the same way
            n = chunk
        elif not decoding:
            n = None if chunk is None else min(chunk, self._fits(IDLE_STEP_MS, start, chunk))
        else:
            n = self._fits(self.step_ms, start, FIRST_TOKENS)
        if n is None:
            return cap
        return n if cap is None else min(n, cap)

    def _fits(self, ms: float, start: int, unknown: int) -> int:
        """Tokens a prefill after `start` cached ones does in `ms` by the fitted cost (at least
        MIN_TOKENS and as many as the fixed part is worth), or `unknown` before a fit."""
        fit = self.cost()
        if fit is None:
            return unknown
        a, d, b, c = fit
        fixed, per_token = a + d * start, max(b + c * start, 1e-9)
        n = max((ms - fixed) / per_token, fixed / per_token, MIN_TOKENS)
        return int(min(n, MAX_TOKENS))
