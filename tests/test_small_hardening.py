"""Smaller hostile-input cases (issue 26 item 7): untrusted text in error messages is cut, stop
strings with lone surrogates are refused like every other text field, and a stream closed from
another thread while it is being iterated aborts its request instead of raising."""

import threading

import pytest
import torch

from flint_graph.errors import CheckpointError, ConfigError, FlintError, InvalidRequestError
from flint_graph.runtime.sampling import SamplingParams


def test_a_huge_architecture_name_is_cut_in_the_message():
    from flint_graph.checkpoints.config import FlintConfig

    raw = FlintConfig.preset("tiny").to_dict()
    raw["architectures"], raw["model_type"] = ["A" * 100_000], "other"
    with pytest.raises(ConfigError) as e:
        FlintConfig.from_dict(raw, source="config.json")
    msg = str(e.value)
    assert len(msg) <= 300 and "…" in msg, msg  # the name is shown cut to 80 characters
    assert msg.startswith("config.json: unknown architecture")


def test_short_messages_are_kept_whole():
    assert str(FlintError("x" * 999)) == "x" * 999


@pytest.mark.parametrize("stop", ["\ud800", "ok\udfff", ["fine", "\udc80x"]])
def test_stop_strings_with_lone_surrogates_are_refused(stop):
    with pytest.raises(InvalidRequestError, match="stop.*surrogate"):
        SamplingParams(stop=stop)


def test_close_from_another_thread_aborts_the_request(tiny_llm):
    stream = tiny_llm.stream("count with me", SamplingParams(max_tokens=2000, temperature=1,
                                                             ignore_eos=True))
    seen = threading.Event()
    done = []

    def consume():
        for i, _ in enumerate(stream):
            if i == 3:
                seen.set()
        done.append(stream.output.finish_reason)

    t = threading.Thread(target=consume)
    t.start()
    assert seen.wait(60)
    stream.close()  # from this thread, while `consume` iterates: no "already executing"
    t.join(60)
    assert done == ["abort"]
    assert len(stream.output.token_ids) < 2000


def test_non_finite_logits_end_the_request_with_an_error(tiny_ckpt):
    """Issue 26 item 4: NaN logits sampled id 0 forever ("!!", finish "length", no error);
    now the request ends with finish reason "error" naming the cause, and the engine goes on
    serving (a second, healthy request on the same engine completes)."""
    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    # the reference engine's (CPU) LM head
    out = _generate_with_nan(llm, llm.engine.model.weights.lm_head, max_tokens=8)
    assert out.finish_reason == "error" and "not finite" in " ".join(out.errors), out
    assert "first in the LM head" in " ".join(out.errors), out.errors
    assert not llm.engine.running and not llm.engine.waiting
    again = llm.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert again.finish_reason == "length" and len(again.token_ids) == 3


@pytest.mark.parametrize("ids, rows, bad", [
    ([0, 5], [float("nan"), 1.0], [0]),  # a NaN row drew id 0 (the sampler reads NaN as -inf)
    ([0, 0], [float("-inf"), float("inf")], [0, 1]),
    ([0, 0], [1.0, float("nan")], [1]),  # id 0 from finite logits is a real draw
    ([3, 4], [float("nan"), float("nan")], []),  # another id: only id-0 rows are checked
    ([7], [1.0], []),
])
def test_graph_decode_rows_with_non_finite_logits_are_found_from_id_zero(ids, rows, bad):
    """Issue 26 item 4 on the graph engine: the fused sampler answers id 0 for a row with no
    finite logit, so `non_finite_rows` checks only rows that drew id 0 (no host sync on the
    hot path otherwise) and names those whose logits hold NaN or inf."""
    import torch

    from flint_graph.runtime.engine import non_finite_rows

    logits = torch.zeros(len(rows), 16, dtype=torch.bfloat16)
    for i, v in enumerate(rows):
        logits[i, 3 + i] = v
    assert non_finite_rows(ids, logits) == bad


