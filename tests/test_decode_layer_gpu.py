"""A whole decoder layer from the decode kernels (capture/decode_layer.py) against the reference
layer (`reference.decoder_layer`): both layer kinds (sliding + RoPE, full + NoPE), both FFN kinds
(dense MLP, MoE), both weight formats, every bucket, tiny and full configs.

Each row has its own cached history (random K/V written into the reference's SequenceKV and
into the kernels' ring / paged caches alike, pages shuffled) and decodes one token. Compared:
the layer output (the residual stream), the K and V entries the layer wrote (rel ≤ 1e-2: one
GEMV and, for K, a norm and RoPE, each rounded once), and the routing.

Tolerances. The layer chains ~10 ops that each round to bf16 (2^-9 relative) with fp32 sums in
a different order than torch; errors add roughly linearly, so the output's ‖out − ref‖/‖ref‖ is
expected at a few 1e-3; we test ≤ 2e-2. The input stream is scaled down (×0.05) so the layer's
own contribution, not the bf16 copy of its input, dominates what is compared. Routing: the
kernel's picks must equal the fp32 reference's on the kernel's own normed input, except where
the reference's biased scores of the swapped experts lie within 1e-3 of each other (the bf16
input itself differs by an ulp between the two paths, which moves scores by ~1e-4); the
reference FFN then follows the kernel's picks (`routing=`), so the output check stays strict.
"""

import math
import types

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.toolchain.spec import BUCKETS, KV_PAGE
from flint_graph.checkpoints.make_checkpoint import quantize_weights
from flint_graph.checkpoints.synthetic import make_layer_weights
from flint_graph.checkpoints.weights import MoEWeights, NVFP4Weight

pytestmark = pytest.mark.gpu
REL_TOL = 2e-2
ROUTE_TIE = 1e-3
KERNELS = ("rmsnorm", "gemv_bf16", "gemv_nvfp4", "qk_norm_rope_kv", "attn_decode",
           "moe_router", "moe_gate_up", "moe_down")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.kernels import registry

    torch.backends.cuda.matmul.allow_tf32 = False
    return KernelSet(kernels=registry(KERNELS))


def _layers(cfg: FlintConfig) -> list[int]:
    """One layer of each (attention kind, FFN kind) pair the config has."""
    seen, out = set(), []
    for i in range(cfg.num_hidden_layers):
        key = (cfg.is_sliding(i), cfg.is_moe(i))
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


_WEIGHTS: dict = {}


def _weights(preset: str, layer: int, fmt: str):
    """The layer's synthetic weights on the GPU; NVFP4 with scale2 multiplied by factors that
    are not powers of two (per expert, gate and up different), so each is applied once."""
    key = (preset, layer, fmt)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()  # one full-size layer at a time
        cfg = FlintConfig.preset(preset)
        lw = make_layer_weights(cfg, 5, layer, "cuda")
        if fmt == "nvfp4":
            quantize_weights(types.SimpleNamespace(layers=[lw]), progress=False)
            gen = torch.Generator(device="cuda").manual_seed(layer)
            for w in _linears(lw):
                w.scale2 = w.scale2 * (1 + torch.rand(w.scale2.shape, generator=gen,
                                                      device="cuda"))
        _WEIGHTS[key] = lw
    return _WEIGHTS[key]


def _linears(lw):
    ffn = lw.ffn
    out = [lw.q_proj, lw.k_proj, lw.v_proj, lw.o_proj]
    mlps = [ffn] if not isinstance(ffn, MoEWeights) else [ffn, ffn.shared]
    for m in mlps:
        if m is not None:
            out += [m.gate, m.up, m.down]
    return [w for w in out if isinstance(w, NVFP4Weight)]


def _history(cfg, layer, lens, gen):
    """Per row: K, V bf16 [L, HKV, D] of the L cached tokens (unit-RMS heads, like normed k)."""
    shape = (cfg.num_key_value_heads, cfg.head_dim)
    return [(torch.randn((n, *shape), generator=gen, device="cuda").bfloat16(),
             torch.randn((n, *shape), generator=gen, device="cuda").bfloat16()) for n in lens]


