"""How many prompt tokens a step may prefill (DESIGN §3 "Scheduler", issue 21 item 2).

While other requests are decoding, every step's prefill delays their next token, so a step
prefills only as many tokens as fit in `step_ms`, predicted from the prefills this engine has
timed: ms(n) ≈ fixed + per_token · n, a least-squares line through the last SAMPLES calls (the
fixed part is what a chunk costs whatever its size: weight reads of the expert GEMMs, launches;
it is why a smaller budget costs the prompt more in total). With nothing decoding there is no
one to keep waiting: the whole remaining prompt goes in one step (in chunks of the engine's
chunk size). Until two prefills of different sizes have been timed the budget is
FIRST_TOKENS; it never falls below MIN_TOKENS (a step_ms below the fixed part would otherwise
prefill a token per step).

The trade-off, in numbers from the H200 (full size, `flint-graph bench --interleave 8k,32k`,
docs/perf-log.md): a chunk has a fixed cost of ~15-35 ms (the expert weights read once, ~4,000
small kernels) beside ~0.03-0.05 ms per token, so a small step budget spends most of each step
on the fixed part. At 50 ms a running stream kept a p50 / p99 time per token of 54 / 79 ms
(BF16) while an 8K and a 32K prompt arrived, but the 32K prompt's first token took 22 s instead
of 1.5 s; unpaced, the stream stalled once for 1.8 s. The default, 200 ms, spends about a fifth
of a step on the fixed part: the stream's tokens slow to ~5 per second while a long prompt
prefills, and the prompt's prefill takes about a quarter longer than alone.
"""

from __future__ import annotations

from collections import deque

SAMPLES = 32  # prefill calls the fit remembers
FIRST_TOKENS = 256  # the budget while decoding, before the line is known
MIN_TOKENS = 64  # the least a step prefills while decoding: a prompt always moves on


class PrefillPacer:
    """Prefill token budget per engine step.

    step_ms: the prefill time a step may add while other requests decode (None: no time
    bound); max_tokens: a hard cap per step either way (None: none). Raises ValueError for a
    step_ms that is not > 0 or a max_tokens that is not ≥ 1."""

    def __init__(self, step_ms: float | None = 200.0, max_tokens: int | None = None):
        if step_ms is not None and not step_ms > 0:
            raise ValueError(f"step_ms {step_ms!r}: expected a number > 0 (or None)")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens!r}: expected an integer >= 1 (or None)")
        self.step_ms, self.max_tokens = step_ms, max_tokens
        self.samples: deque[tuple[int, float]] = deque(maxlen=SAMPLES)

    def observe(self, tokens: int, ms: float) -> None:
        """Record one prefill call: `tokens` prompt tokens took `ms` milliseconds."""
        if tokens > 0 and ms >= 0:
            self.samples.append((tokens, ms))

    def line(self) -> tuple[float, float] | None:
        """(fixed ms, ms per token) fitted to the samples, or None before two distinct sizes."""
        if len({n for n, _ in self.samples}) < 2:
            return None
        k = len(self.samples)
        mx = sum(n for n, _ in self.samples) / k
        my = sum(m for _, m in self.samples) / k
        sxx = sum((n - mx) ** 2 for n, _ in self.samples)
        slope = sum((n - mx) * (m - my) for n, m in self.samples) / sxx
        slope = max(slope, 1e-6)  # timing noise must not make tokens look free
        return max(0.0, my - slope * mx), slope

    def predict_ms(self, tokens: int) -> float | None:
        """Predicted ms of a `tokens`-token prefill, or None while the line is unknown."""
        fit = self.line()
        return None if fit is None else fit[0] + fit[1] * tokens

    def budget(self, decoding: bool) -> int | None:
        """Prompt tokens this step may prefill: None = no bound (nothing decoding and no
        max_tokens), else ≥ 1 (≥ MIN_TOKENS unless max_tokens is lower)."""
        cap = self.max_tokens
        if not decoding or self.step_ms is None:
            return cap
        fit = self.line()
        if fit is None:
            n = FIRST_TOKENS
        else:
            fixed, per_token = fit
            n = int((self.step_ms - fixed) / per_token) if self.step_ms > fixed else 0
        n = max(MIN_TOKENS, n)
        return n if cap is None else min(n, cap)