@pytest.mark.parametrize("ids,valid,bad", [
    ([0], 1.0, []),  # a genuine id 0 beside the -inf padding of the LM head: not an error
    ([0, 0], 2.0, []),
    ([0], float("nan"), [0]),  # NaN among the tokenizer's ids: an error
    ([0], float("inf"), [0]),
    ([0], float("-inf"), [0]),
    ([5], float("nan"), []),  # another id: not checked (the sampler read NaN as -inf)
])
def test_the_lm_heads_padding_rows_are_not_non_finite_logits(ids, valid, bad):
    """The decode graph sets ids >= the tokenizer's size to -inf; a row that draws id 0 is
    checked over the tokenizer's ids only (the H200's "non-finite logits at output token 3" of
    2026-12-05 was a greedy id 0 with the padding counted)."""
    import torch

    from flint_graph.runtime.engine import non_finite_rows

    logits = torch.zeros(len(ids), 16, dtype=torch.bfloat16)
    logits[:, 10:] = float("-inf")  # padding rows 10..15
    logits[:, 0] = 3.0  # id 0 is the argmax
    logits[:, 4] = valid
    assert non_finite_rows(ids, logits, 10) == bad
    # counting the padding, every row that drew id 0 would be an error
    assert non_finite_rows(ids, logits) == [i for i, t in enumerate(ids) if t == 0]


@pytest.mark.parametrize("field,value", [("rms_norm_eps", 1e308), ("routed_scaling_factor", 1e30),
                                         ("rope_theta", 1e300)])
def test_settings_that_make_every_activation_useless_are_refused(field, value):
    from flint_graph.checkpoints.config import FlintConfig

    raw = FlintConfig.preset("tiny").to_dict()
    raw[field] = value
    with pytest.raises(ConfigError, match=f"'{field}'.*at most"):
        FlintConfig.from_dict(raw)


def test_a_parser_fault_ends_only_its_own_request(tiny_llm, monkeypatch):
    """A bad-input trial found tool schemas that made the output parser raise inside the
    engine step, which then ended every request of the step with "error" (an innocent stream
    was killed 4 times in 4). Now the fault is contained in the request whose output it was:
    that one ends with "error" naming it, its text shown as written; the others run on."""
    from flint_graph.chat import tool_call_reader

    real = tool_call_reader.type_argument

    def boom(text, schema, root):
        if isinstance(schema, dict) and schema.get("x-boom"):
            raise KeyError("a schema the parser cannot handle")
        return real(text, schema, root)

    monkeypatch.setattr(tool_call_reader, "type_argument", boom)
    tools = [{"type": "function", "function": {"name": "boom", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "x-boom": True}}}}}]
    tok = tiny_llm.tokenizer
    script = tok.encode_segments([("</think><tool_call>boom<arg_key>x</arg_key><arg_value>1"
                                   "</arg_value></tool_call>", False)])
    a = tiny_llm._chat_request([{"role": "user", "content": "a"}], tools,
                               SamplingParams(max_tokens=len(script) + 4), enable_thinking=True,
                               tool_choice=None)
    a.force(script)
    b = tiny_llm._chat_request([{"role": "user", "content": "b"}], None,
                               SamplingParams(max_tokens=12, ignore_eos=True),
                               enable_thinking=True, tool_choice=None)
    out_a, out_b = tiny_llm._run([a, b])
    assert out_a.finish_reason == "error"
    assert any("output parser failed" in e for e in out_a.errors), out_a.errors
    assert "<tool_call>boom" in out_a.content
    assert out_b.finish_reason == "length" and len(out_b.token_ids) == 12


