"""The fast decode path behind `Engine`: the KV cache, one captured decode graph per batch
bucket, slot bookkeeping and chunked prefill into the cache (DESIGN §3).

`GraphRunner.prefill` runs `capture/prefill.py` (the CuTe DSL prefill attention inside cuBLAS and
grouped expert GEMMs; `prefill="torch"` swaps in torch's SDPA, `"reference"` the reference model
through `kv_cache.SlotKV`), writing the layout the decode kernels read. `decode(rows)` picks the smallest bucket that holds the rows, fills its
graph's static buffers, replays it and returns the sampled ids and the fp32 logits.

Start-up captures every bucket up to `max_slots` (a warm-up step on the scratch slot first), and
the kernel prefill's chunk body once per prefill bucket (`Prefill.capture`), so the first
request pays no capture. `timings` records seconds per phase (KV allocation, then
per bucket the kernel-cache load with the layers' set-up, and the capture), `memory` the bytes of weights, KV cache and the torch allocator's peak.
"""

from __future__ import annotations

import time

import torch

from flint_graph.capture.decode_step import DecodeGraph, Row
from flint_graph.capture.kv_cache import KVCache, SlotKV
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ConfigError
from flint_graph.kernels.toolchain.spec import BUCKETS
from flint_graph.reference import ReferenceModel
from flint_graph.checkpoints.weights import FlintWeights

KV_MEMORY_FRACTION = 0.8  # of the free GPU memory after weights, for the KV cache by default
# the longest chunk start-up runs once eagerly (`GraphRunner._warm_up_eager`): ~0.25 s at full
# size on the H200. 16K rather than 8K: it runs cuBLAS at M = 8,192 (the largest of
# `prefill.gemm_row_windows`' sizes, which the graphs never use), and the caching allocator
# serves a later chunk from the warm-up's freed segments only if it is no larger (after an
# 8,192-token warm-up the first 8,570-token request made 20 cudaMallocs, 2.3 ms, on the H100;
# 2026-12-05, perf log); a longer one would add start-up time for less and less
EAGER_WARM_UP_TOKENS = 16384