def _fill(cfg, layer, hist, bufs, kv, ref_seqs, gen):
    """Write each row's history into the kernels' cache (shuffled pages / one ring slot per
    row) and into the reference's SequenceKV; set positions and tables."""
    b = len(hist)
    if kv.ring:
        slots = torch.randperm(kv.k.shape[0], generator=gen, device="cuda")[:b]
        bufs.ring_table[:, 0] = slots.int()
    pages = torch.randperm(kv.k.shape[0], generator=gen, device="cuda")
    t_max = bufs.page_table.shape[1]
    w = cfg.sliding_window
    for r, ((k, v), seq) in enumerate(zip(hist, ref_seqs)):
        n = k.shape[0]
        bufs.positions[r] = n
        if not kv.ring:
            bufs.page_table[r] = pages[r * t_max:(r + 1) * t_max].int()
        t = torch.arange(n, device="cuda")
        if kv.ring:
            keep = t[max(0, n - w):]
            kv.k[bufs.ring_table[r, 0].long(), :, keep % w] = k[keep].transpose(0, 1)
            kv.v[bufs.ring_table[r, 0].long(), :, keep % w] = v[keep].transpose(0, 1)
            seq.k[layer][keep % w] = k[keep]
            seq.v[layer][keep % w] = v[keep]
        else:
            page = bufs.page_table[r].long()[t // KV_PAGE]
            kv.k[page, :, t % KV_PAGE] = k
            kv.v[page, :, t % KV_PAGE] = v
            seq.k[layer] = k.clone()
            seq.v[layer] = v.clone()
        seq.num_tokens = n


def _case_lens(cfg, b, seed):
    """Cached tokens per row: short, around the window, and long, mixed in one batch."""
    w = cfg.sliding_window
    pool = [0, 1, w - 1, w, w + 1, 3 * w + 5, 1500, 4000]
    g = torch.Generator().manual_seed(seed)
    return [pool[i] for i in torch.randint(0, len(pool), (b,), generator=g).tolist()]


def _run_case(kset, preset, layer, fmt, b, seed, fold=None):
    from flint_graph.capture.decode_layer import DecodeLayer, StepBuffers, allocate_kv

    cfg = FlintConfig.preset(preset)
    lw = _weights(preset, layer, fmt)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = _case_lens(cfg, b, seed)
    max_pages = math.ceil((max(lens) + 1) / KV_PAGE) + 1
    bufs = StepBuffers.allocate(cfg, b, max_pages)
    kv = allocate_kv(cfg, layer, num_pages=b * max_pages + 3, num_slots=b + 2)
    for t in (kv.k, kv.v):
        t.fill_(float("nan"))  # entries nobody wrote must never be read
    windows = [cfg.sliding_window if cfg.is_sliding(i) else None
               for i in range(cfg.num_hidden_layers)]
    seqs = [reference.SequenceKV(windows, cfg.num_key_value_heads, cfg.head_dim, "cuda")
            for _ in range(b)]
    hist = _history(cfg, layer, lens, gen)
    _fill(cfg, layer, hist, bufs, kv, seqs, gen)
    x = (torch.randn((b, cfg.hidden_size), generator=gen, device="cuda") * 0.05).bfloat16()
    bufs.stream.copy_(x)
    dl = DecodeLayer(kset, cfg, layer, lw, b, fold)
    dl.launch(bufs, kv)
    torch.cuda.synchronize()
    out = bufs.stream.clone()
    assert not out.isnan().any(), f"{preset} layer {layer} {fmt} B={b}: NaN in the output"

    routing = None
    if isinstance(lw.ffn, MoEWeights):
        routing = _check_routing(cfg, lw, bufs)
    want = reference.decoder_layer(cfg, lw, layer, x, seqs, [1] * b, routing=routing)
    rel = ((out.float() - want.float()).norm() / want.float().norm()).item()
    assert rel <= REL_TOL, f"{preset} layer {layer} {fmt} B={b} lens {lens}: rel {rel:.2e}"
    _check_kv(cfg, layer, bufs, kv, seqs, lens)
    return rel


def _check_routing(cfg, lw, bufs):
    """The kernel's picks against the fp32 reference route on the kernel's own normed input;
    returns them (ids, weights) for the reference FFN."""
    ffn = lw.ffn
    h = bufs.h
    ids_ref, _ = reference.route(h, ffn.router, ffn.router_bias, cfg.num_experts_per_tok,
                                 cfg.routed_scaling_factor, cfg.norm_topk_prob)
    ids = bufs.ids.long()
    biased = torch.sigmoid(h.float() @ ffn.router.float().T) + ffn.router_bias.float()
    for r in range(ids.shape[0]):
        got, want = set(ids[r].tolist()), set(ids_ref[r].tolist())
        for e_got, e_want in zip(sorted(got - want), sorted(want - got)):
            gap = abs(biased[r, e_got] - biased[r, e_want]).item()
            assert gap <= ROUTE_TIE, f"row {r}: kernel picked {e_got}, reference {e_want} " \
                                     f"(biased scores {gap:.2e} apart)"
    return ids, bufs.weights.clone()


def _check_kv(cfg, layer, bufs, kv, seqs, lens):
    """The K/V entry at each row's position equals what the reference stored there."""
    for r, n in enumerate(lens):
        if kv.ring:
            slot, entry = bufs.ring_table[r, 0].long(), n % cfg.sliding_window
        else:
            slot, entry = bufs.page_table[r, n // KV_PAGE].long(), n % KV_PAGE
        ref_k = seqs[r].k[layer][entry if kv.ring else n]
        ref_v = seqs[r].v[layer][entry if kv.ring else n]
        got_k, got_v = kv.k[slot, :, entry], kv.v[slot, :, entry]
        for name, got, want in (("K", got_k, ref_k), ("V", got_v, ref_v)):
            rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert rel <= 1e-2, f"row {r}: {name} entry rel {rel:.2e}"


CASES = [(preset, layer, fmt) for preset in ("tiny", "full")
         for layer in _layers(FlintConfig.preset(preset)) for fmt in ("bf16", "nvfp4")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-L{c[1]}-{c[2]}")
def test_layer_matches_reference(kset, case):
    preset, layer, fmt = case
    for i, b in enumerate(BUCKETS):
        _run_case(kset, preset, layer, fmt, b, seed=10 * layer + i)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-L{c[1]}-{c[2]}")
def test_folded_layer_matches_reference(kset, case):
    """The same with attention taking the Q/K norm, RoPE and the KV write (attn_decode
    QKN = 1, six launches): the layer output and the K/V entries it wrote, same bounds."""
    preset, layer, fmt = case
    for i, b in enumerate(BUCKETS):
        _run_case(kset, preset, layer, fmt, b, seed=10 * layer + i, fold=True)