@pytest.mark.parametrize("params, match", [
    # refs into a list by an index "²" (a digit to isdigit(), not to int()) and by 5,000 digits:
    # they resolve to nothing, so the declaration is refused (it had crashed the parse once)
    ({"properties": {"x": {"$ref": "#/anyOf/\u00b2"}}, "anyOf": [{"type": "object"}]},
     r"parameters\.properties\.x\.\$ref is \"#/anyOf/\u00b2\"; expected a reference"),
    ({"properties": {"x": {"$ref": "#/anyOf/" + "9" * 5000}}, "anyOf": [{"type": "object"}]},
     r"parameters\.properties\.x\.\$ref is \"#/anyOf/9999"),
    ({"$ref": "#/$defs/U", "allOf": 5,
      "$defs": {"U": {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}}},
     r"parameters\.allOf is 5; expected a non-empty array of schemas"),
    ({"properties": {"x": {"$ref": "#/$defs/L/0"}}, "$defs": {"L": [1]}},
     r"parameters\.\$defs is \{\"L\": \[1\]\}; expected an object whose values are schemas"),
])
def test_schemas_found_by_a_trial_are_refused_when_declared(params, match):
    from flint_graph.chat.output_parser import parse_output

    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    with pytest.raises(InvalidRequestError, match=rf"^tools\[0\] 'f': {match}"):
        parse_output("</think><tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value>"
                     "</tool_call>", tools=tools)


def test_a_ref_into_a_list_by_index_resolves():
    from flint_graph.chat.output_parser import parse_output

    params = {"type": "object", "properties": {"x": {"$ref": "#/$defs/pick/anyOf/1"}},
              "$defs": {"pick": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    out = parse_output("</think><tool_call>f<arg_key>x</arg_key><arg_value>7</arg_value>"
                       "</tool_call>", tools=tools)
    assert out.tool_calls[0].arguments == {"x": 7}


# A bad-input trial (2026-12-05) declared these and each was accepted; some were then ignored
# when the model called the tool.
@pytest.mark.parametrize("change, match", [
    ({"required": "value"}, r"parameters\.required is \"value\"; expected a list of property"),
    ({"required": 5}, r"parameters\.required is 5"),
    ({"properties": [1, 2]}, r"parameters\.properties is \[1, 2\]; expected an object"),
    ({"properties": {"value": 5}}, r"parameters\.properties is \{\"value\": 5\}"),
    ({"type": "array"}, r"parameters\.type is \"array\"; a tool's parameters are an object"),
    ({"type": "string"}, r"parameters\.type is \"string\""),
    ({"$ref": "#/$defs/nope"}, r"parameters\.\$ref is \"#/\$defs/nope\"; expected a reference"),
    ({"$defs": []}, r"parameters\.\$defs is \[\]"),
    ({"enum": "abc"}, r"parameters\.enum is \"abc\"; expected a non-empty array"),
    # admits no value: no call could be valid (a bad-input trial, 2026-12-06)
    ({"properties": {"value": {"enum": []}}},
     r"parameters\.properties\.value\.enum is \[\]; expected a non-empty array"),
    ({"anyOf": {}}, r"parameters\.anyOf is \{\}; expected a non-empty array"),
    ({"anyOf": []}, r"parameters\.anyOf is \[\]"),
    ({"properties": {"value": {"not": 3}}}, r"parameters\.properties\.value\.not is 3"),
    # value constraints JSON Schema forbids (a bad-input trial, 2026-12-07)
    ({"properties": {"value": {"multipleOf": 0}}},
     r"parameters\.properties\.value\.multipleOf is 0; expected a number above 0"),
    ({"properties": {"value": {"multipleOf": -2.5}}},
     r"parameters\.properties\.value\.multipleOf is -2\.5"),
    ({"properties": {"value": {"minimum": "x"}}},
     r"parameters\.properties\.value\.minimum is \"x\"; expected a number"),
    ({"properties": {"value": {"maximum": True}}},
     r"parameters\.properties\.value\.maximum is true; expected a number"),
    ({"properties": {"value": {"exclusiveMinimum": "0"}}},
     r"parameters\.properties\.value\.exclusiveMinimum is \"0\""),
    ({"properties": {"value": {"maxLength": -1}}},
     r"parameters\.properties\.value\.maxLength is -1; expected a non-negative integer"),
    ({"properties": {"value": {"minItems": 1.5}}},
     r"parameters\.properties\.value\.minItems is 1\.5"),
    ({"properties": {"value": {"pattern": 5}}},
     r"parameters\.properties\.value\.pattern is 5; expected a string"),
    ({"maxProperties": "2"}, r"parameters\.maxProperties is \"2\""),
    # a bad-input trial (2026-12-07): `items` not a schema, a JSON Pointer escape RFC 6901
    # does not have ("~2": only ~0 and ~1 exist)
    ({"properties": {"value": {"type": "array", "items": 5}}},
     r"parameters\.properties\.value\.items is 5; expected a schema .* or an array of"),
    ({"properties": {"value": {"type": "array", "items": [{"type": "number"}, 3]}}},
     r"parameters\.properties\.value\.items is \[\{"),
    ({"$defs": {"a~2b": {"type": "number"}}, "properties": {"value": {"$ref": "#/$defs/a~2b"}}},
     r"parameters\.properties\.value\.\$ref is \"#/\$defs/a~2b\"; expected a reference"),
    ({"properties": {"value": {"type": "array", "prefixItems": 3}}},
     r"parameters\.properties\.value\.prefixItems is 3; expected a non-empty array"),
    ({"properties": {"value": {"type": "array", "prefixItems": [3]}}},
     r"parameters\.properties\.value\.prefixItems is \[3\]"),
    ({"$defs": {"a~": {"type": "number"}}, "properties": {"value": {"$ref": "#/$defs/a~"}}},
     r"parameters\.properties\.value\.\$ref is \"#/\$defs/a~\""),
])
def test_malformed_tool_schemas_are_refused_naming_the_keyword(change, match):
    from flint_graph.chat.tool_schema import tool_schemas

    params = {"type": "object", "properties": {"value": {"type": "number"}},
              "required": ["value"], **change}
    with pytest.raises(InvalidRequestError, match=rf"^tools\[0\] 'convert': {match}"):
        tool_schemas([{"type": "function", "function": {"name": "convert",
                                                        "parameters": params}}])


@pytest.mark.parametrize("constraint", [{"multipleOf": 0.5}, {"minimum": 0, "maximum": 1e9},
                                        {"exclusiveMinimum": True}, {"maxLength": 2.0},
                                        {"pattern": "(", "format": "uri"}, {"minItems": 0},
                                        {"items": {"type": "number"}}, {"items": False},
                                        {"items": [{"type": "number"}, True]}])
def test_allowed_value_constraints_pass(constraint):
    """Their legal forms: draft 4's boolean exclusiveMinimum, 2.0 as an integer count, and a
    pattern Python's re would not compile (ECMA-262's, the tool's to apply)."""
    from flint_graph.chat.tool_schema import tool_schemas

    params = {"type": "object", "properties": {"value": {"type": "number", **constraint}}}
    assert tool_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])


