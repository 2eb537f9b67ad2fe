"""Sampler (temperature → top-k → top-p → counter-based draw) and SamplingParams validation.

References: a per-row Python/numpy float64 re-derivation of the filtered distribution, a
pure-Python splitmix64 for the counter hash, and statistical bounds for the draws. All seeds
are fixed, so the statistical tests are deterministic; the bounds say how unlikely a failure
of a correct sampler would be.
"""

import math
import random

import numpy as np
import pytest
import torch

from flint_graph.errors import ConfigError, InvalidRequestError
from flint_graph.runtime.sampling import SamplingParams, counter_uniform, filtered_probs, sample

FULL_VOCAB = 151552  # flint-40b-config.json vocab_size: the size the decode graph samples over
M64 = (1 << 64) - 1


def rows(b, **kw):
    """Per-row parameter tensors of the dtypes the decode graph uses, broadcast to b rows."""
    def col(name, default, dtype):
        v = kw.get(name, default)
        return torch.tensor(v if isinstance(v, list) else [v] * b, dtype=dtype)
    return dict(temperature=col("temperature", 1.0, torch.float32),
                top_k=col("top_k", 0, torch.int64), top_p=col("top_p", 1.0, torch.float32))


def draw(logits, seeds, positions, **kw):
    b = logits.shape[0]
    return sample(logits, **rows(b, **kw), seeds=torch.as_tensor(seeds, dtype=torch.int64),
                  positions=torch.as_tensor(positions, dtype=torch.int64))


def ref_filtered(logits_row, t, k, p):
    """Plain float64 re-derivation, one row: sort, top-k, softmax(l/T), smallest mass>=p set."""
    lg = logits_row.double().numpy()
    out = np.zeros(len(lg))
    order = sorted(range(len(lg)), key=lambda i: (-lg[i], i))
    if t == 0:
        out[order[0]] = 1.0
        return out
    if k > 0:
        order = order[:k]
    z = np.array([lg[i] for i in order])
    w = np.exp((z - z.max()) / t)
    w /= w.sum()
    if p < 1:
        m = int(np.searchsorted(np.cumsum(w), p)) + 1  # first prefix whose mass >= p
        order, w = order[:m], w[:m] / w[:m].sum()
    out[order] = w
    return out


def ref_uniform(seed, pos):
    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)
    g = 0x9E3779B97F4A7C15
    h = mix((mix((seed + g) & M64) + (pos + 1) * g) & M64)
    return ((h >> 12) + 0.5) / 2**52


def test_counter_hash_is_bit_exact_splitmix64():
    rng = random.Random(5)
    seeds = [0, 1, 2**63 - 1, 2**62] + [rng.randrange(2**63) for _ in range(60)]
    pos = [0, 1, 2**40, 7] + [rng.randrange(2**31) for _ in range(60)]
    got = counter_uniform(torch.tensor(seeds), torch.tensor(pos))
    want = torch.tensor([ref_uniform(s, p) for s, p in zip(seeds, pos)], dtype=torch.float64)
    assert torch.equal(got, want)  # exact: integer hash, then exact int→float64 conversion
    assert bool((got > 0).all() and (got < 1).all())


def test_counter_uniforms_are_uniform():
    n = 40000
    u = counter_uniform(torch.full((n,), 99), torch.arange(n)).numpy()
    counts = np.bincount((u * 20).astype(int), minlength=20)
    chi2 = ((counts - n / 20) ** 2 / (n / 20)).sum()
    # chi2 with 19 df: mean 19, sd 6.2; 70 is > 8 sd out (P < 1e-12 for a uniform source).
    assert chi2 < 70


@pytest.mark.parametrize("t, k, p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (1.0, 20, 0.95),
                                     (0.5, 40, 0.3), (2.0, 1, 0.5), (0.0, 7, 0.9), (1.0, 999, 1.0)])
def test_filtered_probs_match_reference(t, k, p):
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 300, generator=g) * 3  # 300: several 128-wide scan blocks + padding
    got = filtered_probs(logits, **rows(6, temperature=t, top_k=k, top_p=p))
    want = np.stack([ref_filtered(r, torch.tensor(t).item(), k, p) for r in logits])
    # float64 on both sides over 300 terms: differences are a few ulp; 1e-12 leaves room.
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, rtol=0, atol=1e-12)


