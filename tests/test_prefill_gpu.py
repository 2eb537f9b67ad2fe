"""GPU tests of the prefill (capture/prefill.py) against the reference model: the last prompt
token's logits and every KV entry written (rings and pages), then greedy decode continuing from
the new prefill on the captured decode graph.

Models: the tiny config (all 6 layers) and the full config's shapes cut to its first 4 layers
(3 sliding + 1 full, 2 dense + 2 MoE with 256 experts), BF16 and NVFP4 weights (scale2 not a
power of two, so its folding into the bf16 decode is exercised). Prompts shorter than, equal to
and many times the window, chunk sizes 1 … 8192, lengths that are no multiple of any tile, and
a prompt prefilled in two calls (a prefix already in the cache).

Tolerances. The reference dequantises NVFP4 in fp32 and runs every matmul in fp32; the prefill
runs bf16 GEMMs (fp32 accumulation, one rounding, as the reference), bf16 P in attention and
folds scale2 into bf16 weights (≤ 2^-9 relative per weight).
  * Layer by layer, teacher-forced (each layer gets the reference's input to it):
    ‖out − ref‖/‖ref‖ ≤ 1e-2 for the layer output and the KV it writes (expected ~3e-3, the
    decode layer test's bound; a router near-tie moves a token or two, not the norm).
  * End to end, where rounding differences compound through the layers and the router's
    near-ties (random weights route many tokens near a tie; one flipped expert moves that
    token's later layers by ~10%, as tests/test_decode_step_gpu.py found for decode), the
    decode step test's statistical rule, with bounds from the H200 measurements (tiny model,
    the chaotic one: medians 1.2e-2 BF16 and 1.5e-2 NVFP4 for the logits, one case at 9.7e-2;
    the full shapes lower) with some margin: over every case, the median of the logits' and KV's
    relative errors ≤ 2.5e-2, none above 0.15, and the greedy pick equal unless the
    reference's logits of the two picks lie within 2% of the logits' RMS or within 4× this
    case's RMS logit error (each logit carries about that error, so their difference about
    1.4× it: 4× is ~3σ; a rule tighter than the error the test accepts flips with the seed: the
    attention kernel's 32-key tiles, 2026-12-02, moved 3 of the picks). Decode continuing from the prefill:
    median ≤ 2e-2 per step (measured 1.2e-2), at most 1 in 20 steps above 5e-2, none above 0.3.
"""

import dataclasses

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.make_checkpoint import quantize_weights
from flint_graph.reference import ReferenceModel
from flint_graph.checkpoints.synthetic import make_weights

pytestmark = pytest.mark.gpu
LAYER_TOL = 1e-2
MEDIAN_TOL = 2.5e-2
MAX_TOL = 0.15
TIE = 2e-2
TIE_ERR = 4.0


def _cfg(preset: str) -> FlintConfig:
    cfg = FlintConfig.preset(preset)
    if preset == "full":  # full-size shapes, first 4 layers (s, s, s, f; dense, dense, MoE, MoE)
        cfg = dataclasses.replace(cfg, num_hidden_layers=4, layer_types=tuple(cfg.layer_types[:4]))
    return cfg


_MODELS: dict = {}


def _model(preset: str, fmt: str):
    key = (preset, fmt)
    if key not in _MODELS:
        _MODELS.clear()
        cfg = _cfg(preset)
        w = make_weights(cfg, 11, "cuda")
        if fmt == "nvfp4":
            quantize_weights(w, progress=False)
            gen = torch.Generator(device="cuda").manual_seed(3)
            for lw in w.layers:
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    m = getattr(lw, name)
                    m.scale2 = m.scale2 * (1 + torch.rand(m.scale2.shape, generator=gen,
                                                          device="cuda"))
        _MODELS[key] = (cfg, w, ReferenceModel(cfg, w, "cuda"))
    return _MODELS[key]