def kv_tokens_for(cfg: FlintConfig, num_slots: int, max_context: int | None,
                  device: torch.device, reserve: int = 0) -> int:
    """Tokens of KV per slot: `max_context` if given, else as many as fit in
    KV_MEMORY_FRACTION of the free GPU memory (capped by the model's context limit), after the
    slots' rings, the most memory KV reuse's ring snapshots can take (`snapshot_reserve`) and
    `reserve` bytes more (the prefill's kept BF16 dense weights, `prefill.dense_bf16_bytes`)."""
    limit = cfg.max_position_embeddings
    if max_context is not None:
        return min(max_context, limit)
    free, _ = torch.cuda.mem_get_info(device)
    per_token = cfg.kv_bytes_per_token * (num_slots + 1)
    ring = cfg.sliding_kv_bytes_per_slot * (num_slots + 2)  # + scratch, + the snapshot row
    rest = free * KV_MEMORY_FRACTION - ring - snapshot_reserve(cfg, num_slots) - reserve
    return max(1, min(limit, int(rest // per_token)))


def snapshot_reserve(cfg: FlintConfig, num_slots: int) -> int:
    """Bytes KV reuse's ring snapshots can hold at most (issue 22): MAX_SNAPSHOTS copies of a
    slot's sliding-window rings for each running and each retained sequence (at most
    `num_slots` of each). 36.8 MB a copy at full size: 1.8 GB for 8 slots."""
    from flint_graph.runtime.prefix_cache import MAX_SNAPSHOTS

    return 2 * num_slots * MAX_SNAPSHOTS * cfg.sliding_kv_bytes_per_slot


# The largest prefill bucket when the full set's graph pool does not fit beside the KV cache:
# the buckets up to it are what the engine captured before the twenty-ninth session
FALLBACK_GRAPH_MAX = 4096


def capture_prefill_graphs(prefiller, chunk: int) -> tuple[list[int], bool]:
    """`prefiller.capture(chunk)`'s buckets, and whether it fell back: when the graph pool of
    the buckets above FALLBACK_GRAPH_MAX rows (up to 8,192) runs out of GPU memory next to the
    KV cache, the graphs are dropped and captured again up to FALLBACK_GRAPH_MAX (larger chunks
    then run eagerly, slower by the host's launches) instead of refusing to start. Raises
    ConfigError naming the flags when even those do not fit."""
    try:
        return prefiller.capture(chunk), False
    except torch.OutOfMemoryError as e:
        if chunk <= FALLBACK_GRAPH_MAX:
            raise _graphs_oom(chunk) from e
    prefiller.drop_graphs()
    torch.cuda.empty_cache()
    try:
        return prefiller.capture(FALLBACK_GRAPH_MAX), True
    except torch.OutOfMemoryError as e:
        raise _graphs_oom(chunk) from e


def _graphs_oom(chunk: int) -> ConfigError:
    return ConfigError(f"out of GPU memory capturing the prefill graphs (chunks up to {chunk} "
                       "tokens); lower --prefill-chunk, --max-context or pass "
                       "--no-prefill-graphs")


class GraphRunner:
    """KV cache + captured decode graphs for `max_slots` (≤ 8) concurrent sequences.

    Raises KernelCacheError / LaunchError when a kernel is missing from the cache (and cannot be
    built here), ValueError when the config has a shape the kernels do not support, ConfigError
    when the KV cache or a bucket's graph does not fit in GPU memory (naming what and the flags
    that shrink it)."""

    def __init__(self, cfg: FlintConfig, weights: FlintWeights, model: ReferenceModel,
                 max_slots: int, max_context: int | None, vocab_limit: int, kset=None,
                 torch_sampler: bool = False, prefill: str = "kernel",
                 prefill_chunk: int = 2048, prefill_graphs: bool = True,
                 prefill_dense_bf16: bool = True, attn_fold: bool | None = None):
        from flint_graph.capture.launcher import KernelSet
        from flint_graph.capture.prefill import Prefill, dense_bf16_bytes

        if not 1 <= max_slots <= max(BUCKETS):
            raise ValueError(f"max_slots {max_slots}: the graph engine runs 1 to {max(BUCKETS)}")
        self.cfg, self.model, self.timings = cfg, model, {}
        dev = self.device = weights.final_norm.device
        t0 = time.perf_counter()
        # the prefill's kept BF16 dense weights come out of the KV cache's share (they are
        # made after it, once the Prefill exists)
        dense = (dense_bf16_bytes(weights) if prefill != "reference" and prefill_dense_bf16
                 else 0)
        tokens = kv_tokens_for(cfg, max_slots, max_context, dev, reserve=dense)
        try:
            self.kv = KVCache(cfg, max_slots, tokens, device=dev)
        except torch.OutOfMemoryError as e:
            free, _ = torch.cuda.mem_get_info(dev)
            need = ((max_slots + 1) * tokens * cfg.kv_bytes_per_token
                    + (max_slots + 2) * cfg.sliding_kv_bytes_per_slot)
            raise ConfigError(
                f"out of GPU memory for the KV cache: {max_slots} slots + 1 scratch × {tokens} "
                f"tokens need ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free after the "
                f"weights; lower --max-context (EngineConfig.max_context) or EngineConfig.max_slots") from e
        self.context_limit = min(self.kv.max_tokens, cfg.max_position_embeddings)
        self.timings["kv_alloc_s"] = time.perf_counter() - t0
        self.kset = kset or KernelSet()
        self.free_slots = list(range(max_slots))
        self.graphs: dict[int, DecodeGraph] = {}
        for b in [b for b in BUCKETS if b <= max_slots] or [max_slots]:
            t0 = time.perf_counter()
            try:
                g = DecodeGraph(self.kset, cfg, weights, self.kv, b, vocab_limit,
                                torch_sampler=torch_sampler, fold=attn_fold)
                t1 = time.perf_counter()
                g.set_rows([])  # warm-up and capture touch only the scratch slot
                g.capture()
            except torch.OutOfMemoryError as e:
                raise ConfigError(
                    f"out of GPU memory capturing the decode graph of bucket {b} (its buffers "
                    f"and workspaces, after {self.kv.nbytes / 2**30:.1f} GiB of KV cache); "
                    f"lower --max-context (EngineConfig.max_context) or EngineConfig.max_slots") from e
            self.graphs[b] = g
            self.timings[f"kernel_load_B{b}_s"] = t1 - t0
            self.timings[f"capture_B{b}_s"] = time.perf_counter() - t1
        self.timings["kernel_cache_s"] = sum(v for k, v in self.timings.items()
                                             if k.startswith("kernel_load_"))
        self.kernels_per_step = {b: g.kernels_per_step for b, g in self.graphs.items()}
        self.prefill_path = prefill
        self.prefiller = None
        if prefill != "reference":
            self.prefiller = Prefill(cfg, weights, self.kv, "kernel" if prefill == "kernel"
                                     else "sdpa", kset=self.kset)
            if dense:
                try:
                    self.prefiller.set_dense_bf16(True)
                except torch.OutOfMemoryError as e:
                    self.prefiller.set_dense_bf16(False)
                    raise ConfigError(
                        f"out of GPU memory keeping the prefill's BF16 dense weights "
                        f"({dense / 2**30:.1f} GiB, after {self.kv.nbytes / 2**30:.1f} GiB of "
                        f"KV cache); lower --max-context or pass --no-prefill-dense-bf16") from e
        self.prefill_buckets: list[int] = []
        self.prefill_graphs_fell_back = False  # capture_prefill_graphs' fallback taken
        if prefill == "kernel" and prefill_graphs:
            t0 = time.perf_counter()
            self.prefill_buckets, self.prefill_graphs_fell_back = capture_prefill_graphs(
                self.prefiller, prefill_chunk)
            self.timings["capture_prefill_s"] = time.perf_counter() - t0
        if self.prefiller is not None:
            # the torch ops around a replay (validation, copies) load their kernels on first
            # use: run them once here, into slot 0 (a slot's next owner overwrites it), a
            # resumed prefill (start > 0) and a KV-reuse ring snapshot and restore with them
            one = torch.zeros(1, dtype=torch.long)
            self.prefiller.prefill(0, one, prefill_chunk)
            self.prefiller.prefill(0, one, prefill_chunk, start=1)
            self.load_rings(0, self.save_rings(0))
            self._warm_up_eager(prefill_chunk)
        # two of each: a step launched before the previous one's ids are read (the engine's
        # pipelined decode) must not copy its ids over them
        self._ids_host = [torch.zeros(max(BUCKETS), dtype=torch.int64, pin_memory=True)
                          for _ in range(2)]
        self._ids_ready = [torch.cuda.Event() for _ in range(2)]
        self._flip = 0
        self.memory = {"weights": weights.nbytes(), "kv_cache": self.kv.nbytes,
                       "prefill_dense_bf16": dense,
                       "peak_allocated": torch.cuda.max_memory_allocated(dev)}

    def _warm_up_eager(self, chunk: int) -> None:
        """Prefill one chunk longer than the largest captured bucket into slot 0 (its next owner
        overwrites it), as a prompt of more than 8,192 tokens will: such a chunk runs eagerly,
        and its first run pays for what a graph replay never touches: the caching allocator's
        first cudaMalloc of the chunk's activations (~1 GB at 8K tokens, full size) and the
        torch kernels loaded on their first use (cuBLAS's per-shape work is left out by
        running an eager chunk's GEMMs in `prefill.gemm_row_windows`). On the H200 the
        first 8K-token request after start-up took 176-189 ms against 124-133 ms for the same
        prompt later (2026-12-05, issue 21: "the first request after start-up runs at full
        speed"). Up to EAGER_WARM_UP_TOKENS tokens, within the chunk size and the slot's
        capacity; none when every chunk replays a graph. Seconds in timings["warm_up_eager_s"].
        Raises ConfigError naming --prefill-chunk when the chunk does not fit in memory."""
        largest = max(self.prefill_buckets, default=0)
        tokens = min(chunk, EAGER_WARM_UP_TOKENS, self.context_limit)
        if tokens <= largest:
            return
        t0 = time.perf_counter()
        # ids spread over the vocabulary, so the chunk's rows route to many experts as a
        # prompt's do (one repeated id would send every row to the same six)
        ids = torch.arange(tokens, dtype=torch.long) * 7919 % self.cfg.vocab_size
        self.prefiller.prefill(0, ids, chunk)
        torch.cuda.synchronize(self.device)
        self.timings["warm_up_eager_s"] = time.perf_counter() - t0

    def alloc_slot(self) -> int:
        """A free slot id. Raises RuntimeError when none is free."""
        if not self.free_slots:
            raise RuntimeError("no free KV slot")
        return self.free_slots.pop(0)

    def free_slot(self, slot: int) -> None:
        """Give `slot` back (its KV is simply overwritten by the next owner)."""
        if slot not in self.free_slots:
            self.free_slots.append(slot)

    def prefill(self, slot: int, prompt: torch.Tensor, chunk_tokens: int,
                start: int = 0, snapshot_at: int | None = None) -> torch.Tensor:
        """Write prompt tokens int [T] into `slot` at positions start … start+T−1, in chunks;
        float32 logits [V] of the last one. A prompt may come in parts (start = tokens already
        written). `snapshot_at` (start ≤ it < start + T): the rings as they stand at that
        position are left for `snapshot_rings` (no chunk boundary there). Raises as
        `Prefill.prefill`."""
        if self.prefiller is None:
            kv = SlotKV(self.kv, slot, start)
            kv.snapshot_at = snapshot_at
            return self.model.prefill(kv, prompt, chunk_tokens)
        return self.prefiller.prefill(slot, prompt, chunk_tokens, start, snapshot_at)

    def snapshot_rings(self) -> list:
        """A copy of the rings the last `prefill(snapshot_at=)` left in the snapshot slot, in
        `save_rings`' form. Raises torch.OutOfMemoryError when the copy does not fit."""
        return self.save_rings(self.kv.snapshot_slot)

    def save_rings(self, slot: int) -> list:
        """A copy of `slot`'s sliding-window rings: per layer (k, v) bf16 [HKV, W, D], or None
        for a full layer (a KV-reuse snapshot, flint_graph/runtime/prefix_cache.py). The
        copies are views of one stacked tensor, made by one batched copy: the snapshot is
        taken between a prompt's prefill and its first token, where 70 separate clones at
        full size cost ~1 ms of launches."""
        rings = [kv for kv in self.kv.layers if kv.ring]
        if not rings:
            return [None] * len(self.kv.layers)
        n = len(rings)
        saved = torch.stack([kv.k[slot] for kv in rings] + [kv.v[slot] for kv in rings])
        out, j = [], 0
        for kv in self.kv.layers:
            if kv.ring:
                out.append((saved[j], saved[n + j]))
                j += 1
            else:
                out.append(None)
        return out

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy the full layers' KV of positions 0 … n − 1 from slot `src` to slot `dst`
        (`KVCache.copy_prefix`)."""
        self.kv.copy_prefix(src, dst, n)

    def load_rings(self, slot: int, rings: list) -> None:
        """Write rings saved by `save_rings` back into `slot` (one batched copy)."""
        dst, src = [], []
        for kv, saved in zip(self.kv.layers, rings):
            if saved is not None:
                dst += [kv.k[slot], kv.v[slot]]
                src += [saved[0], saved[1]]
        if dst:
            torch._foreach_copy_(dst, src)

    def decode(self, rows: list[Row]) -> tuple[list[int], torch.Tensor]:
        """One decode step for `rows` (1 ≤ len ≤ max_slots): (sampled ids, bf16 logits
        [len(rows), V], a view valid until the next step of the same bucket is launched).
        Raises ValueError for a bad row (`DecodeGraph.set_rows`)."""
        return self.launch(rows).result()

    def launch(self, rows: list[Row]) -> "PendingStep":
        """Enqueue one decode step for `rows` and return at once (the GPU runs it while the
        caller does host work); `PendingStep.result()` waits for its ids. At most two steps
        may be pending: a third launch reuses the first one's host buffer. Raises ValueError
        for a bad row (`DecodeGraph.set_rows`)."""
        b = min(b for b in self.graphs if b >= len(rows))
        g = self.graphs[b]
        g.set_rows(rows)
        g.replay()
        k, self._flip = self._flip, self._flip ^ 1
        ids = self._ids_host[k][:len(rows)]
        ids.copy_(g.next_ids[:len(rows)], non_blocking=True)  # to pinned memory, no extra sync
        self._ids_ready[k].record()
        return PendingStep(ids, self._ids_ready[k], g.logits_bf16[:len(rows)])


class PendingStep:
    """A decode step in flight (`GraphRunner.launch`): `result()` waits for it and returns
    (sampled ids, bf16 logits [rows, V]); the logits view stays valid until the next step of
    the same bucket is launched."""

    def __init__(self, ids: torch.Tensor, ready: torch.cuda.Event, logits: torch.Tensor):
        self._ids, self._ready, self._logits = ids, ready, logits

    def result(self) -> tuple[list[int], torch.Tensor]:
        self._ready.synchronize()
        return self._ids.tolist(), self._logits
