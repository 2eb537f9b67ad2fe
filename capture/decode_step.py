"""The whole decode step for one batch bucket, from the kernels, captured in one CUDA graph.

embedding → every `DecodeLayer` → final RMSNorm → LM-head GEMV → sampler kernel
(`kernels/decode/sample_tokens.py`: temperature, top-k, top-p, greedy per row, counter-based draws keyed
by (seed, token index)) (DESIGN §3 "Decode graph"). Every per-step input lives in one static
device buffer owned by `DecodeGraph` for the graph's lifetime; `set_rows` fills it from pinned
host memory with one asynchronous copy before a replay, and no captured node reads host memory.
The embedding lookup is a torch op inside the graph; everything else is our kernels with PDL.

The KV cache is `kv_cache.KVCache`; padding rows of a bucket point at its scratch slot, so they
never touch a live request's KV.

Numerics: as `ReferenceModel` except that the LM head's logits come out of the GEMV rounded to
bf16 (the reference keeps them fp32): a relative change of at most 2^-9 per logit. The sampler
draws from integer weights (2^40 · exp((l − l_max)/T), exact sums): the same token as
`sampling.sample` unless the draw falls within ~2e-6 relative of a CDF step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from flint_graph import reference
from flint_graph.capture.decode_layer import DecodeLayer, StepBuffers
from flint_graph.capture.kv_cache import KVCache
from flint_graph.capture.launcher import capture_graph
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import gemv_bf16, gemv_nvfp4
from flint_graph.kernels.toolchain.spec import DTYPES
from flint_graph.runtime.sampling import sample
from flint_graph.checkpoints.weights import FlintWeights, NVFP4Weight


@dataclass
class Row:
    """One live row of a step: its slot, the token it feeds, that token's position, and the
    sampling parameters of the next token (temperature 0 = greedy; top_k 0 = off)."""

    slot: int
    token: int
    position: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    draw_index: int = 0  # the counter of the sampler's random stream (tokens generated so far)


class StepInputs:
    """Every per-step input of a decode graph in one device buffer, filled from one pinned
    host buffer by one asynchronous copy (instead of one pageable copy per tensor).

    fields: name -> (torch dtype, shape), each placed at a 16-byte aligned offset. `device`
    name -> device tensor (views the graph captures; fixed for its lifetime); `begin()` waits
    until the previous upload has left the staging buffer and returns name -> numpy view of it;
    `upload()` enqueues the copy on the current stream."""

    def __init__(self, fields: dict[str, tuple[torch.dtype, tuple[int, ...]]], device):
        layout, size = {}, 0
        for name, (dtype, shape) in fields.items():
            size = -(-size // 16) * 16
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            layout[name] = (size, nbytes, dtype, shape)
            size += nbytes
        self._dev = torch.zeros(size, dtype=torch.uint8, device=device)
        self._host = torch.zeros(size, dtype=torch.uint8, pin_memory=True)
        raw = self._host.numpy()
        self.device = {n: self._dev[o:o + k].view(dt).view(shape)
                       for n, (o, k, dt, shape) in layout.items()}
        self._np = {n: raw[o:o + k].view(_NUMPY[dt]).reshape(shape)
                    for n, (o, k, dt, shape) in layout.items()}
        self._done = torch.cuda.Event()
        self._pending = False

    def begin(self) -> dict[str, np.ndarray]:
        if self._pending:
            self._done.synchronize()
        return self._np

    def upload(self) -> None:
        self._dev.copy_(self._host, non_blocking=True)
        self._done.record()
        self._pending = True


TOP_K_CAP = 2**31 - 1  # the sampler reads top_k as int32; anything this large means "all"
_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


class DecodeGraph:
    """The decode step of bucket `batch` over `weights` (on the GPU) and `kv`.

    `set_rows(rows)` (at most `batch` rows; the rest become padding rows on the scratch slot),
    then `replay()` (or `run_eager()` before `capture()`); results in `logits_bf16` [B, V]
    (`logits`: a float32 copy) and `next_ids` int64 [B]. `vocab_limit`: ids at or above it are
    never sampled (padding rows of the LM head). fold: `DecodeLayer`'s (attention with the Q/K
    norm, RoPE and KV write folded in; None: the model's default)."""

    def __init__(self, kset, cfg: FlintConfig, weights: FlintWeights, kv: KVCache, batch: int,
                 vocab_limit: int | None = None, *, pdl: bool = True,
                 torch_sampler: bool = False, fold: bool | None = None):
        self.cfg, self.weights, self.kv, self.batch = cfg, weights, kv, batch
        self.pdl = pdl  # False: plain stream order between our kernels (for comparison)
        self.torch_sampler = torch_sampler  # True: sampling.sample in the graph (comparison)
        dev = weights.final_norm.device
        b = batch
        self.bufs = StepBuffers.allocate(cfg, b, kv.pages_per_slot, device=dev)
        self.layers = [DecodeLayer(kset, cfg, i, lw, b, fold)
                       for i, lw in enumerate(weights.layers)]
        self.norm = kset.get("rmsnorm", B=b, H=cfg.hidden_size)
        head = weights.lm_head
        gemv = gemv_nvfp4 if isinstance(head, NVFP4Weight) else gemv_bf16
        spec = gemv.spec_for(b, cfg.hidden_size, cfg.vocab_size)
        self.head = kset.get(spec.kernel, **spec.as_dict())
        self.head_args = ([head.codes, head.scales, head.scale2.float().reshape(1)]
                          if isinstance(head, NVFP4Weight) else [head])
        v = cfg.vocab_size
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        self.inputs = StepInputs({
            "positions": (i32, (b,)), "row_mask": (i32, (b,)), "ring_table": (i32, (b, 1)),
            "page_table": (i32, (b, kv.pages_per_slot)), "ids": (i64, (b,)),
            "temperature": (f32, (b,)), "top_k": (i32, (b,)), "top_p": (f32, (b,)),
            "seeds": (i64, (b,)), "draw_index": (i64, (b,))}, dev)
        dv = self.inputs.device
        self._table_slots: list[int | None] = [None] * b  # slot whose pages each row holds
        self.bufs.positions, self.bufs.row_mask = dv["positions"], dv["row_mask"]
        self.bufs.ring_table, self.bufs.page_table = dv["ring_table"], dv["page_table"]
        self.ids, self.temperature, self.top_k = dv["ids"], dv["temperature"], dv["top_k"]
        self.top_p, self.seeds, self.draw_index = dv["top_p"], dv["seeds"], dv["draw_index"]
        self.logits_bf16 = torch.empty(b, v, dtype=torch.bfloat16, device=dev)
        self.next_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.vocab_limit = vocab_limit if vocab_limit is not None else v
        self.sampler = kset.get("sample_tokens", B=b, V=v, VLIM=v)
        # its workspaces: zero before the first launch, left zero by every launch
        self.sampler_ws = [torch.zeros(a.shape, dtype=getattr(torch, DTYPES[a.dtype][0]),
                                       device=dev)
                           for a in self.sampler.args if getattr(a, "role", "") == "workspace"]
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def kernels_per_step(self) -> int:
        """Our kernel launches in one step: the layers', the final norm, the LM head and the
        sampler (the torch embedding lookup not counted; `graph_nodes` counts everything)."""
        return sum(layer.kernels_per_launch for layer in self.layers) + 3

    def set_rows(self, rows: list[Row]) -> None:
        """Fill the static input buffers for this step (one asynchronous host → device copy on
        the current stream, before replay). Raises ValueError for more rows than the bucket, a bad slot or a position past the
        cache."""
        b, kv = self.batch, self.kv
        if len(rows) > b:
            raise ValueError(f"{len(rows)} rows for a bucket of {b}")
        pad = Row(slot=kv.scratch, token=0, position=0)
        full = list(rows) + [pad] * (b - len(rows))
        for r in rows:
            if not 0 <= r.slot < kv.num_slots:
                raise ValueError(f"slot {r.slot}: expected 0 to {kv.num_slots - 1}")
            if not 0 <= r.position < kv.max_tokens:
                raise ValueError(f"position {r.position}: the cache holds {kv.max_tokens} tokens")
        h = self.inputs.begin()  # numpy views of the pinned staging buffer
        live = len(rows)
        h["positions"][:] = [r.position for r in full]
        h["row_mask"][:] = [1] * live + [0] * (b - live)
        h["ring_table"][:, 0] = [r.slot for r in full]
        for i, r in enumerate(full):  # a slot's pages are fixed: rewrite a row on a new slot
            if self._table_slots[i] != r.slot:
                h["page_table"][i] = kv.page_table(r.slot)
                self._table_slots[i] = r.slot
        h["ids"][:] = [r.token for r in full]
        h["temperature"][:] = [r.temperature for r in full]
        h["top_k"][:] = [min(r.top_k, TOP_K_CAP) for r in full]
        h["top_p"][:] = [r.top_p for r in full]
        h["seeds"][:] = [r.seed for r in full]
        h["draw_index"][:] = [r.draw_index for r in full]
        self.inputs.upload()

    def _body(self, after_layer=None) -> None:
        cfg, w, bf = self.cfg, self.weights, self.bufs
        bf.stream.copy_(reference.embed(w.embed, self.ids))
        pdl = None if self.pdl else False
        for i, (layer, kv) in enumerate(zip(self.layers, self.kv.layers)):
            layer.launch(bf, kv, pdl=pdl)
            if after_layer is not None:
                after_layer(i, bf)
        self.norm.launch(bf.stream, bf.zeros, w.final_norm, bf.residual, bf.h, cfg.rms_norm_eps,
                         pdl=pdl)
        self.head.launch(bf.h, *self.head_args, self.logits_bf16, pdl=pdl)
        if self.vocab_limit < cfg.vocab_size:
            self.logits_bf16[:, self.vocab_limit:] = float("-inf")
        if self.torch_sampler:
            self.next_ids.copy_(sample(self.logits_bf16.float(), self.temperature,
                                       self.top_k.long(), self.top_p, self.seeds,
                                       self.draw_index))
            return
        self.sampler.launch(self.logits_bf16, self.temperature, self.top_k, self.top_p,
                            self.seeds, self.draw_index, self.next_ids, *self.sampler_ws,
                            pdl=pdl)

    @property
    def logits(self) -> torch.Tensor:
        """The last step's logits as float32 [B, V] (a copy; -inf at ids ≥ vocab_limit)."""
        return self.logits_bf16.float()

    def run_eager(self, after_layer=None) -> None:
        """One step without the graph (same kernels, launched one by one). `after_layer(i,
        bufs)`, when given, runs after layer i's kernels are enqueued (e.g. to copy out its
        buffers when looking for the first layer where two runs differ)."""
        self._body(after_layer)

    def capture(self) -> None:
        """Warm up once on a side stream, then capture the step into one CUDA graph. The warm-up
        writes the scratch slot only when `set_rows` was given no live rows: call it first."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with capture_graph(self.graph):
            self._body()

    def graph_nodes(self) -> dict[str, int]:
        """Node counts by type ("kernel", "memcpy", "memset", ...) of the step's CUDA graph,
        read from a separate capture with the driver's graph API: what one replay launches,
        torch's ops included. Raises RuntimeError where torch or the driver cannot say."""
        import cuda.bindings.driver as cu

        try:
            g = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError as e:  # torch without keep_graph
            raise RuntimeError(f"torch {torch.__version__} cannot keep a captured graph") from e
        with capture_graph(g):
            self._body()
        graph = cu.CUgraph(g.raw_cuda_graph())
        err, _, n = cu.cuGraphGetNodes(graph, 0)
        err2, nodes, n = cu.cuGraphGetNodes(graph, n)
        if err != cu.CUresult.CUDA_SUCCESS or err2 != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuGraphGetNodes: {err} / {err2}")
        counts: dict[str, int] = {}
        for node in nodes[:n]:
            err, kind = cu.cuGraphNodeGetType(node)
            name = kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
            counts[name] = counts.get(name, 0) + 1
        del g
        return counts

    def replay(self) -> None:
        """Run the captured step on the current stream (after `set_rows`)."""
        if self.graph is None:
            raise RuntimeError("DecodeGraph.replay before capture()")
        self.graph.replay()