def _cases(preset: str) -> list[tuple[int, int]]:
    """(prompt tokens, chunk tokens)."""
    w = _cfg(preset).sliding_window
    if preset == "tiny":
        return [(5, 1), (w, 64), (150, 1), (150, 17), (150, 18), (1000, 512), (1000, 513),
                (1000, 514), (2100, 2048)]
    # 25: padded to the 32-row graph; (1100, 64): short chunks after 1,024 cached tokens,
    # which split the full layers' keys (attn_prefill_wg SPLITS, the split bucket graphs)
    return [(100, 64), (w, 512), (1500, 513), (1500, 514), (3000, 2048), (9000, 8192),
            (700, 1), (150, 25), (1100, 64)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _check_logits(got: torch.Tensor, want: torch.Tensor, what: str, rels: list) -> None:
    rel = _rel(got, want)
    rels.append(rel)
    assert rel <= MAX_TOL, f"{what}: logits rel err {rel:.2e} > {MAX_TOL}"
    pick, ref_pick = int(got.argmax()), int(want.argmax())
    if pick != ref_pick:
        gap = (want[ref_pick] - want[pick]).item()
        rms = want.float().pow(2).mean().sqrt().item()
        err = (got.float() - want.float()).pow(2).mean().sqrt().item()
        assert gap <= max(TIE * rms, TIE_ERR * err), \
            f"{what}: picked {pick}, reference {ref_pick}: gap {gap:.3g} > {TIE} x rms " \
            f"{rms:.3g} and > {TIE_ERR} x this case's rms logit error {err:.3g}"


def _median_ok(rels: list, what: str) -> None:
    med = sorted(rels)[len(rels) // 2]
    assert med <= MEDIAN_TOL, f"{what}: median rel err {med:.2e} > {MEDIAN_TOL} over {rels}"


def _check_kv(cache, ref_seq, slot: int, tokens: int, what: str, rels: list,
              tol: float = MAX_TOL) -> None:
    """Every entry the prefill wrote equals the reference's SequenceKV within `tol`."""
    from flint_graph.kernels.toolchain.spec import KV_PAGE

    w = cache.cfg.sliding_window
    for i, kv in enumerate(cache.layers):
        if kv.ring:
            pos = torch.arange(max(0, tokens - w), tokens, device="cuda")
            got_k = kv.k[slot][:, pos % w].transpose(0, 1)
            got_v = kv.v[slot][:, pos % w].transpose(0, 1)
            want_k, want_v = ref_seq.k[i][pos % w], ref_seq.v[i][pos % w]
        else:
            pos = torch.arange(tokens, device="cuda")
            pages = cache.page_table(slot).to("cuda").long()
            got_k = kv.k[pages[pos // KV_PAGE], :, pos % KV_PAGE]
            got_v = kv.v[pages[pos // KV_PAGE], :, pos % KV_PAGE]
            want_k, want_v = ref_seq.k[i][:tokens], ref_seq.v[i][:tokens]
        for name, g, r in (("k", got_k, want_k), ("v", got_v, want_v)):
            assert not g.isnan().any(), f"{what}: layer {i} {name}: entries left unwritten"
            rel = _rel(g, r)
            rels.append(rel)
            assert rel <= tol, f"{what}: layer {i} {name} rel err {rel:.2e} > {tol}"


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.kernels import registry

    torch.backends.cuda.matmul.allow_tf32 = False
    return KernelSet(kernels=registry())


def _every_case(kset, preset: str, fmt: str, seed: int, label: str, setup=None,
                graphs: bool = False) -> None:
    """Prefill each of `_cases(preset)` into slot 1 of a fresh cache with a fresh Prefill
    (`setup(pre)` picks its kernels; `graphs` captures the buckets up to 2048 first) and check
    the logits, every KV entry and the other slot's untouched ring, then the medians."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model(preset, fmt)
    gen = torch.Generator().manual_seed(seed)
    logit_rels, kv_rels = [], []
    for tokens, chunk in _cases(preset):
        prompt = torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)
        seq = ref.new_sequence()
        want = ref.prefill(seq, prompt, chunk_tokens=2048)
        cache = KVCache(cfg, num_slots=2, max_tokens=tokens + 1)
        pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
        if setup is not None:
            setup(pre)
        if graphs:
            pre.capture(2048)
        what = f"{label} prompt {tokens} chunk {chunk}" + (" graphs" if graphs else "")
        got = pre.prefill(1, prompt, chunk)
        _check_logits(got, want, what, logit_rels)
        _check_kv(cache, seq, 1, tokens, what, kv_rels)
        assert cache.layers[0].k[0].isnan().all(), f"{what}: another slot's ring was written"
    _median_ok(logit_rels, f"{label} logits")
    _median_ok(kv_rels, f"{label} KV")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("preset", ["tiny", "full"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_prefill_matches_reference(kset, preset, fmt, graphs):
    """Eager, and replaying the per-bucket CUDA graphs (chunks padded to 16, 64, 256, ...
    2048 rows; chunks above 2048 eager): same tolerances."""
    _every_case(kset, preset, fmt, 4, f"{preset} {fmt}", graphs=graphs)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_a_bucket_above_4096_replays_within_the_tolerances(kset, fmt):
    """The buckets above 4,096 rows (5,120 … 8,192 since the twenty-ninth session; those
    chunks ran eagerly before): a 4,700-token chunk replays the 5,120-row graph, padded by 420
    rows, its cuBLAS GEMMs in row windows, and its logits and every KV entry meet the reference
    tolerances (full config)."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model("full", fmt)
    tokens = 4700
    prompt = torch.randint(0, cfg.vocab_size, (tokens,),
                           generator=torch.Generator().manual_seed(21))
    seq = ref.new_sequence()
    want = ref.prefill(seq, prompt, chunk_tokens=2048)
    cache = KVCache(cfg, num_slots=2, max_tokens=5120)
    pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
    assert pre.capture(8192)[-1] == 5120 and pre._bucket(tokens) == 5120
    logit_rels, kv_rels = [], []
    got = pre.prefill(1, prompt, tokens)
    what = f"full {fmt} prompt {tokens} on the 5,120-row graph"
    _check_logits(got, want, what, logit_rels)
    _check_kv(cache, seq, 1, tokens, what, kv_rels)
    _median_ok(kv_rels, f"{what} KV")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_prefill_on_the_wgmma_attention_kernel_matches_reference(kset, fmt):
    """The prefill with attn_prefill_wg (kernels/prefill/attn_prefill_wg.py) for attention, full
    config shapes, every chunk case of the file, eager: the same tolerances."""
    def setup(pre):
        pre.set_attn_kernel("attn_prefill_wg")
        assert pre.attn_kernel == "attn_prefill_wg"

    _every_case(kset, "full", fmt, 6, f"full {fmt} wgmma attention", setup)


@pytest.mark.parametrize("min_rows,values", [(0, {}), (600, {}), (600, {"RS": 1}),
                                             (600, {"RS": 0})],
                         ids=["always", "by-size", "by-size-RS", "by-size-RS0"])
def test_nvfp4_experts_on_the_wgmma_w4a16_kernels_match_reference(kset, min_rows, values):
    """The routed NVFP4 experts on grouped_w4a16_wg (kernels/prefill/grouped_w4a16_wg.py) for
    chunks above `min_rows` rows (600: the cases' chunks fall on both sides; `values`: a
    benchmark variant's spec values: RS = 1 at every NT, RS = 0 at every NT; the default has
    RS = 1 at NT = 64 only, with x in pair order there), full config shapes, every
    chunk case of the file, eager: the same tolerances."""
    _every_case(kset, "full", "nvfp4", 7, f"full nvfp4 wgmma W4A16 >{min_rows} {values}",
                lambda pre: pre.set_w4a16_wg(min_rows, **values))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("row_moe", [0, 16])
def test_bf16_experts_on_the_grouped_kernels_match_reference(kset, row_moe, graphs):
    """A BF16 checkpoint's experts of chunks up to 512 rows on grouped_w4a16's WB = 16 kernels
    (the shared expert folded in; `Prefill.set_bf16_grouped`), longer chunks on
    torch._grouped_mm, the shortest on the decode kernels up to `row_moe` rows; full config
    shapes, every chunk case of the file: the same tolerances as the default path."""
    def setup(pre):
        pre.set_bf16_grouped(512)
        assert pre.w4a16_fold and not pre.w4a16
        pre.row_moe_max = row_moe

    _every_case(kset, "full", "bf16", 9, f"full bf16 grouped, row groups ≤ {row_moe}", setup,
                graphs=graphs)


@pytest.mark.parametrize("most", [(0, 0), (0, None), (None, 0), (600, 600)],
                         ids=["scratch", "routed-scratch", "shared-scratch", "by-size"])
def test_nvfp4_experts_from_the_bf16_scratch_match_reference(kset, most):
    """The NVFP4 experts of large chunks from the per-layer BF16 scratch (routed: nvfp4_unpack +
    torch._grouped_mm, scale2 folded into the weights; shared: cuBLAS with scale2 as alpha)
    instead of the grouped W4A16 kernels, alone, together and chosen by chunk size (600: the
    cases' chunks fall on both sides): the same tolerances as the W4A16 path. The full
    config's shapes only: the tiny config's experts do not fit the W4A16 kernels, so
    test_prefill_matches_reference already runs it from the scratch."""
    def setup(pre):
        assert pre.w4a16_args, "the grouped W4A16 kernels should serve this config"
        pre.w4a16_routed_max, pre.w4a16_shared_max = most

    _every_case(kset, "full", "nvfp4", 5, f"full nvfp4 scratch {most}", setup)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_chunks_of_the_default_size_match_reference(kset, fmt):
    """The engine's default kernel-prefill chunk (KERNEL_PREFILL_CHUNK, 32,768 tokens since
    2026-12-03) at full-size shapes: one whole chunk and a short one after it, every row count
    the kernels see far above the 8,192 the other cases reach (grouped expert tiles, the
    routing schedule, the ring rows a chunk keeps). Same checks and tolerances as
    `_every_case`."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill
    from flint_graph.runtime.engine_config import KERNEL_PREFILL_CHUNK

    cfg, w, ref = _model("full", fmt)
    chunk = KERNEL_PREFILL_CHUNK
    tokens = chunk + 300
    prompt = torch.randint(0, cfg.vocab_size, (tokens,),
                           generator=torch.Generator().manual_seed(5))
    seq = ref.new_sequence()
    want = ref.prefill(seq, prompt, chunk_tokens=2048)
    cache = KVCache(cfg, num_slots=2, max_tokens=tokens + 1)
    pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
    got = pre.prefill(1, prompt, chunk)
    what, rels = f"{fmt} prompt {tokens} chunk {chunk}", []
    _check_logits(got, want, what, rels)
    _check_kv(cache, seq, 1, tokens, what, rels)
    assert cache.layers[0].k[0].isnan().all(), f"{what}: another slot's ring was written"
    _median_ok(rels, what)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_side_stream_changes_no_bit(kset, fmt, graphs):
    """The side stream (capture/side_stream.py: weight decodes ahead, the shared expert and
    the KV write beside the main stream) only reorders independent kernels, each of which is
    deterministic, so the logits and every KV entry equal the one-stream prefill's bit for bit:
    full config shapes, chunks on the decode-kernel MoE (16 rows), the grouped W4A16 and
    grouped_w4a16_wg kernels, the shared expert on W4A16 and on cuBLAS (600 > 512 rows), a
    cached prefix; eagerly and through the bucket graphs."""
    _toggle_changes_no_bit(kset, fmt, graphs, lambda pre, on: pre.set_overlap(on),
                           ((16, 16), (25, 25), (150, 64), (1300, 600), (2100, 2048)))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_side_max_rows_changes_no_bit(kset, graphs):
    """set_side_max_rows(512): chunks above 512 rows run their side work in place, smaller ones
    on the side stream, within one prefill (a 1,300-token prompt in 600-row chunks ends with a
    100-row one), so the logits and every KV entry equal the side stream's everywhere; NVFP4,
    eagerly and through the bucket graphs (captured with the threshold set)."""
    _toggle_changes_no_bit(kset, "nvfp4", graphs,
                           lambda pre, on: pre.set_side_max_rows(512 if on else None),
                           ((150, 64), (1300, 600), (2100, 2048)))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_shared_fold_changes_no_bit(kset, graphs):
    """The NVFP4 shared expert as one more group of the routed grouped_w4a16 launches (SH = 1)
    runs the same per-row arithmetic on the same tiles as its own launches, so the logits and
    every KV entry are bitwise the unfolded prefill's: chunks of 17 … 512 rows (the fold's
    range), one past it (600 rows: no fold either way), a cached prefix; eagerly and through
    the bucket graphs."""
    _toggle_changes_no_bit(kset, "nvfp4", graphs, lambda pre, on: pre.set_fold_shared(on),
                           ((25, 25), (77, 77), (150, 64), (700, 512), (1300, 600)))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_dense_bf16_changes_no_bit(kset, graphs):
    """set_dense_bf16: the NVFP4 dense projections decoded once (the same nvfp4_unpack kernel,
    exact) and read by every chunk instead of decoded per chunk on the side stream, so the
    logits and every KV entry are the per-chunk decode's: short and long chunks (a prompt in
    several), eagerly and through the bucket graphs (captured after the copies were made)."""
    _toggle_changes_no_bit(kset, "nvfp4", graphs, lambda pre, on: pre.set_dense_bf16(on),
                           ((25, 25), (150, 64), (1300, 600), (2100, 2048)))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_kv_write_kernel_changes_no_bit(kset, fmt, graphs):
    """The kv_write kernel copies each head row bit for bit to where torch's indexed
    assignment put it, so the logits and every KV entry of slot 0 are the assignment's: a
    chunk inside the window, chunks longer than the ring (rows it does not keep go to scratch),
    a cached prefix, and an eager chunk above the graphs (4,700 rows)."""
    _toggle_changes_no_bit(kset, fmt, graphs, lambda pre, on: pre.set_kv_write(on),
                           ((25, 25), (150, 64), (1300, 600), (4700, 4700)))


def _toggle_changes_no_bit(kset, fmt, graphs, toggle, cases):
    """Full-config prefills of (prompt tokens, chunk) `cases` with toggle(pre, on) off and on:
    logits and slot 0's KV entries bitwise equal."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, _ = _model("full", fmt)
    gen = torch.Generator().manual_seed(12)
    for tokens, chunk in cases:
        prompt = torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)
        got = {}
        for on in (False, True):
            cache = KVCache(cfg, num_slots=1, max_tokens=tokens)
            pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
            toggle(pre, on)
            if graphs:
                pre.capture(2048)
            logits = pre.prefill(0, prompt, chunk)
            # slot 0's entries only: the scratch slot takes the rows a chunk does not keep,
            # several to one entry, in no fixed order
            pages = cache.page_table(0).to("cuda").long()
            got[on] = (logits, [(kv.k[0].clone(), kv.v[0].clone()) if kv.ring else
                                (kv.k[pages].clone(), kv.v[pages].clone())
                                for kv in cache.layers])
            del pre, cache
        what = f"{fmt} prompt {tokens} chunk {chunk}" + (" graphs" if graphs else "")
        assert torch.equal(got[True][0], got[False][0]), f"{what}: logits differ"
        for i, (a, b) in enumerate(zip(got[True][1], got[False][1])):
            for name, x, y in (("k", a[0], b[0]), ("v", a[1], b[1])):
                assert torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)), \
                    f"{what}: layer {i} {name} differs"


def _poison_free_memory(byte: int, most: int = 4 << 30) -> None:
    """Fill what the caching allocator hands out next with `byte`: one large block written and
    freed, which later allocations are carved from (0xFF reads as NaN in bf16 and fp32 and as
    -1 in integers). A kernel or op that reads memory before writing it then gives other bits
    with another byte."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    block = torch.full((min(most, free // 4),), byte, dtype=torch.uint8, device="cuda")
    del block


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_a_long_chunk_after_a_preamble_reads_nothing_unwritten(kset, fmt):
    """What the engine runs for a first tool-loop request after start-up (2026-12-05 on the
    H200: the BF16 tool loop's step 0 came back empty and was not retained): the chat preamble
    (330 tokens) through the 512-token bucket graph, then the other 8,240 tokens as one eager
    chunk after that prefix (start 330, the default 32,768-token chunk), and a cold 8,267-token
    chunk (a chat's first turn). Each is run on fresh buffers from memory poisoned with 0xFF
    (NaN, -1) and again with 0x3C (finite): deterministic kernels reading only what they wrote
    give the same bits both times, so any read of memory nothing wrote fails here whatever it
    does to the numbers; then the logits and every KV entry against the reference, with
    `_every_case`'s tolerances."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill
    from flint_graph.runtime.engine_config import KERNEL_PREFILL_CHUNK

    cfg, w, ref = _model("full", fmt)
    chunk, rels = KERNEL_PREFILL_CHUNK, []
    for tokens, cut in ((8570, 330), (8267, 0)):
        prompt = torch.randint(0, cfg.vocab_size, (tokens,),
                               generator=torch.Generator().manual_seed(tokens))
        got = {}
        for byte in (0xFF, 0x3C):
            _poison_free_memory(byte)
            cache = KVCache(cfg, num_slots=2, max_tokens=tokens + 1)
            pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
            pre.capture(chunk)
            if cut:
                pre.prefill(1, prompt[:cut], chunk)
            logits = pre.prefill(1, prompt[cut:], chunk, start=cut)
            got[byte] = (logits, cache)
            del pre
        what = f"{fmt} prompt {tokens} after {cut} cached"
        (a, cache), (b, other) = got[0xFF], got[0x3C]
        assert torch.equal(a, b), f"{what}: logits depend on what memory held before"
        # slot 1's entries only: the scratch slot takes the rows a chunk does not keep,
        # several to one entry, in no fixed order
        pages = cache.page_table(1).to("cuda").long()
        for i, (x, y) in enumerate(zip(cache.layers, other.layers)):
            for name in ("k", "v"):
                xs, ys = getattr(x, name), getattr(y, name)
                xs, ys = (xs[1], ys[1]) if x.ring else (xs[pages], ys[pages])
                assert torch.equal(xs.nan_to_num(7.0), ys.nan_to_num(7.0)), \
                    f"{what}: layer {i} {name} depends on what memory held before"
        seq = ref.new_sequence()
        want = ref.prefill(seq, prompt, chunk_tokens=2048)
        _check_logits(a, want, what, rels)
        _check_kv(cache, seq, 1, tokens, what, rels)
        del got, cache, other
    _median_ok(rels, f"{fmt} long chunk after a preamble")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_prefill_in_two_calls_continues_the_cached_prefix(kset, preset, graphs):
    """A prompt prefilled as a prefix then the rest (start > 0) equals the whole at once."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model(preset, "bf16")
    w_len = cfg.sliding_window
    logit_rels, kv_rels = [], []
    for total, cut in ((3 * w_len + 10, w_len + 3), (2 * w_len, 1), (700, 699)):
        prompt = torch.randint(0, cfg.vocab_size, (total,),
                               generator=torch.Generator().manual_seed(total))
        seq = ref.new_sequence()
        want = ref.prefill(seq, prompt, chunk_tokens=2048)
        cache = KVCache(cfg, num_slots=1, max_tokens=total)
        pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
        if graphs:
            pre.capture(256)
        pre.prefill(0, prompt[:cut], 256)
        got = pre.prefill(0, prompt[cut:], 256, start=cut)
        what = f"{preset} prompt {total} cut at {cut}"
        _check_logits(got, want, what, logit_rels)
        _check_kv(cache, seq, 0, total, what, kv_rels)
    _median_ok(logit_rels + kv_rels, f"{preset} two calls")


@pytest.mark.parametrize("attention", ["sdpa", "reference"])
def test_other_attention_paths_agree(kset, attention):
    """The torch-ops baseline (sdpa) and the reference attention give the same prefill within
    the tolerance (the bench times the baseline: it must compute the same thing)."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model("tiny", "bf16")
    prompt = torch.randint(0, cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(9))
    seq = ref.new_sequence()
    want = ref.prefill(seq, prompt, chunk_tokens=2048)
    cache = KVCache(cfg, num_slots=1, max_tokens=300)
    got = Prefill(cfg, w, cache, attention=attention).prefill(0, prompt, 128)
    rels = []
    _check_logits(got, want, attention, rels)
    _check_kv(cache, seq, 0, 300, attention, rels)
    _median_ok(rels, attention)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_greedy_decode_continues_from_the_prefill(kset, fmt):
    """The graph engine prefilling with the kernels then decoding greedily gives the reference
    engine's tokens (tiny model; near-ties in the logits are allowed to swap)."""
    from flint_graph.capture.runner import GraphRunner

    cfg, w, ref = _model("tiny", fmt)
    runner = GraphRunner(cfg, w, ref, max_slots=2, max_context=400, vocab_limit=cfg.vocab_size,
                         kset=kset)
    from flint_graph.capture.decode_step import Row

    prompt = torch.randint(0, cfg.vocab_size, (120,), generator=torch.Generator().manual_seed(1))
    slot = runner.alloc_slot()
    logits = runner.prefill(slot, prompt.cuda(), 50)
    seq = ref.new_sequence()
    want = ref.prefill(seq, prompt, 2048)
    rels = []
    _check_logits(logits, want, f"{fmt} prefill", rels)
    tok = int(want.argmax())
    for step in range(40):
        ids, lg = runner.decode([Row(slot=slot, token=tok, position=120 + step)])
        ref_logits = ref.forward([seq], [torch.tensor([tok], device="cuda")])[0][-1]
        rel = _rel(lg[0].float(), ref_logits)
        rels.append(rel)
        assert rel <= 0.3, f"{fmt} decode step {step}: logits rel err {rel:.2e}"
        tok = int(ref_logits.argmax())  # both follow the reference's greedy path
    # the decode step test's rule (tests/test_decode_step_gpu.py) with this test's bounds
    assert sorted(rels)[len(rels) // 2] <= 2e-2, rels
    assert sum(r > 5e-2 for r in rels) <= len(rels) // 20 + 1, rels


def _check_rows(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """A short chunk's layer output row by row: each row within LAYER_TOL, except at most one
    in 16 (a router near-tie gives a row another expert, which moves it by ~10%: over 32 rows
    that alone is ~2% of the whole output's norm, the LAYER_TOL rule's own margin), and those
    within MAX_TOL."""
    rels = ((got.float() - want.float()).norm(dim=-1)
            / want.float().norm(dim=-1)).tolist()
    off = [(r, v) for r, v in enumerate(rels) if v > LAYER_TOL]
    assert len(off) <= len(rels) // 16 and all(v <= MAX_TOL for _, v in off), \
        f"{what}: rows above {LAYER_TOL}: {[(r, f'{v:.2e}') for r, v in off]}"


@pytest.mark.parametrize("rows", ["long", 24, 32])
@pytest.mark.parametrize("preset", ["tiny", "full"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_each_layer_matches_the_reference_layer(kset, preset, fmt, rows):
    """Teacher-forced: each layer of the prefill gets the reference's input to that layer (a
    chunk after a cached prefix, so attention reads the ring/pages and the chunk) and must give
    the reference layer's output and K/V within LAYER_TOL. Chunks of window + 40 rows (the
    grouped expert GEMMs) and of 24 and 32 rows (BF16: the MoE on the decode kernels in groups
    of 8 rows, prefill_row_moe.py), the short ones row by row (`_check_rows`)."""
    from flint_graph import reference
    from flint_graph.capture.kv_cache import KVCache, SlotKV
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model(preset, fmt)
    win = cfg.sliding_window
    prefix, tokens = 2 * win + 5, win + 40 if rows == "long" else rows
    prompt = torch.randint(0, cfg.vocab_size, (prefix + tokens,),
                           generator=torch.Generator().manual_seed(8)).cuda()
    seq = ref.new_sequence()
    ref.prefill(seq, prompt[:prefix], 2048)
    cache = KVCache(cfg, num_slots=1, max_tokens=prefix + tokens)
    pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
    ref.prefill(SlotKV(cache, 0), prompt[:prefix], 2048)  # the reference's prefix KV, in place
    pos = torch.arange(prefix, prefix + tokens, device="cuda")
    x = reference.embed(w.embed, prompt[prefix:])
    ref_chunk = ref.new_sequence()  # the reference's own cache for the chunk: copy of `seq`
    ref_chunk.k, ref_chunk.v, ref_chunk.num_tokens = ([t.clone() for t in seq.k],
                                                      [t.clone() for t in seq.v], prefix)
    pre._set_slot(0)
    pre.describe_chunk(prefix, tokens)
    assert torch.equal(pre._prepare(tokens), pos)
    for i, lw in enumerate(w.layers):
        want = reference.decoder_layer(cfg, lw, i, x, [ref_chunk], [tokens])
        with torch.inference_mode():
            got = pre._layer(i, lw, x, pos)
        if rows == "long":
            rel = _rel(got, want)
            assert rel <= LAYER_TOL, f"{preset} {fmt} layer {i}: output rel err {rel:.2e}"
        else:
            _check_rows(got, want, f"{preset} {fmt} layer {i}")
        x = want
    ref_chunk.advance(tokens)
    rels = []
    _check_kv(cache, ref_chunk, 0, prefix + tokens, f"{preset} {fmt} layers", rels, LAYER_TOL)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_a_snapshot_inside_a_chunk_is_the_ring_of_a_prefill_stopped_there(kset, fmt):
    """KV reuse's resume point inside a chunk (`Prefill.prefill(snapshot_at=)`, the end of a
    chat's preamble without a chunk boundary there): the snapshot slot's rings against the
    reference's rings after the first `at` tokens (`_every_case`'s tolerances), and the slot's
    own logits and KV bit for bit those of the same prefill without the snapshot. Cases: the
    first tool-loop request's shape (an 8,570-token eager chunk, at 305), graph buckets whose
    ring keeps rows before `at` (700 tokens at 305; 1,500 at 1,000), and eager 1,024-token
    chunks with `at` in the second (entries from the ring before the chunk)."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill
    from flint_graph.runtime.engine_config import KERNEL_PREFILL_CHUNK

    cfg, w, ref = _model("full", fmt)
    win, rels = cfg.sliding_window, []
    for graphs, cases in ((False, ((8570, 305, KERNEL_PREFILL_CHUNK), (3000, 1200, 1024))),
                          (True, ((700, 305, 2048), (1500, 1000, 2048)))):
        cache = KVCache(cfg, num_slots=2, max_tokens=8571)
        pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
        if graphs:
            pre.capture(2048)
        for tokens, at, chunk in cases:
            what = f"{fmt} prompt {tokens} snapshot at {at} chunk {chunk}"
            prompt = torch.randint(0, cfg.vocab_size, (tokens,),
                                   generator=torch.Generator().manual_seed(tokens))
            for x in (kv for layer in cache.layers for kv in (layer.k, layer.v)):
                x.fill_(float("nan"))
            a = pre.prefill(0, prompt, chunk, snapshot_at=at)
            b = pre.prefill(1, prompt, chunk)
            assert torch.equal(a, b), f"{what}: the snapshot changed the logits"
            pages = [cache.page_table(s).to("cuda").long() for s in (0, 1)]
            for i, kv in enumerate(cache.layers):
                for x in (kv.k, kv.v):
                    p, q = (x[0], x[1]) if kv.ring else (x[pages[0]], x[pages[1]])
                    assert torch.equal(p.nan_to_num(7.0), q.nan_to_num(7.0)), \
                        f"{what}: layer {i}: the snapshot changed the slot's KV"
            seq = ref.new_sequence()
            ref.prefill(seq, prompt[:at], chunk_tokens=2048)
            pos = torch.arange(max(0, at - win), at, device="cuda") % win
            for i, kv in enumerate(cache.layers):
                if not kv.ring:
                    continue
                for name, x, r in (("k", kv.k, seq.k[i]), ("v", kv.v, seq.v[i])):
                    got = x[cache.snapshot_slot][:, pos].transpose(0, 1)
                    assert not got.isnan().any(), f"{what}: layer {i} {name}: left unwritten"
                    rel = _rel(got, r[pos])
                    rels.append(rel)
                    assert rel <= MAX_TOL, f"{what}: layer {i} {name} rel err {rel:.2e}"
        del pre, cache
    _median_ok(rels, f"{fmt} snapshots inside a chunk")
