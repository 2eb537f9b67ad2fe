"""KVCache / SlotKV (capture/kv_cache.py) on the CPU: the reference model prefilled through a
slot of the paged-and-ring cache gives exactly the logits of its own SequenceKV, for every chunk
size (smaller than, equal to and larger than the sliding window), and leaves the K/V where the
decode kernels read them (docs/decode-kernels.md layout)."""

import pytest
import torch

from flint_graph.capture.kv_cache import KVCache, SlotKV
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.toolchain.spec import KV_PAGE
from flint_graph.reference import ReferenceModel
from flint_graph.checkpoints.synthetic import make_weights

CFG = FlintConfig.preset("tiny")
PROMPT = 150  # > two KV pages and many windows (tiny window: 17)


@pytest.fixture(scope="module")
def model():
    return ReferenceModel(CFG, make_weights(CFG, 4, "cpu"), "cpu")


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, CFG.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("chunk", [1, 16, 17, 18, 64, PROMPT])
def test_prefill_through_a_slot_equals_sequence_kv(model, prompt, chunk):
    want = model.prefill(model.new_sequence(), prompt, chunk_tokens=chunk)
    cache = KVCache(CFG, num_slots=3, max_tokens=PROMPT + 10, device="cpu")
    slot = SlotKV(cache, 1)
    got = model.prefill(slot, prompt, chunk_tokens=chunk)
    assert torch.equal(got, want)
    assert slot.num_tokens == PROMPT
    other = cache.layers[0].k[0]
    assert other.isnan().all(), "another slot's ring was written"


def test_entries_sit_where_the_kernels_read_them(model, prompt):
    seq = model.new_sequence()
    model.prefill(seq, prompt, chunk_tokens=40)
    cache = KVCache(CFG, num_slots=2, max_tokens=PROMPT, device="cpu")
    model.prefill(SlotKV(cache, 0), prompt, chunk_tokens=40)
    w = CFG.sliding_window
    for i, kv in enumerate(cache.layers):
        if kv.ring:
            for t in range(PROMPT - w, PROMPT):
                assert torch.equal(kv.k[0][:, t % w], seq.k[i][t % w])
        else:
            pages = cache.page_table(0).long()
            for t in (0, KV_PAGE - 1, KV_PAGE, PROMPT - 1):
                assert torch.equal(kv.v[pages[t // KV_PAGE], :, t % KV_PAGE], seq.v[i][t])


def test_a_slot_refuses_tokens_past_its_capacity(model):
    cache = KVCache(CFG, num_slots=1, max_tokens=KV_PAGE, device="cpu")
    with pytest.raises(ValueError, match="exceed the cache's 64 per slot"):
        model.prefill(SlotKV(cache, 0), torch.zeros(KV_PAGE + 1, dtype=torch.long))