def _generate_with_nan(llm, tensor, max_tokens: int):
    """The output of one request while `tensor` (a weight) is all NaN; the weight is restored
    after, whatever happens."""
    saved = tensor.clone()
    tensor.fill_(float("nan"))
    try:
        return llm.generate(["hello"], SamplingParams(max_tokens=max_tokens))[0]
    finally:
        tensor.copy_(saved)


@pytest.mark.parametrize("poison,named", [
    (lambda w: w.layers[1].o_proj, "layer 1 (attention)"),
    (lambda w: w.layers[2].ffn.router, "layer 2 (MoE)"),
    (lambda w: w.embed, "the embedding"),
])
def test_non_finite_logits_name_the_layer_they_started_in(tiny_ckpt, poison, named):
    """Issue 26 item 4: the error names where NaN first appeared. The reference engine reruns
    the failed request's tokens with a check after each block (error path only)."""
    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    out = _generate_with_nan(llm, poison(llm.engine.model.weights), max_tokens=4)
    assert out.finish_reason == "error", out
    assert f"first in {named}" in " ".join(out.errors), out.errors


def test_graph_engine_origin_tells_a_kernel_fault_from_bad_weights(tiny_ckpt):
    """On the graph engine (its weights are the reference model's) `_origin` reruns the
    request on the reference model: NaN weights are named where they start; a rerun that
    stays finite means the graph engine's kernels made the NaN, and the error says so. The
    engine here is the CPU reference engine with a stand-in runner, which is all `_origin`
    looks at (the GPU test in test_graph_engine_gpu.py runs the real one)."""
    from types import SimpleNamespace

    from flint_graph import LLM
    from flint_graph.runtime import engine as eng

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    # what _origin and _not_finite read of a Request
    req = SimpleNamespace(prompt_ids=llm.tokenizer.encode("hello"), output_ids=[5, 6],
                          num_generated=2)
    llm.engine.runner = object()  # as on the graph engine
    try:
        assert llm.engine._origin(req) == eng.KERNEL_FAULT
        msg = eng._not_finite(req, eng.KERNEL_FAULT)
        assert "not finite" in msg and "graph engine's kernels" in msg and "reference" in msg
        w = llm.engine.model.weights.layers[1].o_proj
        saved = w.clone()
        w.fill_(float("nan"))
        try:
            assert llm.engine._origin(req) == "layer 1 (attention)"
        finally:
            w.copy_(saved)
    finally:
        llm.engine.runner = None


