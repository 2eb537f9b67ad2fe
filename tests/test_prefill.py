"""The prefill (capture/prefill.py) on the CPU with the reference attention: the grouped-GEMM
MoE, the per-layer NVFP4 decode, the chunking and the KV writes against the reference model, in
both weight formats; its errors; and the engine ending only the request whose prefill fails.
(The CuTe DSL attention path runs in tests/test_prefill_gpu.py on the H200.)

Tolerance: the prefill's GEMMs round as the reference's (bf16 out of fp32 accumulation; NVFP4
dense projections scale by scale2 in fp32 before that rounding) and on the CPU it is bitwise the
reference here; its LM head rounds logits to bf16 like the graph engine's:
‖Δlogits‖/‖logits‖ ≤ 1e-2 with the same greedy pick, and the KV per layer ≤ 1e-2.
(Expert stacks fold scale2 into their bf16 decode, one rounding per weight: the synthetic
checkpoints' expert scale2 are powers of two, so that rounding is exercised on the GPU tests'
perturbed weights only.)
"""

import pytest
import torch

from flint_graph.capture.kv_cache import KVCache, SlotKV
from flint_graph.capture import prefill as prefill_mod
from flint_graph.capture.prefill import (GRAPH_BUCKETS, NVFP4Decoder, Prefill, gemm_row_windows,
                                       linear_rows, moe_grouped)
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ContextLengthError, InvalidRequestError
from flint_graph.kernels.toolchain.spec import KV_PAGE
from flint_graph.checkpoints.make_checkpoint import quantize_weights
from flint_graph.reference import ReferenceModel, moe, rms_norm
from flint_graph.checkpoints.synthetic import make_weights

CFG = FlintConfig.preset("tiny")
PROMPT = 150  # > two KV pages and many tiny windows (17)
TOL = 1e-2
KV_TOL = 1e-2


@pytest.fixture(scope="module", params=["bf16", "nvfp4"])
def model(request):
    w = make_weights(CFG, 4, "cpu")
    if request.param == "nvfp4":
        quantize_weights(w, quantize_embeddings=True, progress=False)
        for lw in w.layers:  # scale2 not a power of two: its bf16 folding is exercised
            lw.q_proj.scale2 = lw.q_proj.scale2 * 1.37
    return ReferenceModel(CFG, w, "cpu")


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, CFG.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(2))


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("chunk", [1, 16, 17, 18, 64, PROMPT])
def test_prefill_matches_the_reference_model(model, prompt, chunk):
    want = model.prefill(model.new_sequence(), prompt, chunk_tokens=64)
    cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT + 10, device="cpu")
    got = Prefill(CFG, model.weights, cache, attention="reference").prefill(1, prompt, chunk)
    assert _rel(got, want) <= TOL
    assert int(got.argmax()) == int(want.argmax())
    assert cache.layers[0].k[0].isnan().all(), "another slot's ring was written"


@pytest.mark.parametrize("t", [1, 15, 4095, 4096, 4097, 4111, 4112, 8191, 8192, 8570, 12288,
                               12289, 16384, 32768, 100_000])
def test_gemm_row_windows_cover_the_rows_at_seen_sizes(t):
    """Every row in some window, windows in order, and above EAGER_GEMM_ROWS each window of a
    GEMM_WINDOWS size (largest first, back to back from row 0) but the last, which is a graph
    bucket's size ending at row t: the M values cuBLAS saw at start-up."""
    wins = gemm_row_windows(t)
    covered = torch.zeros(t, dtype=torch.bool)
    for r0, r1 in wins:
        assert 0 <= r0 < r1 <= t
        covered[r0:r1] = True
    assert covered.all() and wins[-1][1] == t
    if t <= prefill_mod.EAGER_GEMM_ROWS:
        assert wins == [(0, t)]
        return
    sizes = [r1 - r0 for r0, r1 in wins]
    whole, end = [], 0  # the back-to-back windows from row 0
    for r0, r1 in wins:
        if r0 != end or r1 - r0 not in prefill_mod.GEMM_WINDOWS:
            break
        whole.append(r1 - r0)
        end = r1
    assert whole == sorted(whole, reverse=True)
    rest = t - sum(whole)
    assert rest < min(prefill_mod.GEMM_WINDOWS)
    if rest:  # the last window is the smallest bucket that holds what is left
        assert len(sizes) == len(whole) + 1
        assert sizes[-1] == min(b for b in GRAPH_BUCKETS if b >= rest)
    else:
        assert len(sizes) == len(whole)


