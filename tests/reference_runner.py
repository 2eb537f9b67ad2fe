"""A stand-in for capture.runner.GraphRunner built on the reference model, for CPU tests of
the graph engine's host side (slots, KV reuse, the pipelined decode of
flint_graph/runtime/engine.py) with real KV semantics: each slot is a reference SequenceKV
(sliding layers in rings of `sliding_window` entries, written by position), so a step that
writes one position too many, or a resume from a ring that lost an entry, changes later
tokens exactly as it would on the GPU. Draws follow the reference engine's own sampler
(`greedy`, `sample` with the draw index as position), so outputs must equal a reference
engine's bit for bit.

    eng = llm.engine; use_reference_runner(eng, pipeline=True)
"""

from __future__ import annotations

import torch

from flint_graph.runtime.sampling import greedy, sample


class ReferenceRunner:
    """GraphRunner's interface (what `Engine` calls) over `model`'s SequenceKV, one per slot.
    `launch` computes at once and returns a finished PendingStep-like object; `steps` records
    each launched step's rows (slot, token, position) for tests."""

    prefill_path = "kernel"

    def __init__(self, model, slots: int):
        self.model = model
        self.seqs = [model.new_sequence() for _ in range(slots)]
        self.free_slots = list(range(slots))
        self.context_limit = model.cfg.max_position_embeddings
        self.steps: list[list[tuple[int, int, int]]] = []
        self._chunk_rings = None

    def alloc_slot(self) -> int:
        return self.free_slots.pop(0)

    def free_slot(self, slot: int) -> None:
        self.free_slots.append(slot)

    def prefill(self, slot, part, chunk, start=0, snapshot_at=None):
        seq = self.seqs[slot]
        seq.num_tokens = start
        seq.snapshot_at = snapshot_at
        try:
            logits = self.model.prefill(seq, part, chunk)
        finally:
            seq.snapshot_at = None
        if snapshot_at is not None:
            self._chunk_rings, seq.snapshot = seq.snapshot, [None] * len(seq.snapshot)
        return logits

    def snapshot_rings(self):
        return self._chunk_rings

    def save_rings(self, slot):
        seq = self.seqs[slot]
        return [(k.clone(), v.clone()) if w else None
                for k, v, w in zip(seq.k, seq.v, seq.windows)]

    def load_rings(self, slot, rings) -> None:
        seq = self.seqs[slot]
        for i, saved in enumerate(rings):
            if saved is not None:
                seq.k[i].copy_(saved[0])
                seq.v[i].copy_(saved[1])

    def launch(self, rows):
        self.steps.append([(r.slot, r.token, r.position) for r in rows])
        seqs = [self.seqs[r.slot] for r in rows]
        for r, seq in zip(rows, seqs):
            seq.num_tokens = r.position
        logits = torch.stack([lg[-1] for lg in self.model.forward(
            seqs, [torch.tensor([r.token]) for r in rows])])
        if all(r.temperature == 0 for r in rows):
            ids = greedy(logits)
        else:
            ids = sample(logits, temperature=torch.tensor([r.temperature for r in rows]),
                         top_k=torch.tensor([r.top_k for r in rows], dtype=torch.long),
                         top_p=torch.tensor([r.top_p for r in rows]),
                         seeds=torch.tensor([r.seed for r in rows], dtype=torch.long),
                         positions=torch.tensor([r.draw_index for r in rows], dtype=torch.long))
        return _Done(ids.tolist(), logits)

    def decode(self, rows):
        return self.launch(rows).result()


class _Done:
    def __init__(self, ids, logits):
        self._ids, self._logits = ids, logits

    def result(self):
        return self._ids, self._logits


def use_reference_runner(engine, pipeline: bool) -> ReferenceRunner:
    """Make `engine` (a reference engine on the CPU, no request in it) run as the graph
    engine does, over a ReferenceRunner with its max_slots slots."""
    assert not engine.has_work
    engine.drop_retained()  # (the reference engine's retained sequences)
    engine.runner = ReferenceRunner(engine.model, engine.max_slots)
    engine.pipeline = pipeline
    return engine.runner