def _interrupt_on_step(llm, monkeypatch, after: int):
    """Make the engine's `after`-th step raise KeyboardInterrupt, as Ctrl-C would (the signal
    lands wherever the main thread is: here deep in the engine)."""
    calls = {"n": 0}
    step = llm.engine.step

    def interrupted_step():
        calls["n"] += 1
        if calls["n"] == after:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)


def _our_frames(exc: BaseException) -> list[str]:
    import traceback

    return [f.filename for f in traceback.extract_tb(exc.__traceback__)
            if "flint_graph" in f.filename]


@pytest.mark.parametrize("how", ["stream_chat", "stream", "chat", "generate"])
def test_ctrl_c_in_a_script_raises_one_short_keyboard_interrupt(tiny_ckpt, monkeypatch, how):
    """Issue 25 item 3: Ctrl-C while a script iterates stream_chat (or waits in chat /
    generate) aborts the request and raises KeyboardInterrupt with api.INTERRUPTED from the
    call itself, not from inside the engine and the model; the engine serves on."""
    from flint_graph import LLM
    from flint_graph.api import INTERRUPTED

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    _interrupt_on_step(llm, monkeypatch, after=3)
    msgs = [{"role": "user", "content": "hello"}]
    with pytest.raises(KeyboardInterrupt) as info:
        if how == "stream_chat":
            for _ in llm.stream_chat(msgs, params=params):
                pass
        elif how == "stream":
            for _ in llm.stream("hello", params):
                pass
        elif how == "chat":
            llm.chat(msgs, params=params)
        else:
            llm.generate(["hello"], params)
    assert str(info.value) == INTERRUPTED
    assert info.value.__suppress_context__
    frames = _our_frames(info.value)
    assert all(f.endswith("api.py") for f in frames), frames  # nothing from the engine
    assert not llm.engine.running and not llm.engine.waiting
    monkeypatch.undo()
    again = llm.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert again.finish_reason == "length"


@pytest.mark.parametrize("where,how", [("tokenizer", "stream_chat"), ("tokenizer", "chat"),
                                       ("tokenizer", "generate"), ("template", "stream_chat"),
                                       ("template", "chat")])
def test_ctrl_c_before_the_engine_runs_is_the_same_short_interrupt(tiny_llm_fresh, monkeypatch,
                                                                  where, how):
    """Ctrl-C while the chat template renders or the prompt is tokenized (a long history, a
    batch of long prompts: bad-input trial, 2026-12-02) gave a traceback through jinja2 or the
    tokenizer; now the same one-line interrupt as in the engine loop."""
    from flint_graph.api import INTERRUPTED

    llm = tiny_llm_fresh

    def boom(*a, **k):
        raise KeyboardInterrupt

    if where == "tokenizer":
        monkeypatch.setattr(llm.tokenizer, "encode", boom)
        monkeypatch.setattr(llm.tokenizer, "encode_segments", boom)
    else:
        monkeypatch.setattr("flint_graph.api.render_chat_segments", boom)
    msgs = [{"role": "user", "content": "hello"}]
    with pytest.raises(KeyboardInterrupt) as info:
        if how == "stream_chat":
            llm.stream_chat(msgs)
        elif how == "chat":
            llm.chat(msgs)
        else:
            llm.generate(["hello"])
    assert str(info.value) == INTERRUPTED
    assert all(f.endswith("api.py") for f in _our_frames(info.value))
    assert not llm.engine.running and not llm.engine.waiting


