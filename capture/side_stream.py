"""A second CUDA stream for the prefill's work that the next kernel does not need: decoding the
next projections' NVFP4 weights, the shared expert, the KV write. On one stream each of these
waits for the kernel before it although it reads nothing that kernel writes; at short chunks
the kernels are latency-bound (a 25-token prefill's routed gate/up uses ~1.7 of the H200's
4.8 TB/s), so the GPU has room to run them beside the main stream's work.

Use (capture/prefill.py):

    with side.fork():          # ordered after everything the current stream has queued
        w = decode(weight)     # runs on the side stream
        side.mark("o")         # an event after it
    ...                        # the main stream goes on
    side.wait("o")             # the main stream waits for the decode only
    ...
    side.join()                # the main stream waits for all side work

Works the same eagerly and under CUDA-graph capture (a fork and a wait become graph edges).

Why no record_stream: torch's caching allocator hands a freed block back only to the stream it
was allocated on. Every allocation on the side stream happens inside a fork, right after the
side stream waited on all the main stream had queued, so a block the main stream used and freed
before that point is reused on the side stream only after those uses; and the main stream frees
what side work reads only after a `join` (the prefill joins at the end of every layer). Keep
forks short and allocation-first to keep that true.

Off (`SideStream(None)`: the CPU, the torch-ops paths, or `Prefill.set_overlap(False)` for
comparisons): `fork` runs its block in place on the current stream and the rest do nothing, so
one code path serves both.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class SideStream:
    """A side CUDA stream with named events (module docstring). device: the CUDA device, or
    None for off. Events are created once per name and reused (stream order keeps a re-recorded
    event meaningful)."""

    def __init__(self, device: torch.device | None):
        self.stream = torch.cuda.Stream(device) if device is not None else None
        self._events: dict[str, torch.cuda.Event] = {}

    @property
    def on(self) -> bool:
        return self.stream is not None

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """Run the block's work on the side stream, after everything the current stream has
        queued (in place when off)."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            yield

    def mark(self, name: str) -> None:
        """Record event `name` on the side stream (call inside a fork, after the work the
        main stream will `wait` for)."""
        if self.stream is None:
            return
        ev = self._events.get(name)
        if ev is None:
            ev = self._events[name] = torch.cuda.Event()
        ev.record(self.stream)

    def wait(self, name: str) -> None:
        """Make the current stream wait for the side work before `mark(name)`."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_event(self._events[name])

    def join(self) -> None:
        """Make the current stream wait for all side work queued so far."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