def test_filtered_probs_sum_to_one_at_full_vocab():
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(4, FULL_VOCAB, generator=g) * 4
    probs = filtered_probs(logits, **rows(4, temperature=[1.0, 0.6, 1.0, 0.0],
                                          top_k=[0, 20, 0, 0], top_p=[1.0, 0.95, 0.9, 1.0]))
    # float64 sums of 151552 terms: rounding error ~V * 1e-16; 1e-10 is generous.
    np.testing.assert_allclose(probs.sum(-1).numpy(), 1.0, rtol=0, atol=1e-10)
    assert (probs >= 0).all()
    assert (probs[1] > 0).sum() <= 20


def empirical(logits_row, n, seed, **kw):
    ids = draw(logits_row.expand(n, -1), [seed] * n, torch.arange(n), **kw)
    return np.bincount(ids.numpy(), minlength=logits_row.shape[0])


def assert_matches(counts, probs):
    """Counts agree with probs: no draw outside the support, chi-square within bound."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "drew a token the filters removed"
    expected = n * probs[probs > 0]
    observed = counts[probs > 0]
    small = expected < 5  # pool cells with few expected draws, as chi-square needs
    exp_cells = np.append(expected[~small], expected[small].sum())
    obs_cells = np.append(observed[~small], observed[small].sum())
    keep = exp_cells > 0
    chi2 = ((obs_cells[keep] - exp_cells[keep]) ** 2 / exp_cells[keep]).sum()
    df = max(keep.sum() - 1, 1)
    # Mean df, sd sqrt(2 df); df + 8 sd is beyond a 1e-6 tail for any df used here, while an
    # off-by-one rank, a missing renormalisation or an ignored temperature give chi2 in 100s.
    assert chi2 < df + 8 * math.sqrt(2 * df), (chi2, df)


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_top_k_never_leaves_the_k_best(k):
    g = torch.Generator().manual_seed(20 + k)
    logits = torch.randn(48, generator=g) * 2
    counts = empirical(logits, 6000, seed=k, top_k=k, temperature=1.5)
    best = set(torch.topk(logits, k).indices.tolist())
    assert set(np.flatnonzero(counts)) <= best
    probs = filtered_probs(logits[None], **rows(1, top_k=k, temperature=1.5))[0].numpy()
    assert_matches(counts, probs)


@pytest.mark.parametrize("p", [0.3, 0.8, 0.95])
def test_top_p_draws_only_from_the_nucleus_with_the_right_frequencies(p):
    g = torch.Generator().manual_seed(30)
    logits = torch.randn(64, generator=g) * 1.5
    counts = empirical(logits, 20000, seed=3, top_p=p)
    probs = filtered_probs(logits[None], **rows(1, top_p=p))[0].numpy()
    # The nucleus: smallest descending-probability prefix whose mass reaches p.
    full = torch.softmax(logits.double(), -1).numpy()
    order = np.argsort(-full, kind="stable")
    m = int(np.searchsorted(np.cumsum(full[order]), p)) + 1
    assert set(np.flatnonzero(probs)) == set(order[:m].tolist())
    assert full[order[:m - 1]].sum() < p <= full[order[:m]].sum()
    assert_matches(counts, probs)


def test_top_k_then_top_p_combined():
    g = torch.Generator().manual_seed(31)
    logits = torch.randn(100, generator=g)
    counts = empirical(logits, 20000, seed=4, top_k=20, top_p=0.6, temperature=0.8)
    probs = filtered_probs(logits[None], **rows(1, top_k=20, top_p=0.6, temperature=0.8))[0]
    np.testing.assert_allclose(probs.numpy(), ref_filtered(logits, 0.8, 20, 0.6), atol=1e-12)
    assert_matches(counts, probs.numpy())


def test_temperature_scales_the_distribution():
    g = torch.Generator().manual_seed(40)
    logits = torch.randn(32, generator=g) * 2
    top1, entropy = [], []
    for t in (0.5, 1.0, 2.0):
        probs = filtered_probs(logits[None], **rows(1, temperature=t))[0]
        want = torch.softmax(logits.double() / t, -1)
        torch.testing.assert_close(probs, want, rtol=0, atol=1e-12)  # float64 both sides
        counts = empirical(logits, 20000, seed=5, temperature=t)
        assert_matches(counts, probs.numpy())
        top1.append(counts[int(logits.argmax())] / counts.sum())
        entropy.append(-(probs[probs > 0] * probs[probs > 0].log()).sum().item())
    assert top1[0] > top1[1] > top1[2]  # colder concentrates on the argmax
    assert entropy[0] < entropy[1] < entropy[2]


def test_temperature_zero_is_argmax_whatever_the_other_params():
    g = torch.Generator().manual_seed(50)
    logits = torch.randn(16, 300, generator=g) * 3
    ids = draw(logits, torch.arange(16) * 7919, torch.arange(16), temperature=0.0,
               top_k=[0, 1, 5, 50] * 4, top_p=[1.0, 0.1, 0.5, 0.95] * 4)
    assert torch.equal(ids, logits.argmax(-1))
    tied = torch.zeros(1, 20)
    tied[0, [3, 10]] = 5.0
    assert draw(tied, [1], [0], temperature=0.0).item() == 3  # ties go to the lower id


def test_seeded_draws_reproduce_and_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(60)
    rng = random.Random(60)
    for case in range(16):
        v = FULL_VOCAB if case < 2 else 4096
        logits = torch.randn(8, v, generator=gen) * 3
        params = [dict(temperature=rng.choice([0.0, 0.6, 1.0, 1.7]), top_k=rng.choice([0, 1, 20]),
                       top_p=rng.choice([1.0, 0.95, 0.5])) for _ in range(8)]
        seeds = [rng.randrange(2**63) for _ in range(8)]
        pos = [rng.randrange(1 << 20) for _ in range(8)]
        both = {k: [p[k] for p in params] for k in params[0]}
        batch = draw(logits, seeds, pos, **both)
        assert torch.equal(batch, draw(logits, seeds, pos, **both))  # same call, same ids
        r = rng.randrange(8)
        alone = draw(logits[r:r + 1], seeds[r:r + 1], pos[r:r + 1], **params[r])
        assert alone.item() == batch[r].item(), case
        # Padding rows as the graph makes them (greedy, seed 0) around the same request.
        pad = torch.randn(3, v, generator=gen)
        padded = draw(torch.cat([pad, logits[r:r + 1]]), [0, 0, 0, seeds[r]], [0, 0, 0, pos[r]],
                      **{k: [d] * 3 + [params[r][k]]
                         for k, d in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0))})
        assert padded[3].item() == batch[r].item(), case


def test_different_seeds_and_positions_give_different_draws():
    g = torch.Generator().manual_seed(70)
    logits = torch.randn(64, generator=g) * 0.1  # near-flat: a collision has p ~ 1/64
    n = 500
    by_seed = draw(logits.expand(n, -1), torch.arange(n) * 1000003, [0] * n)
    by_pos = draw(logits.expand(n, -1), [42] * n, torch.arange(n))
    # 500 draws over ~64 near-equal tokens leave fewer than 50 distinct with P < 1e-6.
    assert len(set(by_seed.tolist())) > 50 and len(set(by_pos.tolist())) > 50
    other = draw(logits.expand(n, -1), [43] * n, torch.arange(n))
    agree = (other == by_pos).sum().item()
    # Independent streams agree ~n/64 ≈ 8 times (sd ≈ 2.8); 30 is > 7 sd. A sampler that
    # ignored the seed would agree 500 times.
    assert agree < 30


def test_sample_has_no_host_sync():
    # A meta tensor has no data: .item(), bool(), .tolist(), nonzero and boolean-mask indexing
    # all raise on it, so running the whole sampler on meta proves it never reads values on
    # the host and has no data-dependent shapes (what CUDA graph capture needs).
    b, v = 4, 1000
    args = dict(temperature=torch.ones(b), top_k=torch.zeros(b, dtype=torch.int64),
                top_p=torch.ones(b), seeds=torch.zeros(b, dtype=torch.int64),
                positions=torch.zeros(b, dtype=torch.int64))
    meta = {k: x.to("meta") for k, x in args.items()}
    out = sample(torch.empty(b, v, device="meta"), **meta)
    assert out.shape == (b,) and out.dtype == torch.int64
    probs = filtered_probs(torch.empty(b, v, device="meta"), meta["temperature"], meta["top_k"],
                           meta["top_p"])
    assert probs.shape == (b, v)
    x = torch.empty(b, v, device="meta")
    for syncing in (lambda: x.sum().item(), lambda: bool(x.sum() > 0), lambda: x.nonzero(),
                    lambda: x[x > 0]):
        with pytest.raises((RuntimeError, NotImplementedError)):
            syncing()  # the probe has teeth: each kind of sync fails on meta


def test_sample_rejects_bad_shapes_and_dtypes():
    logits = torch.randn(2, 10)
    ok = dict(temperature=torch.ones(2), top_k=torch.zeros(2, dtype=torch.int64),
              top_p=torch.ones(2), seeds=torch.zeros(2, dtype=torch.int64),
              positions=torch.zeros(2, dtype=torch.int64))
    for name, bad in [("seeds", torch.zeros(2, dtype=torch.int32)), ("top_k", torch.zeros(3,
                      dtype=torch.int64)), ("temperature", torch.ones(2, dtype=torch.int64))]:
        with pytest.raises(InvalidRequestError, match=name):
            sample(logits, **{**ok, name: bad})
    with pytest.raises(InvalidRequestError, match="logits"):
        sample(torch.randn(10), **ok)


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"temperature": "1"}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.01}, "top_p"), ({"top_p": -0.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"top_k": True}, "top_k"), ({"seed": -1}, "seed"), ({"seed": 2**63}, "seed"),
    ({"seed": 1.0}, "seed"), ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"), ({"stop": [""]}, "stop"),
    ({"stop": ["a", 3]}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    # an int too large for a float (the bad-input trial, 2026-12-05: OverflowError, HTTP 500)
    ({"temperature": 10**400}, "temperature"), ({"top_k": 2**63}, "top_k"),
])
def test_validation_names_the_argument(kwargs, name):
    with pytest.raises(InvalidRequestError, match=f"'{name}'"):
        SamplingParams(**kwargs)


def test_the_top_k_refusal_states_its_upper_limit():
    with pytest.raises(InvalidRequestError, match=r"an integer in \[0, 2\*\*63\)"):
        SamplingParams(top_k=2**63)


def test_numpy_integers_are_integers():
    np = pytest.importorskip("numpy")
    p = SamplingParams(top_k=np.int64(5), seed=np.int32(3), max_tokens=np.int64(7),
                       top_p=np.float32(0.5))
    assert (p.top_k, p.seed, p.max_tokens) == (5, 3, 7)
    assert type(p.top_k) is int and type(p.seed) is int and type(p.max_tokens) is int


def test_validation_accepts_the_range_edges():
    p = SamplingParams(temperature=0, top_p=1, top_k=0, seed=2**63 - 1, max_tokens=1,
                       min_tokens=1, stop="</s>", stop_token_ids=[0])
    assert (p.temperature, p.top_p, p.stop, p.stop_token_ids) == (0.0, 1.0, ("</s>",), (0,))
    assert isinstance(p.temperature, float)


def test_with_defaults_fills_only_missing_fields():
    gen = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "eos_token_id": [151329, 151336]}
    got = SamplingParams(top_k=5, stop_token_ids=[9, 151336]).with_defaults(gen)
    assert (got.temperature, got.top_p, got.top_k) == (1.0, 0.95, 5)
    assert got.stop_token_ids == (9, 151336, 151329)
    assert SamplingParams().with_defaults({"eos_token_id": 2}).stop_token_ids == (2,)
    quiet = SamplingParams(ignore_eos=True, stop_token_ids=[9]).with_defaults(gen)
    assert quiet.stop_token_ids == (9,)
    neutral = SamplingParams().with_defaults({})
    assert (neutral.temperature, neutral.top_p, neutral.top_k, neutral.stop_token_ids) == (
        1.0, 1.0, 0, ())
    assert SamplingParams(temperature=0.0).with_defaults(gen).temperature == 0.0


@pytest.mark.parametrize("gen, field", [
    ({"top_p": 1.5}, "top_p"), ({"temperature": -1}, "temperature"), ({"top_k": "20"}, "top_k"),
    ({"eos_token_id": [1, "x"]}, "eos_token_id"),
    ({"temperature": 10**400}, "temperature"),  # too large for a float: not OverflowError
    ({"top_k": 2**63}, "top_k"),  # named as the file's field, not as a sampling argument
])
def test_with_defaults_rejects_a_bad_generation_config(gen, field):
    with pytest.raises(ConfigError, match=f"generation_config.json field '{field}'"):
        SamplingParams().with_defaults(gen)


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager_and_cpu():
    dev = torch.device("cuda")
    b = 8
    gen = torch.Generator().manual_seed(80)
    params = rows(b, temperature=[0.0, 1.0, 0.6, 1.3, 1.0, 0.8, 2.0, 1.0],
                  top_k=[0, 20, 0, 5, 1, 0, 50, 20],
                  top_p=[1.0, 0.95, 0.9, 1.0, 1.0, 0.5, 0.99, 1.0])
    static = {k: x.to(dev) for k, x in params.items()}
    static["logits"] = torch.randn(b, FULL_VOCAB, generator=gen).to(dev)
    static["seeds"] = torch.zeros(b, dtype=torch.int64, device=dev)
    static["positions"] = torch.zeros(b, dtype=torch.int64, device=dev)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(**static)  # warm-up off the default stream, as graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(**static)
    for step in range(5):
        logits = torch.randn(b, FULL_VOCAB, generator=gen) * 3
        seeds = torch.randint(0, 2**62, (b,), generator=gen)
        pos = torch.full((b,), step * 100 + 7)
        static["logits"].copy_(logits.to(dev))
        static["seeds"].copy_(seeds.to(dev))
        static["positions"].copy_(pos.to(dev))
        graph.replay()
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside sample now raises
        try:
            eager = sample(**static)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        cpu = sample(logits, seeds=seeds, positions=pos, **params)
        assert torch.equal(out.cpu(), eager.cpu())
        alone = torch.cat([sample(**{k: x[i:i + 1] for k, x in static.items()})
                           for i in range(b)])
        assert torch.equal(out.cpu(), alone.cpu()), step  # bucket 8 vs bucket 1 on the GPU
        assert torch.equal(out.cpu(), cpu), step  # CPU and CUDA agree (see module doc)


@pytest.mark.gpu
def test_one_row_sample_graph_draws_what_sample_draws():
    """OneRowSampleGraph (the graph engine's first token of a prompt) replays `sample`'s
    kernels for one row: over greedy, top-k, top-p, both and neither, fresh logits, seeds and
    positions each draw, its token equals eager `sample`'s on the GPU, bit for bit."""
    from flint_graph.runtime.sampling import OneRowSampleGraph, SamplingParams

    dev = torch.device("cuda")
    one = OneRowSampleGraph(FULL_VOCAB, dev)
    gen = torch.Generator().manual_seed(81)
    cases = [(0.0, 0, 1.0), (1.0, 20, 0.95), (0.6, 0, 0.9), (1.3, 5, 1.0), (1.0, 1, 1.0),
             (0.8, 0, 0.5), (2.0, 50, 0.99), (1.0, 0, 1.0)]
    for step in range(40):
        t, k, p = cases[step % len(cases)]
        params = SamplingParams(temperature=t, top_k=k, top_p=p)
        logits = (torch.randn(FULL_VOCAB, generator=gen) * 3).to(dev)
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        got = one(logits, params, seed, step * 37)
        want = sample(logits[None], temperature=torch.tensor([t], device=dev),
                      top_k=torch.tensor([k], device=dev), top_p=torch.tensor([p], device=dev),
                      seeds=torch.tensor([seed], device=dev),
                      positions=torch.tensor([step * 37], device=dev))
        assert got == int(want[0]), (step, t, k, p)


def test_greedy_is_sample_at_temperature_zero():
    """`greedy` (the engine's path when every row is greedy) gives `sample`'s ids at T = 0:
    the highest logit and, among equal ones, the lowest id, -0 equal to +0, -inf rows parts
    (banned stop ids, a padded vocabulary) never chosen over a finite logit."""
    from flint_graph.runtime.sampling import greedy

    g = torch.Generator().manual_seed(5)
    b, v = 6, 300
    logits = torch.randn(b, v, generator=g).bfloat16().float()  # bf16 values: many ties
    logits[0, [7, 90, 200]] = 9.0  # an exact three-way tie: id 7
    logits[1] = 0.0
    logits[1, 3] = -0.0  # -0 == +0: id 0
    logits[2, :150] = float("-inf")  # banned ids
    logits[3, 1:] = float("-inf")
    logits[4, -40:] = float("-inf")  # a padded vocabulary
    zeros = torch.zeros(b, dtype=torch.long)
    want = sample(logits, temperature=torch.zeros(b), top_k=zeros, top_p=torch.ones(b),
                  seeds=torch.arange(b), positions=zeros)
    got = greedy(logits)
    assert torch.equal(got, want) and got[0] == 7 and got[1] == 0 and got[3] == 0


def test_do_sample_false_in_generation_config_decodes_greedily():
    """A bad-input trial (2026-12-06): a checkpoint with {"do_sample": false} and no
    temperature sampled at temperature 1.0 (three seeds, three answers), where Hugging Face
    decodes greedily. An explicit false now means temperature 0; a request's own temperature
    still wins; true or absent keeps the file's temperature."""
    assert SamplingParams().with_defaults({"do_sample": False}).temperature == 0.0
    assert SamplingParams().with_defaults({"do_sample": False,
                                           "temperature": 0.7}).temperature == 0.0
    assert SamplingParams(temperature=0.5).with_defaults({"do_sample": False}).temperature == 0.5
    assert SamplingParams().with_defaults({"do_sample": True,
                                           "temperature": 0.7}).temperature == 0.7
    assert SamplingParams().with_defaults({}).temperature == 1.0
    with pytest.raises(ConfigError, match="'do_sample': expected true or false"):
        SamplingParams().with_defaults({"do_sample": "no"})


def test_generation_config_keys_not_applied_are_listed():
    from flint_graph.runtime.sampling import unapplied_generation_keys

    gen = {"repetition_penalty": 1.1, "min_p": 0.0, "max_length": 4096, "temperature": 0.6,
           "num_beams": 1, "typical_p": 0.9, "do_sample": True}
    assert unapplied_generation_keys(gen) == ["repetition_penalty", "max_length", "typical_p"]
    assert unapplied_generation_keys({"repetition_penalty": 1.0, "min_p": None}) == []


def test_every_length_or_token_constraint_of_generation_config_gets_the_note():
    """stop_strings, min_new_tokens, suppress_tokens, … were dropped without the note that
    repetition_penalty gets (a bad-input trial, 2026-12-06); their "off" values, and empty
    lists, are not listed."""
    from flint_graph.runtime.sampling import unapplied_generation_keys

    gen = {"stop_strings": ["END"], "min_new_tokens": 5, "min_length": 3,
           "bad_words_ids": [[7]], "suppress_tokens": [1, 2], "forced_eos_token_id": 2,
           "length_penalty": 1.0, "stop_strings_off": [], "begin_suppress_tokens": []}
    assert unapplied_generation_keys(gen) == ["stop_strings", "min_new_tokens", "min_length",
                                              "bad_words_ids", "suppress_tokens",
                                              "forced_eos_token_id"]
    assert unapplied_generation_keys({"stop_strings": [], "bad_words_ids": None,
                                      "min_new_tokens": 0, "renormalize_logits": False}) == []
