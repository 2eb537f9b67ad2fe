"""flint_graph: a low-latency decode runtime for the Flint 40B mixture-of-experts LLM.

Public entry points: `LLM` (load a checkpoint, generate / stream / chat) and `SamplingParams`.
They are imported lazily so that `import flint_graph.checkpoints.config` stays light.
"""

__all__ = ["LLM", "SamplingParams", "ChatMessage", "GenerationOutput"]


def __getattr__(name: str):
    if name in ("LLM", "ChatMessage", "GenerationOutput"):
        from flint_graph import api

        return getattr(api, name)
    if name == "SamplingParams":
        from flint_graph.runtime.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'flint_graph' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too: tab completion and dir() found no LLM (a new user's trial)
    return sorted(set(globals()) | set(__all__))
