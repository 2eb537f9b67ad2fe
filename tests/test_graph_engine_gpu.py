"""The graph engine behind LLM() (capture/runner.py via Engine) on the tiny checkpoint: it is
picked on CUDA, and greedy generation agrees with the reference engine token for token, or
diverges only where the reference's top two logits are within 2% of their RMS (the graph's
LM-head logits are bf16-rounded, 2^-9 relative; the layers add ~1e-2 at most, see
test_decode_step_gpu.py). Seeded sampling repeats exactly."""

import pytest
import torch

from faults import failing_on_call

from flint_graph import LLM, SamplingParams
from flint_graph.runtime.engine_config import EngineConfig

pytestmark = pytest.mark.gpu
TIE = 2e-2
PROMPTS = ["The decode step is bound by memory bandwidth because",
           "List three prime numbers:", "hi"]


@pytest.fixture(scope="module")
def llms(tiny_ckpt):
    graph = LLM(tiny_ckpt, device="cuda", progress=False, engine=EngineConfig(engine="graph"))
    ref = LLM(tiny_ckpt, device="cuda", progress=False,
              engine=EngineConfig(engine="reference"))
    return graph, ref


def test_auto_picks_the_graph_engine_on_cuda(tiny_ckpt):
    from flint_graph.kernels.decode import attn_decode

    llm = LLM(tiny_ckpt, device="cuda", progress=False)
    assert llm.engine.name == "graph", llm.engine.fallback_reason
    assert set(llm.engine.runner.kernels_per_step) == {1, 2, 4, 8}
    report = llm.startup
    per_layer = 6 if attn_decode.uses_fold(llm.cfg) else 7  # the fold: no qk_norm_rope_kv
    assert report["engine"] == "graph" and report["kernels_per_step"][1] == per_layer * 6 + 3
    assert all(report[f"capture_B{b}_s"] > 0 for b in (1, 2, 4, 8))
    assert report["kv_cache_bytes"] > 0 and report["context_limit"] > 0
    assert report["prefill_buckets"][0] == 16 and report["prefill_dense_bf16_bytes"] == 0  # BF16


def test_greedy_generation_follows_the_reference(llms):
    graph, ref = llms
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    outs_g = graph.generate(PROMPTS, params)  # three rows: the bucket of 4 with a padding row
    outs_r = ref.generate(PROMPTS, params)
    for og, orf in zip(outs_g, outs_r):
        g, r = og.token_ids, orf.token_ids
        same = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), None)
        if same is None:
            continue
        model = ref.engine.model
        seq = model.new_sequence()
        ids = torch.tensor(orf.prompt_token_ids + r[:same], device="cuda")
        logits = model.prefill(seq, ids)
        gap = (logits[r[same]] - logits[g[same]]).item()
        rms = logits.pow(2).mean().sqrt().item()
        assert gap <= TIE * rms, f"token {same}: graph {g[same]}, reference {r[same]} " \
                                 f"(gap {gap:.3g}, logit rms {rms:.3g})"


