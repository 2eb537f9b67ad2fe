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
folds scale2 into bf16 weights (≤ 2^-9 relative per weight). Per layer that is the decode
layer test's ~3e-3; through 4–6 layers and the LM head's bf16 logits (2^-9):
  * logits: ‖out − ref‖/‖ref‖ ≤ 3e-2, and the greedy pick equal unless the reference's top two
    lie within 2% of the logits' RMS (the decode step test's rule);
  * KV entries, per layer: ‖k − k_ref‖/‖k_ref‖ ≤ 3e-2 (the first layers ~4e-3; a MoE layer's
    router may pick another expert for a token at a near-tie, which moves that token's later
    layers; the bound allows that for a few tokens of a long prompt).
"""

import dataclasses

import pytest
import torch

from flint_graph.config import FlintConfig
from flint_graph.make_checkpoint import quantize_weights
from flint_graph.reference import ReferenceModel
from flint_graph.synthetic import make_weights

pytestmark = pytest.mark.gpu
LOGIT_TOL = 3e-2
KV_TOL = 3e-2
TIE = 2e-2


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
    return [(100, 64), (w, 512), (1500, 513), (1500, 514), (3000, 2048), (9000, 8192),
            (700, 1)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _check_logits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    rel = _rel(got, want)
    assert rel <= LOGIT_TOL, f"{what}: logits rel err {rel:.2e} > {LOGIT_TOL}"
    top2 = want.topk(2).values
    near_tie = (top2[0] - top2[1]) < TIE * want.pow(2).mean().sqrt()
    assert near_tie or int(got.argmax()) == int(want.argmax()), f"{what}: greedy pick differs"


def _check_kv(cache, ref_seq, slot: int, tokens: int, what: str) -> None:
    """Every entry the prefill wrote equals the reference's SequenceKV within KV_TOL."""
    from flint_graph.kernels.spec import KV_PAGE

    w = cache.cfg.sliding_window
    for i, kv in enumerate(cache.layers):
        if kv.ring:
            pos = torch.arange(max(0, tokens - w), tokens, device="cuda")
            got_k, got_v = kv.k[slot][:, pos % w].transpose(0, 1), kv.v[slot][:, pos % w].transpose(0, 1)
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
            assert rel <= KV_TOL, f"{what}: layer {i} {name} rel err {rel:.2e} > {KV_TOL}"


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.kernels import registry

    torch.backends.cuda.matmul.allow_tf32 = False
    return KernelSet(kernels=registry())


@pytest.mark.parametrize("preset", ["tiny", "full"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_prefill_matches_reference(kset, preset, fmt):
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model(preset, fmt)
    gen = torch.Generator().manual_seed(4)
    for tokens, chunk in _cases(preset):
        prompt = torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)
        seq = ref.new_sequence()
        want = ref.prefill(seq, prompt, chunk_tokens=2048)
        cache = KVCache(cfg, num_slots=2, max_tokens=tokens + 1)
        pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
        what = f"{preset} {fmt} prompt {tokens} chunk {chunk}"
        got = pre.prefill(1, prompt, chunk)
        _check_logits(got, want, what)
        _check_kv(cache, seq, 1, tokens, what)
        assert cache.layers[0].k[0].isnan().all(), f"{what}: another slot's ring was written"


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_prefill_in_two_calls_continues_the_cached_prefix(kset, preset):
    """A prompt prefilled as a prefix then the rest (start > 0) equals the whole at once."""
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import Prefill

    cfg, w, ref = _model(preset, "bf16")
    w_len = cfg.sliding_window
    for total, cut in ((3 * w_len + 10, w_len + 3), (2 * w_len, 1), (700, 699)):
        prompt = torch.randint(0, cfg.vocab_size, (total,),
                               generator=torch.Generator().manual_seed(total))
        seq = ref.new_sequence()
        want = ref.prefill(seq, prompt, chunk_tokens=2048)
        cache = KVCache(cfg, num_slots=1, max_tokens=total)
        pre = Prefill(cfg, w, cache, attention="kernel", kset=kset)
        pre.prefill(0, prompt[:cut], 256)
        got = pre.prefill(0, prompt[cut:], 256, start=cut)
        what = f"{preset} prompt {total} cut at {cut}"
        _check_logits(got, want, what)
        _check_kv(cache, seq, 0, total, what)


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
    _check_logits(got, want, attention)
    _check_kv(cache, seq, 0, 300, attention)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_greedy_decode_continues_from_the_prefill(kset, fmt):
    """The graph engine prefilling with the kernels then decoding greedily gives the reference
    engine's tokens (tiny model; near-ties in the logits are allowed to swap)."""
    from flint_graph.capture.runner import GraphRunner
    from flint_graph.sampling import sample  # noqa: F401  (the engine's sampler, greedy here)

    cfg, w, ref = _model("tiny", fmt)
    runner = GraphRunner(cfg, w, ref, max_slots=2, max_context=400, vocab_limit=cfg.vocab_size,
                         kset=kset)
    from flint_graph.capture.decode_step import Row

    prompt = torch.randint(0, cfg.vocab_size, (120,), generator=torch.Generator().manual_seed(1))
    slot = runner.alloc_slot()
    logits = runner.prefill(slot, prompt.cuda(), 50)
    seq = ref.new_sequence()
    want = ref.prefill(seq, prompt, 2048)
    _check_logits(logits, want, f"{fmt} prefill")
    tok = int(want.argmax())
    for step in range(40):
        ids, lg = runner.decode([Row(slot=slot, token=tok, position=120 + step)])
        ref_logits = ref.forward([seq], [torch.tensor([tok], device="cuda")])[0][-1]
        _check_logits(lg[0].float(), ref_logits, f"{fmt} decode step {step}")
        tok = int(ref_logits.argmax())  # both follow the reference's greedy path