@pytest.fixture
def tiny_llm_fresh(tiny_ckpt):
    from flint_graph import LLM

    return LLM(tiny_ckpt, device="cpu", progress=False)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_non_finite_row_ends_alone_and_the_others_draw_as_alone(tiny_ckpt, temperature):
    """`Engine._sample_and_append` reads the rows' finiteness with their drawn ids in one
    transfer: a row of NaN logits in a batch ends with the error, and every other row keeps
    the token it draws when sampled alone (greedy and sampled rows)."""
    from flint_graph import LLM
    from flint_graph.runtime.request import Request

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    eng, tok = llm.engine, llm.tokenizer
    params = SamplingParams(max_tokens=4, temperature=temperature, top_k=5, top_p=0.9, seed=7)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, llm.engine.cfg.vocab_size, generator=gen)
    logits[1, 17] = float("nan")

    def rows():
        return [Request(tok.encode(f"row {i}"), params, tok, [], None, 100) for i in range(3)]

    alone = []
    for i in (0, 2):
        r = rows()[i]
        eng._sample_and_append([r], logits[i:i + 1].clone())
        alone.append(r.output_ids)
    batch = rows()
    deltas = eng._sample_and_append(batch, logits.clone())
    assert batch[1].finish_reason == "error" and "not finite" in " ".join(batch[1].errors)
    assert [batch[0].output_ids, batch[2].output_ids] == alone
    assert len(deltas) == 3 and not batch[1].output_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_padding_rows_at_minus_inf_are_not_an_error(tiny_ckpt, temperature):
    """A decode graph's logits hold -inf in the LM head's rows past the tokenizer (they reach
    `_sample_and_append` when min_tokens bans a stop id): the row draws as usual, no error."""
    from flint_graph import LLM
    from flint_graph.runtime.request import Request

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    eng, tok = llm.engine, llm.tokenizer
    eng.tokenizer_vocab = eng.cfg.vocab_size - 100  # as a tokenizer smaller than the LM head
    params = SamplingParams(max_tokens=4, temperature=temperature, top_k=5, top_p=1.0, seed=7)
    logits = torch.randn(1, eng.cfg.vocab_size, generator=torch.Generator().manual_seed(4))
    logits[0, eng.tokenizer_vocab:] = float("-inf")
    r = Request(tok.encode("row"), params, tok, [], None, 100)
    eng._sample_and_append([r], logits)
    assert r.finish_reason != "error" and len(r.output_ids) == 1, r.errors


def test_paths_that_are_no_file_say_why(tmp_path, tiny_ckpt):
    """The bad-input trial (2026-12-04): a symlink loop as the model read "no such checkpoint",
    a shard that is a directory "does not exist", and a config.json that is a directory "no
    config.json". Each now says what is there."""
    import os
    import shutil

    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.errors import CheckpointError
    from flint_graph.paths import why_not_a_file

    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    assert why_not_a_file(tmp_path / "loop") == "a symbolic link that loops"
    assert why_not_a_file(tmp_path / "dangling") == "a symbolic link to a missing target"
    assert why_not_a_file(tmp_path) == "a directory, not a file"
    assert why_not_a_file(tmp_path / "nothing") == "no such file or directory"
    with pytest.raises(CheckpointError, match="loop: a symbolic link that loops"):
        load_checkpoint(tmp_path / "loop", device="cpu")

    copy = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, copy)
    shard = next(copy.glob("*.safetensors"))
    shard.unlink()
    shard.mkdir()
    with pytest.raises(CheckpointError, match="a directory, not a file"):
        load_checkpoint(copy, device="cpu")
    shutil.rmtree(shard)
    shutil.copy(next(tiny_ckpt.glob("*.safetensors")), shard)
    (copy / "config.json").unlink()
    (copy / "config.json").mkdir()
    with pytest.raises(CheckpointError, match="a directory, not a file for config.json"):
        load_checkpoint(copy, device="cpu")