def test_seeded_sampling_repeats(llms):
    graph, _ = llms
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                            ignore_eos=True)
    a = graph.generate(PROMPTS[:2], params)
    b = graph.generate(PROMPTS[:2], params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_the_pipelined_decode_gives_the_tokens_of_one_step_at_a_time(llms, tiny_ckpt):
    """EngineConfig.pipeline_decode (on by default) against off, on the same kernels: rows
    ending at different steps (max_tokens, a stop string, a stop id) so buckets shrink at other
    steps in the two modes (the decode step is bitwise batch-invariant), sampled and greedy
    rows, log-probabilities; then a turn that resumes each finished sequence."""
    graph, _ = llms
    off = LLM(tiny_ckpt, device="cuda", progress=False,
              engine=EngineConfig(engine="graph", pipeline_decode=False))
    assert graph.engine.pipeline and not off.engine.pipeline
    free = off.generate(PROMPTS, SamplingParams(max_tokens=30, temperature=0.0,
                                                ignore_eos=True))
    text = free[0].text
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                             stop=[text[len(text) // 2:len(text) // 2 + 2]]),
              SamplingParams(max_tokens=9, temperature=0.9, top_k=40, seed=3, logprobs=True),
              SamplingParams(max_tokens=30, temperature=0.0,
                             stop_token_ids=[free[2].token_ids[6]])]
    runs = []
    for llm in (graph, off):
        llm.engine.drop_retained()
        outs = llm._run([llm._request(llm._encode(p), q, None)
                         for p, q in zip(PROMPTS, params)])  # one batch, a params each
        more = llm.generate([o.prompt_token_ids + o.token_ids + [11, 12] for o in outs],
                            SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        runs.append([(o.token_ids, o.finish_reason, o.logprobs) for o in outs + more])
    assert runs[0] == runs[1]
    assert [r[1] for r in runs[0][:3]] == ["stop", "length", "stop"]


def test_out_of_memory_for_the_kv_cache_names_it_and_the_flag(tiny_ckpt, monkeypatch):
    from flint_graph.capture import runner
    from flint_graph.errors import ConfigError

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 58.00 GiB")

    monkeypatch.setattr(runner, "KVCache", no_memory)
    with pytest.raises(ConfigError, match="out of GPU memory for the KV cache.*--max-context"):
        LLM(tiny_ckpt, device="cuda", progress=False,
            engine=EngineConfig(engine="graph", max_context=4000))


def test_a_failed_replay_ends_its_requests_and_the_engine_serves_new_ones(llms, monkeypatch):
    graph, _ = llms
    graph.engine.drop_retained()  # earlier tests' retained sequences hold slots (KV reuse)
    runner = graph.engine.runner
    # (decode launches too; the pipelined decode launches alone)
    monkeypatch.setattr(runner, "launch",
                        failing_on_call(runner.launch, 3, ValueError("injected fault")))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = graph.generate(PROMPTS[:2], params)
    assert all(o.finish_reason == "error" and len(o.token_ids) == 3 for o in outs)
    assert outs[0].errors == ["decode step failed: ValueError: injected fault"]
    assert len(runner.free_slots) == graph.engine.max_slots  # failed: nothing retained
    again = graph.generate(PROMPTS[2], params)[0]
    assert again.finish_reason == "length" and len(again.token_ids) == 8


def test_non_finite_logits_in_a_decode_step_end_the_request_with_an_error(llms):
    """Issue 26 item 4 on the graph engine: after the first token (sampled from the prefill's
    logits, checked on the host) the LM head turns NaN; the captured step's sampler then draws
    id 0 from NaN logits (read as -inf), which `non_finite_rows` catches: the request ends with
    "error" naming the cause and where it started, and the engine serves the next request."""
    graph, _ = llms
    head = graph.engine.runner.model.weights.lm_head
    saved = head.clone()
    stream = graph.stream("hello", SamplingParams(max_tokens=16, temperature=0.0,
                                                  ignore_eos=True))
    try:
        for i, _ in enumerate(stream):
            if i == 0:
                head.fill_(float("nan"))
    finally:
        head.copy_(saved)
    out = stream.output
    assert out.finish_reason == "error" and "not finite" in " ".join(out.errors), out
    # the reference model (same weights) reruns the request on the error path and names where
    assert "first in the LM head" in " ".join(out.errors), out.errors
    assert 1 <= len(out.token_ids) < 16
    again = graph.generate(["hello"], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert again.finish_reason == "length" and len(again.token_ids) == 4


def test_start_up_runs_one_eager_chunk_and_leaves_no_trace(tiny_ckpt, monkeypatch):
    """A chunk longer than the largest prefill graph runs eagerly, and its first run pays the
    allocator's and the libraries' first-use costs; start-up pays them instead, with one eager
    chunk into slot 0 (capture/runner.py `_warm_up_eager`). With the prefill graphs off every
    chunk is eager: the warm-up runs (4,096 tokens, the tiny context), and a request served
    in slot 0 afterwards gives the same tokens and log-probabilities, bit for bit, as on an
    engine without it. With the graphs on, the tiny engine's chunks all fit its largest
    graph (4,096 tokens): no warm-up."""
    from flint_graph.capture import runner

    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=True)
    cfg = EngineConfig(engine="graph", prefill_graphs=False)
    warm = LLM(tiny_ckpt, device="cuda", progress=False, engine=cfg)
    assert warm.startup["warm_up_eager_s"] > 0
    a = warm.generate(PROMPTS, params)
    del warm
    monkeypatch.setattr(runner, "EAGER_WARM_UP_TOKENS", 0)
    cold = LLM(tiny_ckpt, device="cuda", progress=False, engine=cfg)
    assert "warm_up_eager_s" not in cold.startup
    b = cold.generate(PROMPTS, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    del cold
    monkeypatch.undo()
    graphs = LLM(tiny_ckpt, device="cuda", progress=False, engine=EngineConfig(engine="graph"))
    assert "warm_up_eager_s" not in graphs.startup
