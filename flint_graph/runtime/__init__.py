"""The engine and its scheduler: requests, sampling, stopping, prefill pacing and multi-turn KV reuse (DESIGN §3)."""
