"""A stand-in LLM whose chat stream yields chosen text, for driving `ChatSession` without a
model (the tmux test runs it in a subprocess, so this module imports nothing heavy)."""

from __future__ import annotations

from types import SimpleNamespace as NS


class FakeStream:
    """Deltas of `reasoning` then `content`, three characters each, and the final message."""

    def __init__(self, reasoning: str, content: str, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.deltas = [NS(reasoning=reasoning[i:i + 3], content="", tool_calls=[])
                       for i in range(0, len(reasoning), 3)]
        self.deltas += [NS(reasoning="", content=content[i:i + 3], tool_calls=[])
                        for i in range(0, len(content), 3)]
        out = NS(errors=[], token_ids=[0] * 50, ttft_ms=1.0, ms_per_token=2.0,
                 finish_reason="stop", prompt_token_ids=[0] * 10, cached_tokens=0)
        self.message = NS(reasoning_content=reasoning, content=content, tool_calls=[],
                          finish_reason="stop", output=out,
                          to_dict=lambda: {"role": "assistant", "content": content})

    def __iter__(self):
        import time

        for d in self.deltas:
            time.sleep(self.delay_s)
            yield d

    def close(self):
        pass


class FakeLLM:
    """Answers every chat with FakeStream(reasoning, content)."""

    cfg = NS(num_hidden_layers=2, max_position_embeddings=4096)
    engine = NS(context_limit=4096, name="reference")
    device = "cpu"

    def __init__(self, reasoning: str, content: str, delay_s: float = 0.0):
        self.reasoning, self.content, self.delay_s = reasoning, content, delay_s

    def stream_chat(self, *args, **kwargs):
        return FakeStream(self.reasoning, self.content, self.delay_s)


def script_chat_output(monkeypatch, llm, ids: list[int]) -> None:
    """Every chat request of the real `llm` writes `ids` (Request.force) instead of sampling:
    a model's output chosen token by token, through the real engine and parsers."""
    original = type(llm)._chat_request

    def scripted(self, *a, **kw):
        req = original(self, *a, **kw)
        req.force(ids)
        return req

    monkeypatch.setattr(type(llm), "_chat_request", scripted)
