"""`GET /metrics` of `flint-graph serve`: Prometheus text exposition through prometheus_client
(issue 23): requests by route and finish reason, prompt / cached / generated tokens, TTFT and
time-per-output-token histograms (seconds, Prometheus' base unit), and the engine's running and
waiting requests, retained sequences and KV slots in use, read when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

# TTFT spans a 10 ms short prompt to seconds for 100K tokens; TPOT ~2 ms (H200) to ~100 ms (CPU)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)


ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def request_line(route: str, out) -> str:
    """One finished request as a log line: its path, finish reason, prompt tokens (cached
    share), generated tokens, TTFT (ms) and total time (s, TTFT + TPOT for the rest); e.g.
    `POST /v1/chat/completions stop: 23 prompt tokens (12 cached), 41 generated, TTFT 120 ms,
    1.91 s`. `out`: a GenerationOutput (api.py)."""
    n = len(out.token_ids)
    cached = f" ({out.cached_tokens:,} cached)" if out.cached_tokens else ""
    parts = [f"{len(out.prompt_token_ids):,} prompt tokens{cached}", f"{n:,} generated"]
    if out.ttft_ms is not None:
        total = out.ttft_ms + (out.ms_per_token or 0.0) * max(n - 1, 0)
        parts += [f"TTFT {out.ttft_ms:,.0f} ms", f"{total / 1e3:,.2f} s"]
    return f"POST {ROUTES.get(route, route)} {out.finish_reason}: {', '.join(parts)}"


class ServerMetrics:
    """The server's metrics in their own registry (several apps in one process, as the tests
    run, keep apart). `record(route, output)` after each request; `render()` -> (bytes, content
    type) for the /metrics response. `log`: called with each finished request's
    `request_line` (the CLI prints it; a new user's trial found `serve` silent while requests
    came and went, 2026-12-07), or None."""

    def __init__(self, engine, log=None):
        self.log = log
        r = self.registry = CollectorRegistry()
        self.requests = Counter("flint_requests", "Finished requests", ["route", "finish_reason"],
                                registry=r)
        self.prompt_tokens = Counter("flint_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter("flint_cached_prompt_tokens",
                                     "Prompt tokens served from retained KV (not prefilled)",
                                     registry=r)
        self.generated = Counter("flint_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("flint_time_to_first_token_seconds",
                              "Submission to first token", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("flint_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request",
                              buckets=TPOT_BUCKETS, registry=r)
        Gauge("flint_requests_running", "Requests being decoded", registry=r).set_function(
            lambda: len(engine.running))
        Gauge("flint_requests_waiting", "Requests waiting for or in prefill",
              registry=r).set_function(lambda: len(engine.waiting) + len(engine.prefilling))
        Gauge("flint_retained_sequences", "Finished sequences kept for KV reuse",
              registry=r).set_function(lambda: len(engine.prefix_cache))
        if engine.runner is not None:
            slots = engine.max_slots
            Gauge("flint_kv_slots_used", "KV slots held (running, prefilling or retained)",
                  registry=r).set_function(lambda: slots - len(engine.runner.free_slots))
            Gauge("flint_kv_slots", "KV slots", registry=r).set(slots)

    def record(self, route: str, out) -> None:
        """Count one finished request's GenerationOutput."""
        self.requests.labels(route, out.finish_reason).inc()
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.cached_tokens.inc(out.cached_tokens)
        self.generated.inc(len(out.token_ids))
        if out.ttft_ms is not None:
            self.ttft.observe(out.ttft_ms / 1e3)
        if out.ms_per_token is not None:
            self.tpot.observe(out.ms_per_token / 1e3)
        if self.log is not None:
            self.log(request_line(route, out))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