# Messages that named the wrong thing (a bad-input trial, 2026-12-05).

def test_stream_of_a_list_of_prompts_says_so(tiny_llm):
    with pytest.raises(InvalidRequestError, match=r"stream\(\) takes one prompt .* found a list "
                                                  r"of 2 prompts; generate\(\) takes several"):
        tiny_llm.stream(["hi", "there"], SamplingParams(max_tokens=1))


def test_a_bad_stop_token_id_is_named_as_the_callers(tiny_llm):
    with pytest.raises(InvalidRequestError, match=r"^stop_token_ids: id 1000000000 outside"):
        tiny_llm.generate(["hi"], SamplingParams(max_tokens=1, stop_token_ids=[10**9]))


def test_hf_config_path_that_is_a_file_says_so(tiny_ckpt, tmp_path):
    from flint_graph.checkpoints.checkpoint import load_checkpoint

    other = tmp_path / "hostname"
    other.write_text("box\n")
    with pytest.raises(CheckpointError, match=r"hostname: hf_config_path \(--hf-config-path\) "
                                          r"is a file, not a directory"):
        load_checkpoint(f"{tiny_ckpt}/model-nvfp4.gguf", hf_config_path=other)


def test_an_unreadable_file_in_a_directory_is_not_taken_for_the_checkpoint(tmp_path,
                                                                         monkeypatch):
    """`generate /proc/self`: a directory without config.json whose files include one that
    cannot be read; the error is the missing config.json, not that file."""
    from pathlib import Path

    from flint_graph.checkpoints.checkpoint import load_checkpoint

    (tmp_path / "unreadable").write_bytes(b"xxxx")
    real = Path.open

    def fail(self, *a, **k):
        if self.name == "unreadable":
            raise OSError(22, "Invalid argument")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "open", fail)
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(tmp_path)