def test_gemm_row_windows_refuse_no_rows():
    with pytest.raises(ValueError, match="t = 0"):
        gemm_row_windows(0)


def test_linear_rows_equals_one_gemm(monkeypatch):
    monkeypatch.setattr(prefill_mod, "EAGER_GEMM_ROWS", 64)
    monkeypatch.setattr(prefill_mod, "GEMM_WINDOWS", (64,))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(150, 96, generator=g).to(torch.bfloat16)
    w = torch.randn(40, 96, generator=g).to(torch.bfloat16)
    assert len(gemm_row_windows(150)) == 3
    assert _rel(linear_rows(x, w), torch.nn.functional.linear(x, w)) <= 1e-2


def test_a_chunk_in_gemm_row_windows_matches_the_reference_model(model, prompt, monkeypatch):
    """The whole prompt as one chunk whose GEMMs run in windows (EAGER_GEMM_ROWS lowered so
    that the tiny model's 150 rows take three: 64, 64 and a 32-row bucket ending at row 150)."""
    monkeypatch.setattr(prefill_mod, "EAGER_GEMM_ROWS", 64)
    monkeypatch.setattr(prefill_mod, "GEMM_WINDOWS", (64,))
    want = model.prefill(model.new_sequence(), prompt, chunk_tokens=64)
    cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT + 10, device="cpu")
    got = Prefill(CFG, model.weights, cache, attention="reference").prefill(1, prompt, PROMPT)
    assert _rel(got, want) <= TOL
    assert int(got.argmax()) == int(want.argmax())


