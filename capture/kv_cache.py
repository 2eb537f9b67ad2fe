"""The BF16 KV cache the decode kernels read (docs/decode-kernels.md "KV cache layout"), and a
per-slot view of it that the reference model can prefill through.

Per sliding layer one ring of `sliding_window` entries per slot; per full layer a pool of
KV_PAGE-token pages, each slot owning a fixed run of `pages_per_slot` pages in this first
version (the page table the kernels read is a device buffer, so a real page allocator can
replace the fixed runs without touching the graph). The last slot is the scratch slot that
padding rows of a bucket point at.

`SlotKV` has `reference.SequenceKV`'s interface (num_tokens, update, advance), so
`ReferenceModel.forward` prefills a slot in place, chunk by chunk, writing exactly the layout
the decode graph reads; like SequenceKV it reads the ring entries a chunk's queries still need
before the chunk overwrites them, so any chunk size is exact, larger than the window too.
"""

from __future__ import annotations

import torch

from flint_graph.capture.decode_layer import LayerKV, allocate_kv
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.toolchain.spec import KV_PAGE
from flint_graph.reference import ring_at


class KVCache:
    """BF16 KV for `num_slots` sequences (plus one scratch slot) of up to `max_tokens` tokens.

    layers[i]: LayerKV of layer i (rings [slots+2, HKV, W, D] or pages [(slots+1)·pages_per_slot,
    HKV, KV_PAGE, D]). `page_table(slot)` int32 [pages_per_slot]: the pages slot owns. Ring row
    `snapshot_slot` (after the scratch slot; no pages) receives a prefill's rings as they stand
    at a position inside a chunk (`SlotKV.snapshot_at`, `Prefill.prefill(snapshot_at=)`), for
    a KV-reuse snapshot taken without stopping the prefill there."""

    def __init__(self, cfg: FlintConfig, num_slots: int, max_tokens: int, device="cuda"):
        self.cfg, self.num_slots = cfg, num_slots
        self.scratch = num_slots  # the padding rows' slot
        self.snapshot_slot = num_slots + 1  # rings only
        self.pages_per_slot = -(-max_tokens // KV_PAGE)
        self.max_tokens = self.pages_per_slot * KV_PAGE
        total = num_slots + 1
        self.layers: list[LayerKV] = [
            allocate_kv(cfg, i, num_pages=total * self.pages_per_slot, num_slots=total + 1,
                        device=device) for i in range(cfg.num_hidden_layers)]
        for kv in self.layers:  # unwritten entries must never reach an output: NaN shows it
            kv.k.fill_(float("nan"))
            kv.v.fill_(float("nan"))

    def page_table(self, slot: int) -> torch.Tensor:
        first = slot * self.pages_per_slot
        return torch.arange(first, first + self.pages_per_slot, dtype=torch.int32)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy the full layers' K/V of positions 0 … n − 1 from slot `src`'s pages to slot
        `dst`'s, whole pages at once (entries past n in the last page come along: the next
        prefill overwrites them, as a new owner overwrites a freed slot's). The rings are not
        copied: a KV-reuse fork (flint_graph/runtime/prefix_cache.py, `Match.fork`) loads them
        from a snapshot. One batched copy on the current stream, after the work queued there.
        Raises ValueError for a slot out of range or n past a slot's tokens."""
        if not (0 <= src < self.num_slots and 0 <= dst < self.num_slots) or src == dst:
            raise ValueError(f"copy_prefix: slots {src} -> {dst}: expected two different "
                             f"slots below {self.num_slots}")
        if not 0 <= n <= self.max_tokens:
            raise ValueError(f"copy_prefix: {n} tokens: expected 0 to {self.max_tokens}")
        pages = -(-n // KV_PAGE)
        s, d = src * self.pages_per_slot, dst * self.pages_per_slot
        out, inp = [], []
        for kv in self.layers:
            if not kv.ring:
                out += [kv.k[d:d + pages], kv.v[d:d + pages]]
                inp += [kv.k[s:s + pages], kv.v[s:s + pages]]
        if out and pages:
            torch._foreach_copy_(out, inp)

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' K and V."""
        return sum(2 * kv.k.numel() * kv.k.element_size() for kv in self.layers)


class SlotKV:
    """One slot of a `KVCache` seen as a `reference.SequenceKV` (num_tokens, update, advance).

    Raises ValueError from `update` when the tokens would pass the slot's capacity."""

    def __init__(self, cache: KVCache, slot: int, num_tokens: int = 0):
        self.cache, self.slot, self.num_tokens = cache, slot, num_tokens
        # a position inside the tokens to come: the rings as they stand there are written to
        # the cache's snapshot slot (`reference.SequenceKV.snapshot_at`'s counterpart)
        self.snapshot_at: int | None = None
        dev = cache.layers[0].k.device
        self.pages = cache.page_table(slot).to(dev).long()
        self.windows = [cache.cfg.sliding_window if kv.ring else None for kv in cache.layers]

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, *,
               gather: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Store k_new, v_new bf16 [T, HKV, D] at positions num_tokens … and return (k, v, k_pos)
        of every key the new queries may see, as SequenceKV.update (None when not `gather`:
        the prefill kernel reads the cache itself, before this write)."""
        kv, n, t = self.cache.layers[layer], self.num_tokens, k_new.shape[0]
        dev = k_new.device
        if n + t > self.cache.max_tokens:
            raise ValueError(f"slot {self.slot}: {n} + {t} tokens exceed the cache's "
                             f"{self.cache.max_tokens} per slot")
        new = torch.arange(n, n + t, device=dev)
        if not kv.ring:
            page, entry = self.pages[new // KV_PAGE], new % KV_PAGE
            kv.k[page, :, entry] = k_new
            kv.v[page, :, entry] = v_new
            if not gather:
                return None
            pos = torch.arange(n + t, device=dev)
            page, entry = self.pages[pos // KV_PAGE], pos % KV_PAGE
            return kv.k[page, :, entry], kv.v[page, :, entry], pos
        w = self.windows[layer]
        ring_k, ring_v = kv.k[self.slot], kv.v[self.slot]  # [HKV, W, D]
        old = torch.arange(max(0, n - w + 1), n, device=dev)  # read before the ring is overwritten
        if gather:
            k = torch.cat([ring_k[:, old % w].transpose(0, 1), k_new])
            v = torch.cat([ring_v[:, old % w].transpose(0, 1), v_new])
        at = self.snapshot_at
        if at is not None and n <= at < n + t:
            s = self.cache.snapshot_slot
            kv.k[s] = ring_at(ring_k, k_new, n, at, w, dim=1)
            kv.v[s] = ring_at(ring_v, v_new, n, at, w, dim=1)
        keep = new[-w:]
        ring_k[:, keep % w] = k_new[-w:].transpose(0, 1)
        ring_v[:, keep % w] = v_new[-w:].transpose(0, 1)
        return (k, v, torch.cat([old, new])) if gather else None

    def advance(self, num_tokens: int) -> None:
        """Count `num_tokens` more tokens as cached (after every layer's update)."""
        self.num_tokens += num_tokens
