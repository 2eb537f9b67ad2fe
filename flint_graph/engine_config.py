"""Runtime knobs (`EngineConfig`), as opposed to the model facts in `config.py` (STYLE §1, §3).

Each default is defined once here; the API and CLI read them from the dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_graph.errors import InvalidRequestError


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model (not what the model is)."""

    max_slots: int = 8  # most sequences decoded together (DESIGN §3: the largest bucket)
    prefill_chunk_tokens: int = 2048  # prompt tokens per prefill forward (bounds memory)

    def __post_init__(self) -> None:
        for name in ("max_slots", "prefill_chunk_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidRequestError(f"{name} {value!r}: expected an integer >= 1")


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