def test_kv_entries_match_the_reference_layout(model, prompt):
    ref_cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
    model.prefill(SlotKV(ref_cache, 0), prompt, chunk_tokens=40)
    cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
    Prefill(CFG, model.weights, cache, attention="reference").prefill(0, prompt, 40)
    w = CFG.sliding_window
    for i, (kv, ref) in enumerate(zip(cache.layers, ref_cache.layers)):
        if kv.ring:
            pos = torch.arange(PROMPT - w, PROMPT) % w
            got, want = kv.k[0][:, pos], ref.k[0][:, pos]
        else:
            pages = cache.page_table(0).long()
            pos = torch.arange(PROMPT)
            got = kv.v[pages[pos // KV_PAGE], :, pos % KV_PAGE]
            want = ref.v[pages[pos // KV_PAGE], :, pos % KV_PAGE]
        assert not got.isnan().any(), f"layer {i}: entries left unwritten"
        assert _rel(got, want) <= KV_TOL, f"layer {i}"


def test_a_prompt_in_two_calls_equals_one(model, prompt):
    cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    whole = pre.prefill(0, prompt, 64)
    cache2 = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
    pre2 = Prefill(CFG, model.weights, cache2, attention="reference")
    pre2.prefill(0, prompt[:53], 64)
    parts = pre2.prefill(0, prompt[53:], 64, start=53)
    assert _rel(parts, whole) <= TOL and int(parts.argmax()) == int(whole.argmax())


@pytest.mark.parametrize("real,pad", [(1, 16), (5, 16), (17, 64), (40, 64), (30, 30)])
def test_a_padded_chunk_equals_the_unpadded_one(model, prompt, real, pad):
    """What a bucket's graph replay does, eagerly on the CPU: the chunk padded with id 0 up to
    `pad` rows gives the same logits and writes the same KV into its slot (tiny's window is
    17, so pads of 64 overrun the ring: the last W real tokens must win); the padding rows'
    keys go to the scratch slot only. A prefix of 23 tokens is cached first."""
    head, chunk = prompt[:23], prompt[23:23 + real]
    caches, logits = [], []
    for pad_to in (None, pad):
        cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT, device="cpu")
        pre = Prefill(CFG, model.weights, cache, attention="reference")
        pre.prefill(1, head, 64)
        pre.run_chunk(chunk, start=23, pad_to=pad_to)
        with torch.inference_mode():
            logits.append(pre._head()[0])
        caches.append(cache)
    assert torch.equal(logits[0], logits[1])
    for i, (a, b) in enumerate(zip(*(c.layers for c in caches))):
        if a.ring:
            got, want = b.k[1], a.k[1]
        else:
            pages = caches[0].page_table(1).long()
            got, want = b.k[pages], a.k[pages]
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), f"layer {i}"
        assert a.k[0].isnan().all() and b.k[0].isnan().all(), f"layer {i}: slot 0 written"


def test_grouped_moe_matches_the_reference_moe(model):
    """Routing, the sort by expert, the device offsets and the per-token combine in ascending
    expert id reproduce `reference.moe` (tokens that no expert shares, experts no token picks)."""
    lw = model.weights.layers[CFG.first_k_dense_replace]
    x = torch.randn(33, CFG.hidden_size, generator=torch.Generator().manual_seed(5)).bfloat16()
    h = rms_norm(x, lw.ffn_norm, CFG.rms_norm_eps)
    want = moe(h, lw.ffn, CFG.num_experts_per_tok, CFG.routed_scaling_factor,
               CFG.norm_topk_prob)
    pre = Prefill(CFG, model.weights, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    got = moe_grouped(h, lw.ffn, CFG, lambda c: pre._experts(lw.ffn, c), pre._shared(lw.ffn))
    assert _rel(got, want) <= TOL


def test_nvfp4_decode_is_exact_without_scale2():
    """The two-table decode gives the format's exact values (scale2 = 1: no rounding at all)."""
    from flint_graph.checkpoints import nvfp4

    w = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1))
    codes, scales = nvfp4.quantize(w, torch.tensor(1.0))
    out = torch.empty(2, 32, 64, dtype=torch.bfloat16)
    NVFP4Decoder(torch.device("cpu")).into(out, codes, scales, torch.tensor(1.0))
    assert torch.equal(out.float(), nvfp4.dequantize(codes, scales, torch.tensor(1.0),
                                                     torch.float32))


def test_scale2_alphas_are_runs_of_equal_row_scales_read_once():
    """NVFP4Decoder.prime: the stacked q/k/v rows' scale2 as one GEMM alpha per run of equal
    values (a per-tensor scale2 is one run), cached by the tensors' addresses, which it keeps
    alive so they cannot be reused."""
    from flint_graph.checkpoints.weights import NVFP4Weight

    dec = NVFP4Decoder(torch.device("cpu"))
    codes, scales = torch.zeros(6, 8, dtype=torch.uint8), torch.zeros(6, 1, dtype=torch.uint8)
    rows = torch.tensor([0.5, 0.5, 0.5, 0.25, 2.0, 2.0])
    w = NVFP4Weight(codes, scales, rows[:1])
    assert dec.prime(w, rows) == [(0, 3, 0.5), (3, 4, 0.25), (4, 6, 2.0)]
    one = NVFP4Weight(codes, scales, torch.tensor(0.125))
    assert dec.prime(one) == [(0, 6, 0.125)]
    rows[0] = 9.0  # cached: not read again
    assert dec.prime(w, rows)[0] == (0, 3, 0.5)


def test_bad_prompts_are_refused_before_any_work(model):
    cache = KVCache(CFG, num_slots=1, max_tokens=KV_PAGE, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    with pytest.raises(ContextLengthError, match="60 cached \\+ 5 new tokens exceed the KV "
                                                 "cache's 64"):
        pre.prefill(0, torch.zeros(5, dtype=torch.long), 8, start=60)
    with pytest.raises(InvalidRequestError, match="non-empty 1-D integer"):
        pre.prefill(0, torch.zeros(0, dtype=torch.long), 8)
    with pytest.raises(InvalidRequestError, match="ids span"):
        pre.prefill(0, torch.tensor([CFG.vocab_size]), 8)
    with pytest.raises(InvalidRequestError, match="chunk_tokens = 0"):
        pre.prefill(0, torch.zeros(3, dtype=torch.long), 0)
    assert cache.layers[0].k.isnan().all(), "a refused prompt wrote the cache"
    with pytest.raises(ValueError, match="attention 'flash'"):
        Prefill(CFG, model.weights, cache, attention="flash")
    with pytest.raises(ValueError, match="runs on CUDA only"):
        Prefill(CFG, model.weights, cache, attention="sdpa")


@pytest.mark.parametrize("call, match", [
    (dict(slot=-1), "slot -1: expected an int in 0 … 1"),
    (dict(slot=2), "slot 2"),  # the scratch slot: padding rows only
    (dict(slot=0.5), "slot 0.5"),
    (dict(tokens=torch.tensor([True, False])), "integer tensor, found torch.bool"),
    (dict(tokens=torch.tensor([1 + 0j])), "integer tensor, found torch.complex64"),
    (dict(tokens=[1, 2]), "integer tensor, found list"),
    (dict(start=-3), "start = -3"),
    (dict(start=2.5), "start = 2.5"),
    (dict(chunk=2.5), "chunk_tokens = 2.5"),
    (dict(chunk=True), "chunk_tokens = True"),
    (dict(chunk=None), "chunk_tokens = None"),
])
def test_bad_arguments_name_themselves_and_write_nothing(model, call, match):
    """The tester's cases: each refused up front; a negative slot used to write another slot."""
    cache = KVCache(CFG, num_slots=2, max_tokens=KV_PAGE, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    args = dict(slot=0, tokens=torch.tensor([1, 2, 3]), chunk=8, start=0) | call
    with pytest.raises(InvalidRequestError, match=match):
        pre.prefill(args["slot"], args["tokens"], args["chunk"], start=args["start"])
    assert all(kv.k.isnan().all() for kv in cache.layers), "a refused call wrote the cache"


def test_a_failing_prefill_ends_only_its_request(tiny_llm, monkeypatch):
    """A prefill that raises (any exception, not only FlintError) ends that request with finish
    reason "error"; the other request of the batch runs."""
    from flint_graph.runtime.sampling import SamplingParams

    engine = tiny_llm.engine
    real = engine.model.prefill
    calls = []

    def flaky(seq, tokens, chunk):
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("an unexpected failure inside the prefill (simulated)")
        return real(seq, tokens, chunk)

    monkeypatch.setattr(engine.model, "prefill", flaky)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    first, second = tiny_llm.generate(["hello", "hello"], params)
    assert first.finish_reason == "error" and "prefill failed" in first.errors[0]
    assert second.finish_reason in ("length", "stop") and second.token_ids


@pytest.mark.parametrize("pairs", [1, 7, 150, 4096, 4097, 9000])
def test_group_pairs_is_a_stable_argsort_with_counts(pairs, monkeypatch):
    from flint_graph.capture.prefill import group_pairs

    flat = torch.randint(0, 9, (pairs,), generator=torch.Generator().manual_seed(pairs))
    flat[0] = 8  # the padding id (the last bin) included
    perm, counts = group_pairs(flat, 9)
    assert torch.equal(perm, torch.argsort(flat, stable=True))
    assert torch.equal(counts, torch.bincount(flat, minlength=9).int())


def test_side_stream_off_runs_in_place():
    """Off the CUDA kernel path the side stream is off: a fork runs its block in place on the
    current stream, and marks, waits and joins do nothing (capture/side_stream.py)."""
    from flint_graph.capture.side_stream import SideStream

    side = SideStream(None)
    assert not side.on
    ran = []
    with side.fork():
        ran.append(1)
        side.mark("x")
    side.wait("x")
    side.join()
    assert ran == [1]


def test_side_stream_needs_the_cuda_kernel_path(model):
    pre = Prefill(CFG, model.weights, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    assert not pre.side.on
    pre.set_overlap(False)
    with pytest.raises(ValueError, match="side stream"):
        pre.set_overlap(True)


# -- a KV-reuse snapshot inside a chunk (Prefill.prefill(snapshot_at=), issue 22) ---------------

# (chunk, snapshot position) on tiny's window of 17 and PROMPT tokens: rows that only the
# snapshot keeps (64, 30), rows the slot's ring keeps too (64, 60; 150, 140), a position at a
# chunk's start (64, 64) and past it with entries from the ring before the chunk (64, 70), one
# token a chunk (1, 5), fewer tokens before it than the window (150, 3)
SNAPSHOT_CASES = [(64, 30), (64, 60), (64, 64), (64, 70), (150, 140), (1, 5), (150, 3)]


def _ring_rows(ring: torch.Tensor, at: int, dim: int) -> torch.Tensor:
    """A ring's entries for positions max(0, at − W) … at − 1 (ring entry p % W along dim)."""
    w = CFG.sliding_window
    return ring.index_select(dim, torch.arange(max(0, at - w), at) % w)


@pytest.mark.parametrize("chunk,at", SNAPSHOT_CASES)
def test_a_snapshot_inside_a_chunk_is_the_ring_of_a_prefill_stopped_there(model, prompt, chunk,
                                                                          at):
    """The snapshot slot holds, bit for bit, the rings a prefill of the first `at` tokens
    leaves, and the prefill that took it writes the same logits and KV into its own slot as one
    that did not (on the CPU the prefill is the reference's arithmetic, so chunk boundaries
    change nothing: exact equality, no tolerance)."""
    cache = KVCache(CFG, num_slots=3, max_tokens=PROMPT + 10, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    with_snapshot = pre.prefill(0, prompt, chunk, snapshot_at=at)
    plain = pre.prefill(1, prompt, chunk)
    pre.prefill(2, prompt[:at], chunk)
    assert torch.equal(with_snapshot, plain)
    mine, other = (cache.page_table(s).long() for s in (0, 1))
    for i, kv in enumerate(cache.layers):
        for x in (kv.k, kv.v):
            a, b = (x[0], x[1]) if kv.ring else (x[mine], x[other])
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"layer {i}"
            if kv.ring:
                got = _ring_rows(x[cache.snapshot_slot], at, 1)
                assert not got.isnan().any(), f"layer {i}: snapshot entries left unwritten"
                assert torch.equal(got, _ring_rows(x[2], at, 1)), f"layer {i}"


def test_a_snapshot_in_a_padded_chunk_ignores_the_padding(model, prompt):
    """What a bucket's graph replay does (the chunk padded to 64 rows, the padding rows' keys
    sent to the scratch slot): the snapshot equals the unpadded chunk's."""
    rings = []
    for pad_to in (None, 64):
        cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT, device="cpu")
        pre = Prefill(CFG, model.weights, cache, attention="reference")
        pre.prefill(1, prompt[:23], 64)
        with torch.inference_mode():
            pre._chunk_with_snapshot(1, prompt[23:63], 23, 50, pad_to=pad_to)
        rings.append([_ring_rows(kv.k[cache.snapshot_slot], 50, 1)
                      for kv in cache.layers if kv.ring])
    for a, b in zip(*rings):
        assert not a.isnan().any() and torch.equal(a, b)


@pytest.mark.parametrize("chunk,at", SNAPSHOT_CASES[:4])
def test_the_reference_caches_take_the_same_snapshot(model, prompt, chunk, at):
    """`reference.SequenceKV.snapshot_at` (the reference engine) and `SlotKV.snapshot_at` (the
    graph engine's reference prefill) save the rings of a prefill stopped at `at`, exactly."""
    stopped = model.new_sequence()
    model.prefill(stopped, prompt[:at], chunk)
    seq = model.new_sequence()
    seq.snapshot_at = at
    model.prefill(seq, prompt, chunk)
    slot = SlotKV(KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu"), 0)
    slot.snapshot_at = at
    model.prefill(slot, prompt, chunk)
    for i, kv in enumerate(slot.cache.layers):
        if not kv.ring:
            assert seq.snapshot[i] is None
            continue
        for j, (ref_ring, x) in enumerate(((stopped.k[i], kv.k), (stopped.v[i], kv.v))):
            want = _ring_rows(ref_ring, at, 0)
            assert torch.equal(_ring_rows(seq.snapshot[i][j], at, 0), want), f"layer {i}"
            assert torch.equal(_ring_rows(x[slot.cache.snapshot_slot], at, 1),
                               want.transpose(0, 1)), f"layer {i}"


@pytest.mark.parametrize("at", [-1, 9, 20, 1.5, "3"])
def test_a_snapshot_outside_the_prompt_is_refused(model, prompt, at):
    cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    pre.prefill(0, prompt[:10], 64)
    with pytest.raises(InvalidRequestError, match="snapshot_at"):
        pre.prefill(0, prompt[10:20], 64, start=10, snapshot_at=at)


class _CountingSide:
    """A stand-in side stream that counts forks (the CPU has no second stream)."""

    on = True

    def __init__(self):
        self.forks = 0

    def fork(self):
        import contextlib

        self.forks += 1
        return contextlib.nullcontext()

    def mark(self, name):
        pass

    def wait(self, name):
        pass

    def join(self):
        pass


def test_side_max_rows_keeps_large_chunks_off_the_side_stream(model, prompt):
    """set_side_max_rows(N): a chunk of more than N rows runs its side work in place, a chunk of
    at most N forks as before, the configured side stream is back after either (and after a
    failing chunk), and the logits do not change."""
    cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT + 10, device="cpu")
    pre = Prefill(CFG, model.weights, cache, attention="reference")
    want = pre.prefill(0, prompt[:40], 40)
    side = pre.side = _CountingSide()
    pre.set_side_max_rows(16)
    got = pre.prefill(0, prompt[:40], 40)  # one chunk of 40 rows: in place
    assert side.forks == 0 and pre.side is side
    assert torch.equal(got, want)
    pre.prefill(0, prompt[:40], 16)  # chunks of 16, 16 and 8 rows: on the side stream
    assert side.forks > 0 and pre.side is side
    pre.set_side_max_rows(None)
    side.forks = 0
    pre.prefill(0, prompt[:40], 40)
    assert side.forks > 0
    pre.set_side_max_rows(16)
    real = pre._layer
    pre._layer = lambda *a: (_ for _ in ()).throw(RuntimeError("simulated"))
    with pytest.raises(RuntimeError, match="simulated"):
        pre.prefill(0, prompt[:40], 40)
    assert pre.side is side
    pre._layer = real


@pytest.mark.parametrize("rows", [0, -1, 1.5, True, "8"])
def test_side_max_rows_refuses_what_is_not_a_row_count(model, rows):
    pre = Prefill(CFG, model.weights, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    with pytest.raises(ValueError, match="side_max_rows"):
        pre.set_side_max_rows(rows)


def test_kept_bf16_dense_weights_change_no_bit(model, prompt):
    """Prefill.set_dense_bf16: the NVFP4 dense projections decoded once and kept give the
    per-chunk decode's logits and KV bit for bit (the decode is exact; scale2 stays apart),
    and nothing is kept for BF16 weights."""
    from flint_graph.capture.prefill import dense_bf16_bytes
    from flint_graph.checkpoints.weights import NVFP4Weight

    def bits(t):  # NaN-safe (unwritten KV entries are NaN)
        return t.view(torch.int16 if t.element_size() == 2 else torch.int32)

    nvfp4 = isinstance(model.weights.layers[0].o_proj, NVFP4Weight)
    outs = []
    for on in (False, True):
        cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
        pre = Prefill(CFG, model.weights, cache, attention="reference")
        kept = pre.set_dense_bf16(on)
        assert (kept > 0) == (on and nvfp4) and bool(pre.dec.kept) == (kept > 0)
        # what the graph engine sets aside for them before it sizes the KV cache
        assert kept == (dense_bf16_bytes(model.weights) if on else 0)
        logits = pre.prefill(0, prompt, 64)
        # slot 0's entries only: the scratch slot takes the rows a chunk does not keep,
        # several to one entry, in no fixed order
        pages = cache.page_table(0).long()
        outs.append([logits] + [t.clone() for lc in cache.layers
                                for t in ((lc.k[0], lc.v[0]) if lc.ring else
                                          (lc.k[pages], lc.v[pages]))])
        if on and nvfp4:  # the kept copy is what a fresh decode gives
            w = model.weights.layers[0].o_proj
            assert torch.equal(pre.dec.unscaled(w), NVFP4Decoder("cpu").unscaled(w))
    for a, b in zip(*outs):
        assert torch.equal(bits(a), bits(b))
    if nvfp4:  # and the chunks read the kept copies: spoiling one changes the logits
        for _, copy in pre.dec.kept.values():
            copy.zero_()
        cache = KVCache(CFG, num_slots=1, max_tokens=PROMPT, device="cpu")
        spoiled = Prefill(CFG, model.weights, cache, attention="reference")
        spoiled.dec = pre.dec
        assert not torch.equal(spoiled.prefill(0, prompt, 64), outs[0][0])


class _FakePrefill:
    """A Prefill stand-in for capture_prefill_graphs: capturing past `fits` tokens runs out of
    GPU memory after the largest bucket's graph was made."""

    def __init__(self, fits: int):
        self.fits, self.calls, self.graphs = fits, [], {}

    def capture(self, max_tokens: int) -> list[int]:
        self.calls.append(max_tokens)
        top = min(max_tokens, max(GRAPH_BUCKETS))
        self.graphs[top] = "graph"  # the largest first, as Prefill.capture
        if top > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return [b for b in GRAPH_BUCKETS if b <= top]

    def drop_graphs(self) -> None:
        self.graphs.clear()


def test_prefill_graphs_fall_back_to_4096_when_the_larger_buckets_do_not_fit():
    """capture/runner.py capture_prefill_graphs: the buckets above 4,096 rows (new in the
    twenty-ninth session) must not make a start-up that fitted before fail: their pool running
    out of memory beside the KV cache drops the half-made graphs and captures up to 4,096
    (larger chunks run eagerly); when even those do not fit, a ConfigError names the flags."""
    from flint_graph.capture.runner import FALLBACK_GRAPH_MAX, capture_prefill_graphs
    from flint_graph.errors import ConfigError

    assert max(GRAPH_BUCKETS) > FALLBACK_GRAPH_MAX == 4096
    pre = _FakePrefill(fits=8192)
    assert capture_prefill_graphs(pre, 32768) == (list(GRAPH_BUCKETS), False)
    pre = _FakePrefill(fits=4096)
    buckets, fell_back = capture_prefill_graphs(pre, 32768)
    assert fell_back and max(buckets) == 4096 and pre.calls == [32768, 4096]
    assert list(pre.graphs) == [4096]  # the 8,192 graph made before the failure was dropped
    for chunk in (32768, 2048):
        pre = _FakePrefill(fits=1024)
        with pytest.raises(ConfigError, match=rf"prefill graphs \(chunks up to {chunk} tokens\)"
                                              r"; lower --prefill-chunk, --max-context or pass "
                                              "--no-prefill-graphs"):
            capture_prefill_graphs(pre, chunk)
        assert pre.calls == ([32768, 4096] if chunk > 4096 else [chunk])


def test_drop_graphs_forgets_every_captured_graph(model):
    pre = Prefill(CFG, model.weights, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    pre.graphs[16], pre.split_graphs[16], pre.head_graph = "g", "s", ("h", None)
    pre.drop_graphs()
    assert not pre.graphs and not pre.split_graphs and pre.head_graph is None
    assert pre._bucket(8) is None
