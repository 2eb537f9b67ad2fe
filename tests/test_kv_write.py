"""CPU checks of the prefill's KV write kernel's declarations and reference
(kernels/prefill/kv_write.py): one specialisation per cache kind each config has, launch
shapes that hold a whole row per thread group, and a reference that is `SlotKV.update`'s write
(the reference model's path) for the destinations `Prefill._prepare` computes. The kernel
itself runs in tests/test_kv_write_gpu.py."""

import pytest
import torch

from flint_graph.capture.kv_cache import KVCache, SlotKV
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import kv_write as kw
from flint_graph.kernels.toolchain.spec import KV_PAGE, check_spec


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
def test_specs_cover_both_cache_kinds(preset):
    cfg = FlintConfig.preset(preset)
    specs = kw.KERNEL.specs(cfg, ())
    assert {s["P"] for s in specs} == {cfg.sliding_window, KV_PAGE}
    for spec in specs:
        check_spec(kw.KERNEL, spec)
        launch = kw.KERNEL.launch(spec)
        x, y, _ = launch.block
        assert x == 2 * cfg.num_key_value_heads * cfg.head_dim // 8
        assert x * y <= kw.MAX_THREADS and launch.grid[0] == ("T", y)
        args = kw.make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu")
        assert len(args) == len(kw.KERNEL.args(spec))


def test_odd_head_dims_are_refused_by_name():
    with pytest.raises(ValueError, match="D = 12"):
        kw.pieces(kw.KERNEL.spec(HKV=2, D=12, P=64))
    with pytest.raises(ValueError, match="pieces a row"):
        kw.pieces(kw.KERNEL.spec(HKV=64, D=128, P=64))


def test_reference_writes_distinct_rows_and_leaves_inputs():
    spec = kw.KERNEL.spec(HKV=2, D=32, P=17)
    args = kw.make_args(spec, gen=torch.Generator().manual_seed(3), tokens=40, device="cpu")
    before = [a.clone() for a in args]
    k, v = kw._reference(spec, *args)
    for a, b in zip(args, before):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    w, e = args[4].long(), args[5].long()
    assert len(set(zip(w.tolist(), e.tolist()))) == 40
    assert torch.equal(k[w, :, e], args[0]) and torch.equal(v[w, :, e], args[1])
    assert int((~k.isnan()).all(-1).sum()) == 40 * 2


@pytest.mark.parametrize("kind", ["ring", "pages"])
def test_reference_is_the_slot_write_of_the_reference_model(kind):
    """A chunk written through `SlotKV.update` (what ReferenceModel.forward does) equals the
    kernel's reference fed the destinations Prefill._prepare computes for a lone slot: ring
    row = slot, entry = position mod W for the last W rows; page, entry = position mod
    KV_PAGE."""
    cfg = FlintConfig.preset("tiny")
    w = cfg.sliding_window
    gen = torch.Generator().manual_seed(4)
    start, t = 5, 30  # a chunk longer than the ring, after a cached prefix
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    k_new = torch.randn(t, hkv, d, generator=gen).bfloat16()
    v_new = torch.randn(t, hkv, d, generator=gen).bfloat16()
    cache = KVCache(cfg, num_slots=2, max_tokens=64, device="cpu")
    ref = KVCache(cfg, num_slots=2, max_tokens=64, device="cpu")
    slot = 1
    layer = next(i for i in range(cfg.num_hidden_layers)
                 if cfg.is_sliding(i) == (kind == "ring"))
    SlotKV(ref, slot, num_tokens=start).update(layer, k_new, v_new, gather=False)
    kv = cache.layers[layer]
    pos = torch.arange(start, start + t)
    if kv.ring:
        keep = pos >= start + t - w
        where = torch.where(keep, slot, cache.scratch)
        entry = pos % w
        spec = kw.KERNEL.spec(HKV=hkv, D=d, P=w)
    else:
        pages = cache.page_table(slot).long()
        where, entry = pages[pos // KV_PAGE], pos % KV_PAGE
        spec = kw.KERNEL.spec(HKV=hkv, D=d, P=KV_PAGE)
    k, v = kw._reference(spec, k_new, v_new, kv.k, kv.v, where.int(), entry.int())
    rows = slot if kv.ring else cache.page_table(slot).long()  # the slot's own entries
    for got, want in ((k, ref.layers[layer].k), (v, ref.layers[layer].v)):
        assert torch.equal(got[rows].nan_to_num(7.0), want[rows].nan_to_num(7.0))
        assert not got[rows].isnan().all()