def test_a_generation_config_eos_id_outside_the_vocabulary_is_the_files(tiny_ckpt, tmp_path):
    """A bad-input trial (2026-12-05): eos_token_id 9999 in generation_config.json (vocab
    4,096) let the model load, then every request failed with "stop_token_ids: id 9999
    outside ..." though the caller passed none. It is refused at start-up, naming the file."""
    import json
    import shutil

    from flint_graph import LLM

    copy = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, copy)
    gen = json.loads((copy / "generation_config.json").read_text())
    gen["eos_token_id"] = 9999
    (copy / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(CheckpointError, match=r"generation_config.json: eos_token_id 9999 "
                                              r"outside \[0, vocab_size = \d+\)"):
        LLM(copy, device="cpu", progress=False)


def test_numpy_values_are_taken_where_python_numbers_are(tiny_llm):
    """A bad-input trial (2026-12-05): SamplingParams took numpy integers, but a prompt of
    numpy ids and EngineConfig's numpy numbers were refused with messages saying they were
    not integers / numbers; a numpy array of stop strings raised numpy's own ValueError."""
    import numpy as np

    from flint_graph.runtime.engine_config import EngineConfig

    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    (a,) = tiny_llm.generate([[np.int64(5), np.int32(6), 7]], params)
    (b,) = tiny_llm.generate([[5, 6, 7]], params)
    assert a.token_ids == b.token_ids and a.prompt_token_ids == [5, 6, 7]
    assert all(type(t) is int for t in a.prompt_token_ids)
    # one prompt as a flat list of numpy ids, as `generate([5, 6, 7])` is one (2026-12-06:
    # "expected text or a list of token ids, found int64")
    (c,) = tiny_llm.generate([np.int64(5), np.int64(6), np.int64(7)], params)
    assert c.token_ids == b.token_ids and c.prompt_token_ids == [5, 6, 7]
    with pytest.raises(InvalidRequestError, match=r"prompt\[0\]: token ids must be integers"):
        tiny_llm.generate([[np.bool_(True), 5]], params)
    cfg = EngineConfig(max_slots=np.int32(2), prefill_chunk_tokens=np.int64(64),
                       prefill_step_ms=np.float32(5))
    assert (cfg.max_slots, cfg.prefill_chunk_tokens, cfg.prefill_step_ms) == (2, 64, 5.0)
    assert type(cfg.max_slots) is int and type(cfg.prefill_step_ms) is float
    with pytest.raises(InvalidRequestError, match=r"prefill_chunk_tokens .*expected an integer"):
        EngineConfig(prefill_chunk_tokens=np.float64(64.0))
    with pytest.raises(InvalidRequestError, match="'stop': expected a list of strings"):
        SamplingParams(stop=np.array(["a", "b"]))
    with pytest.raises(InvalidRequestError, match="'stop': expected a list of strings"):
        SamplingParams(stop=0)  # (was taken as no stop strings)


def test_a_whitespace_prompt_is_called_whitespace(tiny_llm):
    with pytest.raises(InvalidRequestError,
                       match=r"prompt: expected text, got only whitespace \(3 characters\)"):
        tiny_llm.generate("   ")
    with pytest.raises(InvalidRequestError, match="prompt: expected non-empty text, got an empty"):
        tiny_llm.generate("")


def test_an_empty_chat_batch_is_refused_as_an_empty_generate(tiny_llm):
    with pytest.raises(InvalidRequestError, match="conversations: expected at least one"):
        tiny_llm.chat_batch([])
    with pytest.raises(InvalidRequestError, match="prompts: expected at least one prompt"):
        tiny_llm.generate([])


# -- JSON text from outside: every failure one named ValueError (bad-input trial, 2026-12-06) --

UNREADABLE_JSON = {  # text, the words of the error
    "digits": ('{"x": -' + "9" * 4301 + "}", "an integer with more than 4,300 digits"),
    "nested": ("[" * 3000 + "]" * 3000, "nested too deeply"),
    "invalid": ('{"x": }', "Expecting value"),
}


@pytest.mark.parametrize("case", list(UNREADABLE_JSON))
def test_json_from_outside_fails_as_one_value_error_that_says_why(case):
    from flint_graph.checkpoints import jsonfile

    text, words = UNREADABLE_JSON[case]
    with pytest.raises(ValueError) as e:
        jsonfile.loads(text)
    assert words in str(e.value) and "sys.set_int_max_str_digits" not in str(e.value)


@pytest.mark.parametrize("case", list(UNREADABLE_JSON))
def test_tool_call_arguments_json_cannot_read_name_their_field(case):
    """An assistant turn's tool_calls[].function.arguments holding a 4,301-digit integer was a
    500 with a traceback in the server's log (and a bare ValueError from LLM.chat): only
    json.JSONDecodeError and RecursionError were caught."""
    from flint_graph.chat.chat_messages import validate_messages

    text, words = UNREADABLE_JSON[case]
    call = {"id": "c1", "type": "function", "function": {"name": "a", "arguments": text}}
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(InvalidRequestError) as e:
        validate_messages(msgs)
    assert "messages[1].tool_calls[0].function.arguments: expected a JSON object" in str(e.value)
    assert words in str(e.value)


def test_marker_files_json_cannot_read_mean_not_complete(tmp_path):
    """make-checkpoint's and flint-nano's markers are read to decide whether to rebuild: one
    that Python cannot read (nested 3,000 deep) must mean "rebuild", not a RecursionError."""
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.checkpoints.make_checkpoint import MARKER_NAME, _marker_files, is_complete
    from flint_graph.nano import embedded

    (tmp_path / MARKER_NAME).write_text("[" * 3000)
    (tmp_path / embedded.MARKER).write_text("[" * 3000)
    assert _marker_files(tmp_path) == set()
    assert not is_complete(tmp_path, FlintConfig.preset("tiny"), 0, ("bf16",))
    assert not embedded._complete(tmp_path, "0" * 64)


def test_json_pointer_escapes_that_exist_still_resolve():
    """~0 and ~1 (RFC 6901) keep working beside the refusal of other escapes."""
    from flint_graph.chat.tool_schema import tool_schemas

    params = {"type": "object", "$defs": {"a/b~c": {"type": "number"}},
              "properties": {"value": {"$ref": "#/$defs/a~1b~0c"}}}
    assert tool_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])
