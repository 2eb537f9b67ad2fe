"""Graph-engine properties the issue asks for (capture/runner.py, capture/decode_step.py), on the
tiny config with BF16 and NVFP4 weights:
  (d) a step writes exactly one K and one V entry per live row and layer (at the row's slot and
      position): the padding rows of a bucket write only the scratch slot;
  (f) a row's logits are bitwise the same whether or not another request prefills 1,500 tokens
      into another slot between its steps;
  (g) PDL on and off give bitwise identical logits;
and the captured graph's node count (kernel nodes ≥ our launches per step).
"""

import pytest
import torch

from flint_graph.config import FlintConfig
from flint_graph.make_checkpoint import quantize_weights
from flint_graph.reference import ReferenceModel
from flint_graph.synthetic import make_weights

pytestmark = pytest.mark.gpu
CFG = FlintConfig.preset("tiny")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet()


@pytest.fixture(scope="module", params=["bf16", "nvfp4"])
def weights(request):
    w = make_weights(CFG, 8, "cuda")
    if request.param == "nvfp4":
        quantize_weights(w, progress=False)
    return w


def _tokens(n, seed):
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def test_a_step_writes_only_its_rows_entries(kset, weights):
    from flint_graph.capture.decode_step import DecodeGraph, Row
    from flint_graph.capture.kv_cache import KVCache

    kv = KVCache(CFG, num_slots=4, max_tokens=80)
    for layer in kv.layers:  # huge values where nobody may look
        layer.k.fill_(1e30)
        layer.v.fill_(1e30)
    graph = DecodeGraph(kset, CFG, weights, kv, batch=4)
    slots, toks = [3, 1], _tokens(2, 1).tolist()
    for step in range(30):
        before = [(layer.k.clone(), layer.v.clone()) for layer in kv.layers]
        graph.set_rows([Row(slot=s, token=t, position=step) for s, t in zip(slots, toks)])
        if graph.graph is None:
            graph.capture()
            for layer, (k, v) in zip(kv.layers, before):  # the warm-up and capture ran a step
                layer.k.copy_(k)
                layer.v.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        assert graph.logits[:2].isfinite().all()
        for i, (layer, (k, v)) in enumerate(zip(kv.layers, before)):
            changed = (layer.k != k).any(-1).any(1) | (layer.v != v).any(-1).any(1)  # [NB, P]
            allowed = torch.zeros_like(changed)
            for s in slots + [kv.scratch, kv.scratch]:  # two padding rows, position 0
                pos = step if s != kv.scratch else 0
                if layer.ring:
                    allowed[s, pos % CFG.sliding_window] = True
                else:
                    allowed[kv.page_table(s)[pos // 64], pos % 64] = True
            assert not (changed & ~allowed).any(), f"layer {i} step {step}: stray KV writes"
        toks = graph.next_ids[:2].tolist()


def _decode(runner, slot, first, start, steps, between=None):
    from flint_graph.capture.decode_step import Row

    out, tok = [], first
    for i in range(steps):
        if between is not None and i == steps // 2:
            between()
        ids, logits = runner.decode([Row(slot=slot, token=tok, position=start + i)])
        out.append(logits[0].clone())
        tok = ids[0]
    return out


def test_a_concurrent_prefill_leaves_a_decoding_row_bitwise_unchanged(kset, weights):
    from flint_graph.capture.runner import GraphRunner

    ref = ReferenceModel(CFG, weights, "cuda")
    runs = []
    for with_prefill in (False, True):
        runner = GraphRunner(CFG, weights, ref, max_slots=2, max_context=1600,
                             vocab_limit=CFG.vocab_size, kset=kset)
        a = runner.alloc_slot()
        prompt = _tokens(40, 2).cuda()
        first = int(runner.prefill(a, prompt, 16).argmax())
        b = runner.alloc_slot()
        other = _tokens(1500, 3).cuda()
        hook = (lambda: runner.prefill(b, other, 512)) if with_prefill else None
        runs.append(_decode(runner, a, first, 40, 12, hook))
    for i, (x, y) in enumerate(zip(*runs)):
        assert torch.equal(x, y), f"step {i}: logits changed by another slot's prefill"


def test_pdl_on_and_off_give_identical_logits(kset, weights):
    from flint_graph.capture.decode_step import DecodeGraph, Row
    from flint_graph.capture.kv_cache import KVCache

    logits = []
    for pdl in (True, False):
        kv = KVCache(CFG, num_slots=2, max_tokens=64)
        graph = DecodeGraph(kset, CFG, weights, kv, batch=2, pdl=pdl)
        toks, run = _tokens(2, 4).tolist(), []
        for step in range(25):
            graph.set_rows([Row(slot=s, token=t, position=step) for s, t in enumerate(toks)])
            if graph.graph is None:
                graph.capture()
            graph.replay()
            run.append(graph.logits.clone())
            toks = graph.next_ids.tolist()
        logits.append(run)
    for i, (x, y) in enumerate(zip(*logits)):
        assert torch.equal(x, y), f"step {i}: PDL changed the logits"


def test_graph_node_count(kset, weights):
    from flint_graph.capture.decode_step import DecodeGraph, Row
    from flint_graph.capture.kv_cache import KVCache

    graph = DecodeGraph(kset, CFG, weights, KVCache(CFG, num_slots=1, max_tokens=64), batch=1)
    graph.set_rows([Row(slot=0, token=1, position=0)])
    graph.run_eager()
    nodes = graph.graph_nodes()
    assert nodes.get("kernel", 0) >= graph.kernels_per_step, nodes


def test_the_greedy_graph_picks_what_the_sampler_picks_at_temperature_zero(kset, weights):
    from flint_graph.capture.decode_step import DecodeGraph, Row
    from flint_graph.capture.kv_cache import KVCache

    graph = DecodeGraph(kset, CFG, weights, KVCache(CFG, num_slots=3, max_tokens=64), batch=4)
    toks = _tokens(3, 9).tolist()
    for step in range(20):
        graph.set_rows([Row(slot=s, token=t, position=step) for s, t in enumerate(toks)])
        if graph.graph is None:
            graph.capture()
        graph.replay()
        want_ids, want_logits = graph.next_ids.clone(), graph.logits.clone()
        graph.replay(greedy=True)  # rewrites the same KV entries with the same values
        assert torch.equal(graph.logits, want_logits)
        assert torch.equal(graph.next_ids[:3], want_ids[:3]), f"step {step}"
        toks = want_ids[:3].tolist()

